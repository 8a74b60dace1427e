package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// EmptyProgram is a BPF program that does nothing, on tcp_probe as
// lattrace's is: its run time is the floor of the measurement, what the
// kernel's statistics (two clock reads a run) and the dispatch cost any
// program on this machine.
var EmptyProgram = Observer{Name: "empty tp_btf program", What: "a program of two instructions on tp_btf/tcp_probe: the floor of the measurement",
	Start: func(context.Context, *Env, Scope) (func() (string, error), error) {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "empty_probe", Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp, AttachTo: "tcp_probe", License: "GPL",
			Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()},
		})
		if err != nil {
			return nil, fmt.Errorf("loading an empty program: %w", err)
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("attaching an empty program: %w", err)
		}
		return func() (string, error) { return "", errors.Join(l.Close(), p.Close()) }, nil
	}}

// ProgCost is one BPF program's cost over a run, from the kernel's own
// statistics (kernel.bpf_stats_enabled).
type ProgCost struct {
	Name string  `json:"name"`
	Type string  `json:"type"`
	Runs uint64  `json:"runs"`
	Ns   float64 `json:"ns_per_run"`
	// PerRoundTrip is runs per request/response round trip.
	PerRoundTrip float64 `json:"runs_per_round_trip"`
}

// HookCost is what a BPF tool's programs cost on a loopback 100-byte
// request/response loop, both ends on this node, and on a churn of short
// connections.
type HookCost struct {
	Tool       string     `json:"tool"`
	RoundTrips uint64     `json:"round_trips"`
	Programs   []ProgCost `json:"programs"`
	// NsPerRoundTrip is the programs' run time summed per round trip; a
	// round trip is two exchanges, one at each end.
	NsPerRoundTrip float64 `json:"ns_per_round_trip"`
	// Connections is how many connections the churn phase opened, used
	// for one round trip and closed, and Churn what the programs cost
	// over it (runs per round trip there are runs per connection). The
	// loop above holds one connection: its programs of connection events
	// run a handful of times there, cold.
	Connections uint64     `json:"connections,omitempty"`
	Churn       []ProgCost `json:"churn,omitempty"`
	// ChurnError is why the churn phase measured nothing: the loop's
	// figures stand without it.
	ChurnError string `json:"churn_error,omitempty"`
	// Path is what the programs cost on the same loop through the lab's
	// 1 ms path (PathRoundTrips round trips, server and client on
	// different CPUs), and PathNsPerRoundTrip their sum per round trip.
	// A millisecond of other work passes between two runs on a socket, so
	// they find its state, the maps and the ring buffer cold, as on a real
	// network; the loop above, with both ends on one CPU, finds them in
	// the cache. PathError is why this phase measured nothing.
	PathRoundTrips     uint64     `json:"path_round_trips,omitempty"`
	Path               []ProgCost `json:"path,omitempty"`
	PathNsPerRoundTrip float64    `json:"path_ns_per_round_trip,omitempty"`
	PathError          string     `json:"path_error,omitempty"`
	// HTTP2Calls is how many HTTP/2 calls (h2load against nghttpd in
	// clear, one stream at a time, on the loop's CPU) the HTTP/2 phase
	// made, HTTP2 what the programs cost over it and HTTP2NsPerCall their
	// sum per call (one exchange of a stream at each end). Only for
	// lattrace, whose framing programs and stream events it measures;
	// HTTP2Error is why it measured nothing.
	HTTP2Calls     uint64     `json:"http2_calls,omitempty"`
	HTTP2          []ProgCost `json:"http2,omitempty"`
	HTTP2NsPerCall float64    `json:"http2_ns_per_call,omitempty"`
	HTTP2Error     string     `json:"http2_error,omitempty"`
	// H2Resync is what the HTTP/2 framing programs cost per write on
	// non-HTTP/2 connections open before the daemon started, where they
	// look for HTTP/2's framing from frame headers until they decide
	// (issue 46), beside connections seen from their start. Only for
	// lattrace; H2ResyncError is why it measured nothing (or why its
	// figures, still given, are not what they claim).
	H2Resync      *H2ResyncCost `json:"h2_resync,omitempty"`
	H2ResyncError string        `json:"h2_resync_error,omitempty"`
}

// WarmProg is a program's cost in the phase where it ran the most.
type WarmProg struct {
	ProgCost
	// Churn tells that phase: the churn phase rather than the loop.
	Churn bool
}

