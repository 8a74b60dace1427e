package bench

import (
	"fmt"
	"strings"
)

// Target is one of the goals of issues 9 and 29, judged on a run's results.
type Target struct {
	Goal     string
	Measured string
	// Met is "yes", "no", or "not measured" when the run lacks the data.
	Met string
}

const notMeasured = "not measured"

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// loss is the median share of the baseline's rate an observer cost, in %.
func (r Result) loss(observer string) (Spread, bool) {
	if len(r.Rates[observer]) == 0 {
		return Spread{}, false
	}
	s := r.Ratio(observer)
	return Spread{N: s.N, Median: 100 * (1 - s.Median), Min: 100 * (1 - s.Max), Max: 100 * (1 - s.Min),
		Q1: 100 * (1 - s.Q3), Q3: 100 * (1 - s.Q1)}, true
}

func (res *Results) rr(workload string) (Result, bool) {
	for _, r := range res.RR {
		if r.Workload == workload {
			return r, true
		}
	}
	return Result{}, false
}

func fmtLoss(s Spread) string {
	return fmt.Sprintf("%.1f %% (reps %.1f to %.1f)", s.Median, s.Min, s.Max)
}

// rateVerdict judges a cost in % against a goal of pct, saying so when
// the rounds scatter too widely for the goal to be told apart from noise.
func rateVerdict(s Spread, pct float64) string {
	if s.Median > pct {
		return "no"
	}
	if s.Max-s.Min > 2*pct {
		return fmt.Sprintf("within the noise (rounds spread over %.0f %%)", s.Max-s.Min)
	}
	return "yes"
}

// judgedByMedian are the workloads whose cost is judged on the median
// round trip added rather than on the rate: through the lab's relay the
// rate, a mean, swings by several % between rounds even for tools that do
// nothing there.
var judgedByMedian = map[string]bool{"1 ms path RR 100 B": true, "1 ms path RR 1 KB": true}

// Paired comparisons of lattrace with another tool, round by round.
const (
	cheaper    = "cheaper"
	notCheaper = "not cheaper"
	untold     = "not told apart"
)

// compareRounds judges lattrace against tool on one workload from their
// paired rounds: on the median round trip each added where the workload is
// judged so, else on their rates. Cheaper in most rounds is cheaper; dearer
// in three rounds of four or more is not; between, the rounds do not tell
// them apart.
func compareRounds(r Result, tool string) (verdict, detail string, ok bool) {
	if judgedByMedian[r.Workload] {
		a, b := r.added("lattrace"), r.added(tool)
		n := min(len(a), len(b))
		if n == 0 {
			return "", "", false
		}
		d := make([]float64, n) // µs lattrace added beyond tool, per round
		for i := range n {
			d[i] = a[i] - b[i]
		}
		s := SpreadOf(d)
		la, _ := r.Added("lattrace")
		lb, _ := r.Added(tool)
		detail = fmt.Sprintf("median round trip %+.1f vs %+.1f µs", la.Median, lb.Median)
		switch {
		case s.Median <= 0:
			return cheaper, detail, true
		case s.Q1 > 0:
			return notCheaper, detail, true
		}
		return untold, detail, true
	}
	l, ok1 := r.loss("lattrace")
	t, ok2 := r.loss(tool)
	if !ok1 || !ok2 {
		return "", "", false
	}
	// Rate of lattrace over the tool's, each relative to its baseline,
	// per round: above 1, lattrace cost less in that round.
	s := SpreadOf(Ratios(r.relative("lattrace"), r.relative(tool)))
	detail = fmt.Sprintf("%.1f vs %.1f %%", l.Median, t.Median)
	switch {
	case s.Median >= 1:
		return cheaper, detail, true
	case s.Q3 < 1:
		return notCheaper, detail, true
	}
	return untold, detail, true
}

