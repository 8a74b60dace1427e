// Command reruns decides what the failures of a make test run mean. It
// reads the run's events (go test -json, as gotestsum's --jsonfile writes
// them) and the one list of tests CI may run a second time (.ci/reruns.txt).
// A failure of a test not in the list fails the run at once, as does a
// package that fails outside its tests (a build, TestMain, a timeout); a
// listed test that failed runs once more on its own, and every rerun is
// printed at the end, passed or not: a rerun hides a flaky test, so each one
// is in plain sight.
//
//	reruns -list .ci/reruns.txt -events bin/test-events.json -status $?
//
// The exit status is 0 when the run passed: nothing failed, or only listed
// tests that passed their rerun.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout))
}

func run(args []string, out io.Writer) int {
	fs := flag.NewFlagSet("reruns", flag.ContinueOnError)
	fs.SetOutput(out)
	listFile := fs.String("list", ".ci/reruns.txt", "the tests that may be rerun: package, test, reason, a line each")
	eventsFile := fs.String("events", "", "the run's go test -json events")
	status := fs.Int("status", 0, "the run's exit status")
	timeout := fs.String("timeout", "20m", "go test's -timeout for a rerun")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	list, err := readList(*listFile)
	if err != nil {
		fmt.Fprintf(out, "reruns: %v\n", err)
		return 2
	}
	f, err := os.Open(*eventsFile)
	if err != nil {
		fmt.Fprintf(out, "reruns: %v\n", err)
		return 2
	}
	failures, err := readFailures(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(out, "reruns: %s: %v\n", *eventsFile, err)
		return 2
	}

	fmt.Fprintf(out, "\n=== reruns (only the tests in %s may run again)\n", *listFile)
	if len(failures) == 0 {
		if *status != 0 {
			fmt.Fprintf(out, "the run failed (exit %d) without a failed test in its events: nothing to rerun\n", *status)
			return 1
		}
		fmt.Fprintln(out, "none: no test failed")
		return 0
	}
	var listed []failure
	unlisted := false
	for _, fl := range failures {
		e, ok := list.covers(fl)
		switch {
		case fl.test == "":
			fmt.Fprintf(out, "FAIL %s outside its tests (build, TestMain, timeout or panic): not rerun\n", fl.pkg)
			unlisted = true
		case fl.unfinished:
			fmt.Fprintf(out, "FAIL %s %s did not finish (timeout or panic): not rerun\n", fl.pkg, fl.test)
			unlisted = true
		case !ok:
			fmt.Fprintf(out, "FAIL %s %s is not in %s: not rerun\n", fl.pkg, fl.test, *listFile)
			unlisted = true
		default:
			fl.reason = e.reason
			listed = append(listed, fl)
		}
	}
	if unlisted {
		for _, fl := range listed {
			fmt.Fprintf(out, "FAIL %s %s (listed: %s): not rerun, the run fails anyway\n", fl.pkg, fl.test, fl.reason)
		}
		return 1
	}
	code := 0
	for _, fl := range listed {
		passed, log := rerun(fl, *timeout)
		if passed {
			fmt.Fprintf(out, "RERUN %s %s: failed, passed on its rerun (listed: %s)\n", fl.pkg, fl.test, fl.reason)
			continue
		}
		code = 1
		fmt.Fprintf(out, "RERUN %s %s: failed, and failed again on its rerun (listed: %s)\n%s", fl.pkg, fl.test, fl.reason, log)
	}
	return code
}

// entry is a line of the list: a test of a package, or a subtest ("TestX/sub",
// which covers the subtests under it too), and why it may run again.
type entry struct {
	pkg, test, reason string
}

type list []entry

// readList reads the list: "package test reason", a line each; blank lines
// and lines starting with # are comments. An entry without its reason is an
// error: a rerun must say why it is allowed.
func readList(path string) (list, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l list
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want \"package test reason\", got %q", path, i+1, line)
		}
		l = append(l, entry{pkg: f[0], test: f[1], reason: strings.Join(f[2:], " ")})
	}
	return l, nil
}

// covers finds the entry that names the failed test or one of its parents.
func (l list) covers(fl failure) (entry, bool) {
	for _, e := range l {
		if e.pkg == fl.pkg && (fl.test == e.test || strings.HasPrefix(fl.test, e.test+"/")) {
			return e, true
		}
	}
	return entry{}, false
}

// failure is a failed test of a package, the innermost that failed (a
// subtest rather than its parent), or a package that failed outside its
// tests (test "").
type failure struct {
	pkg, test string
	// unfinished: the test started and never ended (its package timed
	// out or crashed).
	unfinished bool
	reason     string
}

// event is a line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// readFailures reads a run's events and returns its failures in the order
// the packages and tests ran.
func readFailures(r io.Reader) ([]failure, error) {
	type pkgState struct {
		failed bool
		tests  []string          // in the order they started
		result map[string]string // test: its last action
	}
	pkgs := map[string]*pkgState{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, err
		}
		if ev.Package == "" {
			continue
		}
		p := pkgs[ev.Package]
		if p == nil {
			p = &pkgState{result: map[string]string{}}
			pkgs[ev.Package] = p
			order = append(order, ev.Package)
		}
		switch {
		case ev.Test == "" && ev.Action == "fail":
			p.failed = true
		case ev.Test == "":
		case ev.Action == "run":
			if _, seen := p.result[ev.Test]; !seen {
				p.tests = append(p.tests, ev.Test)
			}
			p.result[ev.Test] = "run"
		case ev.Action == "pass" || ev.Action == "fail" || ev.Action == "skip":
			p.result[ev.Test] = ev.Action
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []failure
	for _, name := range order {
		p := pkgs[name]
		n := 0
		for _, test := range p.tests {
			res := p.result[test]
			if res == "fail" && !slices.ContainsFunc(p.tests, func(sub string) bool {
				return strings.HasPrefix(sub, test+"/") && p.result[sub] == "fail"
			}) {
				out = append(out, failure{pkg: name, test: test})
				n++
			}
			// A test left running when its package ended: the
			// innermost one is named, its parents are implied.
			if res == "run" && p.failed && !slices.ContainsFunc(p.tests, func(sub string) bool {
				return strings.HasPrefix(sub, test+"/") && p.result[sub] == "run"
			}) {
				out = append(out, failure{pkg: name, test: test, unfinished: true})
				n++
			}
		}
		if p.failed && n == 0 {
			out = append(out, failure{pkg: name})
		}
	}
	return out, nil
}

// rerun runs one failed test again, alone, and reports whether it passed;
// log is its output when it did not.
func rerun(fl failure, timeout string) (passed bool, log string) {
	cmd := exec.Command("go", "test", "-json", "-count=1", "-timeout", timeout, "-run", runPattern(fl.test), fl.pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return false, err.Error() + "\n"
	}
	var text strings.Builder
	passedTest := false
	for _, line := range bytes.Split(stdout, []byte("\n")) {
		var ev event
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		text.WriteString(ev.Output)
		if ev.Test == fl.test && ev.Action == "pass" {
			passedTest = true
		}
	}
	text.Write(stderr.Bytes())
	// The test itself must have run and passed, and its package with it: a
	// pattern that matched nothing passes too.
	return err == nil && passedTest, text.String()
}

// runPattern is go test's -run pattern that selects exactly test: each
// level of its name anchored and quoted.
func runPattern(test string) string {
	parts := strings.Split(test, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
