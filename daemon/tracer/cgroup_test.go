package tracer

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/cgroup"
)

// TestCgroupFilter: with a cgroup given, sockets of tasks outside it are not
// traced and those of tasks inside are.
func TestCgroupFilter(t *testing.T) {
	root, err := cgroup.Root()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var home string
	for _, l := range strings.Split(string(self), "\n") {
		if strings.HasPrefix(l, "0::") {
			home = filepath.Join(root, strings.TrimPrefix(l, "0::"))
		}
	}
	cg := filepath.Join(root, fmt.Sprintf("lattrace-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cg)
	move := func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0); err != nil {
			t.Fatalf("moving into %s: %v", dir, err)
		}
	}
	defer move(home)

	tr, err := Open(Options{CgroupPath: cg, DrainInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	stop := runCollector(t, tr, col)
	defer stop()

	outside := loopbackConn(t)
	move(cg)
	inside := loopbackConn(t)
	move(home)
	in := col.find(t, inside)
	// The cgroup id the kernel records is the cgroup directory's inode,
	// which is how package containers names the container.
	var st syscall.Stat_t
	if err := syscall.Stat(cg, &st); err != nil {
		t.Fatal(err)
	}
	if in.Owner.CgroupID != st.Ino {
		t.Errorf("owner cgroup id %d, the cgroup's inode %d", in.Owner.CgroupID, st.Ino)
	}
	time.Sleep(100 * time.Millisecond)
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, c := range col.conns {
		if c.Flow.Local == outside || c.Flow.Remote == outside {
			t.Errorf("a connection made outside the cgroup was traced: %+v", c)
		}
	}
}

func loopbackConn(t *testing.T) (local netip.AddrPort) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err == nil {
			b := make([]byte, 5)
			c.Read(b)
			c.Write(b)
			c.Close()
		}
		close(done)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	c.Read(make([]byte, 5))
	local = c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	<-done
	return local
}
