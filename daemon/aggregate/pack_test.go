package aggregate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Packing stores these as their memory: a pointer there would be stored
// as an address and come back dangling.
func TestPackedTypesHoldNoPointer(t *testing.T) {
	for _, v := range []any{scalars{}} {
		if p := pointerIn(reflect.TypeOf(v)); p != "" {
			t.Errorf("%T holds a %s", v, p)
		}
		if n := reflect.TypeOf(v).Size(); n%8 != 0 {
			t.Errorf("%T is %d bytes, not whole words", v, n)
		}
	}
}

func pointerIn(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			if p := pointerIn(t.Field(i).Type); p != "" {
				return t.Field(i).Name + ": " + p
			}
		}
	case reflect.Array:
		return pointerIn(t.Elem())
	case reflect.Pointer, reflect.String, reflect.Slice, reflect.Map, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return t.Kind().String()
	}
	return ""
}

// fill sets every settable number, string and bool reachable from v
// without a pointer to a random nonzero value, so a field pack forgets
// shows up as a difference.
func fill(v reflect.Value, r *rand.Rand) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() || v.Field(i).CanSet() {
				fill(v.Field(i), r)
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), r)
		}
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1 + r.Uint64N(1<<(v.Type().Bits()-1)))
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1 + r.Int64N(1<<(v.Type().Bits()-2)))
	case reflect.Float64:
		v.SetFloat(r.Float64() * 1e9)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.String:
		v.SetString(fmt.Sprint("s", r.Uint32()))
	}
}

// Every field of a flow comes back from its packed bytes.
func TestPackRoundTripEveryField(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	c := flowSketches(newMapping(DefaultRelativeAccuracy))
	for range 20 {
		var f flowEntry
		fill(reflect.ValueOf(&f.m.sc).Elem(), r)
		fill(reflect.ValueOf(&f.owner).Elem(), r)
		fill(reflect.ValueOf(&f.peerKey).Elem(), r)
		fill(reflect.ValueOf(&f.burst).Elem(), r)
		fill(reflect.ValueOf(&f.rate).Elem(), r)
		fill(reflect.ValueOf(&f.close).Elem(), r)
		f.key = record.FlowKey{Cookie: r.Uint64(), Flow: record.Flow{
			Local: ap("[fe80::1%eth0]:1234"), Remote: ap("10.1.2.3:443"), Netns: r.Uint32()}}
		f.peerKey.Remote = ap("10.1.2.3:443").Addr()
		f.owner.K8s = &record.K8s{Pod: "p"}
		f.peerK8s = &record.K8s{Pod: "q"}
		f.connRole, f.side, f.m.cc = record.RoleClient, record.RoleServer, "bbr"
		f.opened, f.connectLatency, f.handshakeRTT = record.Mono(r.Uint64()), time.Duration(r.Int64()), -time.Duration(r.Int64N(1e9))
		f.closed, f.lastUpdate, f.closedAt = true, record.Mono(r.Uint64()), record.Mono(r.Uint64())
		for i := range f.m.sk {
			for range r.IntN(50) {
				f.m.sk[i].add(&c, time.Duration(r.Int64N(int64(10*time.Second))))
			}
		}
		p, _ := f.pack(&c, nil)
		var g flowEntry
		if err := p.unpack(&g, &c); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g.snapshotLocked(&c), f.snapshotLocked(&c)) {
			t.Fatalf("snapshot changed:\nbefore %+v\nafter  %+v", f.snapshotLocked(&c), g.snapshotLocked(&c))
		}
		g.m.sc, g.m.cc = scalars{}, ""
		for i := range g.m.sk {
			g.m.sk[i].st = f.m.sk[i].st // compared through the snapshot
		}
		f.m.sc, f.m.cc = scalars{}, ""
		if !reflect.DeepEqual(&g, &f) {
			t.Fatalf("entry changed:\nbefore %+v\nafter  %+v", &f, &g)
		}
	}
}

