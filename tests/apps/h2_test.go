package apps

import (
	"fmt"
	"iter"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/capture"
)

// HTTP/2 in clear (h2c) between nghttpd and h2load, one stream at a time
// and ten at once on one connection: one exchange per stream, held to
// h2load's own timing of each request. nghttpd writes its SETTINGS as it
// accepts, racing the client's preface, which cuts nothing. The frames
// each end counts are tshark's.
func TestHTTP2(t *testing.T) {
	for _, cc := range congestionControls {
		for _, streams := range []int{1, 10} {
			t.Run(fmt.Sprintf("%s m%d", cc, streams), func(t *testing.T) {
				a := newApp(t, cc)
				const port = 8081
				a.file("www/1024.bin", strings.Repeat("x", 1024))
				a.serve(port, "nghttpd", "--no-tls", "-d", filepath.Join(a.dir, "www"), "-a", a.server().String(), strconv.Itoa(port))
				const n = 200
				logFile := filepath.Join(a.dir, "h2load.log")
				wire := capture.StartWholeT(t, a.lab.B, a.lab.B.Ifname, fmt.Sprintf("tcp port %d", port))
				// One stream at a time is lockstep: the capture says
				// when each answer left (an emulated CPU may hold one).
				var answers *capture.Capture
				if streams == 1 {
					answers = a.capture(port)
				}
				a.client("h2load", "-n", strconv.Itoa(n), "-c", "1", "-m", strconv.Itoa(streams), "--log-file="+logFile,
					fmt.Sprintf("http://%s:%d/1024.bin", a.server(), port))
				lats := h2loadLatencies(t, logFile)
				client, server := a.ends(port)
				tr := truth{requests: len(lats), samples: n, p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), streams: true}
				if answers != nil {
					tr.departures, tr.unnamed = departures(t, answers, port), 2
				}
				// One exchange per stream, whether one at a time or
				// ten at once; nothing else (SETTINGS, GOAWAY).
				a.check(fmt.Sprintf("nghttpd + h2load -m %d (%s)", streams, cc), client, server, tr)
				a.checkHTTP2Frames(wire, port)
			})
		}
	}
}

// TestHTTP2Frames: the frames of large answers (100 KB, ten streams at
// once), whose DATA frames span segments and whose frame headers straddle
// segment boundaries, GSO's and GRO's included, are counted as tshark
// reads them from the reassembled streams, at both ends.
func TestHTTP2Frames(t *testing.T) {
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newApp(t, cc)
			const port = 8081
			a.file("www/100k.bin", strings.Repeat("x", 100<<10))
			a.serve(port, "nghttpd", "--no-tls", "-d", filepath.Join(a.dir, "www"), "-a", a.server().String(), strconv.Itoa(port))
			wire := capture.StartWholeT(t, a.lab.B, a.lab.B.Ifname, fmt.Sprintf("tcp port %d", port))
			a.client("h2load", "-n", "100", "-c", "1", "-m", "10", fmt.Sprintf("http://%s:%d/100k.bin", a.server(), port))
			a.checkHTTP2Frames(wire, port)
		})
	}
}

// checkHTTP2Frames holds the frame counts of each end's close record of the
// connection to port to tshark's, from a whole capture of the server's
// side: the same frames, type by type.
func (a *app) checkHTTP2Frames(wire *capture.Capture, port uint16) {
	t := a.t
	t.Helper()
	a.quiesce()
	pcap, err := wire.Stop()
	if err != nil {
		t.Fatal(err)
	}
	want, err := capture.HTTP2Frames(pcap, port)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("tshark found no HTTP/2 frames in the capture")
	}
	ends := 0
	for end, c := range a.closes(port) {
		ends++
		if c.HTTP2 == nil {
			t.Errorf("%s end: the close record has no HTTP/2 frame counts", end)
			continue
		}
		if c.HTTP2.Unsynced || !maps.Equal(c.HTTP2.Frames, want) {
			t.Errorf("%s end: HTTP/2 frames %v (unsynced %v), tshark %v", end, c.HTTP2.Frames, c.HTTP2.Unsynced, want)
		} else {
			t.Logf("%s end: HTTP/2 frames %v, as tshark", end, c.HTTP2.Frames)
		}
	}
	if ends != 2 {
		t.Errorf("%d close records for the connection, want the client's and the server's", ends)
	}
}

// noHTTP2Frames holds a connection that is not HTTP/2 in clear (HTTP/1.1,
// TLS) to close records without HTTP/2 frame counts.
func (a *app) noHTTP2Frames(port uint16) {
	a.t.Helper()
	a.quiesce()
	for _, c := range a.closes(port) {
		if c.HTTP2 != nil {
			a.t.Errorf("%v: HTTP/2 frames %v on a connection that is not HTTP/2 in clear", c.Flow, c.HTTP2.Frames)
		}
	}
}

// closes yields the close records of the connections to port, each with
// its end ("client" in A, "server" in B), as ends does for exchanges.
func (a *app) closes(port uint16) iter.Seq2[string, record.ConnClose] {
	return func(yield func(string, record.ConnClose) bool) {
		a.col.Mu.Lock()
		kept := slices.Clone(a.col.Closes)
		a.col.Mu.Unlock()
		for _, c := range kept {
			end := ""
			switch {
			case c.Flow.Netns == a.netnsA && c.Flow.Remote.Port() == port:
				end = "client"
			case c.Flow.Netns == a.netnsB && c.Flow.Local.Port() == port:
				end = "server"
			default:
				continue
			}
			if !yield(end, c) {
				return
			}
		}
	}
}

// h2loadLatencies reads h2load's --log-file: start, status, duration (us).
func h2loadLatencies(t *testing.T, path string) []time.Duration {
	t.Helper()
	out := microsColumn(t, path, 2)
	if len(out) == 0 {
		t.Fatalf("no requests in h2load's log")
	}
	return out
}
