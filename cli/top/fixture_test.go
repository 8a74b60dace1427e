package top

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

const ms = time.Millisecond

// fakeSource answers with fixed data and records what it was asked. Like
// an old daemon, it ignores the query's filter and sort: the screen must
// filter and sort what it gets.
type fakeSource struct {
	// mu guards queries: Run calls the source from several goroutines.
	mu       sync.Mutex
	flows    api.FlowList
	peers    api.PeerList
	requests api.RequestList
	err      error
	// reqErr fails the requests alone, as a daemon without request
	// trees does.
	reqErr  error
	queries []api.Query
	// treeAsks counts the calls of Requests.
	treeAsks int
}

func (s *fakeSource) record(q api.Query) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries = append(s.queries, q)
}

func (s *fakeSource) Flows(_ context.Context, q api.Query) (api.FlowList, error) {
	s.record(q)
	return s.flows, s.err
}

func (s *fakeSource) Peers(_ context.Context, q api.Query) (api.PeerList, error) {
	s.record(q)
	return s.peers, s.err
}

func (s *fakeSource) Flow(_ context.Context, id string) (api.FlowDetail, error) {
	for _, f := range s.flows.Flows {
		if f.ID == id {
			return api.FlowDetail{Now: testNow, Flow: f, Recent: samples()}, s.err
		}
	}
	return api.FlowDetail{}, api.ErrNotFound
}

func (s *fakeSource) Peer(_ context.Context, id string) (api.PeerDetail, error) {
	for _, p := range s.peers.Peers {
		if p.ID == id {
			return api.PeerDetail{Now: testNow, Peer: p, Flows: s.flows.Flows[:2]}, s.err
		}
	}
	return api.PeerDetail{}, api.ErrNotFound
}

func (s *fakeSource) Requests(_ context.Context, trees bool) (api.RequestList, error) {
	s.mu.Lock()
	s.treeAsks++
	s.mu.Unlock()
	if !trees {
		return api.RequestList{}, errors.New("top must ask for the trees")
	}
	if s.err != nil {
		return s.requests, s.err
	}
	return s.requests, s.reqErr
}

// noTrees is what the API client returns from a daemon started without
// --request-trees.
var noTrees = fmt.Errorf("%w: %s", api.ErrNotFound, "this daemon makes no request trees: it runs with --request-trees=false")

const testNow = record.Mono(1000 * time.Second)

// metrics builds the numbers of a flow or pair from the ones that matter
// to the screen; the component means make split network/transport/app.
func metrics(p50, p99 time.Duration, retrans uint64, turns float64, exchanges uint64, network, transport, app time.Duration) aggregate.Metrics {
	return aggregate.Metrics{
		Exchanges:   exchanges,
		Duration:    aggregate.Summary{Count: exchanges, P50: p50, P90: p99, P99: p99, Max: p99, Mean: network + transport + app},
		Retransmits: retrans,
		Turns:       aggregate.Turns{PerExchangeMean: turns, PerExchangeMax: uint32(turns + 1)},
		ComponentMeans: record.Components{
			Network: network, Propagation: network / 2, Queueing: network / 2,
			SendWait: transport, SendWaitCwnd: transport,
			Peer: app,
		},
		Cwnd: aggregate.Cwnd{Last: 10, Min: 10, Max: 40},
		RTT:  aggregate.RTT{Min: network / 2, SRTTLast: network},
	}
}

func flow(id, comm string, pid uint32, local, remote string, rate float64, m aggregate.Metrics, diags ...record.DiagnosisName) api.Flow {
	f := api.Flow{ID: id, Rate: rate}
	f.Flow = record.Flow{Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(remote), Netns: 4026531840}
	f.Owner = record.Owner{PID: pid, Comm: comm}
	f.ConnRole = record.RoleClient
	f.Metrics = m
	f.Split = f.Metrics.ComponentMeans.Split()
	f.Dominant = f.Split.Dominant()
	for _, d := range diags {
		f.Diagnoses = append(f.Diagnoses, record.Diagnosis{
			Name: d, Severity: record.SeverityWarning, Share: 0.6,
			Summary: "a summary long enough to wrap on a terminal eighty columns wide, because diagnoses say what they saw with numbers",
			Fix:     "do the thing that fixes it",
		})
	}
	return f
}