// Targets judges every goal the run has data for: the four of issue 29
// (cost and scale), then those it kept of issue 9's.
func Targets(res *Results) []Target {
	out := []Target{bpfGoal(res), daemonGoal(res), tcpdumpGoal(res), trackingGoal(res)}
	// A workload in judgedByMedian is judged on the median round trip
	// lattrace adds: its rate would hide a 1 % cost either way.
	lossGoal := func(workload string, pct float64) {
		byMedian := judgedByMedian[workload]
		t := Target{Goal: fmt.Sprintf("lattrace costs at most %g %% of the untraced rate: %s", pct, workload), Met: notMeasured}
		if byMedian {
			t.Goal += " (judged on the median round trip)"
		}
		r, ok := res.rr(workload)
		if !ok {
			out = append(out, t)
			return
		}
		s, ok := r.loss("lattrace")
		if !ok {
			out = append(out, t)
			return
		}
		t.Measured, t.Met = "rate: "+fmtLoss(s), rateVerdict(s, pct)
		if a, ok := r.Added("lattrace"); ok {
			p := 100 * a.Median / Median(r.baseP50s("lattrace"))
			t.Measured += fmt.Sprintf("; median round trip %+.1f µs (%+.2f %%)", a.Median, p)
			if byMedian {
				t.Met = verdict(p <= pct)
			}
		}
		out = append(out, t)
	}
	lossGoal("1 ms path RR 100 B", 1)
	lossGoal("1 ms path RR 1 KB", 1)
	lossGoal("loopback bulk stream", 1)

	t := Target{Goal: "overload: every record decoded or counted lost, the daemon stays up", Met: notMeasured}
	if o := res.Overload; o != nil {
		t.Measured = fmt.Sprintf("%d made = %d decoded + %d lost: %v; alive: %v", o.Made, o.Decoded, o.Lost, o.Exact(), o.Alive)
		t.Met = verdict(o.Exact() && o.Alive && o.Lost > 0)
	}
	out = append(out, t)
	return out
}

// The BPF goal's bounds (issue 29).
const (
	loopNsGoal = 500  // ns of BPF per exchange in the loop
	pathNsGoal = 1000 // and through the 1 ms path
	emptyTimes = 3    // no program above this many times the empty one
)

// iterators are lattrace's programs that run per walk of every socket,
// not per event: no empty program on an event compares with a run of
// theirs.
var iterators = map[string]bool{"lattrace_sweep": true, "lattrace_inflight": true}

// bpfGoal judges lattrace's BPF time per exchange in the loop and through
// the 1 ms path, both ends' programs summed, and each program of an event
// against the empty program in the phase where it ran the most (the loop,
// the churn or the path).
func bpfGoal(res *Results) Target {
	t := Target{Goal: fmt.Sprintf("BPF time per exchange at most %d ns in the loop and %d ns through the 1 ms path; no program of an event above %dx the empty program in the same phase", loopNsGoal, pathNsGoal, emptyTimes), Met: notMeasured}
	h, ok := res.Hook("lattrace")
	if !ok {
		return t
	}
	met := h.NsPerExchange() <= loopNsGoal
	parts := []string{fmt.Sprintf("loop %.0f ns per exchange", h.NsPerExchange())}
	measured := true
	if h.PathNsPerRoundTrip > 0 {
		met = met && h.PathNsPerExchange() <= pathNsGoal
		parts = append(parts, fmt.Sprintf("1 ms path %.0f ns", h.PathNsPerExchange()))
	} else {
		parts = append(parts, "the 1 ms path phase measured nothing")
		measured = false
	}
	e, ok := res.Hook(EmptyProgram.Name)
	if !ok || len(e.Programs) == 0 {
		t.Measured = strings.Join(append(parts, "no empty program measured"), "; ")
		return t
	}
	type worst struct {
		name, phase string
		ns, ratio   float64
	}
	var w worst
	consider := func(name, phase string, ns, empty float64) {
		if empty > 0 && ns/empty > w.ratio {
			w = worst{name, phase, ns, ns / empty}
		}
	}
	var aside []string
	for _, p := range h.Warm() {
		if iterators[p.Name] {
			aside = append(aside, fmt.Sprintf("%s %.0f ns", p.Name, p.Ns))
			continue
		}
		switch {
		case !p.Churn:
			consider(p.Name, "loop", p.Ns, e.Programs[0].Ns)
		case len(e.Churn) > 0:
			consider(p.Name, "churn", p.Ns, e.Churn[0].Ns)
		}
	}
	if len(e.Path) > 0 {
		for _, p := range h.PathProgs() {
			if p.PerRoundTrip >= 1 && !iterators[p.Name] {
				consider(p.Name, "path", p.AtMost, e.Path[0].Ns)
			}
		}
	}
	if w.name != "" {
		parts = append(parts, fmt.Sprintf("most against the empty program: %s %.0f ns in the %s, %.1fx", w.name, w.ns, w.phase, w.ratio))
		met = met && w.ratio <= emptyTimes
	}
	if len(aside) > 0 {
		parts = append(parts, "iterators (a run walks every socket) aside: "+strings.Join(aside, ", "))
	}
	t.Measured = strings.Join(parts, "; ")
	switch {
	case !met:
		t.Met = "no"
	case measured:
		t.Met = "yes"
	default:
		t.Met = "not measured through the path (met in the loop)"
	}
	return t
}

