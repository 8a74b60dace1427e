package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/otelcol"
	"github.com/lattrace/lattrace/tests/workload"
)

// TestRestartAfterKill holds lattrace to its own rule, nothing lost: a
// daemon killed with SIGKILL in the middle of traffic and started again on
// its pinned maps loses no exchange and emits none twice. The programs trace
// on while no daemon runs; exchanges in flight at the kill complete in the
// kernel; the records the killed daemon had read but not written wait in the
// pinned ring buffer for the next one. Every exchange the workload made, on
// both ends, must be in the JSON lines file exactly once, and in the OTLP
// backend once, or twice when the next daemon counted it as possibly
// repeated (an acknowledgement in flight at the kill).
func TestRestartAfterKill(t *testing.T) {
	col := otelcol.Start(t)
	pins := fmt.Sprintf("/sys/fs/bpf/lattrace-e2e-%d", os.Getpid())
	t.Cleanup(func() { run(t, nil, "daemon", "--cleanup", "--pin-path", pins) })
	out := filepath.Join(t.TempDir(), "records.jsonl")
	args := []string{"daemon", "--pin-path", pins, "--output-file", out, "--drain-interval", "50ms",
		"--otlp-endpoint", col.GRPCEndpoint(), "--otlp-insecure", "--span-slow-threshold", "0s", "--span-slow-rate", "-1", "--metrics-addr", ""}

	lab := netlab.NewT(t, netlab.Config{AtoB: netlab.Link{Delay: 5 * time.Millisecond}, BtoA: netlab.Link{Delay: 5 * time.Millisecond}})
	netnsA, netnsB := netnsInode(t, lab.A.Netns), netnsInode(t, lab.B.Netns)
	first, log1 := startDaemon(t, args...)

	// A persistent connection and a connection per request, both paced,
	// for 6 s: the kill and the restart fall in the middle of both.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var srv *workload.Server
	if err := lab.B.Do(func() (err error) {
		srv, err = workload.Listen(workload.ServerConfig{Listen: "[::]:7300"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx)
	addr := netip.AddrPortFrom(lab.B.IPv4, 7300).String()
	var wg sync.WaitGroup
	var made [2][]workload.ClientRecord
	var clientErr [2]error
	for i, mode := range []workload.Mode{workload.ModePersistent, workload.ModePerRequest} {
		interval := 20 * time.Millisecond
		if mode == workload.ModePerRequest {
			interval = 100 * time.Millisecond
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			clientErr[i] = lab.A.Do(func() (err error) {
				made[i], err = workload.RunClient(ctx, workload.ClientConfig{Addr: addr, ReqSize: 300, RespSize: 3000,
					Mode: mode, Interval: interval, Duration: 6 * time.Second})
				return err
			})
		}()
	}

	// Kill the first daemon at a random instant once it has written some
	// of the lab's exchanges, and start the second a second later: the
	// traffic in between has no daemon at all.
	deadline := time.Now().Add(10 * time.Second)
	for countLab(t, out, netnsA, netnsB) < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("the first daemon wrote fewer than 20 of the lab's exchanges in 10 s:\n%s", log1.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	time.Sleep(time.Second)
	second, log2 := startDaemon(t, args...)
	if !strings.Contains(log2.String(), "adopted=true") {
		t.Errorf("the second daemon did not adopt the pinned programs:\n%s", log2.String())
	}
	wg.Wait()
	for i, err := range clientErr {
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	// The last exchange of each connection is closed by its close: let
	// the kernel emit it and the daemon drain it, then stop it cleanly.
	time.Sleep(500 * time.Millisecond)
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("second daemon: %v\n%s", err, log2.String())
	}

	// What the workload made: exchanges per connection, by the client's
	// local port (each connection has its own).
	want := map[uint16]int{}
	total := 0
	for _, recs := range made {
		for _, r := range recs {
			if r.Failed() {
				t.Fatalf("workload exchange %d failed: %s", r.ID, r.Error)
			}
			ap := netip.MustParseAddrPort(r.Local)
			want[ap.Port()]++
			total++
		}
	}
	if total < 200 || len(want) < 30 {
		t.Fatalf("the workload made only %d exchanges on %d connections", total, len(want))
	}

	// JSON lines: each exchange once on each end, none twice.
	got := readLab(t, out, false, netnsA, netnsB)
	for _, side := range []struct {
		name  string
		netns uint32
		role  string
	}{{"requester (A)", netnsA, "requester"}, {"responder (B)", netnsB, "responder"}} {
		per := map[uint16]int{}
		seen := map[string]int{}
		for _, e := range got {
			if e.Flow.Netns != side.netns || e.Role != side.role {
				continue
			}
			seen[fmt.Sprintf("%d/%d/%d", e.Cookie, e.OutSeq, e.InSeq)]++
			port := clientPort(e, side.role)
			per[port]++
		}
		for k, n := range seen {
			if n > 1 {
				t.Errorf("%s: exchange %s written %d times", side.name, k, n)
			}
		}
		for port, n := range want {
			if per[port] != n {
				t.Errorf("%s: connection from port %d: %d exchanges written, the workload made %d", side.name, port, per[port], n)
			}
		}
		if len(per) != len(want) {
			t.Errorf("%s: %d connections written, the workload made %d", side.name, len(per), len(want))
		}
	}

	// OTLP: one exchange span per exchange and end; the trace id names the
	// exchange (both ends share it), so a span sent twice shows as a
	// repeated (trace id, role).
	spans := col.WaitForSpans(t, 2*total, 20*time.Second, func(s otelcol.Span) bool {
		return s.Name == "tcp exchange" && s.Attributes["server.port"] == int64(7300)
	})
	perSpan := map[string]int{}
	perPort := map[string]map[uint16]int{"requester": {}, "responder": {}}
	for _, s := range spans {
		role, _ := s.Attributes["lattrace.role"].(string)
		perSpan[s.TraceID+"/"+role]++
		port, _ := s.Attributes["client.port"].(int64)
		if perPort[role] != nil {
			perPort[role][uint16(port)]++
		}
	}
	// A span may arrive twice only when the kill fell between the
	// backend's taking it and the daemon's storing that it had: the
	// second daemon counts those exchanges (replayed_unsure in its exit
	// line), and the repeats must be within that count.
	unsure := exitCounter(t, log2.String(), "replayed_unsure")
	repeated := 0
	for k, n := range perSpan {
		if n > 2 {
			t.Errorf("span %s arrived %d times", k, n)
		}
		repeated += n - 1
	}
	if repeated > unsure {
		t.Errorf("%d exchange spans arrived twice, the second daemon counted %d exchanges it may have repeated", repeated, unsure)
	}
	for role, per := range perPort {
		for port, n := range want {
			if got := per[port]; got < n || got > n+unsure {
				t.Errorf("OTLP %s spans of the connection from port %d: %d, the workload made %d (%d possibly repeated)", role, port, got, n, unsure)
			}
		}
	}
	t.Logf("%d exchanges on %d connections, each once in JSON lines and in OTLP on both ends (%d spans repeated of %d counted as possibly repeated), across a SIGKILL and a restart",
		total, len(want), repeated, unsure)

	// --cleanup takes the programs out of the kernel.
	code, stdout, stderr := run(t, nil, "daemon", "--cleanup", "--pin-path", pins)
	if code != 0 || !strings.Contains(stdout, "removed") {
		t.Fatalf("--cleanup: exit %d: %s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("%s still there after --cleanup: %v", pins, err)
	}
}

// labExchange is the part of an exchange line the restart test reads.
type labExchange struct {
	Type   string `json:"type"`
	Cookie uint64 `json:"cookie"`
	Role   string `json:"role"`
	Flow   struct {
		Local  string `json:"local"`
		Remote string `json:"remote"`
		Netns  uint32 `json:"netns"`
	} `json:"flow"`
	OutSeq uint32 `json:"out_seq"`
	InSeq  uint32 `json:"in_seq"`
}

// clientPort is the client's port of an exchange's connection: the local
// port on the requester (A, the client), the remote one on the responder.
func clientPort(e labExchange, role string) uint16 {
	a := e.Flow.Local
	if role == "responder" {
		a = e.Flow.Remote
	}
	return netip.MustParseAddrPort(a).Port()
}

// readLab reads the lab's exchanges from a JSON lines file; with live, the
// daemon may be writing its last line, which is then left for later.
func readLab(t *testing.T, path string, live bool, netns ...uint32) []labExchange {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []labExchange
	for len(data) > 0 {
		line, rest, complete := bytes.Cut(data, []byte("\n"))
		data = rest
		if !complete && live {
			break
		}
		var e labExchange
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("%s: a line that is not JSON (a torn write?): %v\n%s", path, err, line)
		}
		if e.Type != "exchange" {
			continue
		}
		for _, n := range netns {
			if e.Flow.Netns == n {
				out = append(out, e)
			}
		}
	}
	return out
}

func countLab(t *testing.T, path string, netns ...uint32) int {
	if _, err := os.Stat(path); err != nil {
		return 0
	}
	return len(readLab(t, path, true, netns...))
}

func netnsInode(t *testing.T, name string) uint32 {
	var st syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+name, &st); err != nil {
		t.Fatalf("netns %s: %v", name, err)
	}
	return uint32(st.Ino)
}

// exitCounter reads a counter from a daemon's exit line ("stopped ...
// name=N").
func exitCounter(t *testing.T, log, name string) int {
	t.Helper()
	m := regexp.MustCompile(`msg="?stopped[^\n]* ` + name + `=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no %s in the daemon's exit line:\n%s", name, log)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