// A packed flow that is read or updated again is the flow it would have
// been unpacked all along: the same traffic through an aggregator that
// keeps 3 flows unpacked and one that keeps all of them gives the same
// snapshots.
func TestPackedFlowsAreLossless(t *testing.T) {
	// Retirement is Expire's (TestPackedFlowsExpire): not here.
	small := New(Config{ActiveFlows: 3, CloseGrace: time.Hour})
	whole := New(Config{CloseGrace: time.Hour})
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 5000 {
		flow := r.IntN(40)
		role := record.RoleClient
		if flow%3 == 0 {
			role = record.RoleServer
		}
		o := owner(fmt.Sprintf("app%d", flow%5), uint64(flow%2), uint32(flow))
		ex := exch(fmt.Sprintf("10.0.0.1:%d", 30000+flow), fmt.Sprintf("10.0.2.%d:443", flow%7),
			uint64(flow+1), o, role, at(float64(i)/100), time.Duration(1+r.IntN(5000))*time.Microsecond)
		ex.Retransmits, ex.CwndEnd, ex.ExchangeTurns, ex.IdleGap = uint32(r.IntN(2)), uint32(10+r.IntN(30)), uint32(1+r.IntN(3)), time.Duration(r.IntN(5))*ms
		ex.Components.SendWait = time.Duration(r.IntN(3)) * time.Microsecond
		for _, a := range []*Aggregator{small, whole} {
			switch {
			case i%97 == 0:
				a.AddConnOpen(record.ConnOpen{Time: ex.Time, Cookie: ex.Cookie, Flow: ex.Flow, Role: role, ConnectLatency: time.Duration(i) * time.Microsecond})
			case i%389 == 0:
				a.AddConnClose(record.ConnClose{Time: ex.Time, Cookie: ex.Cookie, Flow: ex.Flow, Owner: o, Role: role, BytesSent: uint64(i)})
			default:
				a.AddExchange(ex)
			}
			if i%250 == 0 {
				a.Expire(ex.Time)
			}
		}
	}
	got, want := small.Flows(), whole.Flows()
	if st := small.Stats(); st.PackedFlows == 0 || st.Flows != len(want) || st.PackErrors != 0 || st.FlowsEvicted != 0 {
		t.Fatalf("stats %+v (want %d flows, some packed)", st, len(want))
	}
	if !reflect.DeepEqual(got, want) {
		for i := range min(len(got), len(want)) {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Fatalf("flow %d:\npacked %+v\nwhole  %+v", i, got[i], want[i])
			}
		}
		t.Fatalf("%d flows, want %d", len(got), len(want))
	}
	if !reflect.DeepEqual(small.Peers(), whole.Peers()) {
		t.Fatal("peer pairs differ")
	}
	for _, w := range want {
		if g, ok := small.Flow(w.FlowKey); !ok || !reflect.DeepEqual(g, w) {
			t.Fatalf("Flow(%v) = %v, %+v", w.FlowKey, ok, g)
		}
	}
	checkRows(t, small, want)
}

// checkRows wants each flow's row, packed or not, to be what its snapshot
// says of the same things.
func checkRows(t *testing.T, a *Aggregator, flows []FlowStats) {
	t.Helper()
	byCookie := map[uint64]*FlowStats{}
	for i := range flows {
		byCookie[flows[i].Cookie] = &flows[i]
	}
	now := at(100)
	n := 0
	a.EachFlowRow(func(r *FlowRow) bool {
		n++
		s := byCookie[r.Cookie]
		if s == nil {
			t.Errorf("row of flow %d, which has no snapshot", r.Cookie)
			return true
		}
		want := FlowRow{FlowKey: s.FlowKey, Owner: s.Owner, Peer: s.Peer, P50: s.Duration.P50, P99: s.Duration.P99,
			Exchanges: s.Exchanges, Retransmits: s.Retransmits, Bytes: s.Out.Bytes + s.In.Bytes, TurnsPerExchange: s.Turns.PerExchangeMean, rate: s.rate}
		if !reflect.DeepEqual(*r, want) || r.RateAt(now) != s.RateAt(now) {
			t.Errorf("flow %d: row %+v, snapshot says %+v", r.Cookie, *r, want)
		}
		return true
	})
	if n != len(flows) {
		t.Errorf("%d rows for %d flows", n, len(flows))
	}
}

// Packed flows retire after CloseGrace and expire after FlowIdle like the
// others, at Expire's walk of them.
func TestPackedFlowsExpire(t *testing.T) {
	a := New(Config{ActiveFlows: 1, CloseGrace: time.Second, FlowIdle: time.Minute})
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("a", 1, 1), record.RoleClient, at(1), ms)
	e2 := exch("10.0.0.1:40001", "10.0.0.2:443", 2, owner("a", 1, 1), record.RoleClient, at(2), ms)
	e3 := exch("10.0.0.1:40002", "10.0.0.2:443", 3, owner("a", 1, 1), record.RoleClient, at(3), ms)
	a.AddExchange(e1)
	a.AddConnClose(record.ConnClose{Time: at(1.5), Cookie: 1, Flow: e1.Flow, Owner: e1.Owner, Role: record.RoleClient})
	a.AddExchange(e2)
	a.AddExchange(e3) // e1 and e2 are packed now
	if st := a.Stats(); st.PackedFlows != 2 || st.Flows != 3 {
		t.Fatalf("stats %+v", st)
	}
	a.Expire(at(10))
	if st := a.Stats(); st.Flows != 2 || st.FlowsRetired != 1 {
		t.Fatalf("closed packed flow not retired: %+v", st)
	}
	a.Expire(at(70))
	if st := a.Stats(); st.Flows != 0 || st.FlowsExpired != 2 {
		t.Fatalf("idle flows not expired: %+v", st)
	}
}

