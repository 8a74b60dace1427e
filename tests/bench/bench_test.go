package bench

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStats(t *testing.T) {
	if m := Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median of 3,1,2 = %v", m)
	}
	if m := Median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median of 4,1,2,3 = %v", m)
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("median of nothing is a number")
	}
	if q := Quantile([]float64{0, 10}, 0.25); q != 2.5 {
		t.Errorf("quantile 0.25 of 0,10 = %v", q)
	}
	r := Ratios([]float64{90, 45, 30}, []float64{100, 50, 0})
	if len(r) != 2 || r[0] != 0.9 || r[1] != 0.9 {
		t.Errorf("ratios %v: want the pairs of the same repetition, a zero baseline skipped", r)
	}
	s := SpreadOf([]float64{5, 1, 3, 2, 4})
	if s.N != 5 || s.Median != 3 || s.Min != 1 || s.Max != 5 || s.Q1 != 2 || s.Q3 != 4 {
		t.Errorf("spread %+v", s)
	}
	if got := Rotate([]int{1, 2, 3}, 4); got[0] != 2 || got[1] != 3 || got[2] != 1 {
		t.Errorf("rotate by 4: %v", got)
	}
}

// A ping-pong run as sockperf 3.7 prints it.
const sockperfOut = `sockperf: == version #3.7-no.git ==
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)
[ 0] IP = 127.0.0.1       PORT = 11111 # TCP
sockperf: Warmup stage (sending a few dummy messages)...
sockperf: Starting test...
sockperf: Test end (interrupted by timer)
sockperf: Test ended
sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=111889; ReceivedMessages=111888
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=1.545 sec; SentMessages=89873; ReceivedMessages=89873
sockperf: ====> avg-latency=8.564 (std-dev=63.268)
`

func TestParsers(t *testing.T) {
	r, err := parseSockperf(sockperfOut)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.Rate-89873/1.545) > 1e-6 || r.RoundTrips != 111888 {
		t.Errorf("sockperf: %+v", r)
	}
	if _, err := parseSockperf("sockperf: ERROR: connect failed"); err == nil {
		t.Error("sockperf output without a summary was taken")
	}
	r, err = parseIperf([]byte(`{"end":{"sum_received":{"bits_per_second":2.5e10}}}`))
	if err != nil || r.Rate != 25 {
		t.Errorf("iperf3: %+v %v", r, err)
	}
	if _, err := parseIperf([]byte(`{"error":"unable to connect to server"}`)); err == nil || !strings.Contains(err.Error(), "unable to connect") {
		t.Errorf("iperf3 error: %v", err)
	}
	m, err := parseMetrics(strings.NewReader(`# TYPE lattrace_records_decoded_total counter
lattrace_records_decoded_total 42
# TYPE lattrace_flows gauge
lattrace_flows{state="open"} 3
lattrace_flows{state="closed"} 2
# TYPE lattrace_exchange_duration_seconds histogram
lattrace_exchange_duration_seconds_bucket{le="+Inf"} 7
lattrace_exchange_duration_seconds_sum 0.5
lattrace_exchange_duration_seconds_count 7
`))
	if err != nil {
		t.Fatal(err)
	}
	if m["lattrace_records_decoded_total"] != 42 || m["lattrace_flows"] != 5 || m["lattrace_exchange_duration_seconds_count"] != 7 {
		t.Errorf("metrics %v", m)
	}
}

func TestKmallocSize(t *testing.T) {
	for n, want := range map[uint64]uint64{1: 8, 65: 96, 97: 128, 129: 192, 193: 256, 600: 1024, 1024: 1024} {
		if got := kmallocSize(n); got != want {
			t.Errorf("kmallocSize(%d) = %d, want %d", n, got, want)
		}
	}
}

