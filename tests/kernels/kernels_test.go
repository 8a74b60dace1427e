package kernels

import (
	"bytes"
	"context"
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

// cache is where tests/kernels/setup.sh (make setup) puts the kernels and
// virtme-ng.
const cache = "/var/cache/lattrace"

// series are the kernels production nodes run that the matrix boots: each
// must be in the cache.
var series = []string{"6.1", "6.12"}

// suite is what runs inside each kernel: a package's test binary and the
// tests of it that the matrix asks for (README, "Kernels").
var suite = []struct {
	pkg, run string
}{
	// Every hook attaches through the alternative the kernel calls for;
	// connections open before the tracer get their roles from the
	// listeners and their HTTP/2 framing from frame headers (the TCP
	// iterators' variants run on this machine, which refuses the others);
	// calls carry the evidence of the request they served (through the
	// fentry and fexit stand-ins on these kernels).
	{"daemon/tracer", "^(TestHooksOnThisKernel|TestAdoptedRoles|TestHTTP2Adopted|TestRequestLinks)$/^(listeners_read_true,_TCP_iterators_only_false|TCP_iterators_only_false)$"},
	// The lab: delay and think time, loss, a bulk stream.
	{"tests/scenarios", "^(TestPathDelayAndThinkTime|TestLoss|TestOneWayStream)$"},
	// Real servers: nginx, whose bodies go out through sendfile; nghttpd,
	// whose HTTP/2 frames are counted from their headers and cut into
	// one exchange per stream.
	{"tests/apps", "^(TestNginx|TestHTTP2)$/^(cubic_1KB_tls=false|cubic_m1)$"},
	// The daemon with only the chart's capabilities attaches every hook,
	// through whichever alternative, and refuses to start without any one
	// of them.
	{"tests/e2e", "^(TestCapabilitiesSuffice|TestEachCapabilityNeeded)$"},
}

// TestKernelMatrix boots Debian's 6.1 and 6.12 kernels in a VM (qemu's
// software CPU through virtme-ng, with this machine's filesystem) and runs
// the suite above inside each, as root, against that kernel.
func TestKernelMatrix(t *testing.T) {
	vng := filepath.Join(cache, "vng", "bin", "vng")
	if _, err := os.Stat(vng); err != nil {
		t.Fatalf("virtme-ng is not installed (%v): run make setup", err)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(out, "lattrace"), "./cmd/lattrace")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building lattrace: %v: %s", err, b)
	}
	for _, s := range suite {
		bin := filepath.Join(out, filepath.Base(s.pkg)+".test")
		cmd := exec.Command("go", "test", "-c", "-o", bin, "./"+s.pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v: %s", s.pkg, err, b)
		}
	}
	for _, ser := range series {
		t.Run(ser, func(t *testing.T) {
			release, err := newest(ser)
			if err != nil {
				t.Fatal(err)
			}
			runIn(t, vng, release, root, out)
		})
	}
}