// Warm is each program's cost where it ran the most: the loop for the
// programs of every message, the churn phase for those of connection
// events. A handful of runs measures cold caches, not the program.
func (h HookCost) Warm() []WarmProg {
	var out []WarmProg
	for _, p := range h.Programs {
		out = append(out, WarmProg{ProgCost: p})
	}
	for _, c := range h.Churn {
		i := slices.IndexFunc(out, func(w WarmProg) bool { return w.Name == c.Name })
		switch {
		case i < 0:
			out = append(out, WarmProg{ProgCost: c, Churn: true})
		case c.Runs > out[i].Runs:
			out[i] = WarmProg{ProgCost: c, Churn: true}
		}
	}
	return out
}

// NsPerExchange is the run time per exchange (each end traces its own).
func (h HookCost) NsPerExchange() float64 { return h.NsPerRoundTrip / 2 }

// PathNsPerExchange is NsPerExchange through the 1 ms path.
func (h HookCost) PathNsPerExchange() float64 { return h.PathNsPerRoundTrip / 2 }

// HTTP2NsPerExchange is the HTTP/2 phase's run time per stream exchange.
func (h HookCost) HTTP2NsPerExchange() float64 { return h.HTTP2NsPerCall / 2 }

// PathProg is a program's cost through the path. The lab's relay sends
// and receives every frame on packet sockets, and the programs on every
// socket's send and receive run for those too and leave at once: they run
// about twice as often per round trip there as in the loop, and their
// average hides what a run on a TCP socket costs. AtMost bounds that: for
// a program of every message that ran half as often again per round trip
// as in the loop, its time per round trip over its runs per round trip in
// the loop (all the time charged to the TCP runs); else its average. (A
// few retransmissions or pure ACKs on the path add runs of the program's
// own, which are no reason to charge them elsewhere.)
type PathProg struct {
	ProgCost
	AtMost float64
}

// PathProgs are the path phase's programs, each with its AtMost.
func (h HookCost) PathProgs() []PathProg {
	loop := map[string]float64{}
	for _, p := range h.Programs {
		loop[p.Name] = p.PerRoundTrip
	}
	var out []PathProg
	for _, p := range h.Path {
		pp := PathProg{ProgCost: p, AtMost: p.Ns}
		if l := loop[p.Name]; l >= 1 && p.PerRoundTrip >= 1.5*l {
			pp.AtMost = p.Ns * p.PerRoundTrip / l
		}
		out = append(out, pp)
	}
	return out
}

type progSnap struct {
	name, typ string
	runs      uint64
	rt        time.Duration
}

// progSnapshot reads every loaded program's run count and run time.
func progSnapshot() (map[ebpf.ProgramID]progSnap, error) {
	out := map[ebpf.ProgramID]progSnap{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded in between
		}
		info, err := p.Info()
		st, serr := p.Stats()
		p.Close()
		if err != nil || serr != nil {
			continue
		}
		s := progSnap{name: info.Name, typ: info.Type.String()}
		// The kernel keeps 15 characters of a name; BTF has it whole.
		if fi, err := info.FuncInfos(); err == nil && len(fi) > 0 && fi[0].Func != nil {
			s.name = fi[0].Func.Name
		}
		s.runs, s.rt = st.RunCount, st.Runtime
		out[id] = s
	}
}

