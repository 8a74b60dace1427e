package buildonce

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The script builds a module once per content: the second run reuses the
// binary without a word on stderr, a change of the code builds a new one.
func TestScript(t *testing.T) {
	cache, mod := t.TempDir(), t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/hello\n\ngo 1.22\n")
	write("go.sum", "")
	write("main.go", "package main\n\nfunc main() { println(\"hello\") }\n")
	run := func() (bin, stderr string) {
		cmd := exec.Command("bash", "build.sh", mod, "hello", "a note")
		cmd.Env = append(os.Environ(), "LATTRACE_CACHE_DIR="+cache)
		var errb strings.Builder
		cmd.Stderr = &errb
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %s", err, errb.String())
		}
		return strings.TrimSpace(string(out)), errb.String()
	}
	bin, stderr := run()
	if dir, base := filepath.Split(bin); dir != cache+"/" || !strings.HasPrefix(base, "hello-") || len(base) != len("hello-")+16 {
		t.Errorf("binary at %s, want %s/hello-<16 hex digits>", bin, cache)
	}
	if want := "hello: building " + bin + " (a note)\n"; !strings.HasPrefix(stderr, want) {
		t.Errorf("stderr %q, want it to start with %q", stderr, want)
	}
	if out, err := exec.Command(bin).CombinedOutput(); err != nil || string(out) != "hello\n" {
		t.Errorf("the binary says %q (%v)", out, err)
	}
	if again, stderr := run(); again != bin || stderr != "" {
		t.Errorf("second run: %s, stderr %q: want %s and no build", again, stderr, bin)
	}
	write("main.go", "package main\n\nfunc main() { println(\"hello again\") }\n")
	if changed, _ := run(); changed == bin {
		t.Errorf("a change of main.go kept %s", bin)
	}
}

func TestBinary(t *testing.T) {
	t.Setenv("BUILDONCE_TEST_BIN", "")
	b := New("fails", "testdata/fail.sh", "BUILDONCE_TEST_BIN")
	if _, err := b.Path(); err == nil || !strings.Contains(err.Error(), "fails: ") || !strings.Contains(err.Error(), "cannot build") {
		t.Errorf("error %v, want the name and the script's output", err)
	}
	t.Setenv("BUILDONCE_TEST_BIN", "/prebuilt")
	b = New("fails", "testdata/fail.sh", "BUILDONCE_TEST_BIN")
	if p, err := b.Path(); p != "/prebuilt" || err != nil {
		t.Errorf("with the override: %q, %v", p, err)
	}
}
