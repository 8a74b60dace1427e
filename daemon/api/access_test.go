package api

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// nobody is the uid of a user other than the daemon's.
const nobody = 65534

// TestSocketRefusesOthersPaths: a directory or a name another user could
// change is refused with one line that names it, and nothing outside the
// daemon's own directory is created, changed or removed; the socket the
// daemon makes is its user's, mode 0600.
func TestSocketRefusesOthersPaths(t *testing.T) {
	base := t.TempDir() // root's, 0700
	mk := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(p, uint32(mode)); err != nil { // past the umask, sticky bit included
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A file the attacker wants the daemon to change or remove.
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	owned := mk("owned", 0o700, nobody)
	open := mk("open", 0o777, 0)
	real := mk("real", 0o700, 0)
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	others := mk("others", 0o755, nobody)
	if err := os.Mkdir(filepath.Join(others, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	mine := mk("mine", 0o700, 0)
	if err := os.Symlink(victim, filepath.Join(mine, "api.sock")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, socket, want string
	}{
		{"directory of another user", filepath.Join(owned, "api.sock"), owned + " is owned by uid 65534, not by this process's uid 0"},
		{"directory others may write", filepath.Join(open, "api.sock"), open + " is writable by other users (mode 0777)"},
		{"directory is a link", filepath.Join(link, "api.sock"), link + " is a symbolic link"},
		{"directory under another user's", filepath.Join(others, "run", "api.sock"), others + " above it is owned by uid 65534"},
		{"not created under another user's", filepath.Join(others, "new", "api.sock"), others + " above it is owned by uid 65534"},
		{"socket is a link", filepath.Join(mine, "api.sock"), "exists and is not a socket"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ls, err := Listen(c.socket, "")
			if err == nil {
				closeAll(ls)
				t.Fatalf("%s accepted", c.socket)
			}
			if msg := err.Error(); !strings.Contains(msg, c.want) || !strings.Contains(msg, "--api-socket") || strings.Contains(msg, "\n") {
				t.Errorf("got %q, want one line with %q and the way out", msg, c.want)
			}
		})
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Errorf("the link's target changed: %q %v", b, err)
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the link's target's mode changed: %v %v", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(others, "new")); err == nil {
		t.Errorf("a directory was created under another user's")
	}

	// A sticky directory others may write (/tmp) may hold the daemon's
	// own directory, which it creates 0700; the socket is its, 0600.
	sticky := mk("sticky", 0o1777, 0)
	sock := filepath.Join(sticky, "lattrace", "api.sock")
	ls, err := Listen(sock, "")
	if err != nil {
		t.Fatalf("own directory in a sticky one: %v", err)
	}
	defer closeAll(ls)
	var st syscall.Stat_t
	if err := syscall.Lstat(sock, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Mode&0o7777 != 0o600 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("socket mode %o, owner %d:%d (%v): want a socket 0600 of root:root", st.Mode, st.Uid, st.Gid, err)
	}
	if err := syscall.Lstat(filepath.Dir(sock), &st); err != nil || st.Mode&0o7777 != 0o700 || st.Uid != 0 {
		t.Errorf("socket directory mode %o, owner %d (%v): want 0700 of root", st.Mode, st.Uid, err)
	}
}

// TestTCPIsLoopbackOnly: the API's TCP port is refused on every address
// but loopback, and one that is accepted is bound there.
func TestTCPIsLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0", "10.1.2.3:0", "example.com:0"} {
		if ls, err := Listen("", addr); err == nil || !strings.Contains(err.Error(), "is not loopback") {
			closeAll(ls)
			t.Errorf("%s: %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		ls, err := Listen("", addr)
		if err != nil {
			t.Errorf("%s: %v", addr, err)
			continue
		}
		if ip := ls[0].Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			t.Errorf("%s bound on %v", addr, ip)
		}
		closeAll(ls)
	}
}
