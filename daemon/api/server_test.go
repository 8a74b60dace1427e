package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

const ms = time.Millisecond

// exchange makes one requester exchange of a client connection: network
// and peer think time as given, everything else zero.
func exchange(cookie uint64, local, remote, comm string, t record.Mono, network, peer time.Duration) *record.Exchange {
	e := &record.Exchange{
		Time:     t,
		Cookie:   cookie,
		Flow:     record.Flow{Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(remote), Netns: 4026531840},
		Owner:    record.Owner{PID: 100 + uint32(cookie), TID: 100 + uint32(cookie), CgroupID: 1, Comm: comm},
		Role:     record.Requester,
		ConnRole: record.RoleClient,
		Start:    t - record.Mono(network+peer),
		End:      t,
		Duration: network + peer,
		Turns:    2,
		MinRTT:   network,
		SRTT:     network,
		CwndEnd:  10,
	}
	e.Components.Network, e.Components.Propagation, e.Components.Peer = network, network, peer
	return e
}

// fixture serves three flows: curl to a slow app (80 ms think over 20 ms),
// wget to a far but immediate one (60 ms), and an IPv6 flow.
func fixture(t testing.TB) (*Server, http.Handler) {
	t.Helper()
	agg := aggregate.New(aggregate.Config{})
	hist := history.New(history.Config{})
	now := record.Now()
	for i := range 10 {
		at := now - record.Mono(time.Duration(10-i)*100*ms)
		for _, e := range []*record.Exchange{
			exchange(1, "10.0.0.1:40000", "10.0.0.2:8080", "curl", at, 20*ms, 80*ms),
			exchange(2, "10.0.0.1:40001", "10.0.0.3:9090", "wget", at, 60*ms, 100*time.Microsecond),
		} {
			agg.AddExchange(e)
			hist.Add(e)
		}
		if i%2 == 0 {
			e := exchange(3, "[fd00::1]:40002", "[fd00::2]:443", "curl", at, time.Millisecond, 0)
			agg.AddExchange(e)
			hist.Add(e)
		}
	}
	s := NewServer(agg, hist, func() Health { return Health{Version: "test", Status: "ok"} }, nil, nil)
	return s, s.Handler()
}

func get(t *testing.T, h http.Handler, method, path string) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: content type %q", method, path, ct)
	}
	return rec.Code, rec.Body.Bytes()
}

func TestFlowsListFilterSort(t *testing.T) {
	_, h := fixture(t)
	code, body := get(t, h, "GET", "/v1/flows")
	var l FlowList
	if err := json.Unmarshal(body, &l); code != 200 || err != nil {
		t.Fatalf("%d %v %s", code, err, body)
	}
	if l.APIVersion != Version || l.Total != 3 || len(l.Flows) != 3 {
		t.Fatalf("list %+v", l)
	}
	// Default order is p99, slowest first: curl (100 ms), wget (60 ms), v6.
	if l.Flows[0].ID != "1" || l.Flows[1].ID != "2" || l.Flows[2].ID != "3" {
		t.Errorf("order %s %s %s", l.Flows[0].ID, l.Flows[1].ID, l.Flows[2].ID)
	}
	f := l.Flows[0]
	if f.Dominant != "app" || len(f.Diagnoses) == 0 || f.Diagnoses[0].Name != diagnose.PeerThink || f.PeerID == "" {
		t.Errorf("curl flow: dominant %q diagnoses %+v peer %q", f.Dominant, f.Diagnoses, f.PeerID)
	}
	if d := f.Split; d.Network != 20*ms || d.App != 80*ms {
		t.Errorf("split %+v", d)
	}
	if f.Rate <= 0 {
		t.Errorf("rate %v", f.Rate)
	}
	if l.Flows[1].Dominant != "network" {
		t.Errorf("wget dominant %q", l.Flows[1].Dominant)
	}

	for _, c := range []struct {
		query string
		want  []string
	}{
		{"?port=9090", []string{"2"}},
		{"?comm=cur", []string{"1", "3"}},
		{"?addr=fd00::/64", []string{"3"}},
		{"?addr=10.0.0.2", []string{"1"}},
		{"?q=10.0.0.3", []string{"2"}},
		{"?pid=102", []string{"2"}},
		{"?netns=1", nil},
		{"?sort=exchanges", []string{"1", "2", "3"}},
		{"?sort=p50&limit=1", []string{"1"}},
	} {
		code, body := get(t, h, "GET", "/v1/flows"+c.query)
		var l FlowList
		if err := json.Unmarshal(body, &l); code != 200 || err != nil {
			t.Fatalf("%s: %d %v", c.query, code, err)
		}
		var ids []string
		for _, f := range l.Flows {
			ids = append(ids, f.ID)
		}
		if strings.Join(ids, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: ids %v, want %v", c.query, ids, c.want)
		}
	}
}

