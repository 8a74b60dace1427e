package aggregate

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// A flow's rate is its exchanges over the last five to ten seconds, packed
// or not.
func TestRate(t *testing.T) {
	a := New(Config{ActiveFlows: 1})
	// 10 exchanges per second for 8 s on flow 1; flow 2 packs it at the end.
	for i := range 80 {
		a.AddExchange(exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("a", 1, 1), record.RoleClient, at(float64(i)/10), ms))
	}
	a.AddExchange(exch("10.0.0.1:40001", "10.0.0.2:443", 2, owner("a", 1, 1), record.RoleClient, at(8), ms))
	if st := a.Stats(); st.PackedFlows != 1 {
		t.Fatalf("flow 1 not packed: %+v", st)
	}
	f, ok := a.Flow(record.FlowKey{Flow: record.Flow{Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:443"), Netns: 4026531840}, Cookie: 1})
	if !ok {
		t.Fatal("flow 1 not found")
	}
	if r := f.RateAt(at(8)); r < 9 || r > 11 {
		t.Errorf("rate %v, want about 10", r)
	}
	if r := f.RateAt(at(8) + record.Mono(20*time.Second)); r != 0 {
		t.Errorf("idle rate %v", r)
	}
}
