package daemon

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lattrace/lattrace/exporters/otlp"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A step of New that fails closes what the steps before it opened: here
// the JSON lines file, once /metrics cannot listen.
func TestNewClosesWhatItOpenedOnError(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	before := openFDs(t)
	d, err := New(Config{Output: "jsonl", OutputPath: out, MetricsAddr: busy.Addr().String(), MaxPeerPairs: otlp.DefaultMaxPeerPairs}, quiet)
	if err == nil || d != nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("New = %v, %v; want the metrics address's error", d, err)
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("the JSON lines file was not opened before /metrics: %v", err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d file descriptors open after the failed New, %d before", after, before)
	}
}

// Validate runs first: a bad setting opens nothing, and the message names
// the setting.
func TestNewValidatesFirst(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Output: "xml", MaxPeerPairs: 1}, `unknown output "xml"`},
		{Config{Output: "none", OutputPath: out, MaxPeerPairs: 1}, "--output none"},
		{Config{Output: "jsonl", OutputPath: out}, "--metrics-max-peer-pairs 0"},
		{Config{Output: "jsonl", OutputPath: out, MaxPeerPairs: 1, OTLP: &otlp.Config{SlowRatePerSecond: 0}}, "--span-slow-rate 0"},
	} {
		_, err := New(c.cfg, quiet)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%+v: the output was opened before the configuration was checked", c.cfg)
		}
	}
}