// A corrupt packed flow is dropped and counted, never a panic.
func TestCorruptPackedFlowCounted(t *testing.T) {
	a := New(Config{ActiveFlows: 1})
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("a", 1, 1), record.RoleClient, at(1), ms)
	a.AddExchange(e1)
	a.AddExchange(exch("10.0.0.1:40001", "10.0.0.2:443", 2, owner("a", 1, 1), record.RoleClient, at(2), ms))
	p := a.packed[1]
	p.b = p.b[:len(p.b)/2]
	a.packed[1] = p
	if len(a.Flows()) != 1 {
		t.Fatal("a corrupt packed flow listed")
	}
	a.AddExchange(e1)
	if st := a.Stats(); st.PackErrors != 1 || st.Flows != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A full table evicts the least recently updated flow, packed or not.
func TestEvictionTakesTheOldestPacked(t *testing.T) {
	a := New(Config{MaxFlows: 4, ActiveFlows: 2})
	for i := range 6 {
		a.AddExchange(exch(fmt.Sprintf("10.0.0.1:%d", 40000+i), "10.0.0.2:443", uint64(i+1), owner("a", 1, 1), record.RoleClient, at(float64(i)), ms))
	}
	var left []uint64
	for _, f := range a.Flows() {
		left = append(left, f.Cookie)
	}
	if st := a.Stats(); !reflect.DeepEqual(left, []uint64{3, 4, 5, 6}) || st.FlowsEvicted != 2 {
		t.Fatalf("flows left %v, stats %+v: want the two oldest evicted", left, st)
	}
}

// --max-flows alone may go below the default --active-flows; an explicit
// --active-flows above it is one clear error.
func TestValidateBounds(t *testing.T) {
	if err := (Config{MaxFlows: 1000}).Validate(); err != nil {
		t.Errorf("--max-flows 1000: %v", err)
	}
	if c := New(Config{MaxFlows: 1000}).Config(); c.ActiveFlows != 1000 {
		t.Errorf("active flows %d with --max-flows 1000", c.ActiveFlows)
	}
	for c, want := range map[Config]string{
		{MaxFlows: 1000, ActiveFlows: 3000}: "--active-flows 3000 is above --max-flows 1000",
		{MaxPeers: -1}:                      "--max-peers -1: want a positive number",
	} {
		if err := c.Validate(); err == nil || err.Error() != want {
			t.Errorf("%+v: %v, want %q", c, err, want)
		}
	}
}

// A float comes back with its exact bits, whole nanoseconds in a few
// bytes and anything else at all.
func TestPackFloat(t *testing.T) {
	for _, f := range []float64{1, 3150223, 1<<53 - 1, 1 << 53, 1e300, 0.5, -3, math.Copysign(0, -1), math.Inf(1), math.NaN(), 12.6e6} {
		var w packer
		w.float(math.Float64bits(f))
		r := unpacker{b: w.b}
		if got := r.float(); got != math.Float64bits(f) || r.err != nil || len(r.b) != 0 {
			t.Errorf("%v: got %v (%v)", f, math.Float64frombits(got), r.err)
		}
		if f == 3150223 && len(w.b) > 4 {
			t.Errorf("%v took %d bytes", f, len(w.b))
		}
	}
	if r := (unpacker{b: []byte{3}}); r.float() != 0 || r.err == nil {
		t.Error("an odd tag other than 1 was taken")
	}
}

