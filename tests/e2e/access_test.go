package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/tests/netlab"
)

// Who may talk to the daemon (docs/reliability.md, "Who may talk to it"):
// an unprivileged user of the node and another pod try every way in, as
// real processes against a real daemon.

// asNobody runs a command as the user nobody, with no capability left.
var asNobody = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"}

// The ports the daemon of TestWhoMayTalkToIt serves in its own network
// namespace, where nothing else runs.
const (
	accessAPIPort     = "9470"
	accessMetricsPort = "9464"
)

// TestWhoMayTalkToIt runs the daemon in a network namespace of its own, as
// the chart runs it in its pod's (the lab's host A), with every listener
// and file it has: the API's socket in a root directory others may enter
// (the chart's hostPath), its loopback TCP port, /metrics on A's address,
// the JSON lines file, pins.
//   - root reads the flows (the control);
//   - nobody, on the node, gets "permission denied" or "operation not
//     permitted" on the socket, the file, each pin and each of the
//     daemon's maps, programs and links by id, and lattrace's clients
//     say so in one line; nobody cannot detach the programs either;
//   - another pod (host B) cannot reach the API, reaches /metrics and
//     /healthz on A's address, read-only: every other method gets 405 on
//     every path, the API is not there, nothing changes.
func TestWhoMayTalkToIt(t *testing.T) {
	pid := os.Getpid()
	lab, err := netlab.New(netlab.Config{Prefix: fmt.Sprintf("access-%d", pid)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	runDir := fmt.Sprintf("/run/access-%d", pid)
	if err := os.Mkdir(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(runDir, 0o755) // past the umask, as the kubelet makes it
	t.Cleanup(func() { os.RemoveAll(runDir) })
	pins := fmt.Sprintf("/sys/fs/bpf/access-%d", pid)
	t.Cleanup(func() {
		exec.Command(lattrace, "daemon", "--cleanup", "--pin-path", pins).Run()
		os.RemoveAll(pins)
	})
	logs := t.TempDir()
	os.Chmod(logs, 0o755) // others may look in, as in /var/log
	out := filepath.Join(logs, "flows.jsonl")
	sock := filepath.Join(runDir, "api.sock")
	metrics := net.JoinHostPort(lab.A.IPv4.String(), accessMetricsPort)
	cmd := exec.Command(lattrace, "daemon", "--output-file", out, "--api-socket", sock, "--api-addr", "127.0.0.1:"+accessAPIPort,
		"--metrics-addr", metrics, "--pin-path", pins)
	startTracing(t, cmd, func() error { return lab.A.Do(cmd.Start) })

	// The control: root sees a connection of the node's.
	local := loopbackSends(t, 2)
	waitFlow(t, sock, local)
	checkModes(t, sock, out, pins)

	// Everything the daemon holds, by path and by id.
	attempts := []string{"unix:" + sock, "read:" + out, "read:" + pins}
	filepath.WalkDir(pins, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			attempts = append(attempts, "pin:"+p)
		}
		return nil
	})
	ids := bpfIDs(t, cmd.Process.Pid)
	for _, kind := range []string{"map", "prog", "link"} {
		if len(ids[kind]) == 0 {
			t.Fatalf("the daemon holds no %s: %v", kind, ids)
		}
		for _, id := range ids[kind] {
			attempts = append(attempts, kind+":"+id)
		}
	}
	for a, res := range runProbe(t, nil, attempts) {
		if res != "ok" {
			t.Errorf("root: %s: %s, want ok (the probe must reach what it tries)", a, res)
		}
	}
	for a, res := range runProbe(t, asNobody, attempts) {
		if res != "permission denied" && res != "operation not permitted" {
			t.Errorf("nobody: %s: %s, want permission denied or operation not permitted", a, res)
		}
	}
	for _, args := range [][]string{
		{"flows", "--api", sock}, {"flows", "--peers", "--json", "--api", sock}, {"explain", "1", "--api", sock}, {"top", "--once", "--api", sock},
	} {
		code, stdout, stderr := run(t, asNobody, args...)
		if code != 1 || stdout != "" {
			t.Errorf("nobody: %v: exit %d, stdout %.200q", args, code, stdout)
		}
		oneLine(t, stderr, "permission denied: the API socket "+sock+" is root-only (mode 0600); run as root (sudo)")
	}
	code, _, stderr := run(t, asNobody, "daemon", "--cleanup", "--pin-path", pins)
	if code != 1 {
		t.Errorf("nobody: daemon --cleanup: exit %d", code)
	}
	oneLine(t, stderr, "permission denied: lattrace needs root")

	// Another pod. The API's TCP port is on A's loopback only.
	before := health(t, sock)
	base := "http://" + metrics
	want := map[string]string{
		"tcp:" + net.JoinHostPort(lab.A.IPv4.String(), accessAPIPort): "connection refused",
		"tcp:127.0.0.1:" + accessAPIPort:                              "connection refused",
		"GET:" + base + "/metrics":                                    "status 200",
		"GET:" + base + "/healthz":                                    "status 200",
		"HEAD:" + base + "/metrics":                                   "status 200",
	}
	for _, p := range []string{"/", "/v1/flows", "/v1/health", "/debug/pprof/", "/debug/vars"} {
		want["GET:"+base+p] = "status 404"
	}
	for _, p := range []string{"/metrics", "/healthz", "/", "/v1/flows", "/v1/health", "/debug/pprof/"} {
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
			want[m+":"+base+p] = "status 405"
		}
	}
	checkProbe(t, "another pod", lab.B, want)
	// In the daemon's own namespace: the API's port answers, and /metrics
	// is only on the address --metrics-addr names.
	checkProbe(t, "the daemon's pod", lab.A, map[string]string{
		"tcp:127.0.0.1:" + accessAPIPort:     "ok",
		"tcp:127.0.0.1:" + accessMetricsPort: "connection refused",
	})
	after := health(t, sock)
	if before.Started != after.Started || before.Status != after.Status || fmt.Sprint(before.Hooks) != fmt.Sprint(after.Hooks) {
		t.Errorf("the daemon changed under the requests: before %+v, after %+v", before, after)
	}
}

