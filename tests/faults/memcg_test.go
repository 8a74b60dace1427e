package faults

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// memcg is a memory cgroup of the test's own: cgroup v2's where the
// memory controller is there, else v1's (this host's cgroups are a v1
// hybrid). It reads the kernel's own accounting, the truth the memory
// tests compare the daemon's with.
type memcg struct {
	dir string
	v2  bool
}

// newMemcg makes the cgroup, removed when the test ends (its processes
// must be gone by then).
func newMemcg(t *testing.T, name string) *memcg {
	t.Helper()
	var m memcg
	switch {
	case controllerIn("/sys/fs/cgroup", "memory"):
		m = memcg{dir: filepath.Join("/sys/fs/cgroup", name), v2: true}
	case controllerIn("/sys/fs/cgroup/unified", "memory"):
		m = memcg{dir: filepath.Join("/sys/fs/cgroup/unified", name), v2: true}
	default:
		m = memcg{dir: filepath.Join("/sys/fs/cgroup/memory", name)}
	}
	if err := os.Mkdir(m.dir, 0o755); err != nil && !os.IsExist(err) {
		t.Fatalf("memory cgroup: %v", err)
	}
	if m.v2 {
		// The controller must be enabled for children in the parent.
		_ = os.WriteFile(filepath.Join(filepath.Dir(m.dir), "cgroup.subtree_control"), []byte("+memory"), 0)
	}
	t.Cleanup(func() { os.Remove(m.dir) })
	return &m
}

// controllerIn tells whether the cgroup v2 hierarchy at root offers the
// controller.
func controllerIn(root, controller string) bool {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	return err == nil && strings.Contains(" "+strings.TrimSpace(string(b))+" ", " "+controller+" ")
}

func (m *memcg) String() string {
	v := "v1"
	if m.v2 {
		v = "v2"
	}
	return fmt.Sprintf("%s (cgroup %s)", m.dir, v)
}

// procs is the file a process writes its PID to, to move in.
func (m *memcg) procs() string { return filepath.Join(m.dir, "cgroup.procs") }

// setLimit sets the hard limit (memory.max, memory.limit_in_bytes).
func (m *memcg) setLimit(t *testing.T, bytes uint64) {
	t.Helper()
	file := "memory.limit_in_bytes"
	if m.v2 {
		file = "memory.max"
		// No swap either: the limit is the memory the daemon may hold.
		_ = os.WriteFile(filepath.Join(m.dir, "memory.swap.max"), []byte("0"), 0)
	}
	if err := os.WriteFile(filepath.Join(m.dir, file), []byte(strconv.FormatUint(bytes, 10)), 0); err != nil {
		t.Fatalf("setting %s: %v", file, err)
	}
}

// read is one number from a file of the cgroup.
func (m *memcg) read(file string) uint64 {
	b, err := os.ReadFile(filepath.Join(m.dir, file))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// keyed is one key of a flat keyed file (memory.stat, memory.events,
// memory.oom_control).
func (m *memcg) keyed(file, key string) uint64 {
	f, err := os.Open(filepath.Join(m.dir, file))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if k == key {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// usage is what the cgroup is charged now, page cache included.
func (m *memcg) usage() uint64 {
	if m.v2 {
		return m.read("memory.current")
	}
	return m.read("memory.usage_in_bytes")
}

// peak is the most the cgroup was charged.
func (m *memcg) peak() uint64 {
	if m.v2 {
		return m.read("memory.peak")
	}
	return m.read("memory.max_usage_in_bytes")
}

// kernel is the kernel memory charged (the BPF maps the daemon made
// among it).
func (m *memcg) kernel() uint64 {
	if m.v2 {
		return m.keyed("memory.stat", "kernel")
	}
	return m.read("memory.kmem.usage_in_bytes")
}

// oomKills counts the processes the kernel killed for the limit.
func (m *memcg) oomKills() uint64 {
	if m.v2 {
		return m.keyed("memory.events", "oom_kill")
	}
	return m.keyed("memory.oom_control", "oom_kill")
}
