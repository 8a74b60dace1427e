package recording

import (
	"bytes"
	"compress/gzip"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/fuzz"
)

var flowA = record.Flow{Local: netip.MustParseAddrPort("10.0.0.1:40000"), Remote: netip.MustParseAddrPort("10.0.0.2:80"), Netns: 7}

func exchange(cookie uint64, end record.Mono, retrans uint32) *record.Exchange {
	return &record.Exchange{
		Time: end, Cookie: cookie, Flow: flowA, Role: record.Requester, ConnRole: record.RoleClient,
		Owner: record.Owner{PID: 1, Comm: "curl"},
		Start: end - 5_000_000, End: end, Duration: 5 * time.Millisecond,
		Components: record.Components{Network: 2 * time.Millisecond, Peer: 3 * time.Millisecond},
		SRTT:       2 * time.Millisecond, MinRTT: time.Millisecond, CwndEnd: 10, Retransmits: retrans,
		Diagnoses:     []record.Diagnosis{{Name: "app_peer", Severity: record.SeverityInfo, Share: 0.6, Evidence: []record.Evidence{{Name: "peer", Value: 3, Unit: "ms"}}}},
		Turns:         2,
		ExchangeTurns: 2,
	}
}

type got struct {
	exchanges []*record.Exchange
	opens     []*record.ConnOpen
	closes    []*record.ConnClose
	samples   []*Sample
	diagnoses []*Diagnoses
}

func (g *got) handler() Handler {
	return Handler{
		Exchange:  func(e *record.Exchange) { g.exchanges = append(g.exchanges, e) },
		ConnOpen:  func(o *record.ConnOpen) { g.opens = append(g.opens, o) },
		ConnClose: func(c *record.ConnClose) { g.closes = append(g.closes, c) },
		Sample:    func(s *Sample) { g.samples = append(g.samples, s) },
		Diagnoses: func(d *Diagnoses) { g.diagnoses = append(g.diagnoses, d) },
	}
}

