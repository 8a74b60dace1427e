package top

import (
	"bytes"
	"strings"
	"testing"

	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/daemon/api"
)

func TestWriteFlows(t *testing.T) {
	l := testFlows()
	for _, w := range []int{80, 120, 200, 40} {
		var b bytes.Buffer
		if err := WriteFlows(&b, l, w); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if strings.ContainsRune(out, '\x1b') {
			t.Errorf("width %d: output has escape sequences:\n%q", w, out)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != 1+len(l.Flows) {
			t.Fatalf("width %d: %d lines, want a header and %d rows:\n%s", w, len(lines), len(l.Flows), out)
		}
		if !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "P99") || strings.Contains(lines[0], sortMarker) {
			t.Errorf("width %d: header %q", w, lines[0])
		}
		limit := max(w, minWidth)
		for i, line := range lines {
			if lw := lipgloss.Width(line); lw > limit {
				t.Errorf("width %d: line %d is %d wide: %q", w, i, lw, line)
			}
			if line != strings.TrimRight(line, " ") {
				t.Errorf("width %d: line %d has trailing spaces", w, i)
			}
		}
		// The rows keep the order given and name each flow.
		for i, f := range l.Flows {
			if !strings.HasPrefix(lines[1+i], f.ID+" ") {
				t.Errorf("width %d: line %d is %q, want flow %s", w, 1+i, lines[1+i], f.ID)
			}
		}
		if !strings.Contains(out, "app 85%") {
			t.Errorf("width %d: no dominant part:\n%s", w, out)
		}
	}
}

func TestWriteFlowsEmpty(t *testing.T) {
	var b bytes.Buffer
	if err := WriteFlows(&b, api.FlowList{}, 80); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n != 1 {
		t.Errorf("empty list printed %d lines, want the header only:\n%s", n, b.String())
	}
}

func TestWritePeers(t *testing.T) {
	l := testPeers()
	for _, w := range []int{80, 160} {
		var b bytes.Buffer
		if err := WritePeers(&b, l, w); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if strings.ContainsRune(out, '\x1b') || len(lines) != 1+len(l.Peers) {
			t.Fatalf("width %d: not a plain header + %d rows:\n%q", w, len(l.Peers), out)
		}
		for i, line := range lines {
			if lw := lipgloss.Width(line); lw > w {
				t.Errorf("width %d: line %d is %d wide: %q", w, i, lw, line)
			}
		}
		if w >= 160 {
			for _, want := range []string{"p0000000000a1", "client -> 10.0.0.2:8080", "server :443 <- 2001:db8::99", "CONNS"} {
				if !strings.Contains(out, want) {
					t.Errorf("width %d: lacks %q:\n%s", w, want, out)
				}
			}
		}
	}
}
