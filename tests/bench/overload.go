package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lattrace/lattrace/daemon/cgroup"
	"github.com/lattrace/lattrace/tests/workload"
)

// Overload is the outcome of starving the daemon while traffic runs.
type Overload struct {
	Conns      int    `json:"conns"`
	RoundTrips uint64 `json:"round_trips"`
	// Made is the records the workload's traffic makes: an exchange per
	// round trip at each end, and a connection open and close at each end.
	Made     uint64 `json:"made"`
	Decoded  uint64 `json:"decoded"`
	Lost     uint64 `json:"lost"`     // the daemon's lattrace_ringbuf_full_total
	Stopped  string `json:"stopped"`  // how long the daemon was stopped
	Alive    bool   `json:"alive"`    // the daemon still answered afterwards
	Reported string `json:"reported"` // what /healthz said about it
}

// Exact says whether every record made is either decoded or counted lost.
func (o Overload) Exact() bool { return o.Decoded+o.Lost == o.Made }

// MeasureOverload runs request/response traffic from a cgroup of its own,
// traced by a daemon that watches only that cgroup, while the daemon is
// stopped (SIGSTOP) long enough for its ring buffer to fill. Afterwards
// every record the traffic made must be decoded or counted as lost. It
// returns the daemon's log too.
func MeasureOverload(ctx context.Context, env *Env, self string, conns int, d time.Duration) (o Overload, log string, err error) {
	o = Overload{Conns: conns, Stopped: d.String()}
	cg, removeCg, err := Cgroup(fmt.Sprintf("lattrace-bench-%d", os.Getpid()))
	if err != nil {
		return o, log, err
	}
	defer removeCg()
	if err := freshDir(env.Dir); err != nil {
		return o, log, err
	}
	dm, err := StartDaemon(DaemonConfig{Bin: env.Lattrace, Dir: env.Dir, Cgroup: cg})
	if err != nil {
		return o, log, err
	}
	defer func() {
		err = errors.Join(err, dm.Stop())
		log = dm.Log()
	}()
	if err := dm.Signal(syscall.SIGSTOP); err != nil {
		return o, log, err
	}
	l, err := StartLoad(self, LoadConfig{Mode: "rr", Conns: conns, Duration: d, Size: 100}, cg)
	if err != nil {
		_ = dm.Signal(syscall.SIGCONT)
		return o, log, err
	}
	r, err := l.Result(ctx)
	closeErr := l.Close()
	contErr := dm.Signal(syscall.SIGCONT)
	if err := errors.Join(err, closeErr, contErr); err != nil {
		return o, log, err
	}
	o.RoundTrips = r.RoundTrips
	o.Made = 2*r.RoundTrips + 4*uint64(r.Conns)
	m, err := dm.Settled(ctx)
	if err != nil {
		return o, log, err
	}
	o.Decoded, o.Lost = uint64(m["lattrace_records_decoded_total"]), uint64(m["lattrace_ringbuf_full_total"])
	o.Alive = dm.Alive()
	if h, err := healthz(dm); err == nil {
		o.Reported = h
	}
	return o, log, nil
}

// Cgroup makes a cgroup v2 directory of that name under the root, for
// traffic of its own; remove deletes it once its processes are gone.
func Cgroup(name string) (dir string, remove func(), err error) {
	root, err := cgroup.Root()
	if err != nil {
		return "", nil, err
	}
	dir = filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", nil, err
	}
	return dir, func() { os.Remove(dir) }, nil
}

// Settled waits until the daemon has drained what the ring buffer held:
// until its records decoded and lost stop changing between two looks
// (30 s at most), and returns its metrics then.
func (d *Daemon) Settled(ctx context.Context) (map[string]float64, error) {
	last := -1.0
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err := workload.SleepCtx(ctx, 500*time.Millisecond); err != nil {
			return nil, err
		}
		m, err := d.Metrics()
		if err != nil {
			return nil, err
		}
		n := m["lattrace_records_decoded_total"] + m["lattrace_ringbuf_full_total"]
		if n == last || time.Now().After(deadline) {
			return m, nil
		}
		last = n
	}
}

// healthz returns the daemon's /healthz body.
func healthz(d *Daemon) (string, error) {
	return getBody("http://" + d.metrics + "/healthz")
}