// Three flows whose orders differ by every sort key:
//
//	p99: 303 101 202   p50: 101 202 303   rate: 202 101 303
//	turns: 303 202 101 retrans: 303 101 202
func testFlows() api.FlowList {
	fl := []api.Flow{
		flow("101", "curl", 4242, "10.0.0.1:45678", "10.0.0.2:8080", 12.5,
			metrics(20100*time.Microsecond, 45*ms, 3, 1.0, 500, 2*ms, 1*ms, 17*ms), diagnose.PeerThink),
		flow("202", "nginx", 77, "[2001:db8::1]:443", "[2001:db8::99]:51234", 200,
			metrics(1*ms, 5*ms, 0, 2.5, 10000, 3*ms, 1*ms, 1*ms)),
		flow("303", "redis-cli", 9, "127.0.0.1:40000", "127.0.0.1:6379", 1,
			metrics(200*time.Microsecond, 90*ms, 40, 6.0, 50, 3*ms, 6200*time.Microsecond, 800*time.Microsecond), diagnose.Loss),
	}
	return api.FlowList{APIVersion: api.Version, Now: testNow, Total: len(fl), Flows: fl}
}

func testPeers() api.PeerList {
	p1 := api.Peer{ID: "p0000000000a1", Rate: 12.5}
	p1.PeerKey = record.PeerKey{Netns: 4026531840, Comm: "curl", Side: record.RoleClient, Remote: netip.MustParseAddr("10.0.0.2"), RemotePort: 8080}
	p1.Connections = 4
	p1.Metrics = metrics(20*ms, 45*ms, 3, 1.0, 500, 2*ms, 1*ms, 17*ms)
	p1.Split = p1.Metrics.ComponentMeans.Split()
	p2 := api.Peer{ID: "p0000000000b2", Rate: 200}
	p2.PeerKey = record.PeerKey{Netns: 4026532001, Comm: "nginx", Side: record.RoleServer, LocalPort: 443, Remote: netip.MustParseAddr("2001:db8::99")}
	p2.Connections = 1
	p2.Metrics = metrics(1*ms, 5*ms, 0, 2.5, 10000, 3*ms, 1*ms, 1*ms)
	p2.Split = p2.Metrics.ComponentMeans.Split()
	return api.PeerList{APIVersion: api.Version, Now: testNow, Total: 2, Peers: []api.Peer{p1, p2}}
}

// samples are 40 exchanges, one a second up to testNow.
func samples() []history.Sample {
	var out []history.Sample
	for i := range 40 {
		out = append(out, history.Sample{
			Time:       testNow - record.Mono(time.Duration(40-i)*time.Second),
			Role:       record.Requester,
			Duration:   time.Duration(10+i) * ms,
			Components: record.Components{Network: 2 * ms, SendWait: ms, Peer: time.Duration(7+i) * ms},
			BytesOut:   uint64(100 * i), BytesIn: 5000,
			Turns: 1, CwndEnd: uint32(10 + i%5), SRTT: time.Duration(2+i%3) * ms,
		})
	}
	return out
}

// newTestModel is the screen over a fakeSource at w x h, loaded once.
// colour draws with escape sequences, as on a real terminal.
func newTestModel(t *testing.T, opts Options, w, h int, colour bool) (*model, *fakeSource) {
	t.Helper()
	opts, err := opts.check()
	if err != nil {
		t.Fatal(err)
	}
	r := lipgloss.NewRenderer(io.Discard)
	if colour {
		r.SetColorProfile(0) // termenv.TrueColor
	}
	src := &fakeSource{flows: testFlows(), peers: testPeers(), requests: testRequests()}
	m := newModel(context.Background(), src, opts, r)
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	run(t, m, m.Init())
	return m, src
}

// run executes cmd as the program would and hands its answer to Update.
// The answer's own command, the wait before the next refresh, is not run.
func run(t *testing.T, m *model, cmd tea.Cmd) tea.Msg {
	t.Helper()
	if cmd == nil {
		return nil
	}
	msg := cmd()
	switch msg.(type) {
	case flowsMsg, peersMsg, flowDetailMsg, peerDetailMsg, requestsMsg:
		if next := update(m, msg); next == nil {
			t.Fatalf("answer %T scheduled no refresh", msg)
		}
	}
	return msg
}

func update(m *model, msg tea.Msg) tea.Cmd {
	_, cmd := m.Update(msg)
	return cmd
}

// press sends keys, each a key name ("enter", "esc", "up") or runes.
func press(t *testing.T, m *model, keys ...string) tea.Msg {
	t.Helper()
	var last tea.Msg
	for _, k := range keys {
		last = run(t, m, update(m, keyMsg(k)))
	}
	return last
}

func keyMsg(k string) tea.KeyMsg {
	named := map[string]tea.KeyType{
		"enter": tea.KeyEnter, "esc": tea.KeyEsc, "up": tea.KeyUp, "down": tea.KeyDown,
		"tab": tea.KeyTab, "backspace": tea.KeyBackspace, "ctrl+c": tea.KeyCtrlC,
		"pgdown": tea.KeyPgDown, "pgup": tea.KeyPgUp, "home": tea.KeyHome, "end": tea.KeyEnd,
	}
	if t, ok := named[k]; ok {
		return tea.KeyMsg{Type: t}
	}
	if k == " " {
		return tea.KeyMsg{Type: tea.KeySpace, Runes: []rune{' '}}
	}
	return tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
}

