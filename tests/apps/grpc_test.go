package apps

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/grpcapp"
)

// gRPC (grpc-go at its defaults: BDP pings on) in clear, through the lab's
// path, one exchange per call from HTTP/2's framing: one call at a time
// with a known server think time, eight callers at once on one
// connection, and a server streaming twenty messages 200 ms apart, each
// call held to the client's own timing. Over TLS the framing is hidden:
// the connection's own exchanges stand, with no false diagnosis.
func TestGRPC(t *testing.T) {
	bin, err := grpcapp.Binary()
	if err != nil {
		t.Fatal(err)
	}
	const (
		think    = 13 * time.Millisecond
		messages = 20
		every    = 200 * time.Millisecond
	)
	cases := []struct {
		name string
		args []string
		n    int
		// think is the server's time per call: a streamed answer's
		// pauses are the server's too.
		think time.Duration
		tls   bool
	}{
		{"unary", []string{"-mode", "unary"}, 200, think, false},
		{"concurrent", []string{"-mode", "concurrent", "-c", "8"}, 200, think, false},
		{"stream", []string{"-mode", "stream"}, 3, think + (messages-1)*every, false},
		{"unary_tls", []string{"-mode", "unary", "-tls"}, 100, think, true},
	}
	for _, cc := range congestionControls {
		for _, c := range cases {
			t.Run(cc+"_"+c.name, func(t *testing.T) {
				a := newApp(t, cc)
				const port = 50051
				addr := fmt.Sprintf("%s:%d", a.server(), port)
				handled := filepath.Join(a.dir, "handled.log")
				srv := []string{bin, "server", "-addr", addr, "-think", think.String(),
					"-stream-messages", strconv.Itoa(messages), "-stream-every", every.String(), "-log", handled}
				if c.tls {
					cert, key := a.selfSigned()
					srv = append(srv, "-cert", cert, "-key", key)
				}
				a.serve(port, srv...)
				logFile := filepath.Join(a.dir, "calls.log")
				a.client(append([]string{bin, "client", "-addr", addr, "-n", strconv.Itoa(c.n), "-log", logFile}, c.args...)...)
				lats := callTimes(t, logFile)
				client, server := a.ends(port)
				// The server's own time per call, which its sleeps (c.think)
				// take at least, and longer on a busy machine.
				think := quantile(microsColumn(t, handled, 0), 0.5)
				if think < c.think {
					t.Errorf("the server's handlers took %v (median), less than their sleeps' %v", think, c.think)
				}
				a.check(fmt.Sprintf("grpc-go %s (%s)", c.name, cc), client, server,
					truth{requests: len(lats), samples: len(lats), p50: quantile(lats, 0.5), p99: quantile(lats, 0.99),
						think: &think, streams: !c.tls, fallback: c.tls, connectTimed: true})
				if c.tls {
					// The connections' own exchanges, as many
					// as the cuts between directions: at least one
					// per call at each end.
					a.noHTTP2Frames(port)
					for _, end := range [][]*record.Exchange{client, server} {
						if len(end) < len(lats) {
							t.Errorf("over TLS: %d exchanges at an end for %d calls", len(end), len(lats))
						}
						for _, e := range end {
							if e.Stream != nil {
								t.Errorf("over TLS: an exchange of stream %d", e.Stream.ID)
							}
						}
					}
				}
			})
		}
	}
}

// callTimes reads grpcapp's log of calls: one duration in microseconds a
// line.
func callTimes(t *testing.T, path string) []time.Duration {
	t.Helper()
	ds := microsColumn(t, path, 0)
	if len(ds) == 0 {
		t.Fatalf("%s: no calls", path)
	}
	return ds
}

// TestGRPCFlowControl: uploads of 1 MiB to a server whose HTTP/2 windows
// are fixed at 64 KiB (grpc-go's BDP estimate off) wait for its
// WINDOW_UPDATEs about a round trip per window: the client's send wait is
// named flow control. TestGRPC's calls, whose windows never close, are
// the control: none of their send wait is.
func TestGRPCFlowControl(t *testing.T) {
	bin, err := grpcapp.Binary()
	if err != nil {
		t.Fatal(err)
	}
	const (
		size   = 1 << 20
		window = 64 << 10
		calls  = 10
	)
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newApp(t, cc)
			const port = 50051
			addr := fmt.Sprintf("%s:%d", a.server(), port)
			a.serve(port, bin, "server", "-addr", addr, "-window", strconv.Itoa(window))
			logFile := filepath.Join(a.dir, "calls.log")
			a.client(bin, "client", "-addr", addr, "-n", strconv.Itoa(calls), "-size", strconv.Itoa(size), "-log", logFile)
			lats := callTimes(t, logFile)
			client, server := a.ends(port)
			var durs, flows []time.Duration
			for _, e := range client {
				if e.Stream == nil || e.Unanswered {
					t.Errorf("client end: an exchange not of a whole stream (%d out, %d in)", e.BytesOut, e.BytesIn)
					continue
				}
				if e.Components.Sum() != e.Duration {
					t.Errorf("client end: components sum to %v, duration %v", e.Components.Sum(), e.Duration)
				}
				durs = append(durs, e.Duration)
				flows = append(flows, e.Components.SendWaitFlowControl)
			}
			streams := 0
			for _, e := range server {
				if e.Stream != nil && !e.Unanswered {
					streams++
				}
			}
			if len(durs) != calls || streams != calls || len(server) != calls {
				t.Fatalf("%d exchanges of whole streams at the client's end and %d at the server's (of %d) for %d calls", len(durs), streams, len(server), calls)
			}
			// Each window after the first comes a round trip after the
			// data it answers left: half of that, at least, is waiting.
			want := time.Duration(size/window-1) * rtt / 2
			p50, flow := quantile(durs, 0.5), quantile(flows, 0.5)
			t.Logf("%s: calls %v (client's own %v), send wait for the flow-control window %v (at least %v)", cc, p50, quantile(lats, 0.5), flow, want)
			if !within(p50, quantile(lats, 0.5), 0.05, time.Millisecond) {
				t.Errorf("client end median %v, the client's own %v", p50, quantile(lats, 0.5))
			}
			if flow < want || flow > p50 {
				t.Errorf("client end: %v of send wait for the flow-control window (median), want %v to %v", flow, want, p50)
			}
		})
	}
}
