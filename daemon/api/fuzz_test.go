package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/fuzz"
)

// parseBound is what parsing a filter or a query may allocate: a copy of
// each word or value and the list of them, a few times the input.
var parseBound = fuzz.Bound{PerByte: 64, Fixed: 64 << 10}

// FuzzParseFilter parses the filter a person types (--filter, the live
// view's /). What it accepts writes back (Filter.String) to the same
// filter, and an address or prefix it accepts keeps a flow at that address.
func FuzzParseFilter(f *testing.F) {
	fuzz.Seeds(f, map[string][]any{
		"every-field": {Filter{Comm: "nginx", PID: 7, Port: 443, Addr: netip.MustParsePrefix("10.0.0.0/8"), Netns: 4026531840, Container: "3fa", Text: "::1 free"}.String()},
		"address":     {Filter{Addr: netip.MustParsePrefix("fd00::2/128")}.String()},
		"words":       {"curl 10.0.0.1:80 [::1]:443 dead::beef"},
	})
	f.Fuzz(func(t *testing.T, s string) {
		var flt Filter
		var err error
		fuzz.Alloc(t, len(s), parseBound, func() { flt, err = ParseFilter(s) })
		fuzz.OneLine(t, err)
		if err != nil {
			return
		}
		again, err := ParseFilter(flt.String())
		if err != nil || again != flt {
			t.Fatalf("%q parsed to %+v, written back as %q, which parses to %+v (%v)", s, flt, flt.String(), again, err)
		}
		keepsItsAddress(t, flt.Addr)
	})
}

// keepsItsAddress fails t when a filter on prefix p alone drops a flow
// whose local address is p's first, as the tracer writes it (IPv4-mapped
// addresses unmapped).
func keepsItsAddress(t *testing.T, p netip.Prefix) {
	t.Helper()
	if !p.IsValid() {
		return
	}
	fl := Flow{FlowStats: aggregate.FlowStats{FlowKey: record.FlowKey{Flow: record.Flow{Local: netip.AddrPortFrom(p.Addr().Unmap(), 40000)}}}}
	if !(Filter{Addr: p}).MatchFlow(&fl) {
		t.Fatalf("the filter addr:%s drops a flow from %s", p, fl.Flow.Local)
	}
}

// FuzzParseQuery parses the list endpoints' query string. What it accepts
// encodes back (Query.Values) to the same query.
func FuzzParseQuery(f *testing.F) {
	fuzz.Seeds(f, map[string][]any{
		"every-field": {Query{Sort: "rate", Limit: 5, Filter: Filter{Comm: "nginx", PID: 7, Port: 443, Addr: netip.MustParsePrefix("10.0.0.0/8"), Netns: 4026531840, Container: "3fa", Text: "::1 free"}}.Values().Encode()},
		"empty":       {""},
	})
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return // net/url's to refuse: the server answers 400 before ours
		}
		var q Query
		fuzz.Alloc(t, len(raw), parseBound, func() { q, err = ParseQuery(v) })
		fuzz.OneLine(t, err)
		if err != nil {
			return
		}
		again, err := ParseQuery(q.Values())
		if err != nil || again != q {
			t.Fatalf("%q parsed to %+v, encoded as %q, which parses to %+v (%v)", raw, q, q.Values().Encode(), again, err)
		}
		keepsItsAddress(t, q.Filter.Addr)
	})
}

// serveBound is what answering one request may allocate: the answer of the
// fixture's few flows (the fixed part) and the request's own words.
var serveBound = fuzz.Bound{PerByte: 64, Fixed: 4 * fuzz.MiB}

// FuzzRequest sends the server whole HTTP requests, as a client on the
// socket may write them: every answer is JSON with a status the API
// documents, and an error is one line.
func FuzzRequest(f *testing.F) {
	reqs, _ := clientExchanges(f)
	seeds := map[string][]any{}
	for name, r := range reqs {
		seeds[name] = []any{r}
	}
	fuzz.Seeds(f, seeds)
	_, h := fixture(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // net/http's to refuse, before ours
		}
		rec := httptest.NewRecorder()
		fuzz.Alloc(t, len(raw), serveBound, func() { h.ServeHTTP(rec, req) })
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed:
		default:
			t.Fatalf("%s %s answered %d", req.Method, req.URL, rec.Code)
		}
		body := rec.Body.Bytes()
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" || !json.Valid(body) {
			t.Fatalf("%s %s answered %d with %q: %q", req.Method, req.URL, rec.Code, ct, body)
		}
		if rec.Code != http.StatusOK {
			var e Error
			if err := json.Unmarshal(body, &e); err != nil || e.Error == "" || strings.ContainsAny(e.Error, "\r\n") {
				t.Fatalf("%s %s answered %d with %q: want an error of one line", req.Method, req.URL, rec.Code, body)
			}
		}
	})
}