// typeText types s into whatever has the keyboard, a key per rune.
func typeText(t *testing.T, m *model, s string) {
	t.Helper()
	for _, r := range s {
		press(t, m, string(r))
	}
}

// rowIDs are the ids of the rows on screen, top to bottom.
func rowIDs(m *model) []string {
	_, ids := m.list()
	return ids
}

// checkFrame fails unless the view is exactly h lines none wider than w.
func checkFrame(t *testing.T, view string, w, h int) []string {
	t.Helper()
	lines := strings.Split(view, "\n")
	if len(lines) != h {
		t.Errorf("view has %d lines, want %d", len(lines), h)
	}
	for i, l := range lines {
		if lw := lipgloss.Width(l); lw > w {
			t.Errorf("line %d is %d cells wide, terminal is %d: %q", i, lw, w, l)
		}
	}
	return lines
}

var csi = regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]")

// plain is what a view reads as, escape sequences removed.
func plain(s string) string { return csi.ReplaceAllString(s, "") }

// hop is a hop of a test tree; its duration is the sum of its parts.
func hop(from, to string, link record.LinkMethod, network, transport, think, childWait time.Duration, turns uint32, children ...*record.Hop) *record.Hop {
	return &record.Hop{
		From: from, To: to, Link: link,
		Duration: network + transport + think + childWait,
		Network:  network, Transport: transport, Think: think, ChildWait: childWait,
		Turns: turns, CriticalTurns: turns,
		Children: children,
	}
}

// testRequests are three requests, oldest first as the API sends them:
//
//	1f2e3d4c5b6a7980-1a2b3c4d  curl -> front, whose critical path goes
//	    through api to postgres; auth and redis run beside it, and
//	    ldap is critical to auth only, not to the request.
//	5a5a5a5a-77  detached: batch -> api, whose caller is not known.
//	9b9b9b9b-1  one hop, a new connection.
func testRequests() api.RequestList {
	pg := hop("api", "postgres", record.LinkGoroutine, 1*ms, 0, 4*ms, 0, 2)
	pg.Critical = true
	redis := hop("api", "redis", record.LinkWindow, 300*time.Microsecond, 0, 200*time.Microsecond, 0, 2)
	redis.Parallel = true
	api1 := hop("front", "api", record.LinkThread, 1*ms, 500*time.Microsecond, 2*ms, 5*ms, 2, pg, redis)
	api1.Critical = true
	ldap := hop("auth", "ldap", record.LinkHandoff, 1*ms, 0, 1*ms, 0, 2)
	ldap.Critical = true
	auth := hop("front", "auth", record.LinkHandoff, 500*time.Microsecond, 0, 500*time.Microsecond, 2*ms, 2, ldap)
	auth.Parallel, api1.Parallel = true, true
	root := hop("curl", "front", "", 2*ms, 1*ms, 3*ms, 8500*time.Microsecond, 2, api1, auth)
	// The root's server end, for the filter's fields.
	root.Server = &record.Exchange{
		Cookie: 77, Owner: record.Owner{PID: 500, Comm: "front"},
		Flow: record.Flow{Local: netip.MustParseAddrPort("10.0.0.5:8080"), Remote: netip.MustParseAddrPort("10.0.0.1:50000")},
	}
	full := &record.Request{
		ID: "1f2e3d4c5b6a7980-1a2b3c4d", Endpoint: "front:8080", Root: root, Duration: root.Duration,
		Hops: 6, CriticalTurns: 6, CriticalHops: 3, Dominant: "api -> postgres",
	}

	pg2 := hop("api", "postgres", record.LinkGoParent, 1*ms, 0, 6*ms, 0, 2)
	pg2.Critical = true
	batch := hop("batch", "api", "", 1*ms, 0, 1*ms, 7*ms, 2, pg2)
	detached := &record.Request{
		ID: "5a5a5a5a-77", Endpoint: "api:8081", Root: batch, Duration: batch.Duration,
		Hops: 2, CriticalTurns: 4, CriticalHops: 2, Dominant: "api -> postgres", Detached: true,
	}

	one := hop("curl", "front", "", 3*ms, 2*ms, 1*ms, 0, 2)
	one.Handshake = true
	single := &record.Request{
		ID: "9b9b9b9b-1", Endpoint: "front:8080", Root: one, Duration: one.Duration,
		Hops: 1, CriticalTurns: 2, CriticalHops: 1, Dominant: "curl -> front",
	}
	var l api.RequestList
	l.APIVersion = api.Version
	l.Recent = []*record.Request{full, detached, single}
	return l
}
