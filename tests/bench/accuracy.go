package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Accuracy is one quantity of one lab scenario: what lattrace measured
// against the truth the scenario injected or read from an independent
// tool in the same run.
type Accuracy struct {
	Scenario  string  `json:"scenario"`
	Quantity  string  `json:"quantity"`
	Unit      string  `json:"unit"` // "ms", "Mbit/s", "retransmissions", ...
	Truth     float64 `json:"truth"`
	TruthFrom string  `json:"truth_from"`
	Measured  float64 `json:"measured"`
}

// Error is Measured - Truth, in Unit.
func (a Accuracy) Error() float64 { return a.Measured - a.Truth }

// ErrorPct is the error in % of the truth (NaN for a zero truth).
func (a Accuracy) ErrorPct() float64 {
	if a.Truth == 0 {
		return math.NaN()
	}
	return 100 * a.Error() / a.Truth
}

// AccuracyFileEnv names the file the scenario tests append their rows to;
// unset, they write none.
const AccuracyFileEnv = "LATTRACE_ACCURACY_FILE"

var accuracyMu sync.Mutex

// RecordAccuracy appends a row to the file AccuracyFileEnv names, if any.
// The scenario tests call it beside their assertions, with the same truth.
func RecordAccuracy(a Accuracy) error {
	path := os.Getenv(AccuracyFileEnv)
	if path == "" {
		return nil
	}
	accuracyMu.Lock()
	defer accuracyMu.Unlock()
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

// MeasureAccuracy runs the lab scenarios that match run (a go test -run
// pattern) from the module at root and collects their rows. The
// scenarios' own assertions must pass too: a row of a failed scenario is
// not shown as a result.
func MeasureAccuracy(ctx context.Context, root, run string, logf func(string, ...any)) ([]Accuracy, error) {
	dir, err := os.MkdirTemp("", "lattrace-accuracy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "rows.jsonl")
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-timeout", "30m", "-run", run, "./tests/scenarios/")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), AccuracyFileEnv+"="+file)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	logf("accuracy: go test -run '%s' ./tests/scenarios/", run)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the scenarios failed: %v\n%s", err, out.String())
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("the scenarios wrote no accuracy rows: %w", err)
	}
	defer f.Close()
	var rows []Accuracy
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var a Accuracy
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			return nil, err
		}
		rows = append(rows, a)
	}
	return rows, sc.Err()
}
