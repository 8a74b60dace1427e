package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

// Workload is traffic whose rate the observers may slow down.
type Workload struct {
	Name string
	Unit string // of Run's result
	// open starts what stays up across runs (servers, a lab) and returns
	// the run function, the teardown and where the traffic flows.
	open func(ctx context.Context) (run func(ctx context.Context, d time.Duration) (Run, error), close func(), sc Scope, err error)
}

// Run is one measurement of a workload.
type Run struct {
	Rate float64 // in the workload's unit
	// RoundTrips is how many request/response round trips the whole run
	// made, warm-up included (0 for a stream): what the BPF programs saw.
	RoundTrips uint64
	// P50 is the median round trip in µs (0 for a stream). Unlike the
	// rate, a mean, it is not moved by the few round trips a scheduling
	// hiccup stretches, so it resolves a small added cost.
	P50 float64
}

// sockperfRR is a TCP_RR-style loop: sockperf ping-pong, one connection,
// one message of size bytes each way at a time. The rate is round trips
// per second over sockperf's measured duration (its warm-up excluded).
func sockperfRR(name string, size int, lab *netlab.Config) Workload {
	return sockperfOn(name, size, lab, 0, 1)
}

// sockperfOn is sockperfRR with the server on CPU serverCPU and the client
// on clientCPU.
func sockperfOn(name string, size int, lab *netlab.Config, serverCPU, clientCPU int) Workload {
	w := Workload{Name: name, Unit: "round trips/s"}
	w.open = func(ctx context.Context) (func(context.Context, time.Duration) (Run, error), func(), Scope, error) {
		server, client := pinned(serverCPU), pinned(clientCPU)
		sc := Scope{Iface: "lo"}
		addr := "127.0.0.1"
		var l *netlab.Lab
		if lab != nil {
			var err error
			if l, err = netlab.New(*lab); err != nil {
				return nil, nil, sc, err
			}
			sc = Scope{Netns: l.A.Netns, Iface: l.A.Ifname}
			addr = l.B.IPv4.String()
			server = append(server, "ip", "netns", "exec", l.B.Netns)
			client = append(client, "ip", "netns", "exec", l.A.Netns)
		}
		port := "11111"
		srv, err := startWaiting(append(server, "sockperf", "sr", "--tcp", "-i", addr, "-p", port), "to block on socket")
		if err != nil {
			l.Close()
			return nil, nil, sc, err
		}
		closeFn := func() {
			_, _ = srv.stop(syscall.SIGTERM)
			l.Close()
		}
		run := func(ctx context.Context, d time.Duration) (Run, error) {
			secs := strconv.Itoa(max(1, int(d.Round(time.Second).Seconds())))
			argv := append(client, "sockperf", "pp", "--tcp", "--full-rtt", "-i", addr, "-p", port, "-m", strconv.Itoa(size), "-t", secs)
			out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
			if err != nil {
				return Run{}, fmt.Errorf("sockperf: %v: %s", err, lastLine(string(out), ""))
			}
			return parseSockperf(string(out))
		}
		return run, closeFn, sc, nil
	}
	return w
}

var (
	sockperfP50   = regexp.MustCompile(`percentile 50\.000 =\s*([0-9.]+)`)
	sockperfValid = regexp.MustCompile(`\[Valid Duration\] RunTime=([0-9.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)`)
	sockperfTotal = regexp.MustCompile(`\[Total Run\] RunTime=[0-9.]+ sec; Warm up time=\d+ msec; SentMessages=(\d+); ReceivedMessages=(\d+)`)
)

// parseSockperf reads a ping-pong run's summary.
func parseSockperf(out string) (Run, error) {
	m := sockperfValid.FindStringSubmatch(out)
	t := sockperfTotal.FindStringSubmatch(out)
	if m == nil || t == nil {
		return Run{}, fmt.Errorf("sockperf printed no summary: %s", lastLine(out, ""))
	}
	secs, _ := strconv.ParseFloat(m[1], 64)
	recv, _ := strconv.ParseFloat(m[3], 64)
	total, _ := strconv.ParseUint(t[2], 10, 64)
	if secs <= 0 || recv == 0 {
		return Run{}, fmt.Errorf("sockperf measured nothing: %s", m[0])
	}
	r := Run{Rate: recv / secs, RoundTrips: total}
	if p := sockperfP50.FindStringSubmatch(out); p != nil {
		r.P50, _ = strconv.ParseFloat(p[1], 64)
	}
	return r, nil
}