// Flows as traffic leaves them pack and come back whole: a pair's key the
// flow's and owner's (stored as one byte), a flow whose owner changed
// after its attribution, one never attributed, and sums that are whole
// nanoseconds, fractions, negative or not a number.
func TestPackRealFlows(t *testing.T) {
	a := New(Config{})
	c := &a.flowSC
	e := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleClient, at(1), 3*ms)
	a.AddExchange(e)
	a.AddExchange(exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleClient, at(2), 5*ms))
	renamed := a.flows[1]
	renamed.owner.Comm = "curl-renamed" // a later record's owner, the pair's key unchanged
	a.AddExchange(exch("10.0.0.1:40001", "10.0.0.2:443", 2, record.Owner{}, record.RoleClient, at(3), ms))
	lone := a.flows[2]
	lone.m.sc.compSum[csPeer] = math.NaN()
	lone.m.sc.compSum[csThink] = -1234
	lone.m.sc.compSum[csLocalRead] = 0.25
	lone.m.sc.active = 1 << 60
	for name, f := range map[string]*flowEntry{"attributed, then renamed": renamed, "never attributed": lone} {
		p, _ := f.pack(c, nil)
		var g flowEntry
		if err := p.unpack(&g, c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// DeepEqual takes NaN for unequal: compare the words.
		if g.peerKey != f.peerKey || !slices.Equal(wordsOf(&g.m.sc), wordsOf(&f.m.sc)) ||
			!reflect.DeepEqual(g.snapshotLocked(c).Components, f.snapshotLocked(c).Components) {
			t.Errorf("%s: came back changed:\nbefore %+v %+v\nafter  %+v %+v", name, f.peerKey, f.m.sc, g.peerKey, g.m.sc)
		}
	}
	// The flow's own key and owner make its pair's: one byte for it.
	f := a.flows[1]
	f.owner.Comm = "curl"
	short, _ := f.pack(c, nil)
	f.owner.Comm = "curl-renamed"
	long, _ := f.pack(c, nil)
	if len(long.b)-len(short.b) < 10 {
		t.Errorf("a pair key that is the flow's took %d bytes, one that is not %d", len(short.b), len(long.b))
	}
	// Only the binned sketches (duration, send wait) have stores.
	f.m.fold(c)
	for k := range f.m.sk {
		if has := f.m.sk[k].st != nil; has && !c.binned[k] || k == skDuration && !has {
			t.Errorf("sketch %d: store %v, binned %v", k, has, c.binned[k])
		}
	}
}

// A sketch's exact statistics come back exactly, and impossible ones are
// an error.
func TestPackExact(t *testing.T) {
	for _, vals := range [][]time.Duration{nil, {0, 0}, {1}, {math.MaxInt64}, {0, 7 * ms}, {1, math.MaxInt64}, {3, 3, 3}, {1<<53 + 1, 5}} {
		var s sketch
		for _, v := range vals {
			s.count(v)
		}
		var w packer
		w.exact(&s.exactStats)
		r := unpacker{b: w.b}
		if got := r.exact(); got != s.exactStats || r.err != nil || len(r.b) != 0 {
			t.Errorf("%v: got %+v, want %+v (%v)", vals, got, s.exactStats, r.err)
		}
	}
	for _, bad := range [][]byte{{1, 2}, {2, 0, 5, 5}, {2, 0, 0, 0}, {2, 0, 5, 9}} {
		r := unpacker{b: bad}
		if r.exact(); r.err == nil {
			t.Errorf("% x taken", bad)
		}
	}
}

// A connection open before lattrace keeps how its role was told and how
// its HTTP/2 framing was found, packed or not.
func TestAdoptedFlowState(t *testing.T) {
	a := New(Config{ActiveFlows: 1, CloseGrace: time.Hour})
	o := owner("grpc", 1, 1)
	e := exch("10.0.0.1:40000", "10.0.0.2:50051", 1, o, record.RoleClient, at(1), ms)
	e.RoleSource, e.HTTP2Searching, e.Multiplexed = record.RoleFromListener, true, true
	a.AddExchange(e)
	if f, _ := a.Flow(record.FlowKey{Flow: e.Flow, Cookie: 1}); f.RoleSource != record.RoleFromListener || f.HTTP2Framing != HTTP2Searching || f.Timed() != 0 {
		t.Fatalf("searching: %+v", f)
	}
	s := exch("10.0.0.1:40000", "10.0.0.2:50051", 1, o, record.RoleClient, at(2), ms)
	s.RoleSource, s.Stream = record.RoleFromListener, &record.HTTP2Stream{ID: 7}
	a.AddExchange(s)
	a.AddExchange(exch("10.0.0.1:40001", "10.0.0.2:443", 2, o, record.RoleClient, at(3), ms)) // packs the first
	if st := a.Stats(); st.PackedFlows != 1 {
		t.Fatalf("stats %+v", st)
	}
	if f, _ := a.Flow(record.FlowKey{Flow: e.Flow, Cookie: 1}); f.RoleSource != record.RoleFromListener || f.HTTP2Framing != HTTP2FoundMidway || f.Timed() != 1 {
		t.Fatalf("found: %+v", f)
	}
	for was, want := range map[string]string{HTTP2Searching: HTTP2NotFound, "": "", HTTP2FromPreface: HTTP2FromPreface} {
		if got := http2Framing(was, &record.Exchange{}); got != want {
			t.Errorf("after %q, a connection-level exchange: %q, want %q", was, got, want)
		}
	}
}