// sample is a run's results as the report sees them.
func sample() *Results {
	res := &Results{Started: time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC), Machine: Machine{Kernel: "6.18", CPUs: 2}}
	res.Finished = res.Started.Add(30 * time.Minute)
	res.Options.Reps, res.Options.Duration = 3, 5*time.Second
	for _, o := range Observers() {
		res.Observers = append(res.Observers, ObserverInfo{Name: o.Name, What: o.What})
	}
	rates := func(base, frac float64) []float64 {
		return []float64{base * frac, base * frac * 1.01, base * frac * 0.99}
	}
	for _, w := range []string{"loopback RR 100 B", "1 ms path RR 100 B", "1 ms path RR 1 KB", "loopback bulk stream"} {
		r := Result{Workload: w, Unit: "round trips/s", Rates: map[string][]float64{}, P50s: map[string][]float64{}, Evidence: map[string]string{}}
		for i, o := range res.Observers {
			r.Rates[o.Name] = rates(1000, 1-0.005*float64(i))
			r.P50s[o.Name] = []float64{1000 + 5*float64(i), 1000 + 5*float64(i), 1000 + 5*float64(i)}
			r.Evidence[o.Name] = "seen"
		}
		r.Rates["untraced"] = rates(1000, 1)
		res.RR = append(res.RR, r)
	}
	res.Hooks = []HookCost{{Tool: "lattrace", RoundTrips: 1000, NsPerRoundTrip: 800,
		Programs: []ProgCost{{Name: "lattrace_probe", Type: "Tracing", Runs: 2000, Ns: 120, PerRoundTrip: 2}}}}
	h2w := func(writes uint64, egress, ingress float64) H2Window {
		return H2Window{Writes: writes, NsPerWrite: egress*1.5 + ingress,
			Programs: []ProgCost{{Name: "lattrace_h2_egress", Runs: writes * 3 / 2, Ns: egress, PerRoundTrip: 1.5},
				{Name: "lattrace_h2_ingress", Runs: writes, Ns: ingress, PerRoundTrip: 1}}}
	}
	res.Hooks[0].H2Resync = &H2ResyncCost{Conns: 200, FirstWrites: 20, AdoptedServer: 200, AdoptedClient: 200, IdleRunsPerSec: 12,
		Adopted:   H2Windows{First: h2w(4000, 100, 150), After: h2w(90000, 40, 50)},
		FromStart: H2Windows{First: h2w(4000, 60, 60), After: h2w(91000, 40, 48)}}
	round := func(cpu, measured float64, rss uint64, lost float64) RateCost {
		return RateCost{Config: "lattrace", Offered: 50000, Measured: measured, CPU: cpu, RSS: rss, Anon: rss / 4, Lost: lost}
	}
	res.Rates = combineRates([][]RateCost{nil, {round(2.5, 49000, 40<<20, 0), round(2.0, 49000, 41<<20, 1), round(3.1, 48000, 39<<20, 0)}})
	res.Flows = []FlowCost{{Conns: 1000, RSS: 30 << 20}, {Conns: 100000, RSS: 35 << 20,
		Maps: []MapMem{{Name: "socks", Type: "SkStorage", Bytes: 100 << 20}}}}
	res.Overload = &Overload{Conns: 4, RoundTrips: 10, Made: 36, Decoded: 30, Lost: 6, Alive: true}
	res.Accuracy = []Accuracy{{Scenario: "TestX", Quantity: "network", Unit: "ms", Truth: 20, Measured: 20.2, TruthFrom: "injected"}}
	return res
}