// iperfStream is a bulk TCP stream on loopback: iperf3, one connection,
// the receiver's goodput.
func iperfStream() Workload {
	w := Workload{Name: "loopback bulk stream", Unit: "Gbit/s"}
	w.open = func(ctx context.Context) (func(context.Context, time.Duration) (Run, error), func(), Scope, error) {
		sc := Scope{Iface: "lo"}
		port := "5211"
		srv, err := startWaiting(append(pinned(0), "iperf3", "-s", "-B", "127.0.0.1", "-p", port), "Server listening")
		if err != nil {
			return nil, nil, sc, err
		}
		run := func(ctx context.Context, d time.Duration) (Run, error) {
			secs := strconv.Itoa(max(1, int(d.Round(time.Second).Seconds())))
			argv := append(pinned(1), "iperf3", "-c", "127.0.0.1", "-p", port, "-t", secs, "-J")
			out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
			if err != nil {
				return Run{}, fmt.Errorf("iperf3: %v: %s", err, out)
			}
			return parseIperf(out)
		}
		return run, func() { _, _ = srv.stop(syscall.SIGTERM) }, sc, nil
	}
	return w
}

func parseIperf(out []byte) (Run, error) {
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return Run{}, fmt.Errorf("iperf3 output: %w", err)
	}
	if r.Error != "" {
		return Run{}, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.End.SumReceived.BitsPerSecond <= 0 {
		return Run{}, errors.New("iperf3 measured nothing")
	}
	return Run{Rate: r.End.SumReceived.BitsPerSecond / 1e9}, nil
}

// Workloads are the request/response loops and the stream of the cost
// section.
func Workloads() []Workload {
	oneMs := oneMsPath()
	return []Workload{
		sockperfRR("loopback RR 100 B", 100, nil),
		sockperfRR("loopback RR 1 KB", 1024, nil),
		sockperfRR("1 ms path RR 100 B", 100, oneMs),
		sockperfRR("1 ms path RR 1 KB", 1024, oneMs),
		iperfStream(),
	}
}

// oneMsPath is the lab path of the "1 ms path" workloads: 500 µs each way.
func oneMsPath() *netlab.Config {
	l := netlab.Link{Delay: 500 * time.Microsecond}
	return &netlab.Config{AtoB: l, BtoA: l}
}

// Result is one workload measured under every observer.
type Result struct {
	Workload string `json:"workload"`
	Unit     string `json:"unit"`
	// Rates[observer][rep] in Unit, one per round; Rates[Baseline] has
	// every untraced run (in runs from before Base, one per round).
	Rates map[string][]float64 `json:"rates"`
	// P50s[observer][i] are the median round trips in µs (request/
	// response loops only), each beside BaseP50s[observer][i].
	P50s map[string][]float64 `json:"p50s,omitempty"`
	// Base[observer][rep] is the mean rate of the untraced runs made right
	// before and after the observer's in round rep, and BaseP50s their
	// mean median round trip: each observer is judged against its own
	// baseline (see Measure). Absent in
	// runs from before the pairing, where Rates[Baseline] is the one
	// baseline of each round.
	Base     map[string][]float64 `json:"base,omitempty"`
	BaseP50s map[string][]float64 `json:"base_p50s,omitempty"`
	// Evidence is what each observer said it saw in its last run.
	Evidence map[string]string `json:"evidence"`
	// Failed says why an observer's run failed (it could not start, or
	// said so when stopped): it is measured no further on the workload,
	// and its row says so, while the others go on.
	Failed map[string]string `json:"failed,omitempty"`
}

// Ratio is an observer's rate over its baseline's, paired by round.
func (r Result) Ratio(observer string) Spread {
	return SpreadOf(r.relative(observer))
}

// relative is an observer's rate over its baseline's, round by round.
func (r Result) relative(observer string) []float64 {
	base := r.Base[observer]
	if len(base) == 0 {
		base = r.Rates[Baseline]
	}
	return Ratios(r.Rates[observer], base)
}

// Added is the median round trip an observer adds, in µs, paired by round
// with its baseline's (ok false without medians).
func (r Result) Added(observer string) (Spread, bool) {
	d := r.added(observer)
	return SpreadOf(d), len(d) > 0
}

// added is the µs an observer added to the median round trip, round by
// round.
func (r Result) added(observer string) []float64 {
	base, obs := r.baseP50s(observer), r.P50s[observer]
	n := min(len(base), len(obs))
	d := make([]float64, n)
	for i := range n {
		d[i] = obs[i] - base[i]
	}
	return d
}

// baseP50s are the median round trips of the untraced runs an observer is
// compared with, round by round.
func (r Result) baseP50s(observer string) []float64 {
	if len(r.Base[observer]) == 0 {
		return r.P50s[Baseline] // a run from before the pairing
	}
	return r.BaseP50s[observer]
}

