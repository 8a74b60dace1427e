package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildLattrace builds the lattrace binary into a directory of its own for
// a test binary's TestMain, and remove deletes it; LTTEST_BIN names one
// built beforehand instead, which remove leaves (the kernel matrix's
// guests have no Go toolchain to build one).
func BuildLattrace(prefix string) (bin string, remove func(), err error) {
	if bin = os.Getenv("LTTEST_BIN"); bin != "" {
		return bin, func() {}, nil
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "lattrace")
	build := exec.Command("go", "build", "-o", bin, "github.com/lattrace/lattrace/cmd/lattrace")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building lattrace: %w", err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// RunWithLattrace is a test binary's TestMain once its own steps are done:
// it builds lattrace (BuildLattrace) into *bin, runs the tests, removes the
// build and exits with their status.
func RunWithLattrace(m *testing.M, prefix string, bin *string) {
	b, remove, err := BuildLattrace(prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = b
	code := m.Run()
	remove()
	os.Exit(code)
}

// LoadgenMain is the load generator's side of StartLoad, for a test
// binary's TestMain: when this process was started as one (`self loadgen
// JOB`) it runs the job and exits; otherwise it returns at once.
func LoadgenMain() {
	if len(os.Args) != 3 || os.Args[1] != "loadgen" {
		return
	}
	var cfg LoadConfig
	if err := json.Unmarshal([]byte(os.Args[2]), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	if err := RunLoad(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
