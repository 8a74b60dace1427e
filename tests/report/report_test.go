// Package report tests `lattrace record` and `lattrace report` the way a
// person uses them: the built binary records real traffic (the workload
// through a netlab path with delay and loss, traced by the real BPF
// programs), draws it, and the page is opened in headless Chromium, looked
// at (a screenshot) and read back (what each chart holds, console errors,
// network requests).
package report

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/lattrace/lattrace/cli/report"
	"github.com/lattrace/lattrace/exporters/recording"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/bench"
	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

var lattrace string // the binary under test

func TestMain(m *testing.M) {
	bench.RunWithLattrace(m, "lattrace-report-", &lattrace)
}

const port = 7000

func netnsInode(t *testing.T, name string) uint32 {
	var st syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+name, &st); err != nil {
		t.Fatalf("netns %s: %v", name, err)
	}
	return uint32(st.Ino)
}

// TestReportOfNetlabRun records a netlab run (20 ms RTT, 2 % loss on the
// requests' way, 5 ms of server think time; one persistent client and one
// that opens a connection per request), reports it, and looks at the page
// in Chromium.
func TestReportOfNetlabRun(t *testing.T) {
	lab := netlab.NewT(t, netlab.Config{
		AtoB: netlab.Link{Delay: 10 * time.Millisecond, Loss: 0.02},
		BtoA: netlab.Link{Delay: 10 * time.Millisecond},
	})
	netnsA, netnsB := netnsInode(t, lab.A.Netns), netnsInode(t, lab.B.Netns)
	dir := t.TempDir()
	rec := filepath.Join(dir, "run.lattrace")
	page := filepath.Join(dir, "report.html")

	recorder := startRecorder(t, "record", "--duration", "2m", "--out", rec, "--sample-interval", "5ms", "--drain-interval", "20ms")

	var srv *workload.Server
	if err := lab.B.Do(func() (err error) {
		srv, err = workload.Listen(workload.ServerConfig{Listen: fmt.Sprintf("[::]:%d", port), DefaultThink: 5 * time.Millisecond})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { srv.Serve(ctx); close(served) }()
	defer func() { cancel(); <-served }()
	addr := netip.AddrPortFrom(lab.B.IPv4, port).String()
	for _, cfg := range []workload.ClientConfig{
		{Addr: addr, ReqSize: 20_000, RespSize: 1000, Interval: 30 * time.Millisecond, Count: 150, Mode: workload.ModePersistent},
		{Addr: addr, ReqSize: 200, RespSize: 1000, Interval: 30 * time.Millisecond, Count: 20, Mode: workload.ModePerRequest},
	} {
		if err := lab.A.Do(func() error {
			_, err := workload.RunClient(context.Background(), cfg)
			return err
		}); err != nil {
			t.Fatalf("client: %v", err)
		}
	}
	time.Sleep(500 * time.Millisecond) // the last closes reach the recorder
	stderr := recorder.stop(t)
	if !strings.Contains(stderr, "recorded ") {
		t.Fatalf("record said:\n%s", stderr)
	}

	out, err := exec.Command(lattrace, "report", rec, "-o", page, "--max-pairs", "100").CombinedOutput()
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))

	want := expectations(t, rec, netnsA, netnsB)
	if want[record.RoleClient].exchanges < 150 || want[record.RoleServer].exchanges < 150 {
		t.Fatalf("the recording holds %d client and %d server exchanges of the lab, want at least 150 each",
			want[record.RoleClient].exchanges, want[record.RoleServer].exchanges)
	}
	if want[record.RoleClient].retransmitted == 0 {
		t.Fatal("2 % loss on 20 KB requests: no exchange retransmitted")
	}
	seen := look(t, page, filepath.Join(shotDir(t), "netlab-report.png"))

	for side, w := range want {
		netns := netnsA
		if side == record.RoleServer {
			netns = netnsB
		}
		t.Run(string(side), func(t *testing.T) { check(t, seen, w, netns, side) })
	}
}

// recorder is `lattrace record` running.
type recorder struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

