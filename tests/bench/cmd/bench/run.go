package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lattrace/lattrace/tests/bench"
	"github.com/lattrace/lattrace/tests/otelcol"
	"golang.org/x/sys/unix"
)

var allSections = []string{"rr", "hooks", "rates", "flows", "overload", "accuracy"}

// plan is how much a run measures.
type plan struct {
	reps        int
	duration    time.Duration
	settle      time.Duration
	workloads   []string // names; empty = all
	observers   []string // names; empty = all
	hookTools   []string
	rates       []float64
	cpuWindow   time.Duration // the daemon's CPU is measured over one per round
	flows       []int
	overloadFor time.Duration
	accuracy    string // go test -run pattern over tests/scenarios
}

// accuracyScenarios are the lab scenarios that record accuracy rows.
const accuracyScenarios = `^(TestPathDelayAndThinkTime|TestLoss|TestBufferbloat|TestConnectionPerRequest|TestSlowReader|TestFamiliesAndResponder|TestDiagnoseWindowLimited|TestDiagnoseAppDominated|TestDiagnoseDirectionAsymmetry)$`

var full = plan{
	// Five rounds: every observer's run is followed by an untraced one,
	// so the request/response section takes about 35 minutes.
	reps: 5, duration: 4 * time.Second, settle: time.Second,
	hookTools:   []string{"lattrace", "bpftrace srtt", "tcplife", "tcpstates"},
	rates:       []float64{1000, 10000, 50000},
	cpuWindow:   5 * time.Second,
	flows:       []int{1000, 10000, 100000},
	overloadFor: 5 * time.Second,
	accuracy:    accuracyScenarios,
}

var quick = plan{
	reps: 3, duration: 2 * time.Second, settle: 500 * time.Millisecond,
	workloads:   []string{"loopback RR 100 B", "loopback bulk stream"},
	observers:   []string{"untraced", "lattrace", "tcpdump -s 96", "bpftrace srtt"},
	hookTools:   []string{"lattrace"},
	rates:       []float64{1000, 10000},
	cpuWindow:   3 * time.Second,
	flows:       []int{1000, 10000},
	overloadFor: 3 * time.Second,
	accuracy:    `^TestPathDelayAndThinkTime$`,
}