func TestFlowAndPeerDetail(t *testing.T) {
	_, h := fixture(t)
	code, body := get(t, h, "GET", "/v1/flows/1")
	var d FlowDetail
	if err := json.Unmarshal(body, &d); code != 200 || err != nil {
		t.Fatalf("%d %v", code, err)
	}
	// Nothing to say is an empty list, not null.
	if _, b := get(t, h, "GET", "/v1/flows/2"); !strings.Contains(string(b), `"diagnoses":[]`) {
		t.Errorf("no diagnoses is not an empty list: %s", b)
	}
	if d.Flow.ID != "1" || len(d.Recent) != 10 || d.Recent[0].Time >= d.Recent[9].Time || d.Recent[9].CwndEnd != 10 {
		t.Errorf("detail: id %s, %d recent", d.Flow.ID, len(d.Recent))
	}

	code, body = get(t, h, "GET", "/v1/peers?comm=curl&sort=p99")
	var pl PeerList
	if err := json.Unmarshal(body, &pl); code != 200 || err != nil || pl.Total != 2 {
		t.Fatalf("%d %v %s", code, err, body)
	}
	p := pl.Peers[0]
	if p.RemotePort != 8080 || p.Dominant != "app" || p.Rate <= 0 || !strings.HasPrefix(p.ID, "p") {
		t.Errorf("peer %+v", p)
	}
	code, body = get(t, h, "GET", "/v1/peers/"+p.ID)
	var pd PeerDetail
	if err := json.Unmarshal(body, &pd); code != 200 || err != nil || len(pd.Flows) != 1 || pd.Flows[0].ID != "1" {
		t.Errorf("peer detail %d %v %s", code, err, body)
	}
}

func TestBadRequestsGet4xxWithMessage(t *testing.T) {
	_, h := fixture(t)
	for _, c := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"GET", "/v1/flows?sort=fastest", 400, `sort "fastest"`},
		{"GET", "/v1/flows?port=99999", 400, `port "99999"`},
		{"GET", "/v1/flows?limit=-1", 400, `limit "-1"`},
		{"GET", "/v1/flows?addr=nowhere", 400, `addr "nowhere"`},
		{"GET", "/v1/flows?colour=red", 400, `unknown parameter "colour"`},
		{"GET", "/v1/flows?port=1&port=2", 400, `given 2 times`},
		{"GET", "/v1/peers?pid=x", 400, `pid "x"`},
		{"GET", "/v1/flows/abc", 400, `flow id "abc" is not a number`},
		{"GET", "/v1/flows/999", 404, "no flow 999"},
		{"GET", "/v1/peers/p000000000000", 404, "no peer pair p000000000000"},
		{"GET", "/v2/flows", 404, "no endpoint GET /v2/flows"},
		{"POST", "/v1/flows", 405, "method POST not allowed"},
		{"DELETE", "/v1/flows/1", 405, "read-only"},
	} {
		code, body := get(t, h, c.method, c.path)
		var e Error
		if err := json.Unmarshal(body, &e); err != nil || code != c.code || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.method, c.path, code, body, c.code, c.want)
		}
	}
}

func TestHealth(t *testing.T) {
	_, h := fixture(t)
	code, body := get(t, h, "GET", "/v1/health")
	var hl Health
	if err := json.Unmarshal(body, &hl); code != 200 || err != nil || hl.APIVersion != Version || hl.Status != "ok" {
		t.Errorf("%d %v %s", code, err, body)
	}
}

