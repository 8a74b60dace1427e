package top

import (
	"strings"

	"github.com/lattrace/lattrace/record"
)

// A table is laid out for one width at a time: every column starts at its
// natural width, then stages shrink or drop the columns that matter least
// until the line fits, and what the last stages freed beyond the need goes
// back, the last taken first, then to the split bar. The same layout draws
// the live screen and the plain output of WriteFlows, so what a script
// reads is what a person sees; only the plain output never cuts a text.
//
// A column's texts come in alternatives, preferred first, and one column
// shows the same alternative on every row: a screen where some rows show
// the local address and others only its port reads as two kinds of flow.

// sortMarker follows the title of the column the rows are sorted by.
const sortMarker = "▼"

// column describes one column of a table.
type column struct {
	// name identifies the column to stages and to the sort marker.
	name string
	// titles are the header's alternatives, preferred first; a column
	// titled "" lends its header cells to the column before it.
	titles []string
	right  bool
	// middle cuts the text in its middle, when a stage cuts it at all:
	// an address is told apart by its start and its port.
	middle bool
	// whole columns print their first text in plain output, however
	// wide: a script or a pager wants identifiers, addresses and names
	// entire.
	whole bool
	// bar marks the split bar column: its cells come from row.split.
	bar bool
	// barWant is the bar's natural width and grow the width it may reach
	// with spare room.
	barWant, grow int
}

// tableRow is one row: per column, the texts it may show, preferred first.
type tableRow struct {
	id    string
	cells [][]string
	split record.Split
}

// stage is one step of giving up width. A plain stage steps column col
// down through its alternatives, to no narrower than floor (0: as far as
// they go); a cut stage may also cut the text, with an ellipsis, to
// floor; a drop stage hides the column. Plain output takes neither cut
// stages nor the live ones: it shows every value, whole.
type stage struct {
	col   string
	floor int
	cut   bool
	drop  bool
	live  bool
}

func shrinkTo(col string, floor int) stage { return stage{col: col, floor: floor} }
func cutTo(col string, floor int) stage    { return stage{col: col, floor: floor, cut: true} }

// dropCol hides an optional column, on screen and in plain output.
func dropCol(col string) stage { return stage{col: col, drop: true} }

// hideCol hides a column on screen only.
func hideCol(col string) stage { return stage{col: col, drop: true, live: true} }

type table struct {
	cols   []column
	rows   []tableRow
	stages []stage
	// sortCol is the name of the column the rows are sorted by.
	sortCol string
	// alts caches altWidths: a frame asks for them once per cell.
	alts [][]int
}

func (t *table) index(name string) int {
	for i := range t.cols {
		if t.cols[i].name == name {
			return i
		}
	}
	return -1
}

func (t *table) title(i int) []string {
	c := &t.cols[i]
	if c.name != "" && c.name == t.sortCol {
		out := make([]string, len(c.titles))
		for j, s := range c.titles {
			out[j] = s + sortMarker
		}
		return out
	}
	return c.titles
}

// altWidths is, for each alternative k of column i, the width it takes
// on every row (a row with fewer alternatives shows its last), title
// included.
func (t *table) altWidths(i int) []int {
	if t.alts == nil {
		t.alts = make([][]int, len(t.cols))
	}
	if t.alts[i] != nil {
		return t.alts[i]
	}
	titles := t.title(i)
	n := len(titles)
	for _, r := range t.rows {
		n = max(n, len(r.cells[i]))
	}
	ws := make([]int, n)
	for k := range ws {
		ws[k] = width(titles[min(k, len(titles)-1)])
		for _, r := range t.rows {
			if a := r.cells[i]; len(a) > 0 {
				ws[k] = max(ws[k], width(a[min(k, len(a)-1)]))
			}
		}
	}
	t.alts[i] = ws
	return ws
}

// natural is the width column i needs to show its preferred texts.
func (t *table) natural(i int) int {
	if c := &t.cols[i]; c.bar {
		return c.barWant
	}
	return t.altWidths(i)[0]
}

// pick is the alternative column i shows in w cells: the first that fits
// every row, or the last.
func (t *table) pick(i, w int) int {
	ws := t.altWidths(i)
	for k, a := range ws {
		if a <= w {
			return k
		}
	}
	return len(ws) - 1
}

// layout returns each column's width for a line of at most total cells;
// 0 means the column is not shown. In plain output no stage cuts a text
// or narrows a whole column, and the line may be wider than total.
func (t *table) layout(total int, plain bool) []int {
	w := make([]int, len(t.cols))
	used := -1 // n columns take n-1 separators
	for i := range t.cols {
		w[i] = t.natural(i)
		used += w[i] + 1
	}
	type step struct {
		s       stage
		i, from int
	}
	var taken []step
	for _, s := range t.stages {
		if used <= total {
			break
		}
		i := t.index(s.col)
		if i < 0 || w[i] == 0 || plain && (s.cut || s.live || t.cols[i].whole) {
			continue
		}
		from := w[i]
		if s.drop {
			w[i] = 0
			used -= from + 1
		} else {
			w[i] = t.shrink(i, s, from, used-total)
			used -= from - w[i]
		}
		if w[i] != from {
			taken = append(taken, step{s, i, from})
		}
	}
	// A drop frees a whole column where a few cells may have done: what
	// is left over goes back to the stages before it, the last first.
	for j := len(taken) - 1; j >= 0 && used < total; j-- {
		st := taken[j]
		spare := total - used
		if st.s.drop {
			if st.from+1 <= spare {
				w[st.i] = st.from
				used += st.from + 1
			}
			continue
		}
		if w[st.i] == 0 {
			// Hidden by a later stage that got nothing back.
			continue
		}
		nw := t.grow(st.i, w[st.i], min(st.from, w[st.i]+spare))
		used += nw - w[st.i]
		w[st.i] = nw
	}
	for i := range t.cols {
		if c := &t.cols[i]; c.grow > w[i] && w[i] > 0 && used < total {
			g := min(total-used, c.grow-w[i])
			w[i] += g
			used += g
		}
	}
	return w
}