func run(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quickFlag := fs.Bool("quick", false, "a shorter run (under 5 minutes): fewer repetitions, workloads and tools")
	sections := fs.String("sections", strings.Join(allSections, ","), "sections to run: "+strings.Join(allSections, ","))
	lattrace := fs.String("lattrace", "bin/lattrace", "the lattrace binary")
	out := fs.String("out", "bench-out", "directory for results.json")
	md := fs.String("md", "", "write the report here (e.g. BENCHMARKS.md), with plots beside it in docs/bench/")
	report := fs.String("report", "", "only write the report (--md) from this results.json")
	reps := fs.Int("reps", 0, "rounds of the request/response and daemon CPU measurements (default: 5, quick 3)")
	merge := fs.String("merge", "", "a results.json whose --sections this run measures again: they replace its own, and the report says so")
	pgo := fs.String("pgo", "", "measure nothing: write a CPU profile of the daemon under the daemon cost workload to this file, for profile-guided optimisation (make pgo); of the other flags only --lattrace counts")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	if *report != "" {
		r, err := bench.LoadResults(*report)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		return writeReport(r, *md)
	}
	p := full
	if *quickFlag {
		p = quick
	}
	if *reps > 0 {
		p.reps = *reps
	}
	want := strings.Split(*sections, ",")
	for _, s := range want {
		if !slices.Contains(allSections, s) {
			fmt.Fprintf(os.Stderr, "bench: --sections: unknown section %q (want some of %s)\n", s, strings.Join(allSections, ","))
			return 2
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (BPF programs, network namespaces, cgroups)")
		return 1
	}
	bin, err := filepath.Abs(*lattrace)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if _, err := os.Stat(bin); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v (run make build first)\n", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	scratch, err := os.MkdirTemp("", "lattrace-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(scratch)
	colDir := filepath.Join(scratch, "collector")
	if err := os.MkdirAll(colDir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	col, err := otelcol.StartIn(colDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: starting the OpenTelemetry Collector:", err)
		return 1
	}
	defer col.Stop()
	env := &bench.Env{Lattrace: bin, Dir: filepath.Join(scratch, "run"), OTLP: col.GRPCEndpoint()}
	if *pgo != "" {
		return profile(ctx, env, self, *pgo, logf)
	}

	res := &bench.Results{Started: time.Now(), Quick: *quickFlag, Command: "make bench", Machine: machine(), Errors: map[string]string{}}
	if *quickFlag {
		res.Command = "make bench-quick"
	}
	res.Options.Reps, res.Options.Duration, res.Options.CPUWindow = p.reps, p.duration, p.cpuWindow
	observers := pick(bench.Observers(), p.observers)
	for _, o := range observers {
		res.Observers = append(res.Observers, bench.ObserverInfo{Name: o.Name, What: o.What})
	}
	// The BPF tools it runs (bpftrace, libbpf-tools) inherit the limit;
	// bpftrace raises it itself or fails where it cannot.
	if err := syscall.Setrlimit(unix.RLIMIT_MEMLOCK, &syscall.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}); err != nil {
		logf("cannot lift RLIMIT_MEMLOCK for the BPF tools (%v): a tool that needs it fails and loses its own rows", err)
	}
	awake, err := bench.KeepAwake()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: keeping the vCPUs awake:", err)
		return 1
	}
	defer func() {
		if err := awake.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
	}()
	res.Options.Awake = awake.Method
	logf("vCPUs kept awake by %s", awake.Method)
	var base *bench.Results
	if *merge != "" {
		// Rates measured beside busy loops and with idle polling differ
		// by more than any tool's cost: one report cannot hold both.
		// Checked before measuring, so a refusal costs no run.
		if base, err = bench.LoadResults(*merge); err != nil {
			fmt.Fprintln(os.Stderr, "bench: --merge:", err)
			return 1
		}
		if base.Quick != *quickFlag {
			// A quick run has fewer rounds, workloads, tools and
			// scenarios: merged, its sections would pass for whole ones.
			fmt.Fprintf(os.Stderr, "bench: --merge: %s is from a %s run, this one is %s: merge runs of one kind\n",
				*merge, runKind(base.Quick), runKind(*quickFlag))
			return 1
		}
		if bench.AwakeKind(base.Options.Awake) != bench.AwakeKind(awake.Method) {
			fmt.Fprintf(os.Stderr, "bench: --merge: %s kept the vCPUs awake by %s, this run would by %s: measure everything again instead\n",
				*merge, bench.AwakeKind(base.Options.Awake), bench.AwakeKind(awake.Method))
			return 1
		}
	}
	failed := func(section string, err error) {
		logf("%s: %v", section, err)
		res.Errors[section] = err.Error()
	}
	has := func(s string) bool { return slices.Contains(want, s) && ctx.Err() == nil }

	if has("rr") {
		for _, w := range bench.Workloads() {
			if len(p.workloads) > 0 && !slices.Contains(p.workloads, w.Name) {
				continue
			}
			r, err := bench.Measure(ctx, env, w, observers, bench.RunOptions{Reps: p.reps, Duration: p.duration, Settle: p.settle, Log: logf})
			if err != nil {
				failed("rr", err)
				break
			}
			res.RR = append(res.RR, r)
			for _, o := range observers[1:] {
				s := r.Ratio(o.Name)
				logf("%-22s %-16s %6.1f %% of untraced (reps %.1f..%.1f)", w.Name, o.Name, 100*s.Median, 100*s.Min, 100*s.Max)
			}
		}
	}
	if has("hooks") {
		h, err := bench.MeasureHooks(ctx, env, self, append([]bench.Observer{bench.EmptyProgram}, append(pick(bench.Observers(), p.hookTools), bench.LattraceNoLinks)...), p.duration, logf)
		if err != nil {
			failed("hooks", err)
		}
		res.Hooks = h
	}
	cc := bench.CostConfig{Self: self, Rates: p.rates, Rounds: p.reps, Flows: p.flows, Window: p.cpuWindow, Log: logf,
		Settings: []bench.DaemonSetting{{Name: "lattrace", OTLP: true}, {Name: "lattrace+jsonl", OTLP: true, JSONL: true}}}
	if *quickFlag {
		cc.Settings = cc.Settings[:1]
	}
	if has("rates") {
		r, err := bench.MeasureRates(ctx, env, cc)
		if err != nil {
			failed("rates", err)
		}
		res.Rates = r
	}
	if has("flows") {
		f, err := bench.MeasureFlows(ctx, env, cc)
		if err != nil {
			failed("flows", err)
		}
		res.Flows = f
	}
	if has("overload") {
		o, _, err := bench.MeasureOverload(ctx, env, self, 4, p.overloadFor)
		if err != nil {
			failed("overload", err)
		} else {
			res.Overload = &o
			logf("overload: %d records made, %d decoded, %d counted lost (exact: %v), daemon alive: %v", o.Made, o.Decoded, o.Lost, o.Exact(), o.Alive)
		}
	}
	// The scenarios time a lab path: the vCPUs idle as in make test.
	if err := awake.Stop(); err != nil {
		logf("%v", err)
	}
	if has("accuracy") {
		root, err := moduleRoot()
		if err == nil {
			res.Accuracy, err = bench.MeasureAccuracy(ctx, root, p.accuracy, logf)
		}
		if err != nil {
			failed("accuracy", err)
		}
	}
	res.Finished = time.Now()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	path := filepath.Join(*out, "results.json")
	if ctx.Err() != nil {
		// Its sections are cut short (and the later ones skipped): merged,
		// they would replace a base's whole ones, and a report would call
		// them measured. What was measured is kept for a look, unless
		// that would overwrite the base of a merge.
		if *merge != "" {
			fmt.Fprintf(os.Stderr, "bench: interrupted: nothing merged into %s, no report written\n", *merge)
			return 1
		}
		if err := res.Save(path); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		fmt.Fprintf(os.Stderr, "bench: interrupted: partial results in %s, no report written\n", path)
		return 1
	}
	if base != nil {
		base.Merge(res, want)
		res, path = base, *merge
	}
	if err := res.Save(path); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	logf("results in %s (%s)", path, res.Finished.Sub(res.Started).Round(time.Second))
	fmt.Print(bench.Summary(res))
	code := 0
	if len(res.Errors) > 0 {
		code = 1
	}
	if *md != "" {
		if c := writeReport(res, *md); c != 0 {
			code = c
		}
	}
	return code
}

