package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

// Two services behind a 20 ms round trip: slowPort answers after 60 ms of
// think time (its flows are app-dominated), fastPort at once (its flows are
// network-dominated and carry about four times the exchanges per second).
const (
	slowPort = 8080
	fastPort = 9090
)

// liveTraffic runs both services in B and a persistent client of each in A
// until the test ends; it returns the slow service, whose records say how
// long it took.
func liveTraffic(t *testing.T) (slow *workload.Server) {
	t.Helper()
	lab := netlab.NewT(t, netlab.Config{AtoB: netlab.Link{Delay: 10 * time.Millisecond}, BtoA: netlab.Link{Delay: 10 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, port := range []int{slowPort, fastPort} {
		var srv *workload.Server
		if err := lab.B.Do(func() (err error) {
			srv, err = workload.Listen(workload.ServerConfig{Listen: fmt.Sprintf("[::]:%d", port)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() { defer wg.Done(); srv.Serve(ctx) }()
		think := time.Duration(0)
		if port == slowPort {
			think = 60 * time.Millisecond
			slow = srv
		}
		addr := netip.AddrPortFrom(lab.B.IPv4, uint16(port)).String()
		go func() {
			defer wg.Done()
			_ = lab.A.Do(func() error {
				// Ends with the test: its error is the cancellation.
				// Paced, not back to back: a closed loop is a chatty
				// client, a finding of its own.
				_, _ = workload.RunClient(ctx, workload.ClientConfig{Addr: addr, ReqSize: 200, RespSize: 2000, Think: think,
					Interval: 40 * time.Millisecond, Duration: 10 * time.Minute})
				return nil
			})
		}()
	}
	return slow
}

// apiDaemon starts the daemon with its API on a socket of its own.
func apiDaemon(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	startDaemon(t, "daemon", "--output", "none", "--metrics-addr", "", "--api-socket", sock, "--drain-interval", "20ms")
	return sock
}

// flowJSON is the part of GET /v1/flows the tests read.
type flowJSON struct {
	ID       string `json:"id"`
	Dominant string `json:"dominant"`
	Flow     struct {
		Remote string `json:"remote"`
	} `json:"flow"`
	Exchanges int `json:"exchanges"`
	Diagnoses []struct {
		Name  string  `json:"name"`
		Share float64 `json:"share"`
	} `json:"diagnoses"`
}

// waitFlows polls `lattrace flows --json` until both services' flows have
// a few exchanges, and returns them by remote port.
func waitFlows(t *testing.T, sock string) map[int]flowJSON {
	t.Helper()
	var last string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		code, out, stderr := run(t, nil, "flows", "--api", sock, "--json")
		if code != 0 {
			t.Fatalf("flows: exit %d: %s", code, stderr)
		}
		last = out
		var l struct {
			APIVersion string     `json:"api_version"`
			Flows      []flowJSON `json:"flows"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil || l.APIVersion != "v1" {
			t.Fatalf("flows --json: %v\n%s", err, out)
		}
		got := map[int]flowJSON{}
		for _, f := range l.Flows {
			ap, err := netip.ParseAddrPort(f.Flow.Remote)
			if err == nil && f.Exchanges >= 5 && (ap.Port() == slowPort || ap.Port() == fastPort) {
				got[int(ap.Port())] = f
			}
		}
		if len(got) == 2 {
			return got
		}
	}
	t.Fatalf("the two services' flows did not show up with 5 exchanges each:\n%s", last)
	return nil
}

// TestFlowsAndExplain reads the live flows as a script and a person would:
// JSON, the table, and explain's words, with the numbers the lab injected.
func TestFlowsAndExplain(t *testing.T) {
	slowSrv := liveTraffic(t)
	sock := apiDaemon(t)
	flows := waitFlows(t, sock)
	slow, fast := flows[slowPort], flows[fastPort]
	if slow.Dominant != "app" || len(slow.Diagnoses) == 0 || slow.Diagnoses[0].Name != "app_peer" || slow.Diagnoses[0].Share < 0.6 {
		t.Errorf("slow service's flow: %+v, want app-dominated with app_peer explaining ~75 %%", slow)
	}
	if fast.Dominant != "network" || len(fast.Diagnoses) != 0 {
		t.Errorf("fast service's flow: %+v, want network-dominated with no diagnosis", fast)
	}

	code, table, stderr := run(t, nil, "flows", "--api", sock, "--filter", fmt.Sprintf("port:%d", slowPort))
	if code != 0 || !strings.Contains(table, slow.ID) || strings.Contains(table, fast.ID) || strings.Contains(table, "\x1b") {
		t.Errorf("flows table filtered to the slow port: exit %d %s\n%s", code, stderr, table)
	}

	code, out, stderr := run(t, nil, "explain", slow.ID, "--api", sock, "--what-if", "20ms")
	if code != 0 {
		t.Fatalf("explain: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"Flow " + slow.ID, "Most of it is app", "app_peer", "Fix: look at the peer application", "What if the peer were 20 ms further away"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	// The numbers behind the words: the peer's time as the server took it
	// (its sleep of 60 ms, longer on a busy machine: from its read's call
	// to its answer's write) over a 20 ms path.
	var appMs, peerMs, netMs float64
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == "app" {
			fmt.Sscanf(f[1], "%g", &appMs)
		}
		if len(f) > 2 && f[0] == "network" {
			fmt.Sscanf(f[1], "%g", &netMs)
		}
		if m := regexp.MustCompile(`peer ([0-9.]+) ms`).FindStringSubmatch(l); m != nil && f[0] == "app" {
			fmt.Sscanf(m[1], "%g", &peerMs)
		}
	}
	var took float64
	recs := slowSrv.Records()
	for _, r := range recs {
		took += float64(r.RespWriteStartNs-r.LastReadCallNs) / 1e6 / float64(len(recs))
	}
	if math.Abs(peerMs-took) > max(0.1*took, 1) || appMs < peerMs || netMs < 19.5 || netMs > 22 {
		t.Errorf("explain says app %v ms (peer %v ms) and network %v ms; the server took %.1f ms a request over %d, on a 20 ms path:\n%s",
			appMs, peerMs, netMs, took, len(recs), out)
	}
	code, out, _ = run(t, nil, "explain", fast.ID, "--api", sock)
	if code != 0 || !strings.Contains(out, "Nothing stands out") || !strings.Contains(out, "Most of it is network") {
		t.Errorf("explain of the fast flow: exit %d\n%s", code, out)
	}

	code, peers, _ := run(t, nil, "flows", "--api", sock, "--peers", "--json")
	var pl struct {
		Peers []struct {
			ID         string `json:"id"`
			RemotePort int    `json:"remote_port"`
			Dominant   string `json:"dominant"`
		} `json:"peers"`
	}
	if err := json.Unmarshal([]byte(peers), &pl); code != 0 || err != nil {
		t.Fatalf("flows --peers --json: %v", err)
	}
	var pid string
	for _, p := range pl.Peers {
		if p.RemotePort == slowPort {
			pid = p.ID
		}
	}
	code, out, stderr = run(t, nil, "explain", pid, "--api", sock)
	if pid == "" || code != 0 || !strings.Contains(out, "Peer pair "+pid) || !strings.Contains(out, "app_peer") {
		t.Errorf("explain of the slow peer pair %q: exit %d %s\n%s\n%s", pid, code, stderr, out, peers)
	}

	// What a person gets wrong, one line each.
	// Where nobody is listening, in a directory every user may enter.
	noSock := fmt.Sprintf("/tmp/lattrace-e2e-none-%d.sock", os.Getpid())
	for _, c := range []struct {
		name   string
		prefix []string
		env    []string
		args   []string
		code   int
		want   string
	}{
		{"unknown flow", nil, nil, []string{"explain", "999999999", "--api", sock}, 1, "no flow 999999999"},
		{"unknown peer", nil, nil, []string{"explain", "p000000000000", "--api", sock}, 1, "no peer pair p000000000000"},
		{"no daemon", nil, nil, []string{"flows", "--api", noSock}, 1, "no lattrace daemon at " + noSock + ": start one with `sudo lattrace daemon`"},
		{"no daemon for top", nil, nil, []string{"top", "--api", noSock}, 1, "no lattrace daemon at"},
		{"not root", asNobody, nil, []string{"flows", "--api", sock}, 1, "permission denied"},
		{"not root, no daemon, top", asNobody, []string{"LATTRACE_API=" + noSock}, []string{"top", "--once"}, 1, "tracing in-process failed: permission denied: lattrace needs root"},
		{"bad sort", nil, nil, []string{"flows", "--sort", "fastest"}, 2, `--sort "fastest"`},
		{"bad filter", nil, nil, []string{"top", "--filter", "port:http"}, 2, `port "http"`},
		{"bad interval", nil, nil, []string{"top", "--interval", "1ms"}, 2, "--interval"},
		{"no id", nil, nil, []string{"explain"}, 2, "explain what: a flow id, a peer pair id, or --request ID"},
		{"not an id", nil, nil, []string{"explain", "abc", "--api", sock}, 2, `"abc" is neither a flow id`},
		{"unknown filter field", nil, nil, []string{"flows", "--api", sock, "--filter", "foo:bar"}, 2, `unknown filter field "foo"`},
		{"pid on peer pairs", nil, nil, []string{"flows", "--api", sock, "--peers", "--filter", "pid:1"}, 2, "a peer pair has no single process"},
		{"API not loopback", nil, nil, []string{"flows", "--api", "10.1.2.3:80"}, 2, "loopback host:port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runEnv(t, c.env, c.prefix, c.args...)
			if code != c.code {
				t.Errorf("exit status %d, want %d", code, c.code)
			}
			oneLine(t, stderr, c.want)
		})
	}
}

// tmuxSession drives a program in a detached tmux server of the test's
// own, the way a person at a terminal would.
type tmuxSession struct {
	t    *testing.T
	sock string
}

func newTmux(t *testing.T, width, height int, env []string, argv ...string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is needed to test `lattrace top` as a person uses it: make setup installs it")
	}
	s := &tmuxSession{t: t, sock: fmt.Sprintf("lt-e2e-%d-%d", os.Getpid(), time.Now().UnixNano())}
	cmdline := strings.Join(append(append([]string{"env"}, env...), argv...), " ")
	// remain-on-exit keeps the pane after the program exits, so its last
	// words and its exit can be read.
	s.tmux("-f", "/dev/null", "new-session", "-d", "-s", "top", "-x", fmt.Sprint(width), "-y", fmt.Sprint(height), cmdline,
		";", "set-option", "-t", "top", "remain-on-exit", "on")
	t.Cleanup(func() { exec.Command("tmux", "-L", s.sock, "kill-server").Run() })
	return s
}

func (s *tmuxSession) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", s.sock}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v: %s", args, err, out)
	}
	return string(out)
}

func (s *tmuxSession) screen() string { return s.tmux("capture-pane", "-p", "-t", "top") }

func (s *tmuxSession) keys(keys ...string) {
	s.tmux(append([]string{"send-keys", "-t", "top"}, keys...)...)
}

// waitFor polls the screen until ok accepts it.
func (s *tmuxSession) waitFor(what string, ok func(screen string) bool) string {
	s.t.Helper()
	var scr string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if scr = s.screen(); ok(scr) {
			return scr
		}
	}
	s.t.Fatalf("screen never showed %s; last screen:\n%s", what, scr)
	return ""
}

func (s *tmuxSession) dead() bool {
	return strings.TrimSpace(s.tmux("display-message", "-p", "-t", "top", "#{pane_dead}")) == "1"
}

// row returns the line of the screen showing a client's flow to port (the
// remote end, after the arrow; a narrow screen drops the local end), and
// its index. The services' own flows, with port as their local end, do not
// count.
func row(screen string, port int) (string, int) {
	remote := regexp.MustCompile(fmt.Sprintf(`(^|->|\s)\S*:%d(\s|$)`, port))
	for i, l := range strings.Split(screen, "\n") {
		if _, after, ok := strings.Cut(l, "->"); ok {
			l = "->" + after
		}
		if remote.MatchString(l) {
			return strings.Split(screen, "\n")[i], i
		}
	}
	return "", -1
}

func bothRows(screen string) bool {
	_, a := row(screen, slowPort)
	_, b := row(screen, fastPort)
	return a >= 0 && b >= 0
}

// TestTopInTmux drives `lattrace top` against a daemon and live lab
// traffic: the flows appear with their dominant part, and the sort,
// filter, detail, resize and quit keys change the screen as they should.
func TestTopInTmux(t *testing.T) {
	liveTraffic(t)
	sock := apiDaemon(t)
	waitFlows(t, sock)
	s := newTmux(t, 140, 40, nil, lattrace, "top", "--api", sock, "--interval", "500ms")

	scr := s.waitFor("both services' flows", bothRows)
	t.Logf("first screen:\n%s", scr)
	slowRow, _ := row(scr, slowPort)
	fastRow, _ := row(scr, fastPort)
	if !strings.Contains(slowRow, "app") || !strings.Contains(slowRow, "app_peer") || !strings.Contains(fastRow, "network") {
		t.Errorf("dominant parts: slow %q, fast %q", slowRow, fastRow)
	}
	if !strings.Contains(scr, "daemon "+sock) || !strings.Contains(scr, "p99") {
		t.Errorf("header does not say where the data comes from and how it is sorted:\n%s", scr)
	}

	// By p99 the slow service leads; by rate the fast one.
	s.keys("r")
	s.waitFor("the fast service first when sorted by rate", func(scr string) bool {
		_, a := row(scr, slowPort)
		_, b := row(scr, fastPort)
		return b >= 0 && a > b && strings.Contains(scr, "rate")
	})
	s.keys("p")
	s.waitFor("the slow service first when sorted by p99", func(scr string) bool {
		_, a := row(scr, slowPort)
		_, b := row(scr, fastPort)
		return a >= 0 && b > a
	})

	// Filter to the fast service: the slow one's row goes.
	s.keys("/")
	s.keys("-l", fmt.Sprintf("port:%d", fastPort))
	s.keys("Enter")
	scr = s.waitFor("only the fast service after filtering", func(scr string) bool {
		_, a := row(scr, slowPort)
		_, b := row(scr, fastPort)
		return a < 0 && b >= 0
	})
	if !strings.Contains(scr, fmt.Sprintf("port:%d", fastPort)) {
		t.Errorf("the filter is not shown:\n%s", scr)
	}

	// The selected row's detail: its id, recent exchanges and sparklines.
	// The cursor is on the first row, the client's flow or the service's.
	s.keys("Enter")
	s.waitFor("the fast flow's detail", func(scr string) bool {
		return strings.Contains(scr, "flow ") && strings.Contains(scr, fmt.Sprintf(":%d", fastPort)) &&
			strings.Contains(scr, "cwnd") && strings.Contains(scr, "srtt") && strings.Contains(scr, "AGE")
	})
	s.keys("Escape")
	s.waitFor("the list again", func(scr string) bool { _, b := row(scr, fastPort); return b >= 0 && !strings.Contains(scr, "srtt") })

	// 80x24 still shows the row; smaller says so in one line; larger again
	// brings the rows back.
	s.tmux("resize-window", "-t", "top", "-x", "80", "-y", "24")
	scr = s.waitFor("the row at 80x24", func(scr string) bool {
		_, b := row(scr, fastPort)
		return b >= 0 && len(strings.Split(strings.TrimRight(scr, "\n"), "\n")) <= 24
	})
	t.Logf("80x24:\n%s", scr)
	for _, l := range strings.Split(scr, "\n") {
		if n := len([]rune(l)); n > 80 {
			t.Errorf("line of %d columns at 80x24: %q", n, l)
		}
	}
	s.tmux("resize-window", "-t", "top", "-x", "60", "-y", "20")
	scr = s.waitFor("the too-small line", func(scr string) bool { return strings.Contains(scr, "needs at least 80x24") })
	if n := len(strings.Fields(strings.TrimSpace(scr))); strings.Count(strings.TrimSpace(scr), "\n") != 0 || n == 0 {
		t.Errorf("too small terminal: want one line, got:\n%s", scr)
	}
	s.tmux("resize-window", "-t", "top", "-x", "120", "-y", "30")
	s.waitFor("the row after growing back", func(scr string) bool { _, b := row(scr, fastPort); return b >= 0 })

	s.keys("q")
	for deadline := time.Now().Add(5 * time.Second); !s.dead(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("q did not quit:\n%s", s.screen())
		}
	}
}

// TestTopWithoutDaemon: with no daemon, top traces in-process and shows
// the same screen; --once prints one plain table.
func TestTopWithoutDaemon(t *testing.T) {
	liveTraffic(t)
	env := []string{"LATTRACE_API=" + filepath.Join(t.TempDir(), "none.sock")}
	s := newTmux(t, 140, 40, env, lattrace, "top", "--interval", "500ms")
	// The connections predate the tracer: their first exchange is partial,
	// the next ones have their timing.
	scr := s.waitFor("both services' flows, traced in-process, with their dominant part", func(scr string) bool {
		slow, _ := row(scr, slowPort)
		fast, _ := row(scr, fastPort)
		return strings.Contains(slow, "app") && strings.Contains(fast, "net")
	})
	if !strings.Contains(scr, "in-process") {
		t.Errorf("the header does not say the tracer runs in-process:\n%s", scr)
	}
	s.keys("q")
	for deadline := time.Now().Add(10 * time.Second); !s.dead(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("q did not quit the in-process top:\n%s", s.screen())
		}
	}

	cmd := exec.Command(lattrace, "top", "--once", "--interval", "2s", "--filter", fmt.Sprintf("port:%d", slowPort))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("top --once: %v", err)
	}
	if r, _ := row(string(out), slowPort); r == "" || strings.Contains(string(out), "\x1b") {
		t.Errorf("top --once without a terminal: want a plain table with the slow service's flow:\n%s", out)
	}
}
