package containers

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A real cgroup named the way containerd names a container's resolves to
// its id; the parent, a plain cgroup, to none.
func TestResolveRealCgroup(t *testing.T) {
	root := cgroup2(t)
	parent := filepath.Join(root, fmt.Sprintf("lattrace-test-%d", os.Getpid()))
	id := strings.Repeat("0123456789abcdef", 4)
	child := filepath.Join(parent, "cri-containerd-"+id+".scope")
	if err := os.MkdirAll(child, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(parent)
	defer os.Remove(child)
	r := New(root)
	if got := r.ContainerID(inode(t, child)); got != id {
		t.Errorf("container id %q, want %q", got, id)
	}
	if got := r.ContainerID(inode(t, parent)); got != "" {
		t.Errorf("a plain cgroup resolved to %q", got)
	}
	if got := r.ContainerID(1); got != "" {
		t.Errorf("an unknown cgroup resolved to %q", got)
	}
}

// The kernel's lookup of a cgroup by id and the walk of the hierarchy (the
// fallback without CAP_DAC_READ_SEARCH) find the same directory; a cgroup
// that is gone is found by neither.
func TestLookupByHandleAndWalkAgree(t *testing.T) {
	root := cgroup2(t)
	dir := filepath.Join(root, fmt.Sprintf("lattrace-test-handle-%d", os.Getpid()), "docker-"+strings.Repeat("fe", 32)+".scope")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(filepath.Dir(dir))
	ino := inode(t, dir)
	r := New(root)
	byHandle, _, err := r.byHandle(ino)
	if err != nil {
		t.Fatalf("opening the cgroup by its id: %v (as root on Linux >= 5.5 this works)", err)
	}
	if walked := r.walk(ino); byHandle != dir || walked != dir {
		t.Errorf("by handle %q, by walk %q, want %q", byHandle, walked, dir)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if p, gone, err := r.byHandle(ino); err == nil || !gone {
		t.Errorf("a removed cgroup opened by its id: %q, gone %v, %v", p, gone, err)
	}
	if got := r.ContainerID(ino); got != "" {
		t.Errorf("a removed cgroup resolved to %q", got)
	}
}

func TestNames(t *testing.T) {
	id := strings.Repeat("a", 64)
	for path, want := range map[string]string{
		"/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope": id,
		"/system.slice/docker-" + id + ".scope":                               id,
		"/kubepods/besteffort/pod1/" + id:                                     id,
		"/kubepods.slice/crio-" + id + ".scope":                               id,
		"/user.slice/user-0.slice/session-1.scope":                            "",
		"/system.slice/docker-" + id[:12] + ".scope":                          "",
	} {
		got := ""
		if m := containerID.FindStringSubmatch(path); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

func cgroup2(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	t.Fatal("no cgroup v2 hierarchy mounted")
	return ""
}

func inode(t *testing.T, path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