func writeReport(r *bench.Results, md string) int {
	if md == "" {
		fmt.Fprintln(os.Stderr, "bench: --report needs --md")
		return 2
	}
	if err := bench.WriteReport(r, md, filepath.Join(filepath.Dir(md), "docs", "bench")); err != nil {
		fmt.Fprintln(os.Stderr, "bench: writing the report:", err)
		return 1
	}
	return 0
}

// pick keeps the observers named (all when names is empty), in order.
func pick(all []bench.Observer, names []string) []bench.Observer {
	if len(names) == 0 {
		return all
	}
	var out []bench.Observer
	for _, o := range all {
		if slices.Contains(names, o.Name) {
			out = append(out, o)
		}
	}
	return out
}

func machine() bench.Machine {
	m := bench.Machine{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.Atoi(f[1])
				m.MemGiB = (kb + 1<<19) >> 20
			}
		}
	}
	if b, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output(); err == nil {
		m.Revision = strings.TrimSpace(string(b))
	}
	return m
}

// moduleRoot is the directory of go.mod, for running the scenarios.
func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the lattrace module")
	}
	return filepath.Dir(mod), nil
}

// profile is --pgo.
func profile(ctx context.Context, env *bench.Env, self, path string, logf func(string, ...any)) int {
	abs, err := filepath.Abs(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	logf("profiling the daemon at %d exchanges/s for %v", bench.PGORate, bench.PGOTime)
	if err := bench.ProfileDaemon(ctx, env, self, abs); err != nil {
		fmt.Fprintln(os.Stderr, "bench: --pgo:", err)
		return 1
	}
	logf("wrote %s", path)
	return 0
}

func runKind(quick bool) string {
	if quick {
		return "quick"
	}
	return "full"
}
