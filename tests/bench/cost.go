package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/lattrace/lattrace/tests/workload"
)

// RateCost is the daemon's own cost at one offered exchange rate.
type RateCost struct {
	Config string `json:"config"`
	// Offered is the exchanges/s asked of the load generator (a round trip
	// is two exchanges: one at each end, both on this node); Measured is
	// what the daemon counted.
	Offered  float64 `json:"offered_exchanges_per_s"`
	Measured float64 `json:"measured_exchanges_per_s"`
	// CPU is the daemon's user+system time over the window, in % of one
	// core: the median of the rounds, each of which is in CPUs (results
	// from before the rounds have one measurement and no CPUs).
	CPU  float64   `json:"cpu_percent"`
	CPUs []float64 `json:"cpu_percent_rounds,omitempty"`
	// RSS is the daemon's peak resident memory during the window (the
	// highest of the rounds), Anon its anonymous part at the end (the
	// median of the rounds; see ProcStat).
	RSS  uint64 `json:"rss_bytes"`
	Anon uint64 `json:"anon_bytes"`
	// Lost is the records the ring buffer could not take in the windows
	// (all rounds): the daemon fell behind.
	Lost float64 `json:"lost"`
}

// CPURange is how many rounds there were and how far they spread, for a
// table ("" for one round). A run stopped by an error leaves some rows
// with a round fewer than others.
func (r RateCost) CPURange() string {
	if len(r.CPUs) < 2 {
		return ""
	}
	return fmt.Sprintf("%d rounds: %.2f to %.2f", len(r.CPUs), slices.Min(r.CPUs), slices.Max(r.CPUs))
}

// FlowCost is the daemon's memory with many connections open.
type FlowCost struct {
	Conns int `json:"conns"` // connections open (both ends on this node)
	// Flows is what the daemon's flow table holds (it is bounded);
	// Evicted how many it dropped to stay in its bound.
	Flows   float64 `json:"flows"`
	Evicted float64 `json:"evicted"`
	RSS     uint64  `json:"rss_bytes"`
	RSSPeak uint64  `json:"rss_peak_bytes"`
	Anon    uint64  `json:"anon_bytes"`
	// Lost is the records the ring buffer could not take while the
	// connections opened and closed (a burst of four records each).
	Lost float64 `json:"lost"`
	// Maps is the kernel memory of lattrace's maps: the fixed ones as the
	// kernel reports them, the socket storage as live sockets times the
	// kernel's allocation per socket.
	Maps []MapMem `json:"maps"`
}

// MapMem is one map's kernel memory.
type MapMem struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Bytes uint64 `json:"bytes"`
	How   string `json:"how"`
	// PerSocket is a socket storage map's allocation per socket.
	PerSocket uint64 `json:"per_socket_bytes,omitempty"`
}

// SocketStorage is what the storage every traced socket gets (the socks
// map) costs the kernel per socket; 0 when the run did not say.
func (f FlowCost) SocketStorage() uint64 {
	for _, m := range f.Maps {
		if m.Name == "socks" {
			return m.PerSocket
		}
	}
	return 0
}

// MapBytes sums Maps.
func (f FlowCost) MapBytes() uint64 {
	var n uint64
	for _, m := range f.Maps {
		n += m.Bytes
	}
	return n
}

// CostConfig sizes the daemon cost section.
type CostConfig struct {
	Self  string    // the benchmark binary, for load generators
	Rates []float64 // exchanges/s
	// Rounds is how often each setting and rate is measured (at least
	// once), every round in an order rotated from the last one's.
	Rounds   int
	Flows    []int // connections held open
	Window   time.Duration
	Settings []DaemonSetting
	Log      func(string, ...any)
}

// DaemonSetting is a named daemon configuration.
type DaemonSetting struct {
	Name  string
	JSONL bool
	OTLP  bool
}

