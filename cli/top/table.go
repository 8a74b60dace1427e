package top

import (
	"strings"

	"github.com/lattrace/lattrace/daemon/diagnose"
)

// A table is laid out for one width at a time: columns start at their
// natural width, the flexible ones give up cells in a fixed order (stages)
// until the line fits, and spare width goes to optional columns and then
// to the split bar. The same layout draws the live screen and the plain
// output of WriteFlows, so what a script reads is what a person sees.

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
	// middle truncates addresses in their middle: their start and their
	// port are what tell two apart.
	middle bool
	// optional columns appear only when the others fit at their natural
	// width with room to spare.
	optional bool
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
	split diagnose.Split
}

// stage lets column col shrink to floor cells; floor 0 is the width of
// the column's narrowest alternative.
type stage struct {
	col   string
	floor int
}

type table struct {
	cols   []column
	rows   []tableRow
	stages []stage
	// sortCol is the name of the column the rows are sorted by.
	sortCol string
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

// natural is the width column i needs to show its preferred texts.
func (t *table) natural(i int) int {
	c := &t.cols[i]
	if c.bar {
		return c.barWant
	}
	w := width(t.title(i)[0])
	for _, r := range t.rows {
		if a := r.cells[i]; len(a) > 0 {
			w = max(w, width(a[0]))
		}
	}
	return w
}

// narrowest is the width of column i's shortest alternatives.
func (t *table) narrowest(i int) int {
	ts := t.title(i)
	w := width(ts[len(ts)-1])
	for _, r := range t.rows {
		if a := r.cells[i]; len(a) > 0 {
			w = max(w, width(a[len(a)-1]))
		}
	}
	return max(w, 1)
}

// layout returns each column's width for a line of at most total cells;
// 0 means the column is not shown.
func (t *table) layout(total int) []int {
	w := make([]int, len(t.cols))
	used := -1 // n columns take n-1 separators
	for i := range t.cols {
		if !t.cols[i].optional {
			w[i] = t.natural(i)
			used += w[i] + 1
		}
	}
	for _, s := range t.stages {
		if used <= total {
			break
		}
		i := t.index(s.col)
		if i < 0 || w[i] == 0 {
			continue
		}
		floor := s.floor
		if floor <= 0 {
			floor = t.narrowest(i)
		}
		if cut := min(used-total, w[i]-floor); cut > 0 {
			w[i] -= cut
			used -= cut
		}
	}
	for i := range t.cols {
		if t.cols[i].optional {
			if n := t.natural(i); used+1+n <= total {
				w[i] = n
				used += n + 1
			}
		}
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

// fit picks the first alternative that fits w cells, or cuts the last.
func fit(alts []string, w int, middle bool) string {
	for _, a := range alts {
		if width(a) <= w {
			return a
		}
	}
	if len(alts) == 0 {
		return ""
	}
	if middle {
		return truncateAddr(alts[len(alts)-1], w)
	}
	return truncate(alts[len(alts)-1], w)
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
		parts = append(parts, pad(fit(t.title(i), cw, false), cw, t.cols[i].right))
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
		b.WriteString(pad(fit(r.cells[i], w[i], c.middle), w[i], c.right))
	}
	return b.String()
}

// bar draws the split in w cells, each part through paint.
func bar(s diagnose.Split, w int, paint painter) string {
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