func write(t *testing.T, s Sampling, body func(w *Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Host: "h", StartedMono: 1, Started: time.Unix(100, 0).UTC(), Sampling: s})
	if err != nil {
		t.Fatal(err)
	}
	body(w)
	if err := w.Close(End{Ended: 99}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Every record comes back as written, in order, with the header and the
// end line's counts.
func TestRoundTrip(t *testing.T) {
	const n = 3000 // several batches
	var want []*record.Exchange
	file := write(t, Sampling{Interval: time.Millisecond}, func(w *Writer) {
		w.ConnOpen(record.ConnOpen{Time: 5, Cookie: 1, Flow: flowA, Role: record.RoleClient, ConnectLatency: time.Millisecond})
		for i := range n {
			e := exchange(1, record.Mono(10_000_000+i*2_000_000), uint32(i%7/6))
			want = append(want, e)
			w.Exchange(e)
			if i%100 == 0 {
				w.Flush()
			}
		}
		w.ConnClose(record.ConnClose{Time: 1 << 40, Cookie: 1, Flow: flowA, SendCalls: n})
		pk := record.PeerKey{Netns: 7, Comm: "curl", Side: record.RoleClient, Remote: flowA.Remote.Addr(), RemotePort: 80}
		w.Diagnoses(Diagnoses{Scope: ScopePeer, Peer: &pk, Exchanges: n, Diagnoses: want[0].Diagnoses})
	})
	var g got
	hdr, end, err := Read(bytes.NewReader(file), g.handler())
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Format != Format || hdr.Version != Version || hdr.Host != "h" || !hdr.Started.Equal(time.Unix(100, 0)) {
		t.Errorf("header %+v", hdr)
	}
	if len(g.exchanges) != n || len(g.opens) != 1 || len(g.closes) != 1 || len(g.diagnoses) != 1 {
		t.Fatalf("read %d exchanges, %d opens, %d closes, %d diagnoses", len(g.exchanges), len(g.opens), len(g.closes), len(g.diagnoses))
	}
	for i := range want {
		if !reflect.DeepEqual(g.exchanges[i], want[i]) {
			t.Fatalf("exchange %d:\n got %+v\nwant %+v", i, g.exchanges[i], want[i])
		}
	}
	if g.diagnoses[0].Peer.Comm != "curl" || g.diagnoses[0].Diagnoses[0].Evidence[0].Value != 3 {
		t.Errorf("diagnoses %+v", g.diagnoses[0])
	}
	// Exchanges 2 ms apart with a 1 ms interval: every one is sampled.
	if end.Exchanges != n || end.Samples != n || len(g.samples) != n || end.ConnOpens != 1 || end.ConnCloses != 1 || end.Diagnoses != 1 || end.Ended != 99 {
		t.Errorf("end %+v, %d samples read", end, len(g.samples))
	}
	if s := g.samples[6]; s.Retransmits != 1 || s.Cwnd != 10 || s.SRTT != 2*time.Millisecond || s.Source != SourceExchange || s.Time != want[6].End {
		t.Errorf("sample 6: %+v", s)
	}
	// Compact: the 3000 exchanges take well under their JSON size.
	if len(file) > n*200 {
		t.Errorf("file is %d bytes for %d exchanges", len(file), n)
	}
}

// Samples are thinned to one per interval per flow, except those showing
// a retransmission; each flow and the file are capped, and what was left
// out is counted.
func TestSamplingBounds(t *testing.T) {
	var g got
	file := write(t, Sampling{Interval: 10 * time.Millisecond, MaxPerFlow: 50, Max: 70}, func(w *Writer) {
		// Flow 1: an exchange every ms for 200 ms; every 40th retransmits.
		for i := range 200 {
			w.Exchange(exchange(1, record.Mono(1_000_000_000+i*1_000_000), boolU(i%40 == 39)))
		}
		// Flow 2: 100 exchanges 20 ms apart; the file cap stops it at 70 in all.
		for i := range 100 {
			w.Exchange(exchange(2, record.Mono(1_000_000_000+i*20_000_000), 0))
		}
	})
	_, end, err := Read(bytes.NewReader(file), g.handler())
	if err != nil {
		t.Fatal(err)
	}
	per := map[uint64][]*Sample{}
	for _, s := range g.samples {
		per[s.Cookie] = append(per[s.Cookie], s)
	}
	// 200 ms at 10 ms: 20 samples, plus the 5 retransmissions (none of
	// which falls on a sampled ms: 39, 79, ... are not multiples of 10).
	if len(per[1]) != 25 {
		t.Errorf("flow 1: %d samples, want 25", len(per[1]))
	}
	retrans := 0
	for i, s := range per[1] {
		retrans += int(s.Retransmits)
		if i > 0 && s.Retransmits == 0 && s.Time-per[1][i-1].Time < record.Mono(10*time.Millisecond) && per[1][i-1].Retransmits == 0 {
			t.Errorf("flow 1: samples %v and %v closer than the interval", per[1][i-1].Time, s.Time)
		}
	}
	if retrans != 5 {
		t.Errorf("flow 1: %d retransmission samples kept, want all 5", retrans)
	}
	if len(per[2]) != 70-25 || end.Samples != 70 {
		t.Errorf("flow 2: %d samples, file %d; want the file cap of 70", len(per[2]), end.Samples)
	}
	if end.SamplesThinned != 200-25 || end.SamplesDropped != 100-45 {
		t.Errorf("thinned %d dropped %d", end.SamplesThinned, end.SamplesDropped)
	}
}

func boolU(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

func gz(s string) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write([]byte(s))
	w.Close()
	return b.Bytes()
}

// Whatever is not a whole recording of a known version is refused with a
// sentence saying what is wrong.
func TestBadFiles(t *testing.T) {
	good := write(t, Sampling{}, func(w *Writer) {
		for i := range 2000 {
			w.Exchange(exchange(1, record.Mono(1_000_000_000+i*1_000_000), 0))
		}
	})
	for _, c := range []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "not gzip-compressed"},
		{"plain JSON lines", []byte(`{"type":"exchange"}` + "\n"), "not gzip-compressed"},
		{"gzip of something else", gz("hello\n"), "not a lattrace recording"},
		{"newer version", gz(`{"format":"lattrace-recording","version":2}` + "\n"), "a version 2 recording; this lattrace reads version 1"},
		{"truncated", good[:len(good)/2], "cut short"},
		{"no end line", gz(`{"format":"lattrace-recording","version":1}` + "\n" + `{"type":"conn_open"}` + "\n"), "cut short"},
		{"corrupt line", gz(`{"format":"lattrace-recording","version":1}` + "\n" + `{"type":"exchange",` + "\n"), "line 2: the recording is corrupt"},
		{"line after end", gz(`{"format":"lattrace-recording","version":1}` + "\n" + `{"type":"end"}` + "\n" + `{"type":"conn_open"}` + "\n"), "line 3: a line after the end line"},
		{"bad checksum", append(good[:len(good)-8:len(good)-8], 0, 0, 0, 0, 0, 0, 0, 0), "corrupt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var g got
			_, _, err := Read(bytes.NewReader(c.file), g.handler())
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line with %q", err, c.want)
			}
			if c.name == "truncated" && !errors.Is(err, ErrTruncated) {
				t.Errorf("truncated: %v is not ErrTruncated", err)
			}
		})
	}
}

// A line that never ends is refused once it outgrows the longest line a
// recording can hold: a few kilobytes of gzip that inflate to a line of
// gigabytes cost the reader no more than that.
func TestLongLine(t *testing.T) {
	file := gz(`{"format":"lattrace-recording","version":1}` + "\n" + `{"type":"exchange","x":"` + strings.Repeat("a", 64<<20))
	var err error
	alloc := fuzz.Allocated(func() { _, _, err = Read(bytes.NewReader(file), Handler{}) })
	if err == nil || !strings.Contains(err.Error(), "line 2: the recording is corrupt: longer than 1 MiB") {
		t.Errorf("a line of 64 MiB: %v", err)
	}
	if alloc > 16<<20 {
		t.Errorf("reading a %d-byte file with a line of 64 MiB allocated %d MiB", len(file), alloc>>20)
	}
}