// MeasureRates runs the daemon under paced request/response load at each
// rate and reads its CPU time and memory from /proc. A daemon's CPU at one
// rate moves by half from one run to the next on this kind of VM (the host
// moves the vCPUs between speed levels that hold for seconds), so every
// setting and rate is measured in each of c.Rounds rounds, each round in
// an order rotated from the last one's, and the rounds' median is the
// figure.
func MeasureRates(ctx context.Context, env *Env, c CostConfig) ([]RateCost, error) {
	type run struct {
		set  DaemonSetting
		rate float64
		row  int // in rounds
	}
	var runs []run
	for _, set := range c.Settings {
		for _, rate := range c.Rates {
			runs = append(runs, run{set, rate, len(runs)})
		}
	}
	rounds := make([][]RateCost, len(runs))
	for round := range max(1, c.Rounds) {
		for _, run := range Rotate(runs, round) {
			set, rate := run.set, run.rate
			r, err := measureRate(ctx, env, c, set, rate)
			if err != nil {
				return combineRates(rounds), fmt.Errorf("daemon at %.0f exchanges/s (%s): %w", rate, set.Name, err)
			}
			c.Log("daemon %-16s round %d, offered %7.0f exchanges/s, counted %7.0f: CPU %5.2f %% of a core, RSS %5.1f MiB (anonymous %5.1f), %.0f records lost",
				set.Name, round+1, r.Offered, r.Measured, r.CPU, mib(r.RSS), mib(r.Anon), r.Lost)
			rounds[run.row] = append(rounds[run.row], r)
		}
	}
	return combineRates(rounds), nil
}

// combineRates reduces each setting and rate's rounds to one RateCost: the
// median CPU, rate counted and anonymous memory, the highest RSS, the sum
// of the records lost. Settings and rates with no round are left out.
func combineRates(rounds [][]RateCost) []RateCost {
	var out []RateCost
	for _, rs := range rounds {
		if len(rs) == 0 {
			continue
		}
		c := RateCost{Config: rs[0].Config, Offered: rs[0].Offered}
		var measured, anon []float64
		for _, r := range rs {
			c.CPUs = append(c.CPUs, r.CPU)
			measured = append(measured, r.Measured)
			anon = append(anon, float64(r.Anon))
			c.RSS = max(c.RSS, r.RSS)
			c.Lost += r.Lost
		}
		c.CPU, c.Measured, c.Anon = Median(c.CPUs), Median(measured), uint64(Median(anon))
		out = append(out, c)
	}
	return out
}

// daemonLoad starts the daemon cost workload: 100-byte round trips making
// exchanges exchanges/s (one at each end per round trip) for d, on 1
// connection per 400 round trips/s: a few busy connections, as a service's
// pool would have.
func daemonLoad(self string, exchanges float64, d time.Duration) (*Loadgen, error) {
	rt := exchanges / 2
	return StartLoad(self, LoadConfig{Mode: "rr", Conns: max(1, int(rt/400)), Rate: rt, Duration: d, Size: 100}, "")
}

func measureRate(ctx context.Context, env *Env, c CostConfig, set DaemonSetting, rate float64) (RateCost, error) {
	res := RateCost{Config: set.Name, Offered: rate}
	if err := freshDir(env.Dir); err != nil {
		return res, err
	}
	dc := DaemonConfig{Bin: env.Lattrace, Dir: env.Dir, JSONL: set.JSONL, PinPath: BenchPinPath}
	if set.OTLP {
		dc.OTLP = env.OTLP
	}
	d, err := StartDaemon(dc)
	if err != nil {
		return res, err
	}
	defer d.Stop()
	warm := 2 * time.Second
	l, err := daemonLoad(c.Self, rate, warm+c.Window+time.Second)
	if err != nil {
		return res, err
	}
	defer l.Close()
	if err := workload.SleepCtx(ctx, warm); err != nil {
		return res, err
	}
	m0, err := d.Metrics()
	if err != nil {
		return res, err
	}
	p0, err := ReadProc(d.Pid())
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	var peak uint64
	for time.Since(t0) < c.Window {
		if err := workload.SleepCtx(ctx, 200*time.Millisecond); err != nil {
			return res, err
		}
		p, err := ReadProc(d.Pid())
		if err != nil {
			return res, err
		}
		peak = max(peak, p.RSS)
	}
	p1, err := ReadProc(d.Pid())
	if err != nil {
		return res, err
	}
	m1, err := d.Metrics()
	if err != nil {
		return res, err
	}
	dt := time.Since(t0)
	res.Measured = (m1["lattrace_records_decoded_total"] - m0["lattrace_records_decoded_total"]) / dt.Seconds()
	res.CPU = 100 * float64(p1.CPU-p0.CPU) / float64(dt)
	res.RSS, res.Anon = peak, p1.Anon
	res.Lost = m1["lattrace_ringbuf_full_total"] - m0["lattrace_ringbuf_full_total"]
	_, err = l.Result(ctx)
	return res, err
}