// runIn boots release and runs the suite in it; each test binary's output
// and exit status come back through out, which the guest may write.
func runIn(t *testing.T, vng, release, root, out string) {
	dir := filepath.Join(cache, "kernels", release)
	results := filepath.Join(out, release)
	if err := os.MkdirAll(results, 0o755); err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	// tracefs is not mounted in the guest; the emulated CPU widens the
	// tests' tolerances (LTTEST_EMULATED; not LATTRACE_*, which the
	// daemon takes for its settings and refuses when unknown), and
	// tests/e2e runs the binary built here.
	fmt.Fprintf(&script, "mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null; export LTTEST_EMULATED=1 LTTEST_BIN=%s; ",
		filepath.Join(out, "lattrace"))
	// A binary's time limit only catches a hang: the lab's scenarios alone
	// take minutes on the emulated CPU, more on a busy machine.
	for _, s := range suite {
		name := filepath.Base(s.pkg)
		fmt.Fprintf(&script, "cd %s && %s -test.run '%s' -test.v -test.count=1 -test.timeout 30m > %s 2>&1; echo $? > %s; ",
			filepath.Join(root, s.pkg), filepath.Join(out, name+".test"), s.run,
			filepath.Join(results, name+".log"), filepath.Join(results, name+".rc"))
	}
	// The script goes in a file: vng quotes its command for a shell, and
	// the tests' patterns would break that quoting.
	runner := filepath.Join(results, "run.sh")
	if err := os.WriteFile(runner, []byte(script.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	// The VM runs as long as the suite in it takes on this machine's
	// emulated CPU, which a busy machine slows: it is stopped only for the
	// test's own deadline, soon enough to say what the guest was doing.
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-time.Minute))
		defer cancel()
	}
	// The cache (kernels and their modules) and the repository are shared
	// read-only: the guest's /var and /tmp are fresh overlays.
	// psi=1: Debian's kernels keep the CPU pressure account, which the
	// tests hold findings of slow applications to, only when asked.
	cmd := exec.CommandContext(ctx, vng, "--disable-kvm", "--run", filepath.Join(dir, "boot", "vmlinuz-"+release), "--append", "psi=1",
		"--cpus", fmt.Sprint(runtime.NumCPU()), "--memory", "2G", "--rodir", cache, "--rodir", root, "--rwdir", out,
		"--exec", "sh "+runner)
	// vng runs virtme-run, from the same virtualenv.
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(vng)+":"+os.Getenv("PATH"))
	// A pipe, not a file: qemu reopens its output with O_TRUNC.
	var console bytes.Buffer
	cmd.Stdout, cmd.Stderr = &console, &console
	start := time.Now()
	err := cmd.Run()
	t.Logf("Linux %s: booted and ran the suite in %v", release, time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("vng: %v; console:\n%s", err, tail(console.String(), 40))
	}
	for _, s := range suite {
		name := filepath.Base(s.pkg)
		log, _ := os.ReadFile(filepath.Join(results, name+".log"))
		rc, err := os.ReadFile(filepath.Join(results, name+".rc"))
		if err != nil {
			t.Errorf("%s did not run in the guest; console:\n%s", s.pkg, tail(console.String(), 40))
			continue
		}
		summary := verdicts(string(log))
		if strings.TrimSpace(string(rc)) != "0" {
			t.Errorf("%s on Linux %s: exit %s\n%s", s.pkg, release, strings.TrimSpace(string(rc)), tail(string(log), 60))
			continue
		}
		t.Logf("%s on Linux %s:\n%s", s.pkg, release, summary)
	}
}

// verdicts keeps a test log's verdicts and the lines that say what was
// measured.
func verdicts(log string) string {
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "--- ") || strings.Contains(l, "kernel hooks attached") || strings.Contains(l, "tracing hooks_attached") ||
			strings.Contains(l, "medians:") || strings.Contains(l, "retransmissions:") || strings.Contains(l, "stream:") ||
			strings.Contains(l, "| nginx") || strings.Contains(l, "| nghttpd") || strings.Contains(l, "HTTP/2 frames") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// newest is the release of the newest cached kernel of a series ("6.1" →
// "6.1.0-56-amd64", "6.12" → "6.12.117+deb12-amd64").
func newest(ser string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(cache, "kernels"))
	if err != nil {
		return "", fmt.Errorf("no kernels cached (%v): run make setup", err)
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(ser) + `[.-]`)
	var found []string
	for _, e := range ents {
		if re.MatchString(e.Name()) && !strings.HasSuffix(e.Name(), ".partial") {
			found = append(found, e.Name())
		}
	}
	if len(found) == 0 {
		return "", fmt.Errorf("no %s kernel in %s/kernels: run make setup", ser, cache)
	}
	slices.SortFunc(found, compareVersions)
	return found[len(found)-1], nil
}

// compareVersions orders releases by their numbers ("6.1.0-9" before
// "6.1.0-56").
func compareVersions(a, b string) int {
	num := regexp.MustCompile(`\d+|\D+`)
	pa, pb := num.FindAllString(a, -1), num.FindAllString(b, -1)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		var na, nb int
		if _, err := fmt.Sscan(pa[i], &na); err == nil {
			if _, err := fmt.Sscan(pb[i], &nb); err == nil {
				return na - nb
			}
		}
		return strings.Compare(pa[i], pb[i])
	}
	return len(pa) - len(pb)
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("finding the repository: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
