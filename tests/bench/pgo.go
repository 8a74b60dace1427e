package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// PGORate and PGOTime are the workload ProfileDaemon profiles: the daemon
// cost section's highest rate (exchanges/s), for about 300 of the
// profiler's samples (the daemon takes some 5 % of a core; Go samples at
// 100 Hz), which put the hot path's calls well above the rest.
const (
	PGORate = 50000
	PGOTime = 60 * time.Second
)

// ProfileDaemon writes to path a Go CPU profile of the daemon, run as the
// chart runs it (pinned, OTLP to the Collector), under the daemon cost
// section's workload at PGORate: the profile Go's profile-guided
// optimisation builds cmd/lattrace with (make pgo writes it to
// cmd/lattrace/default.pgo, which go build picks up by itself).
func ProfileDaemon(ctx context.Context, env *Env, self, path string) error {
	if err := freshDir(env.Dir); err != nil {
		return err
	}
	// The daemon writes beside path, which is replaced only by a whole
	// profile: go build takes whatever is there, and an interrupted run
	// would leave an empty or partial one.
	tmp := path + ".tmp"
	defer os.Remove(tmp)
	d, err := StartDaemon(DaemonConfig{Bin: env.Lattrace, Dir: env.Dir, OTLP: env.OTLP, PinPath: BenchPinPath, CPUProfile: tmp})
	if err != nil {
		return err
	}
	lost, err := profiledLoad(ctx, d, self)
	// The profile is written as the daemon exits.
	err = errors.Join(err, d.Stop())
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %s left as it was", path)
	}
	if err != nil {
		return err
	}
	if lost > 0 {
		return fmt.Errorf("the daemon lost %.0f records: not the steady state to profile", lost)
	}
	st, err := os.Stat(tmp)
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		return fmt.Errorf("the daemon wrote an empty profile")
	}
	return os.Rename(tmp, path)
}

// profiledLoad runs the workload against d and returns the records d lost.
func profiledLoad(ctx context.Context, d *Daemon, self string) (lost float64, err error) {
	l, err := daemonLoad(self, PGORate, PGOTime)
	if err != nil {
		return 0, err
	}
	if _, err = l.Result(ctx); err != nil {
		// Interrupted: the generator would run its full time.
		_ = l.cmd.Process.Kill()
	}
	if err = errors.Join(err, l.Close()); err != nil {
		return 0, err
	}
	m, err := d.Metrics()
	return m["lattrace_ringbuf_full_total"], err
}
