// Package fuzz holds what lattrace's fuzz targets share, and runs them.
//
// Every parser of bytes from outside the process has a native Go fuzz
// target (func FuzzXxx(f *testing.F)) in its own package, with a seed
// corpus in that package's testdata/fuzz/FuzzXxx/ (docs/reliability.md,
// "Hostile input", lists them). Each target holds its parser to the same
// three rules, checked by the functions here: bad input is one line, never
// a panic (the fuzzing engine reports a panic itself); what one input
// allocates is bounded by its size (Alloc); and where the parser has an
// encoder, what it accepts encodes back to the same value.
//
// The test of this package (TestFuzzTargets) builds and runs every target
// for a bounded time: LTTEST_FUZZTIME per target (a Go duration, default
// 8s) as `make test` runs it, longer in `make soak`.
package fuzz

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Bound is how much one input may allocate in all: PerByte for each byte
// of the input, plus Fixed for the parser's buffers and the measurement's
// noise. Each target chooses its own and says why.
type Bound struct {
	PerByte, Fixed uint64
}

// Of is the bound for an input of n bytes.
func (b Bound) Of(n int) uint64 { return b.PerByte*uint64(n) + b.Fixed }

// MiB is a mebibyte, for bounds.
const MiB = 1 << 20

// Allocated is what f allocated while it ran: the runtime's count of the
// bytes allocated (MemStats.TotalAlloc) before and after, which the
// garbage collector does not lower. The fuzzing engine runs one input at a
// time, so little else allocates meanwhile.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Alloc runs f and fails t when it allocated more than b allows for n
// bytes of input.
func Alloc(t testing.TB, n int, b Bound, f func()) {
	t.Helper()
	if got := Allocated(f); got > b.Of(n) {
		t.Fatalf("%d bytes of input allocated %d bytes, more than the bound of %d (%d per byte + %d)", n, got, b.Of(n), b.PerByte, b.Fixed)
	}
}

// OneLine fails t when err, an error a person would read, spans lines.
func OneLine(t testing.TB, err error) {
	t.Helper()
	if err != nil && strings.ContainsAny(err.Error(), "\r\n") {
		t.Fatalf("an error of several lines: %q", err.Error())
	}
}

// SeedsEnv names the variable that makes Seeds write the seeds into the
// package's corpus directory: LATTRACE_FUZZ_SEEDS=write go test ./pkg
// after a change to what the seeds are made from.
const SeedsEnv = "LATTRACE_FUZZ_SEEDS"

// writeSeeds is read as the test starts: a target may clear lattrace's
// variables before it makes its seeds.
var writeSeeds = os.Getenv(SeedsEnv) == "write"

// Writing reports whether the seeds are being written (SeedsEnv): a target
// whose seeds cost much to make (a tracer loaded, traffic made) makes
// them then only, and reads them from its corpus otherwise.
func Writing() bool { return writeSeeds }

// Seeds adds seeds, made from the code (a writer's real output), to f's
// corpus. With SeedsEnv=write it also writes each one as
// testdata/fuzz/<target>/seed-<name>, the corpus committed with the
// package, where the inputs the fuzzer found (regressions) live too.
// Values are the fuzz function's arguments after t, of the types a corpus
// file holds: []byte, string, bool, byte (uint8), int and uint64.
func Seeds(f *testing.F, seeds map[string][]any) {
	f.Helper()
	for name, args := range seeds {
		f.Add(args...)
		if !writeSeeds {
			continue
		}
		dir := filepath.Join("testdata", "fuzz", f.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), corpusFile(f, args), 0o644); err != nil {
			f.Fatal(err)
		}
	}
}

// corpusFile encodes args in the format of the fuzzing engine's corpus
// files (testing/internal/fuzz: a version line, then one Go literal per
// argument).
func corpusFile(f *testing.F, args []any) []byte {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case byte:
			fmt.Fprintf(&b, "byte(%q)\n", v)
		case string, bool, int, uint64:
			fmt.Fprintf(&b, "%T(%#v)\n", v, v)
		default:
			f.Fatalf("a seed of type %T: not one a corpus file holds here", a)
		}
	}
	return []byte(b.String())
}
