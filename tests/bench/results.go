package bench

import (
	"encoding/json"
	"os"
	"slices"
	"time"
)

// Results is everything one benchmark run measured, as written to
// bench-results.json and drawn into BENCHMARKS.md.
type Results struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Quick    bool      `json:"quick"`
	Command  string    `json:"command"`
	Machine  Machine   `json:"machine"`
	Options  struct {
		Reps     int           `json:"reps"`
		Duration time.Duration `json:"duration"`
		// Awake is how the vCPUs were kept from halting (Awake.Method);
		// empty in runs from before it was recorded, which all used busy
		// loops.
		Awake string `json:"awake,omitempty"`
		// CPUWindow is the daemon cost section's measuring window; zero
		// in runs from before it was recorded, which used 5 s.
		CPUWindow time.Duration `json:"cpu_window,omitempty"`
	} `json:"options"`
	Observers []ObserverInfo `json:"observers"`
	RR        []Result       `json:"rr"`
	Hooks     []HookCost     `json:"hooks"`
	Rates     []RateCost     `json:"rates"`
	Flows     []FlowCost     `json:"flows"`
	Overload  *Overload      `json:"overload,omitempty"`
	Accuracy  []Accuracy     `json:"accuracy"`
	// Errors are sections that failed, by name: the report says so
	// instead of leaving them out silently.
	Errors map[string]string `json:"errors,omitempty"`
	// Reruns are sections measured again later and merged in (bench
	// --merge), each with when and at which revision.
	Reruns []Rerun `json:"reruns,omitempty"`
}

// Paired tells whether the request/response rates were measured with a
// baseline beside each run (Result.Base), as Measure does now.
func (r *Results) Paired() bool {
	for _, x := range r.RR {
		if len(x.Base) > 0 {
			return true
		}
	}
	return false
}

// Rerun is a section of a run measured again by a later one.
type Rerun struct {
	Section  string    `json:"section"`
	Started  time.Time `json:"started"`
	Revision string    `json:"revision"`
}

// Merge replaces the sections of r that later measured with later's,
// recording each as a rerun: a section that failed (or changed) need not
// cost a whole run again.
func (r *Results) Merge(later *Results, sections []string) {
	for _, s := range sections {
		switch s {
		case "rr":
			r.RR = later.RR
		case "hooks":
			r.Hooks = later.Hooks
		case "rates":
			r.Rates = later.Rates
			r.Options.CPUWindow = later.Options.CPUWindow
		case "flows":
			r.Flows = later.Flows
		case "overload":
			r.Overload = later.Overload
		case "accuracy":
			r.Accuracy = later.Accuracy
		default:
			continue
		}
		delete(r.Errors, s)
		if e, ok := later.Errors[s]; ok {
			if r.Errors == nil {
				r.Errors = map[string]string{}
			}
			r.Errors[s] = e
		}
		// Only the latest measurement of a section is in the results.
		r.Reruns = slices.DeleteFunc(r.Reruns, func(x Rerun) bool { return x.Section == s })
		r.Reruns = append(r.Reruns, Rerun{Section: s, Started: later.Started, Revision: later.Machine.Revision})
	}
}

// ObserverInfo names an observer in the results.
type ObserverInfo struct {
	Name string `json:"name"`
	What string `json:"what"`
}

// Machine is where the run happened.
type Machine struct {
	Kernel   string `json:"kernel"`
	CPU      string `json:"cpu"`
	CPUs     int    `json:"cpus"`
	MemGiB   int    `json:"mem_gib"`
	Revision string `json:"revision"`
}

// Save writes r as JSON.
func (r *Results) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// LoadResults reads what Save wrote.
func LoadResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// DaemonWindow is the window the daemon's CPU was measured over.
func (r *Results) DaemonWindow() time.Duration {
	if r.Options.CPUWindow > 0 {
		return r.Options.CPUWindow
	}
	return 5 * time.Second
}

// TickShare is how much of a core one tick of /proc's CPU time (10 ms)
// is over the daemon's window, in %: the resolution of its CPU figures.
func (r *Results) TickShare() float64 {
	return 100 * float64(10*time.Millisecond) / float64(r.DaemonWindow())
}

// HasPath tells whether any tool's programs were measured through the
// 1 ms path (runs from before that phase have none).
func (r *Results) HasPath() bool {
	for _, h := range r.Hooks {
		if len(h.Path) > 0 {
			return true
		}
	}
	return false
}

// Hook is the per-program cost of one tool, if the run measured it.
func (r *Results) Hook(tool string) (HookCost, bool) {
	for _, h := range r.Hooks {
		if h.Tool == tool {
			return h, true
		}
	}
	return HookCost{}, false
}

// PathRatio is lattrace's BPF time per exchange through the path over the
// loop's (0 without both).
func (r *Results) PathRatio() float64 {
	if h, ok := r.Hook("lattrace"); ok && h.NsPerRoundTrip > 0 {
		return h.PathNsPerRoundTrip / h.NsPerRoundTrip
	}
	return 0
}
