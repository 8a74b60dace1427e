package tracer

import "testing"

// TestSetConfig: the loader sets the fields Options decide and leaves the
// object's defaults for the rest (a zero path window would disable the
// path's recent RTT).
func TestSetConfig(t *testing.T) {
	spec, err := loadLattrace()
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{NoTxTimestamps: true}
	opts.defaults()
	set, err := setConfig(spec, opts, true)
	if err != nil {
		t.Fatal(err)
	}
	var got lattraceLtConfig
	if err := spec.Variables["cfg"].Get(&got); err != nil {
		t.Fatal(err)
	}
	want := lattraceLtConfig{WakeupBytes: 1 << 20, UseTxTstamp: 0, FilterCgroup: 1, PathWindowNs: 2_000_000_000, IdleWriteNs: uint64(DefaultIdleWrite)}
	if got != want || set != want {
		t.Errorf("configuration %+v (returned %+v), want %+v", got, set, want)
	}
}
