package goroutines

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// build compiles a small Go program with the given linker flags.
func build(t *testing.T, ldflags string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	cmd := exec.Command("go", "build", "-ldflags="+ldflags, "-o", bin, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The offsets come from the binary's DWARF: goid before parentGoid in
// runtime.g, both past its stack bounds and scheduling state; without
// DWARF there are none and the goroutines are named by their g.
func TestOffsets(t *testing.T) {
	o, err := Of(build(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if o.Goid < 64 || o.ParentGoid <= o.Goid {
		t.Errorf("offsets %+v: want goid past the g's first fields and parentGoid after it", o)
	}
	o, err = Of(build(t, "-w"))
	if err != nil || o != (Offsets{}) {
		t.Errorf("without DWARF: %+v %v, want zero offsets", o, err)
	}
	if _, err := Of("/bin/sh"); !errors.Is(err, errNotGo) {
		t.Errorf("/bin/sh: %v, want not a Go program", err)
	}
}

// Scan finds this test (a Go program) among the node's processes and
// leaves a C program out.
func TestScanFindsSelf(t *testing.T) {
	f := &Finder{}
	procs := f.Scan()
	if p, ok := procs[uint32(os.Getpid())]; !ok || p.Err != nil {
		t.Errorf("this test's process %d not found among %d Go processes", os.Getpid(), len(procs))
	}
	sh := exec.Command("/bin/sh", "-c", "sleep 5")
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer sh.Process.Kill()
	if _, ok := f.Scan()[uint32(sh.Process.Pid)]; ok {
		t.Errorf("a shell taken for a Go program")
	}
}