func startRecorder(t *testing.T, args ...string) *recorder {
	t.Helper()
	cmd := exec.Command(lattrace, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &recorder{cmd, &stderr}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "recording for") {
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("record did not start:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r
}

// stop ends the recording early, as Ctrl-C would.
func (r *recorder) stop(t *testing.T) string {
	t.Helper()
	r.cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("record: %v\n%s", err, r.stderr.String())
		}
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		t.Fatalf("record did not stop on SIGINT:\n%s", r.stderr.String())
	}
	return r.stderr.String()
}

// shotDir keeps screenshots where a person can open them after the run
// ($LATTRACE_SCREENSHOTS, default a directory under the system's temp).
func shotDir(t *testing.T) string {
	dir := os.Getenv("LATTRACE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "lattrace-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// expected is what one lab pair's charts must hold, computed from the
// recording itself, independently of the report's code.
type expected struct {
	exchanges     int
	p50, p99, max float64
	components    []string // those that occur, in stacking order
	retransmitted int      // exchanges with retransmissions
	srtt, path    int      // exchanges carrying an srtt / a path RTT
	distinct      int      // distinct durations (the app CDF's points)
	exchangeDx    int      // distinct diagnosis names given to exchanges
	pairDx        int      // findings stored for the pair
	flowDx        int      // findings of its connections the pair's do not say
	sampledFlows  int      // flows with RTT/cwnd samples
	retransSample bool     // a sample with retransmissions exists
}

func expectations(t *testing.T, path string, netnsA, netnsB uint32) map[record.Role]*expected {
	t.Helper()
	out := map[record.Role]*expected{record.RoleClient: {}, record.RoleServer: {}}
	durs := map[record.Role][]float64{}
	comps := map[record.Role][8]bool{}
	distinct := map[record.Role]map[float32]bool{record.RoleClient: {}, record.RoleServer: {}}
	dx := map[record.Role]map[record.DiagnosisName]bool{record.RoleClient: {}, record.RoleServer: {}}
	sampled := map[record.Role]map[uint64]bool{record.RoleClient: {}, record.RoleServer: {}}
	flowDx := map[record.Role]map[record.DiagnosisName]bool{record.RoleClient: {}, record.RoleServer: {}}
	pairDx := map[record.Role][]record.DiagnosisName{}
	side := func(f record.Flow) (record.Role, bool) {
		switch {
		case f.Netns == netnsA && f.Remote.Port() == port:
			return record.RoleClient, true
		case f.Netns == netnsB && f.Local.Port() == port:
			return record.RoleServer, true
		}
		return "", false
	}
	_, _, err := recording.ReadFile(path, recording.Handler{
		Exchange: func(e *record.Exchange) {
			s, ok := side(e.Flow)
			if !ok {
				return
			}
			w := out[s]
			w.exchanges++
			d := float64(float32(float64(e.Duration) / 1e6))
			durs[s] = append(durs[s], d)
			distinct[s][float32(d)] = true
			c := e.Components
			occ := comps[s]
			for i, v := range []time.Duration{c.Network, c.SendWait, c.LossRecovery, c.Handshake, c.Receive, c.Peer, c.LocalRead, c.Think} {
				occ[i] = occ[i] || v > 0
			}
			comps[s] = occ
			if e.Retransmits > 0 {
				w.retransmitted++
			}
			if e.SRTT > 0 {
				w.srtt++
			}
			if e.PathRTT > 0 || e.MinRTT > 0 {
				w.path++
			}
			for _, d := range e.Diagnoses {
				dx[s][d.Name] = true
			}
		},
		Sample: func(x *recording.Sample) {
			if s, ok := side(x.Flow); ok {
				sampled[s][x.Cookie] = true
				out[s].retransSample = out[s].retransSample || x.Retransmits > 0
			}
		},
		Diagnoses: func(d *recording.Diagnoses) {
			if d.Scope == recording.ScopeFlow {
				if s, ok := side(d.Flow.Flow); ok {
					for _, x := range d.Diagnoses {
						flowDx[s][x.Name] = true
					}
				}
				return
			}
			for s, netns := range map[record.Role]uint32{record.RoleClient: netnsA, record.RoleServer: netnsB} {
				if d.Peer.Netns == netns && (d.Peer.RemotePort == port || d.Peer.LocalPort == port) {
					out[s].pairDx = len(d.Diagnoses)
					for _, x := range d.Diagnoses {
						pairDx[s] = append(pairDx[s], x.Name)
					}
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for s, w := range out {
		v := durs[s]
		slices.Sort(v)
		if len(v) > 0 {
			w.p50, w.p99, w.max = v[int(math.Ceil(0.5*float64(len(v))))-1], v[int(math.Ceil(0.99*float64(len(v))))-1], v[len(v)-1]
		}
		for i, c := range report.Components {
			if comps[s][i] {
				w.components = append(w.components, c.Name)
			}
		}
		w.distinct = len(distinct[s])
		w.exchangeDx = len(dx[s])
		w.sampledFlows = len(sampled[s])
		for name := range flowDx[s] {
			if !slices.Contains(pairDx[s], name) {
				w.flowDx++
			}
		}
	}
	return out
}

// seen is what the browser showed.
type seen struct {
	Charts []struct {
		Pair   int          `json:"pair"`
		Kind   string       `json:"kind"`
		Series []seenSeries `json:"series"`
	} `json:"charts"`
	Rows     []seenRow `json:"rows"`
	Sections []struct {
		Pair   int            `json:"pair"`
		Netns  uint32         `json:"netns"`
		Side   string         `json:"side"`
		Scopes map[string]int `json:"scopes"`
	} `json:"sections"`
	Boxes map[string][][]float64 `json:"boxes"` // "pair/kind": [min,q1,med,q3,max] per box
	// Errors the page's own script caught.
	Errors []string `json:"errors"`
}

type seenSeries struct {
	Name   string  `json:"name"`
	Type   string  `json:"type"`
	Points int     `json:"points"`
	Total  float64 `json:"total"` // bars only
}

type seenRow struct {
	Netns     uint32            `json:"netns"`
	Side      string            `json:"side"`
	Exchanges int               `json:"exchanges"`
	Ms        map[string]string `json:"ms"`
}

// look opens the page in headless Chromium, saves a screenshot and reads
// back what it shows; any console error, uncaught exception or network
// request fails the test.
func look(t *testing.T, page, shot string) seen {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // root in a container: Chromium's sandbox needs user namespaces it may not get
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	var problems, requests []string
	note := func(list *[]string, s string) {
		mu.Lock()
		*list = append(*list, s)
		mu.Unlock()
	}
	// Listen starts the browser; chromedp enables the runtime and network
	// events of the tab itself.
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, a.Description+string(a.Value))
				}
				note(&problems, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			note(&problems, "exception: "+msg)
		case *network.EventRequestWillBeSent:
			if !strings.HasPrefix(ev.Request.URL, "file://") {
				note(&requests, ev.Request.URL)
			}
		}
	}); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+page)); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`window.lattraceReport && window.lattraceReport.ready`, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		t.Fatalf("the page never finished drawing: %v", err)
	}
	s, err := chromedp.Run(ctx, chromedp.Evaluate[seen](`({
			charts: lattraceReport.describe(),
			errors: lattraceReport.errors,
			rows: [...document.querySelectorAll("table.summary tbody tr")].map((tr) => ({
				netns: Number(tr.dataset.netns), side: tr.dataset.side,
				exchanges: Number(tr.querySelector("[data-col=exchanges]").textContent),
				ms: Object.fromEntries([...tr.querySelectorAll("[data-ms]")].map((td) => [td.dataset.col, td.dataset.ms])),
			})),
			sections: [...document.querySelectorAll("section.pair")].map((s) => ({
				pair: Number(s.dataset.pair), netns: Number(s.dataset.netns), side: s.dataset.side,
				scopes: [...s.querySelectorAll("table.diagnoses tbody tr")].reduce((m, tr) => (m[tr.dataset.scope] = (m[tr.dataset.scope] || 0) + 1, m), {}),
			})),
			boxes: Object.fromEntries(lattraceReport.charts.filter((c) => c.kind.endsWith("box")).map((c) =>
				[c.pair + "/" + c.kind, c.chart.getOption().series[0].data.map((d) => d.value)])),
		})`))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	t.Logf("page drawn and read in %v", time.Since(start).Round(time.Millisecond))
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d KB)", shot, len(png)/1024)
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 || len(s.Errors) > 0 {
		t.Errorf("the page reported problems: %q %q", problems, s.Errors)
	}
	if len(requests) > 0 {
		t.Errorf("the page went to the network: %q", requests)
	}
	return s
}