// shrink is column i's width after stage s, from cur, when the line is
// excess cells too wide.
func (t *table) shrink(i int, s stage, cur, excess int) int {
	want := cur - excess
	if t.cols[i].bar {
		return min(cur, max(want, s.floor, 1))
	}
	alts := t.altWidths(i)
	floor := s.floor
	if floor <= 0 {
		floor = minOf(alts)
	}
	target := max(want, floor)
	if s.cut {
		// An alternative below the floor is still better than a cut.
		if a := widestWithin(alts, 0, target); a > 0 {
			return min(a, cur)
		}
		return min(target, cur)
	}
	if a := widestWithin(alts, floor, target); a > 0 {
		return min(a, cur)
	}
	// None frees enough: the narrowest above the floor frees some.
	best := cur
	for _, a := range alts {
		if a >= floor && a < best {
			best = a
		}
	}
	return best
}

// grow is column i's width given back up to limit cells, from cur.
func (t *table) grow(i, cur, limit int) int {
	if t.cols[i].bar {
		return limit
	}
	alts := t.altWidths(i)
	if a := widestWithin(alts, cur+1, limit); a > 0 {
		return a
	}
	if cur < minOf(alts) {
		// Cut already: less cut is better.
		return limit
	}
	return cur
}

// widestWithin is the widest of ws in [lo, hi], 0 if none is.
func widestWithin(ws []int, lo, hi int) int {
	best := 0
	for _, a := range ws {
		if a >= lo && a <= hi && a > best {
			best = a
		}
	}
	return best
}

func minOf(ws []int) int {
	m := ws[0]
	for _, a := range ws[1:] {
		m = min(m, a)
	}
	return m
}

// fit picks the first alternative that fits w cells, or cuts the last.
func fit(alts []string, w int) string {
	for _, a := range alts {
		if width(a) <= w {
			return a
		}
	}
	if len(alts) == 0 {
		return ""
	}
	return truncate(alts[len(alts)-1], w)
}

// cut shortens s to w cells, in its middle or at its end.
func cut(s string, w int, middle bool) string {
	if middle {
		return truncateAddr(s, w)
	}
	return truncate(s, w)
}

// header draws the title line for widths w.
func (t *table) header(w []int) string {
	var parts []string
	for i := 0; i < len(t.cols); i++ {
		if w[i] == 0 {
			continue
		}
		cw := w[i]
		// Titles of "" lend their cells: the split's title spans the
		// bar and its label.
		j := i + 1
		for ; j < len(t.cols) && (w[j] == 0 || t.cols[j].titles[0] == ""); j++ {
			if w[j] > 0 {
				cw += 1 + w[j]
			}
		}
		// The title goes with the texts below it: "REMOTE" over remote
		// addresses only.
		titles := t.title(i)
		if !t.cols[i].bar {
			titles = titles[min(t.pick(i, w[i]), len(titles)-1):]
		}
		parts = append(parts, pad(fit(titles, cw), cw, t.cols[i].right))
		i = j - 1
	}
	return strings.Join(parts, " ")
}

// painter colours one part of the split bar; nil draws it plain.
type painter func(part int, s string) string

// line draws row r for widths w.
func (t *table) line(r *tableRow, w []int, paint painter) string {
	var b strings.Builder
	first := true
	for i := range t.cols {
		if w[i] == 0 {
			continue
		}
		if !first {
			b.WriteByte(' ')
		}
		first = false
		c := &t.cols[i]
		if c.bar {
			b.WriteString(bar(r.split, w[i], paint))
			continue
		}
		b.WriteString(pad(t.cell(r, i, w[i]), w[i], c.right))
	}
	return b.String()
}

// cell is row r's text in column i at w cells: the column's alternative,
// cut only when a stage narrowed the column below it.
func (t *table) cell(r *tableRow, i, w int) string {
	alts := r.cells[i]
	if len(alts) == 0 {
		return ""
	}
	s := alts[min(t.pick(i, w), len(alts)-1)]
	if width(s) > w {
		return cut(s, w, t.cols[i].middle)
	}
	return s
}

// bar draws the split in w cells, each part through paint.
func bar(s record.Split, w int, paint painter) string {
	if paint == nil || s.Total() <= 0 {
		return plainBar(s, w)
	}
	var b strings.Builder
	for i, n := range barCells(s, w) {
		if n > 0 {
			b.WriteString(paint(i, strings.Repeat(partGlyph(i), n)))
		}
	}
	return b.String()
}
