package fuzz

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TimeEnv names the variable that sets how long each target is fuzzed, a
// Go duration: unset, DefaultTime (make test); make soak sets it longer
// (and go test's -timeout above it times the number of targets).
const TimeEnv = "LTTEST_FUZZTIME"

// DefaultTime is each target's time in make test, where all of them
// together, builds included, must stay within a few minutes.
const DefaultTime = 6 * time.Second

// TestFuzzTargets finds every fuzz target of the repository (each
// func FuzzXxx(f *testing.F) of a _test.go file), checks that its package
// commits a corpus for it (testdata/fuzz/FuzzXxx), and fuzzes it for
// LTTEST_FUZZTIME (DefaultTime when unset) with go test -fuzz, one
// worker at a time, minimisation off (the time goes to new inputs; an
// input that fails is kept as found). A run shorter than a minute starts
// from the committed corpus alone; a longer one (make soak) also from
// what the engine's cache kept of earlier long runs. A failure names the
// target, what it asserted and the input, which the fuzzing engine writes
// into the package's corpus: fix the bug and commit the input as a
// regression seed.
func TestFuzzTargets(t *testing.T) {
	per := DefaultTime
	if v := os.Getenv(TimeEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a Go duration above zero, e.g. 10m", TimeEnv, v)
		}
		per = d
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	targets, err := findTargets(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) < 10 {
		t.Fatalf("%d fuzz targets found under %s: the search is broken", len(targets), root)
	}
	// Each target costs its time and a few seconds more (linking its
	// test binary, starting its worker, the seeds' baseline).
	need := time.Duration(len(targets)) * (per + 5*time.Second)
	if dl, ok := t.Deadline(); ok && time.Until(dl) < need {
		t.Fatalf("%d targets for %v each need about %v; the test's -timeout leaves %v: raise it", len(targets), per, need, time.Until(dl).Round(time.Second))
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	start := time.Now()
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			corpus := filepath.Join(root, tg.pkg, "testdata", "fuzz", tg.name)
			if ents, err := os.ReadDir(corpus); err != nil || len(ents) == 0 {
				t.Errorf("%s has no corpus in %s: commit its seeds (%s=write go test -run %s ./%s)", tg.name, corpus, SeedsEnv, tg.name, tg.pkg)
			}
			args := []string{"test", "-run", "^$", "-fuzz", "^" + tg.name + "$", "-fuzztime", per.String(),
				"-fuzzminimizetime", "0", "-parallel", "1", "./" + tg.pkg}
			if per < time.Minute {
				// The engine's cache of inputs found interesting grows
				// with every run, and replaying it comes first: a short
				// run starts from the committed corpus instead, or it
				// would soon spend all its time replaying.
				args = append(args, "-args", "-test.fuzzcachedir="+t.TempDir())
			}
			cmd := exec.Command(goBin, args...)
			cmd.Dir = root
			began := time.Now()
			out, err := cmd.CombinedOutput()
			t.Logf("%s: fuzzed %v in %v of wall time: %s", tg.name, per, time.Since(began).Round(100*time.Millisecond), lastProgress(out))
			if err != nil {
				t.Errorf("%s (./%s): %v\n%s%s", tg.name, tg.pkg, err, failure(out), failingInput(out, tg.pkg))
			}
		})
	}
	t.Logf("%d targets in %v", len(targets), time.Since(start).Round(time.Second))
}

// target is one fuzz target: its package, from the repository's root, and
// its name.
type target struct{ pkg, name string }

var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)

// findTargets lists the fuzz targets of the repository's test files,
// sorted, leaving out what is no package of it (testdata, hidden
// directories).
func findTargets(root string) ([]target, error) {
	var out []target
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg, _ := filepath.Rel(root, filepath.Dir(path))
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			out = append(out, target{pkg: filepath.ToSlash(pkg), name: string(m[1])})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b target) int { return strings.Compare(a.pkg+"."+a.name, b.pkg+"."+b.name) })
	return out, err
}

// failure is what go test said of the failure: the lines from the first
// "--- FAIL" on, else all of it.
func failure(out []byte) string {
	if i := bytes.Index(out, []byte("--- FAIL")); i >= 0 {
		return string(out[i:])
	}
	return string(out)
}

var failingRe = regexp.MustCompile(`Failing input written to (\S+)`)

// failingInput names the file the fuzzing engine wrote the failing input
// to, from the repository's root.
func failingInput(out []byte, pkg string) string {
	m := failingRe.FindSubmatch(out)
	if m == nil {
		return ""
	}
	rel := string(m[1]) // testdata/fuzz/FuzzXxx/NAME
	again := filepath.Base(filepath.Dir(rel)) + "/" + filepath.Base(rel)
	return fmt.Sprintf("failing input: %s (again: go test -run '%s' ./%s)", filepath.Join(pkg, rel), again, pkg)
}

// lastProgress is the fuzzing engine's last line of progress: how many
// inputs it ran.
func lastProgress(out []byte) string {
	last := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "fuzz: elapsed") {
			last = strings.TrimPrefix(l, "fuzz: ")
		}
	}
	return last
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("finding the repository's root: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