// chromium is Debian's browser (make test installs it).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: `make test` installs Debian's chromium package (or apt-get install chromium)")
	return ""
}

// check compares one lab pair's table row, charts and diagnoses with
// what the recording holds, and its RTTs with the lab's.
func check(t *testing.T, s seen, w *expected, netns uint32, side record.Role) {
	row := slices.IndexFunc(s.Rows, func(r seenRow) bool { return r.Netns == netns && r.Side == string(side) })
	if row < 0 {
		t.Fatalf("no summary row for netns %d %s", netns, side)
	}
	r := s.Rows[row]
	if r.Exchanges != w.exchanges {
		t.Errorf("summary: %d exchanges, the recording holds %d", r.Exchanges, w.exchanges)
	}
	for col, v := range map[string]float64{"p50": w.p50, "p99": w.p99, "max": w.max} {
		var got float64
		fmt.Sscan(r.Ms[col], &got)
		if math.Abs(got-v) > 1e-3 {
			t.Errorf("summary %s: %v ms, the recording says %v ms", col, got, v)
		}
	}
	sec := -1
	for _, x := range s.Sections {
		if x.Netns == netns && x.Side == string(side) {
			sec = x.Pair
			if x.Scopes["exchange"] != w.exchangeDx || x.Scopes["pair"] != w.pairDx || x.Scopes["flow"] != w.flowDx {
				t.Errorf("diagnoses table: %v rows by scope, want %d for the pair, %d for connections and %d for exchanges", x.Scopes, w.pairDx, w.flowDx, w.exchangeDx)
			}
		}
	}
	if sec < 0 {
		t.Fatalf("no charts for netns %d %s", netns, side)
	}
	series := map[string][]seenSeries{}
	for _, c := range s.Charts {
		if c.Pair == sec {
			series[c.Kind] = c.Series
		}
	}
	kinds := []string{"timeline", "layers", "layer-box", "cdf", "component-box", "turns", "cwnd"}
	for _, k := range kinds {
		if len(series[k]) == 0 {
			t.Errorf("chart %s missing or empty", k)
		}
	}
	// Fewer exchanges than the points bound: every one is drawn.
	tl := series["timeline"]
	var names []string
	for _, x := range tl {
		if x.Type == "line" {
			names = append(names, x.Name)
			if x.Points != w.exchanges {
				t.Errorf("timeline %s: %d points, want %d", x.Name, x.Points, w.exchanges)
			}
		}
	}
	if !slices.Equal(names, w.components) {
		t.Errorf("timeline stacks %v, the recording's exchanges have %v", names, w.components)
	}
	if last := tl[len(tl)-1]; last.Name != "retransmissions" || last.Points != w.retransmitted {
		t.Errorf("timeline markers %+v, want %d retransmitted exchanges", last, w.retransmitted)
	}
	ly := series["layers"]
	if len(ly) != 3 || ly[0].Points != w.exchanges || ly[1].Points != w.srtt || ly[2].Points != w.path {
		t.Errorf("layers %+v, want app %d, TCP %d, network %d points", ly, w.exchanges, w.srtt, w.path)
	}
	cdf := series["cdf"]
	if len(cdf) != 3 || cdf[0].Points != w.distinct {
		t.Errorf("cdf %+v, want 3 lines, the app one with %d points (distinct durations)", cdf, w.distinct)
	}
	if lb := series["layer-box"]; len(lb) != 2 || lb[0].Type != "boxplot" || lb[0].Points != 3 || lb[1].Points != 3 {
		t.Errorf("layer boxes %+v", lb)
	}
	if cb := series["component-box"]; len(cb) != 2 || cb[0].Points != len(w.components) {
		t.Errorf("component boxes %+v, want %d", cb, len(w.components))
	}
	if tu := series["turns"]; len(tu) != 1 || int(tu[0].Total) != w.exchanges {
		t.Errorf("turns %+v: want a histogram of %d exchanges", tu, w.exchanges)
	}
	cw := series["cwnd"]
	flows := min(w.sampledFlows, report.DefaultFlowsPerPair)
	if len(cw) != 2*flows+1 || cw[0].Points == 0 {
		t.Errorf("cwnd: %d series (first %+v), want cwnd and srtt of %d flows and the markers", len(cw), cw[0], flows)
	}
	if w.retransSample && side == record.RoleClient && cw[len(cw)-1].Points == 0 {
		t.Error("cwnd: the client retransmitted but no marker is drawn")
	}
	// The lab's truth: a 20 ms round trip, 5 ms of think time.
	box := s.Boxes[fmt.Sprintf("%d/layer-box", sec)]
	if len(box) != 3 {
		t.Fatalf("layer boxes %v", box)
	}
	if net := box[2][2]; net < 19 || net > 30 {
		t.Errorf("network RTT median %.1f ms, the lab's round trip is 20 ms", net)
	}
	if side == record.RoleClient {
		if app := box[0][2]; app < box[2][2]+5 {
			t.Errorf("app RTT median %.1f ms: less than the network's %.1f ms plus 5 ms of think time", app, box[2][2])
		}
	}
}

