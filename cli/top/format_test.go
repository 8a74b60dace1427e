package top

import (
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                         "0",
		350 * time.Microsecond:    "0.35ms",
		20100 * time.Microsecond:  "20.1ms",
		9999 * time.Microsecond:   "10.0ms",
		120 * ms:                  "120ms",
		999600 * time.Microsecond: "1.00s",
		1250 * ms:                 "1.25s",
		90 * time.Second:          "90.0s",
		30 * time.Minute:          "30.0m",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
		if len(fmtDur(d)) > 6 {
			t.Errorf("fmtDur(%v) = %q is wider than a column", d, fmtDur(d))
		}
	}
}

func TestCompactNumbers(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtRate(0), "0"}, {fmtRate(0.26), "0.3"}, {fmtRate(12.5), "12"}, {fmtRate(200), "200"},
		{fmtRate(1500), "1.5k"}, {fmtRate(25000), "25k"},
		{fmtCount(12345), "12345"}, {fmtCount(2_500_000), "2.5M"},
		{fmtBytes(512), "512B"}, {fmtBytes(1536), "1.5K"}, {fmtBytes(5 << 20), "5.0M"},
		{fmtInterval(250 * ms), "250ms"}, {fmtInterval(2 * time.Second), "2s"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestTruncate(t *testing.T) {
	if got := truncate("redis-server", 6); got != "redis…" {
		t.Errorf("truncate: %q", got)
	}
	if got := truncate("short", 10); got != "short" {
		t.Errorf("truncate of what fits: %q", got)
	}
	if got := truncateMiddle("[2001:db8::99]:51234", 12); width(got) != 12 || !strings.HasSuffix(got, ":51234") {
		t.Errorf("truncateMiddle keeps the port: %q", got)
	}
	if got := truncateAddr(":443 <- 2001:db8::1234", 16); !strings.HasPrefix(got, ":443 <- ") || width(got) != 16 {
		t.Errorf("truncateAddr keeps the local port: %q", got)
	}
	if got := sanitize("evil\x1b[2Jcomm"); strings.ContainsRune(got, '\x1b') {
		t.Errorf("sanitize left an escape: %q", got)
	}
}

func TestBar(t *testing.T) {
	s := record.Split{Network: 2 * ms, Transport: 1 * ms, App: 17 * ms}
	for _, w := range []int{1, 4, 10, 33} {
		c := barCells(s, w)
		if c[0]+c[1]+c[2] != w {
			t.Errorf("width %d: cells %v do not add up", w, c)
		}
		if got := plainBar(s, w); width(got) != w {
			t.Errorf("width %d: bar %q", w, got)
		}
	}
	if got := plainBar(s, 20); got != "██▒░░░░░░░░░░░░░░░░░" {
		t.Errorf("bar %q", got)
	}
	if got := dominantLabels(s); got[0] != "app 85%" {
		t.Errorf("label %v", got)
	}
	if got := dominantLabels(record.Split{Transport: 62, Network: 38}); got[0] != "transport 62%" || got[1] != "trans 62%" {
		t.Errorf("labels %v", got)
	}
	if got := plainBar(record.Split{}, 4); got != "····" {
		t.Errorf("empty split drawn %q", got)
	}
}

func TestSparkline(t *testing.T) {
	line, lo, hi, ok := sparkline([]float64{1, 2, 0, 8}, 10)
	if !ok || line != "▁▂ █" || lo != 1 || hi != 8 {
		t.Errorf("sparkline %q %v %v %v", line, lo, hi, ok)
	}
	if line, _, _, _ := sparkline([]float64{1, 2, 3, 4, 5}, 3); []rune(line)[2] != '█' || len([]rune(line)) != 3 {
		t.Errorf("a narrow sparkline does not keep the newest: %q", line)
	}
	if _, _, _, ok := sparkline([]float64{0, 0}, 5); ok {
		t.Error("nothing measured drew a line")
	}
}

func TestFmtIntervalAndCount(t *testing.T) {
	for d, want := range map[time.Duration]string{
		250 * ms: "250ms", 500 * ms: "500ms", time.Second: "1s", 2 * time.Second: "2s",
		30 * time.Second: "30s", time.Minute: "1m", 1500 * ms: "1500ms",
	} {
		if got := fmtInterval(d); got != want {
			t.Errorf("fmtInterval(%v) = %q, want %q", d, got, want)
		}
	}
	for _, c := range []struct{ got, want string }{
		{count(uint64(0), "exchange"), "0 exchanges"}, {count(uint64(1), "exchange"), "1 exchange"},
		{count(2, "timeout"), "2 timeouts"}, {count(uint64(1), "connection"), "1 connection"},
		{fmtByteRate(0.5e6), "0.5 MB/s"}, {fmtByteRate(4.8e6), "4.8 MB/s"}, {fmtByteRate(12e3), "12 kB/s"},
		{fmtByteRate(2.5e9), "2.5 GB/s"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestWrapKeepsNumbersWithTheirUnits(t *testing.T) {
	text := "the peer took 30 ms of 42.5 ms, 60 % of it, at 1.5 MB/s; 3 retransmissions in 12 s."
	for w := 8; w <= 40; w++ {
		lines := wrap(text, w)
		for i, l := range lines {
			if strings.HasSuffix(l, "…") {
				continue
			}
			if i+1 < len(lines) && endsInDigit(l) && unitWord.MatchString(strings.Fields(lines[i+1])[0]) {
				t.Errorf("width %d: %q / %q splits a number from its unit", w, l, lines[i+1])
			}
		}
		if got := strings.Join(lines, " "); w >= 16 && got != text {
			t.Errorf("width %d: wrapping lost text: %q", w, got)
		}
	}
}