// MeasureHooks runs the loopback 100-byte loop under each BPF tool with
// run-time statistics on, then a churn of short connections (self's load
// generator), then the loop through the 1 ms path, and attributes the run
// time of the programs the tool loaded. Under lattrace it also measures
// its programs on HTTP/2 in clear and its HTTP/2 framing programs on
// connections open before the daemon started (measureH2Resync).
func MeasureHooks(ctx context.Context, env *Env, self string, tools []Observer, d time.Duration, logf func(string, ...any)) ([]HookCost, error) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	// Both ends on one CPU: each program's own cost, without the cache
	// misses of a socket's state touched by two CPUs in turn (loopback's
	// receive runs on the sender's CPU), which the rate measurements
	// include.
	w := sockperfOn("loopback RR 100 B", 100, nil, 1, 1)
	run, closeFn, sc, err := w.open(ctx)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	// Without the lab the loop and churn still measure: each tool says
	// why its path phase is missing.
	pathRun, pathClose, _, pathOpenErr := sockperfOn("1 ms path RR 100 B", 100, oneMsPath(), 0, 1).open(ctx)
	if pathOpenErr != nil {
		pathOpenErr = fmt.Errorf("the 1 ms path: %w", pathOpenErr)
		logf("%v", pathOpenErr)
	} else {
		defer pathClose()
	}
	h2, h2OpenErr := startHTTP2(ctx)
	if h2OpenErr != nil {
		logf("the HTTP/2 phase: %v", h2OpenErr)
	} else {
		defer h2.close()
	}
	var out []HookCost
	for _, tool := range tools {
		if err := os.MkdirAll(env.Dir, 0o700); err != nil {
			return nil, err
		}
		before, err := progSnapshot()
		if err != nil {
			return nil, err
		}
		// The adopted-HTTP/2 phase's connections open before the
		// daemon starts.
		var adopted *rrConns
		var adoptedErr error
		if tool.Name == "lattrace" {
			if adopted, adoptedErr = adoptedConns(); adoptedErr != nil {
				adoptedErr = fmt.Errorf("connections open before the daemon: %w", adoptedErr)
			}
		}
		stop, err := tool.Start(ctx, env, sc)
		if err != nil {
			if adopted != nil {
				adopted.close()
			}
			return nil, fmt.Errorf("%s: %w", tool.Name, err)
		}
		loop := measurePhase(func() (uint64, error) { r, err := run(ctx, d); return r.RoundTrips, err })
		var churn, path, http2 phase
		if loop.err == nil && tool.Name == "lattrace" {
			if h2OpenErr != nil {
				http2.err = h2OpenErr
			} else {
				http2 = measurePhase(func() (uint64, error) { return h2.calls(ctx, d) })
			}
		}
		var resync *H2ResyncCost
		var resyncErr error
		if loop.err == nil && tool.Name == "lattrace" {
			if adoptedErr != nil {
				resyncErr = adoptedErr
			} else {
				resync, resyncErr = measureH2Resync(ctx, adopted, env.Dir, BenchPinPath, d)
			}
		}
		if adopted != nil {
			adopted.close()
		}
		if loop.err == nil {
			churn = measurePhase(func() (uint64, error) { r, err := churnFor(ctx, self, d); return r.RoundTrips, err })
			if pathOpenErr != nil {
				path.err = pathOpenErr
			} else {
				path = measurePhase(func() (uint64, error) { r, err := pathRun(ctx, d); return r.RoundTrips, err })
			}
		}
		_, stopErr := stop()
		if err := errors.Join(loop.err, stopErr); err != nil {
			return nil, fmt.Errorf("%s: %w", tool.Name, err)
		}
		h := HookCost{Tool: tool.Name, RoundTrips: loop.n}
		h.Programs, h.NsPerRoundTrip = loop.costs(before)
		if len(h.Programs) == 0 {
			return nil, fmt.Errorf("%s: no program of its ran during the loop", tool.Name)
		}
		if churn.err != nil {
			h.ChurnError = churn.err.Error()
			logf("%-16s %v", tool.Name, churn.err)
		} else {
			h.Connections = churn.n
			h.Churn, _ = churn.costs(before)
		}
		if path.err != nil {
			h.PathError = path.err.Error()
			if pathOpenErr == nil {
				logf("%-16s through the 1 ms path: %v", tool.Name, path.err)
			}
		} else {
			h.PathRoundTrips = path.n
			h.Path, h.PathNsPerRoundTrip = path.costs(before)
		}
		switch {
		case http2.err != nil:
			h.HTTP2Error = http2.err.Error()
			logf("%-16s HTTP/2: %v", tool.Name, http2.err)
		case http2.n > 0:
			h.HTTP2Calls = http2.n
			h.HTTP2, h.HTTP2NsPerCall = http2.costs(before)
			for _, p := range h.HTTP2 {
				logf("%-16s %-28s %10d runs %7.0f ns/run %5.2f runs/call (HTTP/2)", tool.Name, p.Name, p.Runs, p.Ns, p.PerRoundTrip)
			}
			logf("%-16s %.0f ns per HTTP/2 call, %.0f ns per stream exchange", tool.Name, h.HTTP2NsPerCall, h.HTTP2NsPerExchange())
		}
		h.H2Resync = resync
		if resyncErr != nil {
			h.H2ResyncError = resyncErr.Error()
			logf("%-16s HTTP/2 framing looked for on connections open before it: %v", tool.Name, resyncErr)
		}
		if r := resync; r != nil {
			for _, x := range []struct {
				kind string
				w    H2Window
			}{{"open before, first writes", r.Adopted.First}, {"open before, after", r.Adopted.After},
				{"seen from start, first writes", r.FromStart.First}, {"seen from start, after", r.FromStart.After}} {
				for _, p := range x.w.Programs {
					logf("%-16s %-28s %10d runs %7.0f ns/run %5.2f runs/write (%s)", tool.Name, p.Name, p.Runs, p.Ns, p.PerRoundTrip, x.kind)
				}
				logf("%-16s %.0f ns per write over %d writes (%s)", tool.Name, x.w.NsPerWrite, x.w.Writes, x.kind)
			}
			logf("%-16s HTTP/2 framing looked for on a connection open before it: %+.0f ns per write over its first %d, %+.0f after (%d ends adopted as servers, %d as clients, %d guessed; %.0f runs/s idle)",
				tool.Name, r.FirstExtra(), r.FirstWrites, r.AfterExtra(), r.AdoptedServer, r.AdoptedClient, r.AdoptedGuessed, r.IdleRunsPerSec)
		}
		for _, p := range h.Programs {
			logf("%-16s %-28s %10d runs %7.0f ns/run %5.2f runs/round trip", tool.Name, p.Name, p.Runs, p.Ns, p.PerRoundTrip)
		}
		logf("%-16s %.0f ns per round trip, %.0f ns per exchange", tool.Name, h.NsPerRoundTrip, h.NsPerExchange())
		for _, p := range h.Churn {
			logf("%-16s %-28s %10d runs %7.0f ns/run %5.2f runs/connection (churn of %d connections)", tool.Name, p.Name, p.Runs, p.Ns, p.PerRoundTrip, churn.n)
		}
		for _, p := range h.Path {
			logf("%-16s %-28s %10d runs %7.0f ns/run %5.2f runs/round trip (1 ms path)", tool.Name, p.Name, p.Runs, p.Ns, p.PerRoundTrip)
		}
		if h.Path != nil {
			logf("%-16s %.0f ns per round trip, %.0f ns per exchange through the 1 ms path", tool.Name, h.PathNsPerRoundTrip, h.PathNsPerExchange())
		}
		out = append(out, h)
	}
	return out, nil
}

