package e2e

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestImageBinary builds the binary exactly as the Dockerfile's build
// stage does (its RUN line, run on this host) and starts it: static, with
// the BPF objects inside, it traces.
func TestImageBinary(t *testing.T) {
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .*)$`).FindSubmatch(df)
	if m == nil {
		t.Fatal("no `RUN CGO_ENABLED=0 go build` line in the Dockerfile")
	}
	out := t.TempDir()
	line := strings.NewReplacer("${VERSION}", "image-test", "/out/", out+"/").Replace(string(m[1]))
	build := exec.Command("sh", "-c", line)
	build.Dir = "../.."
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, b)
	}
	bin := filepath.Join(out, "lattrace")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked: a distroless static image cannot run it", bin)
		}
	}
	f.Close()
	v, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(v), "image-test") {
		t.Errorf("version: %q %v", v, err)
	}
	// As the image starts it (CMD), with the chart's API socket.
	cmd := exec.Command(bin, "daemon", "--output", "none", "--metrics-addr", "", "--api-socket", filepath.Join(t.TempDir(), "api.sock"))
	log := &syncBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitLog(t, log, "msg=tracing")
	loopbackSends(t, 2)
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the image's binary: %v\n%s", err, log.String())
	}
}

// waitLog waits until the log holds want, however long the daemon takes
// to get there (loading the programs takes seconds, more on an emulated
// CPU or a busy machine); a daemon that never does fails the test shortly
// before its deadline, with its log.
func waitLog(t *testing.T, log *syncBuffer, want string) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	deadline = deadline.Add(-30 * time.Second)
	start := time.Now()
	for time.Now().Before(deadline) {
		if strings.Contains(log.String(), want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%q not logged after %v:\n%s", want, time.Since(start).Round(time.Second), log.String())
}

// TestCapabilitiesSuffice runs the daemon as the chart does: uid 0 with
// every capability gone but CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN. Every
// hook attaches and it traces, so the chart asks for no more.
func TestCapabilitiesSuffice(t *testing.T) {
	caps := "-all,+bpf,+perfmon,+net_admin"
	cmd := exec.Command("setpriv", "--bounding-set="+caps, "--inh-caps="+caps,
		lattrace, "daemon", "--output", "none", "--metrics-addr", "", "--api-socket", filepath.Join(t.TempDir(), "api.sock"))
	log := &syncBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitLog(t, log, "msg=API")
	checkAttached(t, log.String()) // with only the chart's capabilities
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
}

// TestEachCapabilityNeeded: without any one of the chart's three
// capabilities the daemon refuses to start, in one line that names it.
// What the kernel itself refuses without each is in docs/reliability.md.
func TestEachCapabilityNeeded(t *testing.T) {
	chart := []string{"bpf", "perfmon", "net_admin"}
	for _, missing := range chart {
		caps := "-all"
		for _, c := range chart {
			if c != missing {
				caps += ",+" + c
			}
		}
		code, _, stderr := run(t, []string{"setpriv", "--bounding-set=" + caps, "--inh-caps=" + caps},
			"daemon", "--output", "none", "--metrics-addr", "", "--api-socket", "")
		if code != 1 {
			t.Errorf("without CAP_%s: exit status %d, want 1", strings.ToUpper(missing), code)
		}
		oneLine(t, stderr, "permission denied: lattrace needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN; this process lacks CAP_"+strings.ToUpper(missing))
	}
}
