package netlab

import (
	"math"
	"strings"
	"testing"
	"time"
)

// Unit tests of the link model: no namespaces, no root.

const ms = int64(time.Millisecond)

func drain(s *shaper) []frame {
	out, _ := s.popDue(math.MaxInt64, nil)
	return out
}

func TestShaperSerialization(t *testing.T) {
	// 1500 IP bytes at 12 Mbit/s take exactly 1 ms on the wire.
	s := newShaper(Link{Delay: 10 * time.Millisecond, RateBitsPerSec: 12_000_000, QueueLimitBytes: 1 << 20}, 1, 1)
	for range 5 {
		s.offer(make([]byte, 1514), 100*ms)
	}
	// A frame arriving after the queue drained starts serializing at once.
	s.offer(make([]byte, 1514), 200*ms)
	got := drain(s)
	want := []int64{111, 112, 113, 114, 115, 211}
	for i, f := range got {
		if f.due != want[i]*ms {
			t.Errorf("frame %d due %v, want %d ms", i, time.Duration(f.due), want[i])
		}
	}
	var st LinkStats
	s.stats(200*ms, &st)
	if st.QueueBytes != 1500 {
		t.Errorf("backlog at the start of a frame's serialization = %d, want 1500", st.QueueBytes)
	}
}

func TestShaperQueueLimit(t *testing.T) {
	s := newShaper(Link{RateBitsPerSec: 12_000_000, QueueLimitBytes: 3000}, 1, 1)
	for range 4 {
		s.offer(make([]byte, 1514), 0)
	}
	var st LinkStats
	s.stats(0, &st)
	// Frames 1 and 2 fill the 3000-byte queue; 3 and 4 are tail-dropped.
	if st.QueueDrops != 2 || st.Pending != 2 || st.QueueBytes != 3000 {
		t.Errorf("stats %+v, want 2 queue drops, 2 pending, 3000 B queued", st)
	}
	// One frame time later there is room for exactly one more.
	s.offer(make([]byte, 1514), ms)
	s.offer(make([]byte, 1514), ms)
	s.stats(ms, &st)
	if st.QueueDrops != 3 || st.Pending != 3 {
		t.Errorf("stats %+v, want 3 queue drops, 3 pending", st)
	}
	// A limit below one frame still passes one frame at a time.
	s = newShaper(Link{RateBitsPerSec: 12_000_000, QueueLimitBytes: 100}, 1, 1)
	s.offer(make([]byte, 1514), 0)
	s.offer(make([]byte, 1514), 0)
	s.offer(make([]byte, 1514), 2*ms)
	s.stats(2*ms, &st)
	if st.Pending != 2 || st.QueueDrops != 1 {
		t.Errorf("tiny limit: %+v, want 2 pending 1 drop", st)
	}
}

func TestShaperLoss(t *testing.T) {
	const n, p = 200_000, 0.01
	s := newShaper(Link{Loss: p}, 42, 7)
	for i := range n {
		s.offer(nil, int64(i))
		if i%1000 == 0 {
			drain(s)
		}
	}
	var st LinkStats
	s.stats(0, &st)
	sigma := math.Sqrt(n * p * (1 - p))
	if d := float64(st.LossDrops); math.Abs(d-n*p) > 4.5*sigma {
		t.Errorf("%v drops of %d at p=%v, want %v +- %.0f", d, n, p, n*p, 4.5*sigma)
	}
	for _, tc := range []struct {
		p    float64
		want uint64
	}{{0, 0}, {1, 1000}} {
		s := newShaper(Link{Loss: tc.p}, 1, 1)
		for range 1000 {
			s.offer(nil, 0)
		}
		s.stats(0, &st)
		if st.LossDrops != tc.want {
			t.Errorf("loss %v: %d drops of 1000, want %d", tc.p, st.LossDrops, tc.want)
		}
	}
}

func TestShaperJitterFIFO(t *testing.T) {
	const delay, jitter = 10 * ms, 3 * ms
	s := newShaper(Link{Delay: time.Duration(delay), Jitter: time.Duration(jitter)}, 3, 4)
	// Frames 100 us apart: jitter would reorder them without the FIFO rule.
	for i := range int64(10_000) {
		s.offer(nil, i*ms/10)
	}
	var prev int64
	lo, hi := int64(math.MaxInt64), int64(0)
	for i, f := range drain(s) {
		if f.due < prev {
			t.Fatalf("frame %d due before its predecessor", i)
		}
		prev = f.due
		extra := f.due - int64(i)*ms/10
		lo, hi = min(lo, extra), max(hi, extra)
	}
	if lo < delay-jitter || hi > delay+jitter || hi-lo < jitter {
		t.Errorf("delays span %v..%v, want within %v +- %v and well spread",
			time.Duration(lo), time.Duration(hi), time.Duration(delay), time.Duration(jitter))
	}
}

func TestShaperPopDue(t *testing.T) {
	s := newShaper(Link{Delay: time.Millisecond}, 1, 1)
	for i := range int64(3000) {
		s.offer([]byte{byte(i)}, i)
	}
	got, next := s.popDue(ms+1499, nil)
	if len(got) != 1500 || next != ms+1500 {
		t.Fatalf("popped %d, next %d; want 1500 and %d", len(got), next, ms+1500)
	}
	for i, f := range got {
		if f.data[0] != byte(i) {
			t.Fatalf("frame %d out of order", i)
		}
	}
	got, next = s.popDue(ms+2999, got[:0])
	if len(got) != 1500 || next != 0 || s.pending() != 0 {
		t.Fatalf("popped %d, next %d, pending %d; want 1500, 0, 0", len(got), next, s.pending())
	}
}

func TestLinkValidate(t *testing.T) {
	bad := []Link{
		{Delay: -1}, {Jitter: -1}, {Loss: -0.1}, {Loss: 1.01}, {Loss: math.NaN()},
		{RateBitsPerSec: -1}, {QueueLimitBytes: -1},
	}
	for _, l := range bad {
		if l.Validate() == nil {
			t.Errorf("%+v validated", l)
		}
	}
	if err := (Link{Delay: time.Second, Loss: 1, RateBitsPerSec: 1}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestParse(t *testing.T) {
	rates := map[string]int64{"10mbit": 10e6, "1.5Gbit": 1.5e9, "500kbit": 500e3, "64bit": 64, "0": 0, "2500": 2500}
	for in, want := range rates {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"10mbps", "-1mbit", "fast", ""} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
	sizes := map[string]int{"1500": 1500, "64KiB": 65536, "1MB": 1e6, "1mib": 1 << 20, "10k": 10000, "0": 0}
	for in, want := range sizes {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"-5", "lots", "9GB"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
		}
	}
	for _, r := range []int64{10e6, 1e9, 2.5e9, 500e3, 1234567, 7} {
		if got, err := ParseRate(FormatRate(r)); err != nil || got != r {
			t.Errorf("ParseRate(FormatRate(%d)=%q) = %d, %v", r, FormatRate(r), got, err)
		}
	}
	if s := (Link{Delay: 10 * time.Millisecond, Loss: 0.01, RateBitsPerSec: 10e6}).String(); !strings.Contains(s, "10mbit") || !strings.Contains(s, "loss 1%") {
		t.Errorf("Link.String() = %q", s)
	}
}