// TestOthersPathsRefused: a directory or file another user prepared for
// the daemon (theirs, or a link they made) is refused at start with one
// line that names it, and nothing is created in it or written through it.
func TestOthersPathsRefused(t *testing.T) {
	pid := os.Getpid()
	theirs := func(p string) string {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(p) })
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		return p
	}
	runDir := theirs(fmt.Sprintf("/run/access-%d-theirs", pid))
	pins := theirs(fmt.Sprintf("/sys/fs/bpf/access-%d-theirs", pid))
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	quiet := []string{"daemon", "--log-level", "error", "--metrics-addr", "", "--api-socket", ""}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"socket directory of another user", []string{"daemon", "--log-level", "error", "--output", "none", "--metrics-addr", "", "--api-socket", runDir + "/api.sock"}, 1,
			"API socket directory: " + runDir + " is owned by uid 65534, not by this process's uid 0 or root; remove it or choose another --api-socket"},
		{"pin directory of another user", append(quiet, "--output", "none", "--pin-path", pins), 1,
			"pin directory: " + pins + " is owned by uid 65534, not by this process's uid 0 or root; remove it or choose another --pin-path"},
		{"output file is a link", append(quiet, "--output-file", link), 1, "opening output: " + link + " is a symbolic link"},
		{"CPU profile is a link", append(quiet, "--output", "none", "--cpu-profile", link), 1, "--cpu-profile: " + link + " is a symbolic link"},
		{"API on every address", append(quiet, "--output", "none", "--api-addr", "0.0.0.0:"+accessAPIPort), 2, "is not loopback"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := run(t, nil, c.args...)
			if code != c.code {
				t.Errorf("exit status %d, want %d", code, c.code)
			}
			oneLine(t, stderr, c.want)
		})
	}
	for _, d := range []string{runDir, pins} {
		if ents, _ := os.ReadDir(d); len(ents) > 0 {
			t.Errorf("the daemon created %v in %s, another user's", ents, d)
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Errorf("written through the link: %q %v", b, err)
	}
}

// waitFlow waits until root's `lattrace flows` lists the connection whose
// local end is local.
func waitFlow(t *testing.T, sock, local string) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var code int
		if code, out, _ = run(t, nil, "flows", "--json", "--api", sock); code == 0 && strings.Contains(out, local) {
			return
		}
	}
	t.Fatalf("root's flows never listed %s:\n%s", local, out)
}

// checkModes: the socket, the JSON lines and the pins are root's, 0600,
// the pin directories 0700.
func checkModes(t *testing.T, sock, out, pins string) {
	t.Helper()
	want := map[string]uint32{sock: syscall.S_IFSOCK | 0o600, out: syscall.S_IFREG | 0o600, pins: syscall.S_IFDIR | 0o700}
	filepath.WalkDir(pins, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != pins {
			want[p] = syscall.S_IFREG | 0o600
			if d.IsDir() {
				want[p] = syscall.S_IFDIR | 0o700
			}
		}
		return nil
	})
	if len(want) < 10 {
		t.Errorf("only %d paths pinned and written: %v", len(want), want)
	}
	for p, mode := range want {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Mode != mode || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: mode %o owner %d:%d (%v), want %o root:root", p, st.Mode, st.Uid, st.Gid, err, mode)
		}
	}
}

