package netlab

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseRate parses a rate in tc's style: "10mbit", "1.5gbit", "500kbit",
// "100bit" or a bare number of bits per second. Units are decimal (k=1000),
// as in tc. "0" means unlimited. Byte rates ("mbps" is MB/s in tc, and
// ambiguous to humans) are rejected on purpose.
func ParseRate(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("bad rate %q (want e.g. 10mbit, 500kbit, 1gbit)", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("rate %q is negative", s)
	}
	r := v * mult
	if r > math.MaxInt64/2 {
		return 0, fmt.Errorf("rate %q is too large", s)
	}
	return int64(math.Round(r)), nil
}

// ParseBytes parses a size: a bare number of bytes, or with a suffix
// k/kb/m/mb/g/gb (decimal) or kib/mib/gib (binary). "0" means default.
func ParseBytes(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},
		{"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"b", 1},
	} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("bad size %q (want e.g. 64KiB, 1MB, 1500)", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	b := v * mult
	if b > math.MaxInt32 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int(math.Round(b)), nil
}

// FormatRate formats bits per second the way ParseRate reads them.
func FormatRate(bps int64) string {
	switch {
	case bps >= 1e9 && bps%1e7 == 0:
		return strconv.FormatFloat(float64(bps)/1e9, 'f', -1, 64) + "gbit"
	case bps >= 1e6 && bps%1e4 == 0:
		return strconv.FormatFloat(float64(bps)/1e6, 'f', -1, 64) + "mbit"
	case bps >= 1e3 && bps%10 == 0:
		return strconv.FormatFloat(float64(bps)/1e3, 'f', -1, 64) + "kbit"
	}
	return strconv.FormatInt(bps, 10) + "bit"
}
