package top

import (
	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/record"
)

// styles are made from the renderer of the output the screen is drawn on,
// so the colour profile is that terminal's, not the process's stdout's.
// Colours are the 16 ANSI ones: they follow the user's terminal theme.
type styles struct {
	r        *lipgloss.Renderer
	title    lipgloss.Style
	colHead  lipgloss.Style
	selected lipgloss.Style
	err      lipgloss.Style
	dim      lipgloss.Style
	key      lipgloss.Style
	parts    [numParts]lipgloss.Style
	severity map[record.Severity]lipgloss.Style
}

func newStyles(r *lipgloss.Renderer) styles {
	s := styles{
		r:        r,
		title:    r.NewStyle().Bold(true),
		colHead:  r.NewStyle().Bold(true),
		selected: r.NewStyle().Reverse(true),
		err:      r.NewStyle().Foreground(lipgloss.Color("9")),
		dim:      r.NewStyle().Faint(true),
		key:      r.NewStyle().Bold(true),
	}
	s.parts[partNetwork] = r.NewStyle().Foreground(lipgloss.Color("12"))
	s.parts[partTransport] = r.NewStyle().Foreground(lipgloss.Color("11"))
	s.parts[partApp] = r.NewStyle().Foreground(lipgloss.Color("13"))
	s.severity = map[record.Severity]lipgloss.Style{
		record.SeverityCritical: r.NewStyle().Foreground(lipgloss.Color("9")).Bold(true),
		record.SeverityWarning:  r.NewStyle().Foreground(lipgloss.Color("11")),
		record.SeverityInfo:     r.NewStyle().Foreground(lipgloss.Color("14")),
	}
	return s
}

// paint colours the parts of the split bar.
func (s *styles) paint(part int, text string) string { return s.parts[part].Render(text) }

// legend explains the bar's glyphs, each in its colour.
func (s *styles) legend() string {
	out := ""
	for i := range numParts {
		if i > 0 {
			out += " "
		}
		out += s.parts[i].Render(partGlyph(i) + " " + partName(i))
	}
	return out
}

// plainLegend is legend without colour, for measuring it.
func plainLegend() string {
	out := ""
	for i := range numParts {
		if i > 0 {
			out += " "
		}
		out += partGlyph(i) + " " + partName(i)
	}
	return out
}

// sev styles a severity's name.
func (s *styles) sev(v record.Severity) string {
	st, ok := s.severity[v]
	if !ok {
		return string(v)
	}
	return st.Render(string(v))
}

// clip is the last guard of "never wider than the terminal": it cuts a
// styled line, escape sequences and all, to w cells.
func (s *styles) clip(line string, w int) string {
	if width(line) <= w {
		return line
	}
	return s.r.NewStyle().MaxWidth(w).Render(line)
}