func TestTargets(t *testing.T) {
	res := sample()
	res.Hooks = append(res.Hooks, HookCost{Tool: EmptyProgram.Name,
		Programs: []ProgCost{{Name: "empty_probe", Runs: 2000, Ns: 60, PerRoundTrip: 2}},
		Path:     []ProgCost{{Name: "empty_probe", Runs: 2000, Ns: 120, PerRoundTrip: 2}}})
	res.Hooks[0].Path = []ProgCost{{Name: "lattrace_probe", Runs: 2000, Ns: 300, PerRoundTrip: 2}}
	res.Hooks[0].PathNsPerRoundTrip = 1800
	res.Flows[1].Flows = 200010
	res.Flows[1].Maps[0].PerSocket = 448
	got := map[string]string{}
	for _, tg := range Targets(res) {
		got[tg.Goal] = tg.Met
	}
	const (
		bpf      = "BPF time per exchange at most 500 ns in the loop and 1000 ns through the 1 ms path; no program of an event above 3x the empty program in the same phase"
		tcpdump  = "lattrace is not dearer than tcpdump -s 96: loopback RR 100 B, round by round"
		tracking = "every connection tracked: with 100k open, all listed and none evicted; daemon RSS at most 64 MiB and flat from 1k; at most 512 B of socket storage per traced socket"
		overload = "overload: every record decoded or counted lost, the daemon stays up"
	)
	for goal, want := range map[string]string{
		bpf: "yes", // 400 and 900 ns per exchange; 2x and 2.5x the empty program
		"the daemon uses at most 3 % of one core at 50k exchanges/s": "yes",
		tcpdump:  "yes",
		tracking: "yes",
		"lattrace costs at most 1 % of the untraced rate: 1 ms path RR 100 B (judged on the median round trip)": "yes",
		overload: "yes",
	} {
		if got[goal] != want {
			t.Errorf("%q: %q, want %q", goal, got[goal], want)
		}
	}
	if v := rateVerdict(Spread{Median: 0.5, Min: -5, Max: 6}, 1); !strings.HasPrefix(v, "within the noise") {
		t.Errorf("a 0.5 %% cost among rounds spread over 11 %%: %q", v)
	}
	// Each goal missed by one figure.
	for _, c := range []struct {
		goal   string
		change func(*Results)
	}{
		{overload, func(r *Results) { r.Overload.Lost = 5 }},
		{bpf, func(r *Results) { r.Hooks[0].NsPerRoundTrip = 1002 }},
		{bpf, func(r *Results) { r.Hooks[0].PathNsPerRoundTrip = 2002 }},
		{bpf, func(r *Results) { r.Hooks[0].Programs[0].Ns = 181 }},
		{bpf, func(r *Results) { r.Hooks[0].Path[0].Ns = 361 }},
		{tracking, func(r *Results) { r.Flows[1].Evicted = 1 }},
		{tracking, func(r *Results) { r.Flows[1].Flows = 2048 }},
		{tracking, func(r *Results) { r.Flows[1].Maps[0].PerSocket = 1216 }},
		{tracking, func(r *Results) { r.Flows[1].RSS = 65 << 20 }},
	} {
		r := sample()
		r.Hooks, r.Flows = res.Hooks, res.Flows
		r.Hooks = append([]HookCost(nil), res.Hooks...)
		r.Hooks[0].Programs = append([]ProgCost(nil), res.Hooks[0].Programs...)
		r.Hooks[0].Path = append([]ProgCost(nil), res.Hooks[0].Path...)
		r.Flows = append([]FlowCost(nil), res.Flows...)
		r.Flows[1].Maps = append([]MapMem(nil), res.Flows[1].Maps...)
		c.change(r)
		for _, tg := range Targets(r) {
			if tg.Goal == c.goal && tg.Met != "no" {
				t.Errorf("%q met with %s", tg.Goal, tg.Measured)
			}
		}
	}
	// Paired rounds: dearer than tcpdump in every round is a miss; dearer
	// in some and cheaper in others, with lattrace cheaper in fewer than
	// half, is not told apart.
	lat := res.RR[0].Rates["lattrace"] // loopback RR 100 B, judged on rates
	dump := func(ratios ...float64) []float64 {
		out := make([]float64, len(lat))
		for i := range lat {
			out[i] = lat[i] / ratios[i]
		}
		return out
	}
	for _, c := range []struct {
		ratios []float64 // lattrace's rate over tcpdump's, per round
		want   string
	}{
		{[]float64{0.98, 0.99, 0.97}, "no"},
		{[]float64{0.99, 0.995, 1.01}, "within the noise"},
		{[]float64{1.01, 0.99, 1.02}, "yes"},
	} {
		res.RR[0].Rates["tcpdump -s 96"] = dump(c.ratios...)
		for _, tg := range Targets(res) {
			if tg.Goal == tcpdump && tg.Met != c.want {
				t.Errorf("lattrace/tcpdump rates %v: %q (%s), want %q", c.ratios, tg.Met, tg.Measured, c.want)
			}
		}
	}
	for _, tg := range Targets(&Results{}) {
		if tg.Met != notMeasured {
			t.Errorf("a goal without data: %+v", tg)
		}
	}
}

