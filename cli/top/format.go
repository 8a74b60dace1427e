package top

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/record"
)

// Glyphs of the latency split: distinct shapes, so the bar reads on a
// terminal without colour, in a pipe and in a screenshot printed grey.
const (
	glyphNetwork   = '█'
	glyphTransport = '▒'
	glyphApp       = '░'
)

// Parts of the split, in the order the bar draws them.
const (
	partNetwork = iota
	partTransport
	partApp
	numParts
)

func partName(i int) string { return [numParts]string{"network", "transport", "app"}[i] }

// shortPartName fits the narrowest split column.
func shortPartName(i int) string { return [numParts]string{"net", "trans", "app"}[i] }

func partGlyph(i int) string {
	return string([numParts]rune{glyphNetwork, glyphTransport, glyphApp}[i])
}

// sparkGlyphs are the eight heights of a sparkline, lowest first.
const sparkGlyphs = "▁▂▃▄▅▆▇█"

// width is the cell width of s, escape sequences ignored.
func width(s string) int { return lipgloss.Width(s) }

// sanitize makes text that came from the kernel or the network safe to put
// on a terminal: a process may name itself with escape sequences.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

// truncate cuts s to at most w cells, marking the cut with an ellipsis.
func truncate(s string, w int) string {
	if width(s) <= w {
		return s
	}
	if w <= 0 {
		return ""
	}
	var b strings.Builder
	used := 0
	for _, r := range s {
		rw := width(string(r))
		if used+rw > w-1 {
			break
		}
		b.WriteRune(r)
		used += rw
	}
	b.WriteRune('…')
	return b.String()
}

// truncateMiddle cuts s to w cells keeping both ends: an address is told
// apart by its start and its port.
func truncateMiddle(s string, w int) string {
	if width(s) <= w {
		return s
	}
	if w < 5 {
		return truncate(s, w)
	}
	rs := []rune(s)
	// The end gets the larger half: it holds the port.
	tail := w / 2
	head := w - 1 - tail
	var h, t []rune
	for i, used := 0, 0; i < len(rs); i++ {
		rw := width(string(rs[i]))
		if used+rw > head {
			break
		}
		h = append(h, rs[i])
		used += rw
	}
	for i, used := len(rs)-1, 0; i >= 0; i-- {
		rw := width(string(rs[i]))
		if used+rw > tail {
			break
		}
		t = append([]rune{rs[i]}, t...)
		used += rw
	}
	return string(h) + "…" + string(t)
}

// truncateAddr cuts "a -> b" or ":port <- b" in b, the part that
// varies from row to row, and any other address in the middle.
func truncateAddr(s string, w int) string {
	if width(s) <= w {
		return s
	}
	for _, arrow := range []string{" -> ", " <- "} {
		if head, tail, ok := strings.Cut(s, arrow); ok && width(head)+len(arrow)+5 <= w {
			return head + arrow + truncateMiddle(tail, w-width(head)-len(arrow))
		}
	}
	return truncateMiddle(s, w)
}

// pad fills s with spaces to w cells, on the left when right-aligned.
func pad(s string, w int, right bool) string {
	n := w - width(s)
	if n <= 0 {
		return s
	}
	if right {
		return strings.Repeat(" ", n) + s
	}
	return s + strings.Repeat(" ", n)
}

// fmtDur prints a duration in at most six cells with three significant
// digits: 0.35ms, 20.1ms, 120ms, 1.25s. It is diagnose.Dur without the
// space, one digit finer, so a column of them lines up.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	ms := float64(d) / float64(time.Millisecond)
	if ms < 999.5 {
		return sig3(ms) + "ms"
	}
	s := d.Seconds()
	if s < 999.5 {
		return sig3(s) + "s"
	}
	if m := d.Minutes(); m < 999.5 {
		return sig3(m) + "m"
	}
	return fmt.Sprintf("%.0fh", d.Hours())
}