// clientBound is what one call of the client may allocate: its transport
// and connection (the fixed part), and the answer read whole and decoded.
// The largest value per byte of an answer is a flow of a list (1.6 kB)
// from the 3 bytes of "{},", twice over as the list grows by doubling.
var clientBound = fuzz.Bound{PerByte: 2048, Fixed: 4 * fuzz.MiB}

// FuzzClient answers the client's calls with whatever bytes a process
// listening on the API's socket might write: a daemon of another version,
// another program, a hostile one. The client says what is wrong in one
// line, and what it accepts encodes back to the same answer.
func FuzzClient(f *testing.F) {
	_, resps := clientExchanges(f)
	seeds := map[string][]any{}
	for name, r := range resps {
		seeds[name] = []any{callIndex(name), r}
	}
	fuzz.Seeds(f, seeds)
	sock := filepath.Join(f.TempDir(), "fuzz-api.sock")
	d := startHostile(f, sock)
	f.Fuzz(func(t *testing.T, call byte, resp []byte) {
		d.answer(resp)
		c, err := NewClient(sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.hc.CloseIdleConnections()
		var got any
		fuzz.Alloc(t, len(resp), clientBound, func() { got, err = calls[int(call)%len(calls)].do(c) })
		fuzz.OneLine(t, err)
		if err != nil {
			return
		}
		j, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("an accepted answer does not encode: %v", err)
		}
		again := newOf(got)
		if err := json.Unmarshal(j, again); err != nil {
			t.Fatalf("an accepted answer, encoded, does not decode: %v", err)
		}
		if j2, _ := json.Marshal(again); !bytes.Equal(j, j2) {
			t.Fatalf("an accepted answer changed through its encoding:\n%s\n%s", j, j2)
		}
	})
}

// calls are the client's calls, one per endpoint, and the answer each
// decodes.
var calls = []struct {
	name string
	do   func(*Client) (any, error)
}{
	{"health", func(c *Client) (any, error) { return c.Health(context.Background()) }},
	{"flows", func(c *Client) (any, error) {
		return c.Flows(context.Background(), Query{Sort: "rate", Limit: 2, Filter: Filter{Comm: "curl"}})
	}},
	{"peers", func(c *Client) (any, error) { return c.Peers(context.Background(), Query{}) }},
	{"flow", func(c *Client) (any, error) { return c.Flow(context.Background(), "1") }},
	{"peer", func(c *Client) (any, error) { return c.Peer(context.Background(), "p000000000001") }},
	{"no-flow", func(c *Client) (any, error) { return c.Flow(context.Background(), "42") }},
}

func callIndex(name string) byte {
	for i, c := range calls {
		if c.name == name {
			return byte(i)
		}
	}
	panic("no call " + name)
}

// newOf is a new zero value of v's type, for decoding into.
func newOf(v any) any {
	switch v.(type) {
	case Health:
		return new(Health)
	case FlowList:
		return new(FlowList)
	case PeerList:
		return new(PeerList)
	case FlowDetail:
		return new(FlowDetail)
	case PeerDetail:
		return new(PeerDetail)
	}
	panic(fmt.Sprintf("an answer of type %T", v))
}

// clientExchanges makes each call of the client to the fixture's server
// over a real socket, and returns the bytes that crossed it each way, by
// call: the seeds of FuzzRequest and FuzzClient.
func clientExchanges(tb testing.TB) (reqs, resps map[string][]byte) {
	_, h := fixture(tb)
	sock := filepath.Join(tb.TempDir(), "fuzz-seed.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	reqs, resps = map[string][]byte{}, map[string][]byte{}
	for _, call := range calls {
		done := make(chan struct{})
		go func() {
			defer close(done)
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			raw := readHead(conn)
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
			if err != nil {
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var resp bytes.Buffer
			rec.Result().Write(&resp)
			conn.Write(resp.Bytes())
			reqs[call.name], resps[call.name] = raw, resp.Bytes()
		}()
		c, err := NewClient(sock)
		if err != nil {
			tb.Fatal(err)
		}
		call.do(c)
		c.hc.CloseIdleConnections()
		<-done
		if reqs[call.name] == nil {
			tb.Fatalf("%s: no exchange captured", call.name)
		}
	}
	return reqs, resps
}

// readHead reads a request's head, all a GET has, from conn.
func readHead(conn net.Conn) []byte {
	var raw []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(raw, []byte("\r\n\r\n")) {
		n, err := conn.Read(buf)
		raw = append(raw, buf[:n]...)
		if err != nil {
			break
		}
	}
	return raw
}

// hostile is a process on the API's socket that answers every request
// with the bytes it was last given, then hangs up.
type hostile struct {
	mu   sync.Mutex
	resp []byte
}

func (h *hostile) answer(resp []byte) {
	h.mu.Lock()
	h.resp = resp
	h.mu.Unlock()
}

func startHostile(tb testing.TB, sock string) *hostile {
	l, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	h := &hostile{}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			readHead(conn)
			h.mu.Lock()
			conn.Write(h.resp)
			h.mu.Unlock()
			conn.Close()
		}
	}()
	return h
}