// Each setting and rate's rounds become one row: the median CPU and rate,
// the highest RSS, every record lost; a rate never measured is no row.
func TestCombineRates(t *testing.T) {
	got := sample().Rates
	if len(got) != 1 {
		t.Fatalf("%d rows from one measured rate and one never measured: %+v", len(got), got)
	}
	r := got[0]
	if r.CPU != 2.5 || r.Measured != 49000 || r.RSS != 41<<20 || r.Anon != 10<<20 || r.Lost != 1 || len(r.CPUs) != 3 {
		t.Errorf("combined %+v", r)
	}
	if s := (RateCost{CPU: 4}).CPURange(); s != "" {
		t.Errorf("one round has a range: %q", s)
	}
	// Rows keep the order measured; a run stopped mid-round leaves a row
	// a round short, and says so; an even count's median is the middle
	// two's mean.
	at := func(rate, cpu float64) RateCost {
		return RateCost{Config: "x", Offered: rate, CPU: cpu, Measured: rate}
	}
	got = combineRates([][]RateCost{{at(1000, 1), at(1000, 3)}, {at(10000, 2), at(10000, 4), at(10000, 9)}})
	if len(got) != 2 || got[0].Offered != 1000 || got[1].Offered != 10000 {
		t.Fatalf("rows %+v", got)
	}
	if got[0].CPU != 2 || got[0].CPURange() != "2 rounds: 1.00 to 3.00" || got[1].CPU != 4 || got[1].CPURange() != "3 rounds: 2.00 to 9.00" {
		t.Errorf("medians %v %v, ranges %q %q", got[0].CPU, got[1].CPU, got[0].CPURange(), got[1].CPURange())
	}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	md := filepath.Join(dir, "BENCHMARKS.md")
	if err := WriteReport(sample(), md, filepath.Join(dir, "docs", "bench")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| lattrace | 995 | 0.5 (0.5 … 0.5) | 1005.0 | +5.0 (+5.0 … +5.0) | seen |", "![rate lost per observer and workload](docs/bench/rr-cost.png)",
		"lattrace_probe | Tracing | 120 | 2.00 | 240", "| 36 (10 round trips x 2 ends + 4 connections x 4) | 30 | 6 | true | true |",
		"| TestX | network | 20.00 ms | injected | 20.20 ms | +200 µs | 1.0 |",
		"| lattrace | 50000 | 49000 | 2.50 (3 rounds: 2.00 to 3.10) | 41.0 | 10.0 | 1 |", "is measured once in each round",
		// The adopted-HTTP/2 phase: 1.5 x 100 + 150 = 300 ns per write
		// first, 1.5 x 60 + 60 = 150 seen from the start.
		"**300 ns per write over its first 20 writes, 110 ns after** (seen from its start: 150 and 108): +3000 ns per connection in all.",
		"| each connection's first 20 writes (4000 and 4000) | 300 | 150 | +150 |", "| after (90000 and 91000 writes) | 110 | 108 | +2 |",
		"| open before | first 20 writes | lattrace_h2_egress | 100 | 1.50 | 150 |"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("report lacks %q; it says:\n%s", want, b)
		}
	}
	// A results.json from before the rounds: one measurement, no range,
	// no word of rounds.
	old := sample()
	old.Rates = []RateCost{{Config: "lattrace", Offered: 50000, Measured: 49000, CPU: 2.5, RSS: 40 << 20, Anon: 10 << 20}}
	if err := WriteReport(old, md, filepath.Join(dir, "docs", "bench")); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "| lattrace | 50000 | 49000 | 2.50 | 40.0 | 10.0 | 0 |") || strings.Contains(string(b), "in each round") {
		t.Errorf("a single measurement reported with rounds:\n%s", b)
	}
	// A phase that failed says why; results from before it say nothing
	// of it.
	failed := sample()
	failed.Hooks[0].H2Resync, failed.Hooks[0].H2ResyncError = nil, "lattrace_h2_egress not attached: no cgroup v2"
	if err := WriteReport(failed, md, filepath.Join(dir, "docs", "bench")); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(md); err != nil {
		t.Fatal(err)
	}
	if want := "Its phase of HTTP/2 framing looked for on connections open before it failed: `lattrace_h2_egress not attached: no cgroup v2`"; !strings.Contains(string(b), want) || strings.Contains(string(b), "ns per write over its first") {
		t.Errorf("report of a failed adopted-HTTP/2 phase lacks %q or shows figures:\n%s", want, b)
	}
	failed.Hooks[0].H2ResyncError = ""
	if err := WriteReport(failed, md, filepath.Join(dir, "docs", "bench")); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(md); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "connections open before it") || strings.Contains(string(b), "open before lattrace (not HTTP/2)") {
		t.Errorf("results without the adopted-HTTP/2 phase reported with it:\n%s", b)
	}
	for _, f := range []string{"rr-cost", "hooks", "daemon-cpu", "daemon-memory", "accuracy"} {
		png, err := os.ReadFile(filepath.Join(dir, "docs", "bench", f+".png"))
		if err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
			t.Errorf("%s.png: %v", f, err)
		}
	}
}

