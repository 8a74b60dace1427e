package bench

import (
	"encoding/json"
	"os"
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
