package private

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCreate: a file the daemon writes is created 0600; one prepared by
// another user (theirs, a symbolic or hard link to another file) is
// refused with a line that says why, and left as it was.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	// Others may add names here, as in /tmp.
	if err := syscall.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	symlink := filepath.Join(dir, "symlink")
	hardlink := filepath.Join(dir, "hardlink")
	theirs := filepath.Join(dir, "theirs")
	fifo := filepath.Join(dir, "fifo")
	if os.Symlink(victim, symlink) != nil || os.Link(victim, hardlink) != nil || os.WriteFile(theirs, nil, 0o666) != nil ||
		os.Chown(theirs, 65534, 65534) != nil || syscall.Mkfifo(fifo, 0o666) != nil || os.Chown(fifo, 65534, 65534) != nil {
		t.Fatal("preparing the paths")
	}
	for _, c := range []struct{ path, want string }{
		{symlink, "is a symbolic link"},
		{hardlink, "has 2 hard links"},
		{theirs, "is owned by uid 65534"},
		{fifo, "is owned by uid 65534"},
		{dir, "is a directory"},
	} {
		for _, flag := range []int{os.O_APPEND, os.O_TRUNC} {
			f, err := Create(c.path, flag)
			if err == nil {
				f.Close()
				t.Errorf("%s accepted", c.path)
				continue
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
				t.Errorf("%s: %v, want %q", c.path, err, c.want)
			}
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Errorf("the linked file changed: %q %v", b, err)
	}
	mine := filepath.Join(dir, "out.jsonl")
	for i, flag := range []int{os.O_APPEND, os.O_APPEND, os.O_TRUNC} {
		f, err := Create(mine, flag)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("x")
		f.Close()
		b, _ := os.ReadFile(mine)
		if want := []string{"x", "xx", "x"}[i]; string(b) != want {
			t.Errorf("write %d: %q, want %q", i, b, want)
		}
	}
	if fi, err := os.Stat(mine); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("created with mode %v (%v), want 0600", fi.Mode(), err)
	}
}

// TestMkdirAll: the daemon's own directory is made 0700; nothing is made
// under a directory another user owns.
func TestMkdirAll(t *testing.T) {
	base := t.TempDir()
	mine := filepath.Join(base, "a", "b")
	if err := MkdirAll(mine); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(mine); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v %v", fi.Mode(), err)
	}
	theirs := filepath.Join(base, "theirs")
	if os.Mkdir(theirs, 0o755) != nil || os.Chown(theirs, 65534, 65534) != nil {
		t.Fatal("preparing")
	}
	if err := MkdirAll(filepath.Join(theirs, "x", "y")); err == nil || !strings.Contains(err.Error(), theirs+" above it is owned by uid 65534") {
		t.Errorf("under another user's directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(theirs, "x")); err == nil {
		t.Error("created under another user's directory")
	}
}