// A section that failed is measured again and merged in: its data and
// error are the later run's, and the report says when and at which
// revision it was measured.
func TestMergeRerun(t *testing.T) {
	res := sample()
	res.Accuracy = nil
	res.Errors = map[string]string{"accuracy": "the scenarios failed"}
	later := &Results{Started: res.Finished.Add(time.Hour), Machine: Machine{Revision: "abc1234"},
		Accuracy: []Accuracy{{Scenario: "TestY", Quantity: "peer", Unit: "ms", Truth: 5, Measured: 5.1, TruthFrom: "injected"}},
		RR:       []Result{{Workload: "not asked for"}}}
	res.Merge(later, []string{"accuracy"})
	if len(res.Accuracy) != 1 || res.Accuracy[0].Scenario != "TestY" || len(res.Errors) != 0 || len(res.RR) != 4 {
		t.Fatalf("merged: accuracy %+v, errors %v, %d rr workloads (want the later accuracy, no error, the run's own 4)", res.Accuracy, res.Errors, len(res.RR))
	}
	md := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := WriteReport(res, md, filepath.Join(filepath.Dir(md), "docs", "bench")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	if want := "- Section accuracy measured again on 2026-11-25 09:30 UTC, revision `abc1234`"; !strings.Contains(string(b), want) {
		t.Errorf("report lacks %q", want)
	}
	if strings.Contains(string(b), "Sections that failed") {
		t.Error("the report still lists the rerun section as failed")
	}
}

// TestPairedBaselines: with a baseline per observer, each observer is
// judged against its own (a jump of the machine's speed between pairs
// cancels), and comparisons between tools go through those ratios.
func TestPairedBaselines(t *testing.T) {
	r := Result{Workload: "loopback RR 100 B", Rates: map[string][]float64{
		// The machine ran at 100 in round 1 and 70 in round 2; the
		// one-per-round baseline would have caught either.
		Baseline:        {100, 70, 100, 70},
		"lattrace":      {90, 63},
		"tcpdump -s 96": {66.5, 95},
	}, Base: map[string][]float64{
		"lattrace":      {100, 70},
		"tcpdump -s 96": {70, 100},
	}, P50s: map[string][]float64{"lattrace": {11, 16}, "tcpdump -s 96": {15.5, 10.5}},
		BaseP50s: map[string][]float64{"lattrace": {10, 14}, "tcpdump -s 96": {14, 10}}}
	if s := r.Ratio("lattrace"); math.Abs(s.Min-0.9) > 1e-9 || math.Abs(s.Max-0.9) > 1e-9 {
		t.Errorf("lattrace at 90 %% of its own baseline in both rounds: %+v", s)
	}
	if s := r.Ratio("tcpdump -s 96"); math.Abs(s.Min-0.95) > 1e-9 || math.Abs(s.Max-0.95) > 1e-9 {
		t.Errorf("tcpdump at 95 %% of its own baseline in both rounds: %+v", s)
	}
	if a, ok := r.Added("lattrace"); !ok || a.Min != 1 || a.Max != 2 {
		t.Errorf("lattrace added 1 and 2 µs to its baselines' medians: %+v", a)
	}
	// Round by round, tcpdump's raw rate is the lower in round 1 and the
	// higher in round 2; against their own baselines lattrace is dearer
	// in both.
	if v, detail, ok := compareRounds(r, "tcpdump -s 96"); !ok || v != notCheaper {
		t.Errorf("lattrace 10 %% dearer than its baseline, tcpdump 5 %%: %q (%s)", v, detail)
	}
}

// TestWarmPrograms: a program is judged where it ran the most, so a
// connection program's few cold runs in the loop give way to the churn's.
func TestWarmPrograms(t *testing.T) {
	h := HookCost{Tool: "lattrace", Connections: 5000,
		Programs: []ProgCost{
			{Name: "lattrace_probe", Runs: 20000, Ns: 120, PerRoundTrip: 2},
			{Name: "lattrace_set_state", Runs: 6, Ns: 1100, PerRoundTrip: 0.0006},
		},
		Churn: []ProgCost{
			{Name: "lattrace_set_state", Runs: 40000, Ns: 140, PerRoundTrip: 8},
			{Name: "lattrace_probe", Runs: 10000, Ns: 300, PerRoundTrip: 2},
			{Name: "lattrace_sockops", Runs: 10000, Ns: 90, PerRoundTrip: 2},
		}}
	got := map[string]WarmProg{}
	for _, w := range h.Warm() {
		got[w.Name] = w
	}
	for name, want := range map[string]WarmProg{
		"lattrace_probe":     {ProgCost: h.Programs[0]},
		"lattrace_set_state": {ProgCost: h.Churn[0], Churn: true},
		"lattrace_sockops":   {ProgCost: h.Churn[2], Churn: true},
	} {
		if got[name] != want {
			t.Errorf("%s: %+v, want %+v", name, got[name], want)
		}
	}
	empty := HookCost{Tool: EmptyProgram.Name,
		Programs: []ProgCost{{Name: "empty_probe", Runs: 20000, Ns: 60, PerRoundTrip: 2}},
		Churn:    []ProgCost{{Name: "empty_probe", Runs: 20000, Ns: 70, PerRoundTrip: 2}}}
	if tg := bpfGoal(&Results{Hooks: []HookCost{h, empty}}); !strings.Contains(tg.Measured, "most against the empty program: lattrace_probe 120 ns in the loop, 2.0x") {
		t.Errorf("set_state at 140 ns warm (2x the empty program's 70 in the churn), 1100 ns over 6 cold runs: %q (%s)", tg.Met, tg.Measured)
	}
}

// TestPathPrograms: the programs of every message are judged through the
// path too, where they run cold, against the empty program there; a
// connection program's few runs there are not judged, a program that also
// runs for the relay's packet sockets is judged on its time per round trip
// over its runs in the loop, and the iterators are set aside.
func TestPathPrograms(t *testing.T) {
	empty := HookCost{Tool: EmptyProgram.Name,
		Programs: []ProgCost{{Name: "empty_probe", Runs: 20000, Ns: 60, PerRoundTrip: 2}},
		Path:     []ProgCost{{Name: "empty_probe", Runs: 8000, Ns: 110, PerRoundTrip: 2}}}
	h := HookCost{Tool: "lattrace", Connections: 5000,
		Programs: []ProgCost{
			{Name: "lattrace_probe", Runs: 20000, Ns: 120, PerRoundTrip: 2},
			{Name: "lattrace_send_length", Runs: 20000, Ns: 100, PerRoundTrip: 2},
			{Name: "lattrace_sweep", Runs: 20, Ns: 900, PerRoundTrip: 0.002},
		},
		Path: []ProgCost{
			{Name: "lattrace_set_state", Runs: 2, Ns: 1300, PerRoundTrip: 0.0005},
			{Name: "lattrace_probe", Runs: 8000, Ns: 190, PerRoundTrip: 2},
			// Twice the loop's runs: 100 ns on average, at most 200 a TCP run.
			{Name: "lattrace_send_length", Runs: 16000, Ns: 100, PerRoundTrip: 4},
		},
		NsPerRoundTrip: 390, PathRoundTrips: 4000, PathNsPerRoundTrip: 780}
	if r := (&Results{Hooks: []HookCost{empty, h}}).PathRatio(); r != 2 {
		t.Errorf("780 ns per round trip through the path, 390 in the loop: ratio %v, want 2", r)
	}
	goal := func(hs ...HookCost) Target { return bpfGoal(&Results{Hooks: hs}) }
	if tg := goal(empty, h); tg.Met != "yes" || !strings.Contains(tg.Measured, "loop 195 ns per exchange; 1 ms path 390 ns; most against the empty program: lattrace_probe 120 ns in the loop, 2.0x; iterators (a run walks every socket) aside: lattrace_sweep 900 ns") {
		t.Errorf("probe at twice the empty program, send_length at most 200 ns through the path (1.8x): %q (%s)", tg.Met, tg.Measured)
	}
	if tg := goal(h); tg.Met != notMeasured || !strings.Contains(tg.Measured, "no empty program measured") {
		t.Errorf("without the empty program: %q (%s)", tg.Met, tg.Measured)
	}
	h.Path[1].Ns = 600
	if tg := goal(empty, h); tg.Met != "no" || !strings.Contains(tg.Measured, "lattrace_probe 600 ns in the path, 5.5x") {
		t.Errorf("probe at 120 ns in the loop, 600 ns through the path: %q (%s)", tg.Met, tg.Measured)
	}
	h.Path, h.PathNsPerRoundTrip = nil, 0
	if tg := goal(empty, h); tg.Met != "not measured through the path (met in the loop)" || !strings.Contains(tg.Measured, "the 1 ms path phase measured nothing") {
		t.Errorf("no path phase: %q (%s)", tg.Met, tg.Measured)
	}
}

// TestDaemonWindow: the report states the CPU figures' resolution from the
// run's own window; runs from before it was recorded used 5 s.
func TestDaemonWindow(t *testing.T) {
	var old Results
	if w, s := old.DaemonWindow(), old.TickShare(); w != 5*time.Second || math.Abs(s-0.2) > 1e-9 {
		t.Errorf("results without a window: %v, %.3f %%", w, s)
	}
	quick := Results{}
	quick.Options.CPUWindow = 3 * time.Second
	if s := quick.TickShare(); math.Abs(s-1.0/3) > 1e-9 {
		t.Errorf("the quick run's 3 s window: a tick is %.3f %% of a core, want 0.333", s)
	}
	// A quick rates run merged into results from before the window was
	// recorded brings its window along.
	old.Merge(&quick, []string{"rates"})
	if w := old.DaemonWindow(); w != 3*time.Second {
		t.Errorf("merged rates: window %v, want 3s", w)
	}
}

// An observer that fails (bpftrace unable to lift RLIMIT_MEMLOCK, say)
// loses its own row; the others are measured in every round.
func TestMeasureObserverFails(t *testing.T) {
	w := Workload{Name: "fake", Unit: "round trips/s", open: func(context.Context) (func(context.Context, time.Duration) (Run, error), func(), Scope, error) {
		return func(context.Context, time.Duration) (Run, error) { return Run{Rate: 100, P50: 10}, nil }, func() {}, Scope{}, nil
	}}
	fails := 0
	observers := []Observer{
		{Name: Baseline, Start: startNothing},
		{Name: "fine", Start: startNothing},
		{Name: "broken", Start: func(context.Context, *Env, Scope) (func() (string, error), error) {
			fails++
			return nil, errors.New("couldn't set RLIMIT_MEMLOCK")
		}},
	}
	r, err := Measure(context.Background(), &Env{Dir: t.TempDir()}, w, observers, RunOptions{Reps: 3})
	if err != nil {
		t.Fatalf("the workload failed with its observer: %v", err)
	}
	if len(r.Rates["fine"]) != 3 || len(r.Rates["broken"]) != 0 || fails != 1 || !strings.Contains(r.Failed["broken"], "RLIMIT_MEMLOCK") {
		t.Errorf("rates %v, %d starts of the broken one, failed %v", r.Rates, fails, r.Failed)
	}
}