// sig3 prints v (>= 0, < 999.5) with three significant digits; the bounds
// are where rounding would add a digit.
func sig3(v float64) string {
	switch {
	case v < 9.995:
		return fmt.Sprintf("%.2f", v)
	case v < 99.95:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// fmtRate prints exchanges per second in at most four cells.
func fmtRate(r float64) string {
	switch {
	case r <= 0 || math.IsNaN(r):
		return "0"
	case r < 9.95:
		return fmt.Sprintf("%.1f", r)
	case r < 999.5:
		return fmt.Sprintf("%.0f", r)
	case r < 9950:
		return fmt.Sprintf("%.1fk", r/1e3)
	case r < 999.5e3:
		return fmt.Sprintf("%.0fk", r/1e3)
	}
	return fmt.Sprintf("%.1fM", r/1e6)
}

// fmtCount prints a counter in at most five cells.
func fmtCount(n uint64) string {
	switch {
	case n < 100000:
		return fmt.Sprintf("%d", n)
	case n < 999500:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	case n < 999.5e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	}
	return fmt.Sprintf("%.1fG", float64(n)/1e9)
}

// fmtBytes prints a byte count in at most five cells, powers of 1024.
func fmtBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	v := float64(n)
	for _, u := range []string{"K", "M", "G", "T"} {
		v /= 1024
		if v < 9.95 {
			return fmt.Sprintf("%.1f%s", v, u)
		}
		if v < 1023.5 {
			return fmt.Sprintf("%.0f%s", v, u)
		}
	}
	return fmt.Sprintf("%.0fP", v/1024)
}

// fmtAge prints how long ago something happened, in at most five cells.
func fmtAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < 100*time.Second:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < 100*time.Minute:
		return fmt.Sprintf("%.0fm", d.Minutes())
	}
	return fmt.Sprintf("%.0fh", d.Hours())
}

