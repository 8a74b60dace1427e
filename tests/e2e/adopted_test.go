package e2e

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestAdoptedConnectionsShown: the daemon started on a node whose
// connections were open before it, as a DaemonSet installed on a running
// cluster: a plain request/response connection and a cleartext HTTP/2 one,
// each with its server's port above its client's. /metrics counts their
// ends by how their role was told and the HTTP/2 one's framing found;
// `flows --json` shows each end's role from the listening socket and how
// the framing was found.
func TestAdoptedConnectionsShown(t *testing.T) {
	plain := adoptedPair(t, false)
	h2 := adoptedPair(t, true)
	metrics := freeAddr(t)
	sock := t.TempDir() + "/api.sock"
	startDaemon(t, "daemon", "--output", "none", "--metrics-addr", metrics, "--api-socket", sock, "--drain-interval", "20ms")

	want := map[string]float64{
		`lattrace_connections_adopted_total{role="server"}`: 2,
		`lattrace_connections_adopted_total{role="client"}`: 2,
		`lattrace_http2_adopted_total{framing="synced"}`:    2,
	}
	var m map[string]float64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m = scrape(t, metrics)
		ok := true
		for k, v := range want {
			ok = ok && m[k] >= v
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics after 20 s: %v; want at least %v", pick(m, want), want)
		}
	}
	if g := m[`lattrace_connections_adopted_total{role="guessed"}`]; g != 0 {
		t.Errorf("%v adopted ends had their role guessed", g)
	}

	type flowJSON struct {
		Flow struct {
			Local string `json:"local"`
		} `json:"flow"`
		ConnRole     string `json:"conn_role"`
		RoleSource   string `json:"role_source"`
		HTTP2Framing string `json:"http2_framing"`
	}
	wantFlows := map[netip.AddrPort]flowJSON{}
	for _, p := range []struct {
		client, server netip.AddrPort
		framing        string
	}{{plain[0], plain[1], ""}, {h2[0], h2[1], "found_midway"}} {
		var c, s flowJSON
		c.ConnRole, c.RoleSource, c.HTTP2Framing = "client", "listener", p.framing
		s.ConnRole, s.RoleSource, s.HTTP2Framing = "server", "listener", p.framing
		wantFlows[p.client], wantFlows[p.server] = c, s
	}
	var last string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		code, out, stderr := run(t, nil, "flows", "--api", sock, "--json")
		if code != 0 {
			t.Fatalf("flows: exit %d: %s", code, stderr)
		}
		last = out
		var l struct {
			Flows []flowJSON `json:"flows"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("flows --json: %v", err)
		}
		right := 0
		for _, f := range l.Flows {
			local, err := netip.ParseAddrPort(f.Flow.Local)
			if w, ok := wantFlows[local]; err == nil && ok && f.ConnRole == w.ConnRole && f.RoleSource == w.RoleSource && f.HTTP2Framing == w.HTTP2Framing {
				right++
			}
		}
		if right == len(wantFlows) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("flows --json does not show the four adopted ends as %v:\n%s", wantFlows, last)
		}
	}
}

func pick(m, keys map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k := range keys {
		out[k] = m[k]
	}
	return out
}

// adoptedPair opens a loopback connection whose client's port is below
// its server's, makes a few calls on it, and keeps calling every 20 ms
// until the test ends: plain requests and answers, or HTTP/2 frames (a
// HEADERS request, a HEADERS and DATA answer, after the preface and the
// SETTINGS). It returns the client's and the server's addresses.
func adoptedPair(t *testing.T, http2 bool) [2]netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	server := ln.Addr().(*net.TCPAddr).AddrPort()
	var c net.Conn
	for port := 21000 + int(time.Now().UnixNano()%5000); c == nil; port++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}}
		if c, err = d.Dial("tcp", server.String()); err != nil && port > 31000 {
			t.Fatal(err)
		}
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	frame := func(typ, flags byte, stream uint32, payload []byte) []byte {
		b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[5:], stream)
		return append(b, payload...)
	}
	request := func(id uint32) []byte {
		if !http2 {
			return make([]byte, 100)
		}
		return frame(1, 0x5, id, []byte{0x82, 0x86, 0x84}) // HEADERS, END_STREAM|END_HEADERS
	}
	answer := func(id uint32) []byte {
		if !http2 {
			return make([]byte, 1000)
		}
		return append(frame(1, 0x4, id, []byte{0x88}), frame(0, 0x1, id, make([]byte, 100))...)
	}
	if http2 {
		settings := frame(4, 0, 0, nil)
		if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), settings...)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(append(settings, frame(4, 1, 0, nil)...)); err != nil {
			t.Fatal(err)
		}
		io.ReadFull(s, make([]byte, 24+9))
		io.ReadFull(c, make([]byte, 18))
	}
	call := func(id uint32) error {
		req, ans := request(id), answer(id)
		if _, err := c.Write(req); err != nil {
			return err
		}
		if _, err := io.ReadFull(s, make([]byte, len(req))); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
		if _, err := s.Write(ans); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, len(ans)))
		return err
	}
	id := uint32(1)
	for range 3 {
		if err := call(id); err != nil {
			t.Fatal(err)
		}
		id += 2
	}
	done := make(chan struct{})
	go func() {
		for ; ; id += 2 {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if call(id) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); c.Close(); s.Close() })
	return [2]netip.AddrPort{c.LocalAddr().(*net.TCPAddr).AddrPort(), server}
}