// phase is one workload run under a tool: the programs' statistics
// before and after it, and the round trips (or connections) it made.
type phase struct {
	from, to map[ebpf.ProgramID]progSnap
	n        uint64
	err      error
}

func measurePhase(run func() (uint64, error)) phase {
	var p phase
	if p.from, p.err = progSnapshot(); p.err != nil {
		return p
	}
	if p.n, p.err = run(); p.err != nil {
		return p
	}
	p.to, p.err = progSnapshot()
	return p
}

// costs is what the programs loaded after before cost in the phase.
func (p phase) costs(before map[ebpf.ProgramID]progSnap) ([]ProgCost, float64) {
	return progCosts(before, p.from, p.to, p.n)
}

// churnConns is how many workers of the churn phase connect at once.
const churnConns = 2

// churnFor opens, uses once and closes connections for d, on the CPU the
// loop ran on: both phases measure programs without a socket's state
// moving between CPUs.
func churnFor(ctx context.Context, self string, d time.Duration) (LoadResult, error) {
	cpu := 1 // the loop's (sockperfOn in MeasureHooks)
	lg, err := StartLoad(self, LoadConfig{Mode: "churn", Conns: churnConns, Duration: d, Size: 100, CPU: &cpu}, "")
	if err != nil {
		return LoadResult{}, fmt.Errorf("churn: %w", err)
	}
	r, err := lg.Result(ctx)
	if cerr := lg.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil && r.RoundTrips == 0 {
		err = errors.New("no connection made its round trip")
	}
	if err != nil {
		return r, fmt.Errorf("churn: %w", err)
	}
	return r, nil
}

// progCosts is what the programs loaded after before cost between the
// snapshots from and to, over n round trips: each program's runs and ns a
// run, heaviest per round trip first, and their ns per round trip summed.
func progCosts(before, from, to map[ebpf.ProgramID]progSnap, n uint64) ([]ProgCost, float64) {
	var out []ProgCost
	var total float64
	if n == 0 {
		return nil, 0
	}
	for id, e := range to {
		if _, old := before[id]; old {
			continue
		}
		s := from[id]
		runs := e.runs - s.runs
		if runs == 0 {
			continue
		}
		ns := float64(e.rt-s.rt) / float64(runs)
		out = append(out, ProgCost{Name: e.name, Type: e.typ, Runs: runs, Ns: ns, PerRoundTrip: float64(runs) / float64(n)})
		total += float64(e.rt-s.rt) / float64(n)
	}
	slices.SortFunc(out, func(a, b ProgCost) int { return cmp.Compare(b.Ns*b.PerRoundTrip, a.Ns*a.PerRoundTrip) })
	return out, total
}