func TestParseFilterRoundTrip(t *testing.T) {
	f, err := ParseFilter("comm:nginx port:443 addr:10.0.0.0/8 netns:4026531840 pid:7 container:3fa ::1 free")
	if err != nil {
		t.Fatal(err)
	}
	if f.Comm != "nginx" || f.Port != 443 || f.Addr.String() != "10.0.0.0/8" || f.Netns != 4026531840 || f.PID != 7 ||
		f.Container != "3fa" || f.Text != "::1 free" {
		t.Errorf("%+v", f)
	}
	g, err := ParseFilter(f.String())
	if err != nil || g != f {
		t.Errorf("round trip %+v %v", g, err)
	}
	q, err := ParseQuery(Query{Sort: "rate", Limit: 5, Filter: f}.Values())
	if err != nil || q.Filter != f || q.Sort != "rate" || q.Limit != 5 {
		t.Errorf("query round trip %+v %v", q, err)
	}
	for _, bad := range []string{"port:http", "foo:bar", "colour:red"} {
		if _, err := ParseFilter(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, text := range []string{"dead::beef", "fe80::1", "10.0.0.1:80", "[::1]:443", "::1"} {
		if f, err := ParseFilter(text); err != nil || f.Text != text {
			t.Errorf("%q: %+v %v", text, f, err)
		}
	}
}

// TestSocket serves over a real Unix socket: mode 0600, a client gets the
// list, a second listener is refused, a stale socket file is replaced, and
// the client tells "no daemon" apart.
func TestSocket(t *testing.T) {
	s, _ := fixture(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "api.sock")
	ls, err := Listen(path, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ls)
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v %v", fi.Mode(), err)
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o700 {
		t.Errorf("socket directory mode %v", di.Mode())
	}
	for _, target := range []string{path, "unix:" + path, ls[1].Addr().String()} {
		c, err := NewClient(target)
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.Flows(context.Background(), Query{Filter: Filter{Port: 8080}})
		if err != nil || len(l.Flows) != 1 {
			t.Errorf("%s: %v %+v", target, err, l)
		}
		if _, err := c.Flow(context.Background(), "42"); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: unknown flow: %v", target, err)
		}
	}
	if _, err := Listen(path, ""); err == nil || !strings.Contains(err.Error(), "another lattrace daemon") {
		t.Errorf("second daemon: %v", err)
	}
	if _, err := Listen("", "0.0.0.0:0"); err == nil || !strings.Contains(err.Error(), "not loopback") {
		t.Errorf("non-loopback: %v", err)
	}

	// A socket left by a killed daemon: nobody answers, so it is replaced.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ls2, err := Listen(stale, "")
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	ls2[0].Close()

	c, _ := NewClient(filepath.Join(dir, "none.sock"))
	if _, err := c.Health(context.Background()); !errors.Is(err, ErrNoDaemon) {
		t.Errorf("no daemon: %v", err)
	}
	for _, bad := range []string{"ftp://x", "10.1.2.3:80", "example.com:80", "foo"} {
		if _, err := NewClient(bad); err == nil {
			t.Errorf("target %q accepted", bad)
		}
	}
	// Something else on a loopback port: said so, not "not found".
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	oc, err := NewClient(other.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oc.Flows(context.Background(), Query{}); err == nil || !strings.Contains(err.Error(), "not as a lattrace API") {
		t.Errorf("another service: %v", err)
	}
}

// A flow waiting in a bloated queue names the flow that moved data in bulk
// at the same time.
func TestBufferbloatNamesBulkSenders(t *testing.T) {
	agg := aggregate.New(aggregate.Config{})
	hist := history.New(history.Config{})
	now := record.Now()
	for i := range 5 {
		at := now - record.Mono(time.Duration(5-i)*200*ms)
		e := exchange(1, "10.0.0.1:40000", "10.0.0.2:8080", "curl", at, 180*ms, 0)
		e.Components.Propagation, e.Components.Queueing = 20*ms, 160*ms
		agg.AddExchange(e)
	}
	bulk := exchange(2, "10.0.0.1:40001", "10.0.0.9:5201", "iperf3", now, 2*time.Second, 0)
	bulk.BytesOut = 50 << 20
	agg.AddExchange(bulk)
	s := NewServer(agg, hist, func() Health { return Health{} }, nil, nil)
	code, body := get(t, s.Handler(), "GET", "/v1/flows/1")
	var d FlowDetail
	if err := json.Unmarshal(body, &d); code != 200 || err != nil {
		t.Fatalf("%d %v", code, err)
	}
	ds := d.Flow.Diagnoses
	if len(ds) == 0 || ds[0].Name != diagnose.Bufferbloat || len(ds[0].Related) != 1 || !strings.Contains(ds[0].Related[0], "flow 2: iperf3") {
		t.Errorf("diagnoses %+v", ds)
	}
}

// A transfer still running has no record yet: the list shows it from the
// kernel's view, with its owner and bytes so far; a known flow gets its
// exchange in progress attached.
func TestInFlightInTheList(t *testing.T) {
	agg := aggregate.New(aggregate.Config{})
	agg.AddExchange(exchange(1, "10.0.0.1:40000", "10.0.0.2:8080", "curl", record.Now(), 20*ms, 0))
	now := record.Now()
	ins := []record.InFlight{
		{Cookie: 1, Role: record.Requester, Start: now, BytesOut: 10},
		{Cookie: 9, Flow: record.Flow{Local: netip.MustParseAddrPort("10.0.0.1:40009"), Remote: netip.MustParseAddrPort("10.0.0.9:5201")},
			Owner: record.Owner{PID: 77, Comm: "iperf3"}, Role: record.Requester, Start: now, BytesOut: 300 << 20},
		{Cookie: 10, Owner: record.Owner{PID: 78, Comm: "idle"}}, // nothing in progress
	}
	s := NewServer(agg, history.New(history.Config{}), func() Health { return Health{} }, func() []record.InFlight { return ins }, nil)
	_, body := get(t, s.Handler(), "GET", "/v1/flows")
	var l FlowList
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatal(err)
	}
	got := map[string]Flow{}
	for _, f := range l.Flows {
		got[f.ID] = f
	}
	if len(got) != 2 || got["1"].InFlight == nil || got["1"].InFlight.BytesOut != 10 {
		t.Fatalf("flows %+v", got)
	}
	if b := got["9"]; b.Owner.Comm != "iperf3" || b.InFlight == nil || b.InFlight.BytesOut != 300<<20 || b.Exchanges != 0 {
		t.Errorf("running transfer %+v", b)
	}
	if _, b := get(t, s.Handler(), "GET", "/v1/flows/9"); !strings.Contains(string(b), `"in_flight"`) {
		t.Errorf("detail of the running transfer: %s", b)
	}
}

// The bulk sender behind a bufferbloat is often still sending: its bytes
// so far count.
func TestBufferbloatNamesARunningTransfer(t *testing.T) {
	agg := aggregate.New(aggregate.Config{})
	now := record.Now()
	for i := range 5 {
		e := exchange(1, "10.0.0.1:40000", "10.0.0.2:8080", "curl", now-record.Mono(time.Duration(5-i)*200*ms), 180*ms, 0)
		e.Components.Propagation, e.Components.Queueing = 20*ms, 160*ms
		agg.AddExchange(e)
	}
	ins := []record.InFlight{{Cookie: 9, Flow: record.Flow{Local: netip.MustParseAddrPort("10.0.0.1:40009"), Remote: netip.MustParseAddrPort("10.0.0.9:5201")},
		Owner: record.Owner{PID: 77, Comm: "uploader"}, Role: record.Requester, Start: now - record.Mono(10*time.Second), BytesOut: 80 << 20}}
	s := NewServer(agg, history.New(history.Config{}), func() Health { return Health{} }, func() []record.InFlight { return ins }, nil)
	_, body := get(t, s.Handler(), "GET", "/v1/flows/1")
	var d FlowDetail
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	if ds := d.Flow.Diagnoses; len(ds) == 0 || len(ds[0].Related) != 1 || !strings.Contains(ds[0].Related[0], "flow 9: uploader") {
		t.Errorf("diagnoses %+v", ds)
	}
}

// SortFlows orders by value, largest first, then by id, whatever the
// order it is given.
func TestSortFlowsPermutes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 50 {
		n := r.IntN(40)
		flows := make([]Flow, n)
		for i := range flows {
			flows[i].ID = fmt.Sprint(r.IntN(1000))
			flows[i].Exchanges = uint64(r.IntN(5))
		}
		want := slices.Clone(flows)
		slices.SortStableFunc(want, func(a, b Flow) int {
			return cmp.Or(cmp.Compare(b.Exchanges, a.Exchanges), cmp.Compare(a.ID, b.ID))
		})
		SortFlows(flows, "exchanges")
		for i := range flows {
			if flows[i].ID != want[i].ID || flows[i].Exchanges != want[i].Exchanges {
				t.Fatalf("position %d: %s/%d, want %s/%d", i, flows[i].ID, flows[i].Exchanges, want[i].ID, want[i].Exchanges)
			}
		}
	}
}

// An answer that redirects is not the daemon's: the client says so and
// goes nowhere else, so a process on the API's port cannot send it off
// loopback.
func TestClientFollowsNoRedirect(t *testing.T) {
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the client followed a redirect")
	}))
	defer elsewhere.Close()
	redirecting := httptest.NewServer(http.RedirectHandler(elsewhere.URL+"/v1/health", http.StatusFound))
	defer redirecting.Close()
	c, err := NewClient(redirecting.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); err == nil || !strings.Contains(err.Error(), "answered 302 Found, not as a lattrace API") {
		t.Errorf("a redirect: %v", err)
	}
}
