package report

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/lattrace/lattrace/tests/fuzz"
)

// buildBound is what reading a recording into a page may allocate: the
// recording's reader and the page's template and charting library (the
// fixed part), and per byte of JSON lines what the reader takes
// (exporters/recording, 128 bytes) and what the shortest line,
// {"type":"exchange"} at 20 bytes, adds: its point and its share of the
// columns the charts are cut from, a few hundred bytes.
var buildBound = fuzz.Bound{PerByte: 256, Fixed: 16 * fuzz.MiB}

// FuzzBuild draws the JSON lines of a recording, compressed as the writer
// compresses them, as `lattrace report` does: whatever the reader accepts
// makes a page.
func FuzzBuild(f *testing.F) {
	seeds := map[string][]any{}
	for name, c := range map[string]struct{ n, pairs int }{"three-pairs": {20, 3}, "one-exchange": {1, 1}} {
		path := filepath.Join(f.TempDir(), name)
		synthetic(f, path, c.n, c.pairs)
		seeds[name] = []any{gunzipFile(f, path)}
	}
	fuzz.Seeds(f, seeds)
	path := filepath.Join(f.TempDir(), "fuzz.lattrace")
	zw := gzip.NewWriter(nil)
	f.Fuzz(func(t *testing.T, lines []byte) {
		var file bytes.Buffer
		zw.Reset(&file)
		zw.Write(lines)
		zw.Close()
		if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		var m *Model
		var err error
		fuzz.Alloc(t, len(lines), buildBound, func() {
			if m, err = Build(path, Options{}); err == nil {
				err = Write(io.Discard, m)
			}
		})
		fuzz.OneLine(t, err)
		if m != nil && err != nil {
			t.Fatalf("a recording read but its page not written: %v", err)
		}
	})
}

func gunzipFile(tb testing.TB, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	r, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