// RunOptions size a measurement.
type RunOptions struct {
	Reps     int
	Duration time.Duration
	// Settle is the pause after an observer started, before measuring.
	Settle time.Duration
	Log    func(format string, args ...any)
}

// Measure runs w under each observer, reps times, interleaved: each round
// runs every observer once, in an order rotated from the last round's,
// between two untraced runs (untraced, A, untraced, B, untraced, ...), and
// an observer is compared with the mean of the two runs beside it. On this
// VM the rate of a loop jumps between levels a third apart as the host
// moves the vCPUs, and holds one for ten seconds or so: a round of every
// observer spans several jumps, the runs beside one seldom do, and a jump
// on one side of it counts half.
func Measure(ctx context.Context, env *Env, w Workload, observers []Observer, o RunOptions) (Result, error) {
	res := Result{Workload: w.Name, Unit: w.Unit, Rates: map[string][]float64{}, P50s: map[string][]float64{},
		Base: map[string][]float64{}, BaseP50s: map[string][]float64{}, Evidence: map[string]string{}, Failed: map[string]string{}}
	run, closeFn, sc, err := w.open(ctx)
	if err != nil {
		return res, fmt.Errorf("%s: %w", w.Name, err)
	}
	defer closeFn()
	// One untimed run: the first connection of a workload pays for cold
	// caches and the lab's first ARP-free path setup.
	if _, err := run(ctx, time.Second); err != nil {
		return res, fmt.Errorf("%s: warm-up: %w", w.Name, err)
	}
	measure := func(ob Observer, rep int) (Run, error) {
		if err := os.RemoveAll(env.Dir); err != nil {
			return Run{}, err
		}
		if err := os.MkdirAll(env.Dir, 0o700); err != nil {
			return Run{}, err
		}
		stop, err := ob.Start(ctx, env, sc)
		if err != nil {
			return Run{}, fmt.Errorf("%s under %s: %w", w.Name, ob.Name, err)
		}
		if err := workload.SleepCtx(ctx, o.Settle); err != nil {
			_, _ = stop()
			return Run{}, err
		}
		r, runErr := run(ctx, o.Duration)
		evidence, stopErr := stop()
		if err := errors.Join(runErr, stopErr); err != nil {
			return Run{}, fmt.Errorf("%s under %s: %w", w.Name, ob.Name, err)
		}
		res.Rates[ob.Name] = append(res.Rates[ob.Name], r.Rate)
		res.Evidence[ob.Name] = evidence
		if o.Log != nil {
			o.Log("%-22s %-16s rep %d: %10.2f %s  (%s)", w.Name, ob.Name, rep+1, r.Rate, w.Unit, evidence)
		}
		return r, nil
	}
	var untraced Observer
	var others []Observer
	for _, ob := range observers {
		if ob.Name == Baseline {
			untraced = ob
		} else {
			others = append(others, ob)
		}
	}
	if untraced.Name == "" {
		return res, fmt.Errorf("%s: no %s observer to compare with", w.Name, Baseline)
	}
	for rep := range o.Reps {
		before, err := measure(untraced, rep)
		if err != nil {
			return res, err
		}
		for _, ob := range Rotate(others, rep) {
			if _, failed := res.Failed[ob.Name]; failed {
				continue
			}
			r, err := measure(ob, rep)
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			if err != nil {
				// One tool that fails (a limit it cannot raise, a
				// crash) loses its own row, not the workload's.
				res.Failed[ob.Name] = err.Error()
				if o.Log != nil {
					o.Log("%-22s %-16s failed, measured no further on this workload: %v", w.Name, ob.Name, err)
				}
				continue
			}
			after, err := measure(untraced, rep)
			if err != nil {
				return res, err
			}
			res.Base[ob.Name] = append(res.Base[ob.Name], (before.Rate+after.Rate)/2)
			// Medians go in pairs or not at all, so that round i of an
			// observer's stays beside round i of its baseline's.
			if r.P50 > 0 && before.P50 > 0 && after.P50 > 0 {
				res.P50s[ob.Name] = append(res.P50s[ob.Name], r.P50)
				res.BaseP50s[ob.Name] = append(res.BaseP50s[ob.Name], (before.P50+after.P50)/2)
				res.P50s[Baseline] = append(res.P50s[Baseline], before.P50)
			}
			before = after
		}
	}
	return res, nil
}

// pinned prefixes a command with taskset for one CPU: the server of a
// request/response loop runs on CPU 0 and its client on CPU 1, as
// netperf -T does. Left to the scheduler, the two land on the same CPU in
// some runs and not in others, and the rate swings by half between runs.
func pinned(cpu int) []string {
	if runtime.NumCPU() < 2 {
		return nil
	}
	return []string{"taskset", "-c", strconv.Itoa(cpu)}
}