// Bad input is one line and an exit status, never a page.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	notRec := filepath.Join(dir, "notes.txt")
	os.WriteFile(notRec, []byte("hello\n"), 0o644)
	good := filepath.Join(dir, "empty.lattrace")
	f, _ := os.Create(good)
	w, err := recording.NewWriter(f, recording.Header{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close(recording.End{})
	f.Close()
	cut := filepath.Join(dir, "cut.lattrace")
	b, _ := os.ReadFile(good)
	os.WriteFile(cut, b[:len(b)-10], 0o644)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing file", []string{"report", filepath.Join(dir, "nope.lattrace")}, 1, "no such file"},
		{"not a recording", []string{"report", notRec}, 1, "not a lattrace recording"},
		{"truncated", []string{"report", cut}, 1, "cut short"},
		{"unwritable output", []string{"report", good, "-o", "/proc/lattrace.html"}, 1, "-o /proc/lattrace.html"},
		{"no argument", []string{"report"}, 2, "accepts 1 arg"},
		{"bad points", []string{"report", good, "--points", "1"}, 2, "--points"},
		{"record without --out", []string{"record"}, 2, "--out FILE is required"},
		{"record bad duration", []string{"record", "--out", filepath.Join(dir, "x"), "--duration", "0s"}, 2, "--duration"},
		{"record unwritable", []string{"record", "--out", "/proc/x.lattrace"}, 1, "--out"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(lattrace, c.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if code != c.code || len(lines) != 1 || !strings.HasPrefix(lines[0], "lattrace: ") || !strings.Contains(lines[0], c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and one line with %q", code, stderr.String(), c.code, c.want)
			}
		})
	}
	// An empty recording still makes a page, saying nothing was seen.
	page := filepath.Join(dir, "empty.html")
	if out, err := exec.Command(lattrace, "report", good, "-o", page).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if b, _ := os.ReadFile(page); !bytes.Contains(b, []byte("No exchange was recorded")) {
		t.Error("the empty recording's page does not say it is empty")
	}
	// Without privilege: the tracer's own line, and no file left behind.
	open, err := os.MkdirTemp("", "lattrace-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(open)
	os.Chmod(open, 0o777) // nobody may write there: the refusal must be the tracer's
	unpriv := filepath.Join(open, "unpriv.lattrace")
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", lattrace, "record", "--out", unpriv)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "lattrace needs root") {
		t.Errorf("unprivileged record: %v, %q", err, stderr.String())
	}
	if _, err := os.Stat(unpriv); err == nil {
		t.Error("a refused record left its file behind")
	}
}