// MeasureFlows holds n connections open (one exchange each, both ends on
// this node) for each n and reads the daemon's memory and the kernel's.
func MeasureFlows(ctx context.Context, env *Env, c CostConfig) ([]FlowCost, error) {
	if err := freshDir(env.Dir); err != nil {
		return nil, err
	}
	d, err := StartDaemon(DaemonConfig{Bin: env.Lattrace, Dir: env.Dir, OTLP: env.OTLP, PinPath: BenchPinPath})
	if err != nil {
		return nil, err
	}
	defer d.Stop()
	var out []FlowCost
	for _, n := range c.Flows {
		f, err := holdFlows(ctx, d, c.Self, n)
		if err != nil {
			return out, fmt.Errorf("%d connections: %w", n, err)
		}
		c.Log("daemon with %6d connections open: %6.0f flows in its table (%0.f evicted), RSS %5.1f MiB (peak %5.1f, anonymous %5.1f), kernel maps %6.1f MiB; %0.f records lost opening and closing them",
			n, f.Flows, f.Evicted, mib(f.RSS), mib(f.RSSPeak), mib(f.Anon), mib(f.MapBytes()), f.Lost)
		out = append(out, f)
	}
	return out, nil
}

func holdFlows(ctx context.Context, d *Daemon, self string, n int) (FlowCost, error) {
	f := FlowCost{Conns: n}
	m0, err := d.Metrics()
	if err != nil {
		return f, err
	}
	gens, err := holdConns(ctx, self, n)
	if err == nil {
		err = measureHeld(ctx, d, &f)
	}
	for _, g := range gens {
		err = errors.Join(err, g.Close())
	}
	if err != nil {
		return f, err
	}
	// The connections' close records, drained.
	if err := workload.SleepCtx(ctx, 2*time.Second); err != nil {
		return f, err
	}
	m1, err := d.Metrics()
	if err != nil {
		return f, err
	}
	f.Lost = m1["lattrace_ringbuf_full_total"] - m0["lattrace_ringbuf_full_total"]
	return f, nil
}

// holdConns opens n connections in as many load generators as the limit
// of open files needs; they hold them until closed.
func holdConns(ctx context.Context, self string, n int) ([]*Loadgen, error) {
	var gens []*Loadgen
	for left := n; left > 0; left -= MaxHoldPerProcess {
		g, err := StartLoad(self, LoadConfig{Mode: "hold", Conns: min(left, MaxHoldPerProcess), Size: 100}, "")
		if err != nil {
			return gens, err
		}
		gens = append(gens, g)
		if _, err := g.Result(ctx); err != nil {
			return gens, err
		}
	}
	return gens, nil
}

// measureHeld reads the daemon's tables and memory, and the kernel maps',
// once it has taken in the connections.
func measureHeld(ctx context.Context, d *Daemon, f *FlowCost) error {
	// Two drains and the aggregator's work on what they brought.
	if err := workload.SleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	m, err := d.Metrics()
	if err != nil {
		return err
	}
	p, err := ReadProc(d.Pid())
	if err != nil {
		return err
	}
	f.Flows, f.Evicted = m["lattrace_flows"], m["lattrace_flows_evicted_total"]
	f.RSS, f.RSSPeak, f.Anon = p.RSS, p.RSSMax, p.Anon
	f.Maps, err = lattraceMaps(2 * f.Conns)
	return err
}

