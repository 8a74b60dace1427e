package top

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/record"
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
		if strings.Contains(out, "…") {
			t.Errorf("width %d: plain output cut something:\n%s", w, out)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != 1+len(l.Flows) {
			t.Fatalf("width %d: %d lines, want a header and %d rows:\n%s", w, len(lines), len(l.Flows), out)
		}
		if !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "P99") || strings.Contains(lines[0], sortMarker) {
			t.Errorf("width %d: header %q", w, lines[0])
		}
		for i, line := range lines {
			if line != strings.TrimRight(line, " ") {
				t.Errorf("width %d: line %d has trailing spaces", w, i)
			}
		}
		// The rows keep the order given and show each flow whole,
		// however narrow the width asked for.
		for i, f := range l.Flows {
			line := lines[1+i]
			if !strings.HasPrefix(line, f.ID+" ") {
				t.Errorf("width %d: line %d is %q, want flow %s", w, 1+i, line, f.ID)
			}
			for _, want := range []string{processCell(f.Owner)[0], addrCell(f.Flow)[0], diagCell(f.Diagnoses)[0]} {
				if !strings.Contains(line, want) {
					t.Errorf("width %d: flow %s lacks %q: %q", w, f.ID, want, line)
				}
			}
		}
		if !strings.Contains(out, "app 85%") {
			t.Errorf("width %d: no dominant part:\n%s", w, out)
		}
		// The width still decides the optional columns.
		if got := strings.Contains(lines[0], "CWND"); got != (w >= 200) {
			t.Errorf("width %d: CWND shown %v:\n%s", w, got, out)
		}
	}
}

func TestWriteEmptyAndLimited(t *testing.T) {
	var b bytes.Buffer
	if err := WriteFlows(&b, api.FlowList{}, 80); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") || lines[1] != "(none)" {
		t.Errorf("empty list printed:\n%s", b.String())
	}
	b.Reset()
	if err := WritePeers(&b, api.PeerList{}, 80); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), "\n(none)\n") {
		t.Errorf("empty pair list printed:\n%s", b.String())
	}

	// A limit left some out: the last line says how many.
	l := testFlows()
	l.Total = 5
	l.Flows = l.Flows[:2]
	b.Reset()
	if err := WriteFlows(&b, l, 80); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 4 || lines[3] != "(3 more not shown)" {
		t.Errorf("limited list printed:\n%s", b.String())
	}
	p := testPeers()
	p.Total = 3
	p.Peers = p.Peers[:2]
	b.Reset()
	if err := WritePeers(&b, p, 80); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), "\n(1 more not shown)\n") {
		t.Errorf("limited pair list printed:\n%s", b.String())
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
		if strings.Contains(out, "…") {
			t.Errorf("width %d: plain output cut something:\n%s", w, out)
		}
		for _, want := range []string{"p0000000000a1 curl", "p0000000000b2 nginx", "client -> 10.0.0.2:8080", "server :443 <- 2001:db8::99"} {
			if !strings.Contains(out, want) {
				t.Errorf("width %d: lacks %q:\n%s", w, want, out)
			}
		}
		if w >= 160 {
			for _, want := range []string{"CONNS", "NETNS", "4026531840", "4026532001"} {
				if !strings.Contains(out, want) {
					t.Errorf("width %d: lacks %q:\n%s", w, want, out)
				}
			}
		}
	}
}

// A transfer under way with nothing diagnosed yet says how far it got.
func TestRunningTransferShows(t *testing.T) {
	f := flow("7", "iperf3", 77, "10.0.0.1:40009", "10.0.0.9:5201", 0, aggregate.Metrics{})
	f.InFlight = &record.InFlight{Start: 1, BytesOut: 300 << 20}
	var b strings.Builder
	if err := WriteFlows(&b, api.FlowList{Flows: []api.Flow{f}, Total: 1}, 120); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "moving ") || !strings.Contains(b.String(), "iperf3") {
		t.Errorf("running transfer:\n%s", b.String())
	}
}

// In a cluster, a flow's process column names its pod when there is room.
func TestPodNamed(t *testing.T) {
	f := flow("8", "nginx", 42, "10.1.0.5:8080", "10.1.0.9:40000", 1, aggregate.Metrics{})
	f.Owner.K8s = &record.K8s{Namespace: "shop", Pod: "front-7d9f-x2", Container: "nginx"}
	var b strings.Builder
	if err := WriteFlows(&b, api.FlowList{Flows: []api.Flow{f}, Total: 1}, 200); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "shop/front-7d9f-x2") {
		t.Errorf("no pod name:\n%s", b.String())
	}
}