// fmtInterval prints a refresh interval the way a person sets it: 250ms,
// 1s, 30s, 1m; Duration.String would say 1m0s.
func fmtInterval(d time.Duration) string {
	switch {
	case d < time.Second || d%time.Second != 0:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// count says "1 exchange", "2 exchanges".
func count[N uint64 | uint32 | int](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// fmtByteRate prints bytes per second in decimal units, as link speeds
// are: 0.5 MB/s, 120 kB/s.
func fmtByteRate(r float64) string {
	switch {
	case r >= 1e9:
		return fmt.Sprintf("%.1f GB/s", r/1e9)
	case r >= 0.1e6:
		return fmt.Sprintf("%.1f MB/s", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.0f kB/s", r/1e3)
	}
	return fmt.Sprintf("%.0f B/s", max(r, 0))
}

// fmtAddrPort prints an endpoint as it appears on the wire: IPv4-mapped
// addresses as IPv4, IPv6 in brackets.
func fmtAddrPort(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return "-"
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}

func fmtAddr(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.Unmap().String()
}

// hasTiming reports whether m has complete exchanges; without them its
// quantiles are zeros that mean "unknown", not "instant", and its turns
// those of exchanges whose start lattrace missed.
func hasTiming(m *aggregate.Metrics) bool { return m.Duration.Count > 0 }

// durOrDash prints d, or "-" when m has no timing.
func durOrDash(m *aggregate.Metrics, d time.Duration) string {
	if !hasTiming(m) {
		return "-"
	}
	return fmtDur(d)
}

// splitParts is the split as an array, in bar order.
func splitParts(s record.Split) [numParts]time.Duration {
	return [numParts]time.Duration{s.Network, s.Transport, s.App}
}

// splitOfSample groups one exchange's components the way diagnose groups
// a flow's means, so a sample's split and its flow's add up alike.
func splitOfSample(c record.Components) record.Split {
	return c.Split()
}

// barCells shares w cells among the parts of s by largest remainder, so
// the cells always add up to w and a bar of one row lines up with the next.
func barCells(s record.Split, w int) [numParts]int {
	var out [numParts]int
	total := s.Total()
	if total <= 0 || w <= 0 {
		return out
	}
	parts := splitParts(s)
	var rem [numParts]float64
	used := 0
	for i, p := range parts {
		exact := float64(p) / float64(total) * float64(w)
		out[i] = int(exact)
		rem[i] = exact - float64(out[i])
		used += out[i]
	}
	for ; used < w; used++ {
		best := 0
		for i := range rem {
			if rem[i] > rem[best] {
				best = i
			}
		}
		out[best]++
		rem[best] = -1
	}
	return out
}

// plainBar draws the bar without colour; an empty split is dots, so a row
// without timing does not look like a zero-latency one.
func plainBar(s record.Split, w int) string {
	if s.Total() <= 0 {
		return strings.Repeat("·", max(w, 0))
	}
	var b strings.Builder
	for i, n := range barCells(s, w) {
		b.WriteString(strings.Repeat(partGlyph(i), n))
	}
	return b.String()
}

// dominantPart is the index of s.Dominant(), -1 without timing.
func dominantPart(s record.Split) int {
	switch s.Dominant() {
	case "network":
		return partNetwork
	case "transport":
		return partTransport
	case "app":
		return partApp
	}
	return -1
}

// pctOf is p's share of total in whole percent.
func pctOf(p, total time.Duration) int {
	if total <= 0 {
		return 0
	}
	return int(math.Round(100 * float64(p) / float64(total)))
}

// dominantLabels are the texts after a bar, longest first: "app 85%",
// "transport 62%" then "trans 62%".
func dominantLabels(s record.Split) []string {
	i := dominantPart(s)
	if i < 0 {
		return []string{"-"}
	}
	pct := pctOf(splitParts(s)[i], s.Total())
	full := fmt.Sprintf("%s %d%%", partName(i), pct)
	short := fmt.Sprintf("%s %d%%", shortPartName(i), pct)
	if short == full {
		return []string{full}
	}
	return []string{full, short}
}

// sparkline draws vals (oldest first) in at most w cells, the newest on
// the right. Values not above zero are "not measured" and stay blank.
func sparkline(vals []float64, w int) (line string, lo, hi float64, ok bool) {
	if w <= 0 {
		return "", 0, 0, false
	}
	if len(vals) > w {
		vals = vals[len(vals)-w:]
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if v > 0 {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return strings.Repeat(" ", len(vals)), 0, 0, false
	}
	glyphs := []rune(sparkGlyphs)
	var b strings.Builder
	for _, v := range vals {
		switch {
		case v <= 0:
			b.WriteByte(' ')
		case hi == lo:
			// A flat line is drawn mid-height, not as "all minimum".
			b.WriteRune(glyphs[len(glyphs)/2-1])
		default:
			i := int(math.Round((v - lo) / (hi - lo) * float64(len(glyphs)-1)))
			b.WriteRune(glyphs[i])
		}
	}
	return b.String(), lo, hi, true
}

// wrap breaks text into lines of at most w cells at spaces, never between
// a number and its unit; a word longer than a line is cut.
func wrap(text string, w int) []string { return wrapItems(words(text), " ", w) }

// unitWord is a unit that follows a number after a space, as diagnoses
// write them ("30 ms", "60 %", "1.5 MB/s"), trailing punctuation allowed.
var unitWord = regexp.MustCompile(`^(ns|µs|us|ms|s|m|min|h|%|B|[kKMGT]i?B)(/s)?[,.;:)]*$`)

// words splits text at spaces, keeping a number and its unit together.
func words(text string) []string {
	var out []string
	for _, f := range strings.Fields(text) {
		if n := len(out); n > 0 && unitWord.MatchString(f) && endsInDigit(out[n-1]) {
			out[n-1] += " " + f
			continue
		}
		out = append(out, f)
	}
	return out
}

func endsInDigit(s string) bool { return s != "" && s[len(s)-1] >= '0' && s[len(s)-1] <= '9' }

// wrapItems lays items out on lines of at most w cells, joined by sep,
// never breaking an item unless it alone is wider than a line.
func wrapItems(items []string, sep string, w int) []string {
	var lines []string
	cur := ""
	for _, it := range items {
		switch {
		case it == "":
		case cur == "":
			cur = it
		case width(cur)+width(sep)+width(it) <= w:
			cur += sep + it
		default:
			lines = append(lines, truncate(cur, w))
			cur = it
		}
	}
	if cur != "" {
		lines = append(lines, truncate(cur, w))
	}
	return lines
}

// oneLine makes a message fit one status line's worth of text.
func oneLine(s string) string { return strings.Join(strings.Fields(sanitize(s)), " ") }
