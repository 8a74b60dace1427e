package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeModule is a module of three tests: TestFlaky/once fails the first
// time it runs and passes after, TestBroken fails while BROKEN is set,
// TestSteady passes. Each run of a test leaves a line in $RUNS/<test>.
const fakeModule = `package fake

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func ran(t *testing.T) int {
	f := filepath.Join(os.Getenv("RUNS"), strings.ReplaceAll(t.Name(), "/", "_"))
	b, _ := os.ReadFile(f)
	os.WriteFile(f, append(b, '.'), 0o644)
	return len(b) + 1
}

func TestFlaky(t *testing.T) {
	t.Run("once", func(t *testing.T) {
		if ran(t) == 1 {
			t.Fatal("first run fails")
		}
	})
	t.Run("always", func(t *testing.T) { ran(t) })
}

func TestBroken(t *testing.T) {
	ran(t)
	if os.Getenv("BROKEN") != "" {
		t.Fatal("broken")
	}
}

func TestSteady(t *testing.T) { ran(t) }
`

// The list decides: a listed failure runs once more and is printed with
// its reason and verdict, an unlisted one fails the run with nothing
// rerun, and a listed test that fails again fails the run.
func TestListDecides(t *testing.T) {
	cases := []struct {
		name, list string
		broken     bool
		want       int
		// says: lines of the summary; runs: how many times each test ran.
		says []string
		runs map[string]int
	}{
		{"listed flaky test passes its rerun",
			"example.com/fake TestFlaky/once the first run fails by design\n", false, 0,
			[]string{"RERUN example.com/fake TestFlaky/once: failed, passed on its rerun (listed: the first run fails by design)"},
			map[string]int{"TestFlaky_once": 2, "TestFlaky_always": 1, "TestSteady": 1}},
		{"a parent's entry covers its subtests",
			"# comment\n\nexample.com/fake TestFlaky reason\n", false, 0,
			[]string{"RERUN example.com/fake TestFlaky/once: failed, passed on its rerun (listed: reason)"},
			map[string]int{"TestFlaky_once": 2, "TestFlaky_always": 1}},
		{"unlisted failure fails at once",
			"", false, 1,
			[]string{"FAIL example.com/fake TestFlaky/once is not in "},
			map[string]int{"TestFlaky_once": 1}},
		{"an unlisted failure beside a listed one: nothing rerun",
			"example.com/fake TestFlaky/once reason\n", true, 1,
			[]string{"FAIL example.com/fake TestBroken is not in ", "FAIL example.com/fake TestFlaky/once (listed: reason): not rerun, the run fails anyway"},
			map[string]int{"TestFlaky_once": 1, "TestBroken": 1}},
		{"a listed test that fails again fails the run",
			"example.com/fake TestBroken reason\nexample.com/fake TestFlaky/once reason\n", true, 1,
			[]string{"RERUN example.com/fake TestBroken: failed, and failed again on its rerun (listed: reason)", "--- FAIL: TestBroken",
				"RERUN example.com/fake TestFlaky/once: failed, passed on its rerun"},
			map[string]int{"TestBroken": 2, "TestFlaky_once": 2, "TestSteady": 1}},
		{"an entry without its reason is refused",
			"example.com/fake TestFlaky/once\n", false, 2,
			[]string{`want "package test reason"`}, nil},
	}
	mod := t.TempDir()
	for name, text := range map[string]string{"go.mod": "module example.com/fake\n\ngo 1.22\n", "fake_test.go": fakeModule} {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(mod)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runs := t.TempDir()
			t.Setenv("RUNS", runs)
			t.Setenv("BROKEN", "")
			if c.broken {
				t.Setenv("BROKEN", "1")
			}
			dir := t.TempDir()
			listFile, events := filepath.Join(dir, "reruns.txt"), filepath.Join(dir, "events.json")
			if err := os.WriteFile(listFile, []byte(c.list), 0o644); err != nil {
				t.Fatal(err)
			}
			first := exec.Command("go", "test", "-json", "-count=1", "./...")
			b, err := first.Output()
			status := first.ProcessState.ExitCode()
			if err != nil && status <= 0 {
				t.Fatal(err)
			}
			if err := os.WriteFile(events, b, 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			got := run([]string{"-list", listFile, "-events", events, "-status", itoa(status)}, &out)
			t.Logf("first run exit %d; summary:\n%s", status, out.String())
			if got != c.want {
				t.Errorf("exit %d, want %d", got, c.want)
			}
			for _, s := range c.says {
				if !strings.Contains(out.String(), s) {
					t.Errorf("the summary does not say %q", s)
				}
			}
			for test, n := range c.runs {
				b, _ := os.ReadFile(filepath.Join(runs, test))
				if len(b) != n {
					t.Errorf("%s ran %d times, want %d", test, len(b), n)
				}
			}
		})
	}
}

// A run that failed without a failed test (a package that does not build)
// has nothing to rerun and fails; a run without failures passes and says
// that nothing ran again.
func TestFailuresOutsideTests(t *testing.T) {
	dir := t.TempDir()
	listFile := filepath.Join(dir, "reruns.txt")
	if err := os.WriteFile(listFile, []byte("example.com/fake TestFlaky reason\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, events string
		status, want int
		says         string
	}{
		{"package fails to build", `{"Action":"fail","Package":"example.com/fake","FailedBuild":"example.com/fake"}`, 1, 1,
			"FAIL example.com/fake outside its tests"},
		{"a test left running by a timeout", `{"Action":"run","Package":"example.com/fake","Test":"TestFlaky"}
{"Action":"output","Package":"example.com/fake","Output":"panic: test timed out after 1s\n"}
{"Action":"fail","Package":"example.com/fake"}`, 1, 1, "FAIL example.com/fake TestFlaky did not finish"},
		{"failed with no events", ``, 2, 1, "without a failed test in its events"},
		{"passed", `{"Action":"run","Package":"example.com/fake","Test":"TestFlaky"}
{"Action":"pass","Package":"example.com/fake","Test":"TestFlaky"}
{"Action":"pass","Package":"example.com/fake"}`, 0, 0, "none: no test failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			events := filepath.Join(t.TempDir(), "events.json")
			if err := os.WriteFile(events, []byte(c.events), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if got := run([]string{"-list", listFile, "-events", events, "-status", itoa(c.status)}, &out); got != c.want {
				t.Errorf("exit %d, want %d:\n%s", got, c.want, out.String())
			}
			if !strings.Contains(out.String(), c.says) {
				t.Errorf("the summary does not say %q:\n%s", c.says, out.String())
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