// bpfIDs are the ids of the BPF objects process pid holds, by kind (map,
// prog, link), read from its file descriptors' fdinfo.
func bpfIDs(t *testing.T, pid int) map[string][]string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fdinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]string{}
	seen := map[string]bool{}
	for _, fd := range fds {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(l, "_id:")
			v = strings.TrimSpace(v)
			if ok && (k == "map" || k == "prog" || k == "link") && !seen[k+v] {
				seen[k+v] = true
				ids[k] = append(ids[k], v)
			}
		}
	}
	return ids
}

// runProbe runs the attempts in this test binary, behind prefix (another
// user), and returns what came of each.
func runProbe(t *testing.T, prefix []string, attempts []string) map[string]string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append(append([]string{}, prefix...), self, "probe"), attempts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return probeResults(t, exec.CommandContext(ctx, argv[0], argv[1:]...), len(attempts))
}

// checkProbe runs the attempts of want, as root in host's network
// namespace, and wants each to come out as want says.
func checkProbe(t *testing.T, who string, host *netlab.Host, want map[string]string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var attempts []string
	for a := range want {
		attempts = append(attempts, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for a, res := range probeResults(t, host.Command(ctx, self, append([]string{"probe"}, attempts...)...), len(attempts)) {
		if res != want[a] {
			t.Errorf("%s: %s: %s, want %s", who, a, res, want[a])
		}
	}
}

func probeResults(t *testing.T, cmd *exec.Cmd, n int) map[string]string {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args[:3], err, out)
	}
	res := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if a, r, ok := strings.Cut(sc.Text(), "\t"); ok {
			res[a] = r
		}
	}
	if len(res) != n {
		t.Fatalf("the probe answered %d of %d attempts:\n%s", len(res), n, out)
	}
	return res
}

// probe makes each attempt it is given, KIND:TARGET, and prints a line
// for each: the attempt, a tab, and what came of it: "ok", an HTTP status
// or the system's word for the error.
func probe(attempts []string) {
	for _, a := range attempts {
		kind, target, _ := strings.Cut(a, ":")
		res := "ok"
		status, err := try(kind, target)
		var errno syscall.Errno
		switch {
		case errors.As(err, &errno):
			res = errno.Error()
		case err != nil:
			res = err.Error()
		case status != 0:
			res = "status " + strconv.Itoa(status)
		}
		fmt.Printf("%s\t%s\n", a, res)
	}
}

// try makes one attempt: connect to a socket (unix, tcp), open a file or
// directory (read), open a pinned BPF object read-only (pin), a BPF object
// by its id (map, prog, link), or an HTTP request with a body (its method:
// GET, POST, ...), which returns the status.
func try(kind, target string) (status int, err error) {
	switch kind {
	case "unix", "tcp":
		c, err := net.DialTimeout(kind, target, 2*time.Second)
		if err == nil {
			c.Close()
		}
		return 0, err
	case "read":
		f, err := os.Open(target)
		if err == nil {
			f.Close()
		}
		return 0, err
	case "pin":
		fd, err := objGet(target)
		if err == nil {
			unix.Close(fd)
		}
		return 0, err
	case "map", "prog", "link":
		id, err := strconv.ParseUint(target, 10, 32)
		if err != nil {
			return 0, err
		}
		var c io.Closer
		switch kind {
		case "map":
			c, err = ebpf.NewMapFromID(ebpf.MapID(id))
		case "prog":
			c, err = ebpf.NewProgramFromID(ebpf.ProgramID(id))
		default:
			c, err = link.NewFromID(link.ID(id))
		}
		if err == nil {
			c.Close()
		}
		return 0, err
	}
	req, err := http.NewRequest(kind, target, strings.NewReader(`{"output":"none"}`))
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// objGet opens the BPF object pinned at path (BPF_OBJ_GET): read-only,
// or, for a link, which takes no flags, read-write.
func objGet(path string) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	var errno syscall.Errno
	for _, flags := range []uint32{unix.BPF_F_RDONLY, 0} {
		attr := struct {
			pathname uint64
			fd       uint32
			flags    uint32
		}{pathname: uint64(uintptr(unsafe.Pointer(p))), flags: flags}
		var fd uintptr
		fd, _, errno = unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		if errno == 0 {
			return int(fd), nil
		}
		if errno != unix.EINVAL {
			break
		}
	}
	runtime.KeepAlive(p)
	return -1, errno
}

// daemonHealth is what the access test compares of GET /v1/health.
type daemonHealth struct {
	Started string `json:"started"`
	Status  string `json:"status"`
	Hooks   []struct {
		Program  string `json:"program"`
		Attached bool   `json:"attached"`
	} `json:"hooks"`
}

// health asks the daemon's API on sock for its health, as root.
func health(t *testing.T, sock string) daemonHealth {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	resp, err := c.Get("http://lattrace/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h daemonHealth
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || len(h.Hooks) == 0 {
		t.Fatalf("health: %v %+v", err, h)
	}
	return h
}