// daemonGoal is the daemon's CPU at 50,000 exchanges/s.
func daemonGoal(res *Results) Target {
	t := Target{Goal: "the daemon uses at most 3 % of one core at 50k exchanges/s", Met: notMeasured}
	for _, r := range res.Rates {
		if r.Config == "lattrace" && r.Offered == 50000 {
			t.Measured = fmt.Sprintf("%.2f %% at %.0f exchanges/s counted", r.CPU, r.Measured)
			if s := r.CPURange(); s != "" {
				t.Measured += fmt.Sprintf(" (median of %s)", s)
			}
			t.Met = verdict(r.CPU <= 3)
		}
	}
	return t
}

// tcpdumpGoal: lattrace costs the loopback 100-byte loop's rate no more
// than tcpdump -s 96 does, judged round by round.
func tcpdumpGoal(res *Results) Target {
	const tool, workload = "tcpdump -s 96", "loopback RR 100 B"
	t := Target{Goal: fmt.Sprintf("lattrace is not dearer than %s: %s, round by round", tool, workload), Met: notMeasured}
	r, ok := res.rr(workload)
	if !ok {
		return t
	}
	v, detail, ok := compareRounds(r, tool)
	if !ok {
		return t
	}
	t.Measured = fmt.Sprintf("%s of the untraced rate (%s)", detail, v)
	switch v {
	case cheaper:
		t.Met = "yes"
	case notCheaper:
		t.Met = "no"
	default:
		t.Met = "within the noise"
	}
	return t
}

// socketStorageGoal is issue 29's bound on a traced socket's storage.
const socketStorageGoal = 512

// trackingGoal: with 100,000 connections open, every one is listed and
// none evicted, in bounded daemon memory and socket storage.
func trackingGoal(res *Results) Target {
	t := Target{Goal: fmt.Sprintf("every connection tracked: with 100k open, all listed and none evicted; daemon RSS at most 64 MiB and flat from 1k; at most %d B of socket storage per traced socket", socketStorageGoal), Met: notMeasured}
	n := len(res.Flows)
	if n == 0 {
		return t
	}
	first, last := res.Flows[0], res.Flows[n-1]
	// Both ends of every connection are on this node.
	listed := last.Flows >= float64(2*last.Conns) && last.Evicted == 0
	per := last.SocketStorage()
	t.Measured = fmt.Sprintf("%d connections: %.0f flows listed for %d sockets, %.0f evicted; RSS %.1f MiB (%.1f with %d connections); socket storage %d B per socket",
		last.Conns, last.Flows, 2*last.Conns, last.Evicted, mib(last.RSS), mib(first.RSS), first.Conns, per)
	if last.Conns >= 100000 && per > 0 {
		t.Met = verdict(listed && last.RSS <= 64<<20 && last.RSS <= first.RSS+first.RSS/2 && per <= socketStorageGoal)
	}
	return t
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