// lattraceMaps reports the kernel memory of the maps lattrace's programs
// use. The socket storage allocates per socket, which the kernel does not
// report for the map, so it is counted as sockets times the allocation
// (the storage element with its value, and the socket's storage header),
// with sizes from the kernel's BTF.
func lattraceMaps(sockets int) ([]MapMem, error) {
	ids := map[ebpf.MapID]bool{}
	var pid ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(pid)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
		pid = next
		p, err := ebpf.NewProgramFromID(pid)
		if err != nil {
			continue
		}
		info, err := p.Info()
		p.Close()
		if err != nil || !strings.HasPrefix(info.Name, "lattrace_") {
			continue
		}
		mids, _ := info.MapIDs()
		for _, id := range mids {
			ids[id] = true
		}
	}
	var out []MapMem
	for id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			continue
		}
		mm := MapMem{Name: info.Name, Type: info.Type.String()}
		if info.Type == ebpf.SkStorage {
			per, err := skStorageBytes(info.ValueSize)
			if err != nil {
				return nil, err
			}
			mm.Bytes, mm.PerSocket = uint64(sockets)*per, per
			mm.How = fmt.Sprintf("%d sockets x %d B (a %d B value in a storage element, plus the socket's storage header)", sockets, per, info.ValueSize)
			if info.Name == "h2socks" {
				// Made only for a connection that opens as HTTP/2.
				mm.Bytes = 0
				mm.How = fmt.Sprintf("%d B per HTTP/2 connection (a %d B value in a storage element, plus the socket's storage header when it has no other): none here", per, info.ValueSize)
			}
		} else if b, ok := info.Memlock(); ok {
			mm.Bytes = b
			mm.How = "as the kernel reports it (memlock)"
		}
		out = append(out, mm)
	}
	if len(out) == 0 {
		return nil, errors.New("no map of lattrace's programs found")
	}
	return out, nil
}

// skStorageBytes is what one socket's lattrace storage costs the kernel:
// a bpf_local_storage_elem followed by the value, and the socket's
// bpf_local_storage, each rounded up to its kmalloc size class.
func skStorageBytes(valueSize uint32) (uint64, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return 0, err
	}
	size := func(name string) (uint32, error) {
		var s *btf.Struct
		if err := spec.TypeByName(name, &s); err != nil {
			return 0, fmt.Errorf("kernel BTF: %s: %w", name, err)
		}
		return s.Size, nil
	}
	// The kernel allocates an element up to its value's end:
	// offsetof(struct bpf_local_storage_elem, sdata.data[value_size]).
	var el *btf.Struct
	if err := spec.TypeByName("bpf_local_storage_elem", &el); err != nil {
		return 0, fmt.Errorf("kernel BTF: bpf_local_storage_elem: %w", err)
	}
	i := slices.IndexFunc(el.Members, func(m btf.Member) bool { return m.Name == "sdata" })
	if i < 0 {
		return 0, errors.New("kernel BTF: bpf_local_storage_elem has no sdata")
	}
	data, err := size("bpf_local_storage_data")
	if err != nil {
		return 0, err
	}
	head, err := size("bpf_local_storage")
	if err != nil {
		return 0, err
	}
	elem := uint64(el.Members[i].Offset.Bytes()) + uint64(data) + uint64(valueSize)
	return kmallocSize(elem) + kmallocSize(uint64(head)), nil
}

// kmallocSize is the slab size class a kmalloc of n bytes uses.
func kmallocSize(n uint64) uint64 {
	switch {
	case n <= 8:
		return 8
	case n <= 96 && n > 64:
		return 96
	case n <= 192 && n > 128:
		return 192
	}
	s := uint64(8)
	for s < n {
		s <<= 1
	}
	return s
}

func freshDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Clean(dir), 0o700)
}
