package tracer

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lattrace/lattrace/record"
)

// TestPinnedUpgrade follows one connection across an upgrade of the kernel
// side: a daemon with other programs (here: another load-time setting, so
// another generation) replaces the pinned links on the same maps, and the
// exchange that was in progress at the switch is completed by the new
// programs from the state the old ones left. A third daemon of the new
// generation then adopts the links as they are.
func TestPinnedUpgrade(t *testing.T) {
	dir := fmt.Sprintf("/sys/fs/bpf/lattrace-test-%d", os.Getpid())
	t.Cleanup(func() { Cleanup(dir) })

	a, err := Open(Options{PinPath: dir, DrainInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open: %v (this test pins BPF objects: run it as root with bpffs mounted)", err)
	}
	colA := &collector{}
	stopA := runCollector(t, a, colA)
	if _, err := Open(Options{PinPath: dir}); err == nil || !strings.Contains(err.Error(), "in use by another lattrace daemon") {
		t.Fatalf("a second daemon on the same pins: %v", err)
	}
	var oldIDs []ebpf.ProgramID
	for _, p := range a.Programs() {
		if info, err := p.Info(); err == nil {
			if id, ok := info.ID(); ok {
				oldIDs = append(oldIDs, id)
			}
		}
	}

	// A connection with one exchange done and the next one's request out
	// before the switch; its response comes after.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 100)
		for i := 0; ; i++ {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if i == 1 {
				<-release
			}
			c.Write(make([]byte, 200))
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	exchange := func(wait bool) {
		if _, err := c.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		if wait {
			if _, err := io.ReadFull(c, make([]byte, 200)); err != nil {
				t.Fatal(err)
			}
		}
	}
	exchange(true)
	exchange(false) // in progress across the switch
	time.Sleep(50 * time.Millisecond)
	switched := record.Now()
	stopA()
	markPath(t, dir)

	b, err := Open(Options{PinPath: dir, DrainInterval: 20 * time.Millisecond, NoTxTimestamps: true})
	if err != nil {
		t.Fatal(err)
	}
	if pathMarked(t, dir) {
		t.Error("the path RTT table survived a change of programs, which may read it in other units")
	}
	for _, h := range b.Hooks() {
		if h.Adopted {
			t.Errorf("hook %s adopted across a change of programs", h.Hook)
		}
	}
	for _, id := range oldIDs {
		if p, err := ebpf.NewProgramFromID(id); err == nil {
			p.Close()
			t.Errorf("program %d of the old generation is still loaded: its link was not replaced", id)
		}
	}
	colB := &collector{}
	stopB := runCollector(t, b, colB)
	close(release)
	if _, err := io.ReadFull(c, make([]byte, 200)); err != nil {
		t.Fatal(err)
	}
	exchange(true)
	local := c.LocalAddr().String()
	c.Close()
	colB.find(t, netip.MustParseAddrPort(local))
	stopB()

	// The exchange in progress at the switch: started under the old
	// programs, closed by the new ones, in one record.
	var across *record.Exchange
	for _, e := range colB.exchanges {
		if e.Flow.Local.String() == local && e.Role == record.Requester && e.Start < switched && e.End > switched {
			across = e
		}
	}
	if across == nil || across.BytesOut != 100 || across.BytesIn != 200 {
		t.Fatalf("no whole record of the exchange in progress at the switch (start before %d): %+v", switched, across)
	}

	markPath(t, dir)
	c2, err := Open(Options{PinPath: dir, NoTxTimestamps: true})
	if err != nil {
		t.Fatal(err)
	}
	if !pathMarked(t, dir) {
		t.Error("the path RTT table was cleared by a daemon of the same generation")
	}
	for _, h := range c2.Hooks() {
		if h.Attached && !h.Adopted && !isIterator(h.Program) {
			t.Errorf("hook %s not adopted by a daemon of the same generation", h.Hook)
		}
	}
	c2.Close()
	removed, err := Cleanup(dir)
	if err != nil || len(removed) < len(pinnedMaps)+1 {
		t.Fatalf("Cleanup: %v, removed %v", err, removed)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left after Cleanup", dir)
	}
}

// TestRecordOfAnotherLayout: a record left in a pinned ring by programs of
// another version is counted, never decoded as if it were ours.
func TestRecordOfAnotherLayout(t *testing.T) {
	tr := &Tracer{}
	raw := make([]byte, 512)
	raw[0] = byte(lattraceLtRecordKindLT_RECORD_EXCHANGE)
	raw[4] = byte(lattraceLtLayoutLT_LAYOUT + 1)
	col := &collector{}
	tr.decode(raw, col)
	if len(col.exchanges) != 0 || tr.decodeErrors.Load() != 1 {
		t.Errorf("a record of layout %d: %d decoded, %d errors", raw[4], len(col.exchanges), tr.decodeErrors.Load())
	}
	raw[4] = byte(lattraceLtLayoutLT_LAYOUT)
	tr.decode(raw, col)
	if len(col.exchanges) != 1 {
		t.Errorf("a record of our layout was not decoded")
	}
}

// durable is a collector that is an output: what it took is out for good.
type durable struct{ collector }

func (*durable) Sync(done func(error)) { done(nil) }

// both hands every record to two sinks, as the daemon's fan-out does.
type both [2]record.Sink

func (b both) Exchange(e *record.Exchange)  { b[0].Exchange(e); b[1].Exchange(e) }
func (b both) ConnOpen(o record.ConnOpen)   { b[0].ConnOpen(o); b[1].ConnOpen(o) }
func (b both) ConnClose(c record.ConnClose) { b[0].ConnClose(c); b[1].ConnClose(c) }
func (b both) Flush()                       { b[0].Flush(); b[1].Flush() }

// TestResumeAfterKillMidDrain stops a daemon at the worst instant: its
// output has written a drain (and stored how far it got) but the drain was
// not released to the kernel. The next daemon dies a few records into
// reading them again. The one after reads the same records again: its
// aggregator (a plain sink) gets them all, its output none of them, and
// then everything new.
func TestResumeAfterKillMidDrain(t *testing.T) {
	dir := testPinDir(t, "lattrace-test-resume")
	a := openPinned(t, Options{PinPath: dir, DrainInterval: 20 * time.Millisecond})
	addr := serveEach(t, func(c net.Conn) {
		buf := make([]byte, 100)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			c.Write(buf)
		}
	})
	port := netip.MustParseAddrPort(addr).Port()
	talk := func(n int) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			c.Write(make([]byte, 100))
			io.ReadFull(c, make([]byte, 100))
		}
		c.Close()
	}
	talk(10)
	time.Sleep(100 * time.Millisecond)

	// The first daemon's drain, by hand, up to the output's flush; then it
	// dies without releasing the records.
	outA := &durable{}
	sinkA := a.Resume("test", outA)
	decodeAll(a, sinkA)
	sinkA.Flush()
	a.Close()
	took := ours(outA.exchanges, port)
	if len(took) < 20 {
		t.Fatalf("the first daemon's output took %d of the 20 exchanges", len(took))
	}

	// A second daemon dies too, a few records into the replay, after its
	// output flushed: the output's position must stay where the first
	// left it, not go back to where this one got.
	m, err := Open(Options{PinPath: dir, DrainInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	outM := &durable{}
	sinkM := m.Resume("test", outM)
	for range 3 {
		raw, end, ok := m.ring.next()
		if !ok {
			t.Fatal("the second daemon found nothing to replay")
		}
		m.pos = end
		m.decode(raw, sinkM)
	}
	sinkM.Flush()
	m.Close()
	if len(outM.exchanges) != 0 {
		t.Fatalf("the second daemon's output took %d records the first had written", len(outM.exchanges))
	}

	b, err := Open(Options{PinPath: dir, DrainInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agg, outB := &collector{}, &durable{}
	stop := runCollector(t, b, both{agg, b.Resume("test", outB)})
	time.Sleep(100 * time.Millisecond)
	talk(5)
	time.Sleep(100 * time.Millisecond)
	counters, _ := b.Counters()
	stop()
	replayed, got := ours(agg.exchanges, port), ours(outB.exchanges, port)
	for k := range took {
		if !replayed[k] {
			t.Errorf("exchange %s was not read again by the next daemon", k)
		}
		if got[k] {
			t.Errorf("exchange %s written again by the next daemon's output", k)
		}
	}
	if len(got) != 10 || len(replayed) != 30 {
		t.Errorf("next daemon: its output took %d exchanges (want the 10 new ones), its aggregator %d (want 20 again + 10)", len(got), len(replayed))
	}
	if counters.ReplayedUnsure != 0 {
		t.Errorf("replayed_unsure %d: the first daemon's output had confirmed everything it took", counters.ReplayedUnsure)
	}
	if counters.ReplaySkipped < uint64(len(took)) {
		t.Errorf("replay_skipped %d, fewer than the %d exchanges withheld", counters.ReplaySkipped, len(took))
	}
}

// ours keys the exchanges of connections to port (both ends).
func ours(es []*record.Exchange, port uint16) map[string]bool {
	m := map[string]bool{}
	for _, e := range es {
		if e.Flow.Local.Port() == port || e.Flow.Remote.Port() == port {
			m[fmt.Sprintf("%d/%d/%d", e.Cookie, e.OutSeq, e.InSeq)] = true
		}
	}
	return m
}

// markPath writes a marker into the last slot of the pinned path table
// (the lab's traffic hashes elsewhere only by chance; a real path in that
// slot would overwrite the marker, not the other way round).
func markPath(t *testing.T, dir string) { pathMarker(t, dir, true) }

// pathMarked tells whether markPath's marker is still there.
func pathMarked(t *testing.T, dir string) bool { return pathMarker(t, dir, false) }

// pathMarker writes the marker when set, and reads it back.
func pathMarker(t *testing.T, dir string, set bool) bool {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "paths"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := make([]byte, m.ValueSize())
	last := m.MaxEntries() - 1
	if set {
		v[len(v)-1] = 0xa5
		err = m.Put(last, v)
	} else {
		err = m.Lookup(last, v)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v[len(v)-1] == 0xa5
}

// isIterator tells an iterator's program: each daemon links its own.
func isIterator(program string) bool {
	for _, h := range hooks {
		if h.program == program {
			return h.iterator
		}
	}
	return false
}

// unconfirmed is an output whose confirmations never come: an OTLP
// backend that took the spans and whose answer is in flight.
type unconfirmed struct{ collector }

func (*unconfirmed) Sync(func(error)) {}

// TestResumeCountsUnconfirmed kills a daemon whose output took a drain and
// had not confirmed it: the next daemon gives that output all of it again,
// and counts each of those exchanges as possibly repeated, and nothing
// after them.
func TestResumeCountsUnconfirmed(t *testing.T) {
	dir := testPinDir(t, "lattrace-test-unconfirmed")
	a := openPinned(t, Options{PinPath: dir})
	first := pingPong(t, 4, 100, 100, 0)
	time.Sleep(100 * time.Millisecond)
	outA := &unconfirmed{}
	sinkA := a.Resume("test", outA)
	decodeAll(a, sinkA)
	sinkA.Flush()
	a.Close()
	sent := len(outA.exchanges)
	if len(outA.connExchanges(first)) < 8 {
		t.Fatalf("the first daemon's output took %d of the 8 exchanges", len(outA.connExchanges(first)))
	}

	b, err := Open(Options{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	outB := &durable{}
	sinkB := b.Resume("test", outB)
	decodeAll(b, sinkB)
	unsure := b.replayedUnsure.Load()
	second := pingPong(t, 3, 100, 100, 0)
	time.Sleep(100 * time.Millisecond)
	decodeAll(b, sinkB)
	if got := len(outB.connExchanges(first)); got != 8 {
		t.Errorf("the next daemon's output took %d of the 8 unconfirmed exchanges again", got)
	}
	if unsure < 8 || unsure > uint64(sent) {
		t.Errorf("replayed_unsure %d after the replay: want the 8 exchanges of the test's connection, at most the %d the killed daemon handed out", unsure, sent)
	}
	if got, after := len(outB.connExchanges(second)), b.replayedUnsure.Load(); got != 6 || after != unsure {
		t.Errorf("after the replay: the output took %d of 6 new exchanges, replayed_unsure went from %d to %d", got, unsure, after)
	}
}

// TestResumeFromCursorPastRing: a cursor in the pinned state map beyond
// what the ring ever produced (the map written by hand, or by a daemon
// gone wrong) was never synced: the output resumed from it takes the
// records, rather than none until the ring gets that far.
func TestResumeFromCursorPastRing(t *testing.T) {
	tr := openPinned(t, Options{PinPath: testPinDir(t, "fuzz-cursor")})
	defer tr.Close()
	if err := tr.storeCursor("test", cursor{ringID: tr.ringID, pos: 1 << 62}); err != nil {
		t.Fatal(err)
	}
	out := &durable{}
	sink := tr.Resume("test", out)
	local := pingPong(t, 3, 100, 100, 0)
	time.Sleep(100 * time.Millisecond)
	decodeAll(tr, sink)
	if got := len(out.connExchanges(local)); got < 3 || tr.replaySkipped.Load() != 0 {
		t.Errorf("resumed from a cursor at 2^62: the output took %d of the 6 exchanges, %d records withheld", got, tr.replaySkipped.Load())
	}
}

// decodeAll hands sink every record the ring holds, as a drain does up to
// its flush, and releases none of them.
func decodeAll(tr *Tracer, sink record.Sink) {
	for {
		raw, end, ok := tr.ring.next()
		if !ok {
			return
		}
		tr.pos = end
		tr.decode(raw, sink)
	}
}

// testPinDir is a pin directory of the test's own under /sys/fs/bpf, cleaned
// up at its end.
func testPinDir(t *testing.T, name string) string {
	dir := fmt.Sprintf("/sys/fs/bpf/%s-%d", name, os.Getpid())
	t.Cleanup(func() { Cleanup(dir) })
	return dir
}

// openPinned opens a tracer on opts' pin directory, or fails the test.
func openPinned(t *testing.T, opts Options) *Tracer {
	t.Helper()
	tr, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v (this test pins BPF objects: run it as root with bpffs mounted)", err)
	}
	return tr
}
