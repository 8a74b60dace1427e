// Package containers names the container a socket's owner runs in, from the
// cgroup id the kernel side records: on cgroup v2 the id is the inode of the
// cgroup's directory, and container runtimes put the container id in that
// directory's name (docker-<id>.scope, cri-containerd-<id>.scope,
// crio-<id>.scope, or a bare 64-hex directory). Nothing but the cgroup file
// system is read, so it works inside and outside Kubernetes alike.
package containers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

var containerID = regexp.MustCompile(`(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$`)

// maxCached bounds the cache; past it the cache starts over.
const maxCached = 8192

// Resolver maps cgroup ids to container ids, caching answers (empty ones
// too: a host process stays a host process).
type Resolver struct {
	root  string
	mu    sync.Mutex
	cache map[uint64]string
	// noHandles: opening cgroups by id was refused (no
	// CAP_DAC_READ_SEARCH); find walks instead.
	noHandles bool
}

// New returns a Resolver for the cgroup v2 hierarchy mounted at root.
func New(root string) *Resolver {
	return &Resolver{root: root, cache: map[uint64]string{}}
}

// ContainerID returns the container id of the cgroup, or "" when the cgroup
// is not a container's (or no longer exists).
func (r *Resolver) ContainerID(cgroupID uint64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id, ok := r.cache[cgroupID]; ok {
		return id
	}
	if len(r.cache) >= maxCached {
		r.cache = map[uint64]string{}
	}
	id := r.find(cgroupID)
	r.cache[cgroupID] = id
	return id
}

// find names the cgroup's container. The kernel opens a cgroup v2
// directory by its id (the id is a file handle of the cgroup file system),
// so a new cgroup costs three system calls however large the hierarchy;
// where that is refused (it needs CAP_DAC_READ_SEARCH) the hierarchy is
// walked for the directory with that inode, which on a node of thousands
// of cgroups takes milliseconds, on the ring buffer's reader.
func (r *Resolver) find(cgroupID uint64) string {
	path, gone := "", false
	if !r.noHandles {
		var err error
		path, gone, err = r.byHandle(cgroupID)
		if errors.Is(err, unix.EPERM) {
			r.noHandles = true // not for this process: walk from now on
		}
	}
	if path == "" && !gone {
		path = r.walk(cgroupID)
	}
	if m := containerID.FindStringSubmatch(path); m != nil {
		return m[1]
	}
	return ""
}

// fileidKernfs is the handle type of kernfs (cgroup v2) file handles: the
// handle is the node's 64-bit id, the cgroup id BPF reads.
const fileidKernfs = 0xfe

// byHandle opens the cgroup with that id and returns its path; gone says
// the kernel knows no such cgroup any more (its processes exited).
func (r *Resolver) byHandle(cgroupID uint64) (path string, gone bool, err error) {
	mount, err := unix.Open(r.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, err
	}
	defer unix.Close(mount)
	h := make([]byte, 8)
	binary.NativeEndian.PutUint64(h, cgroupID)
	fd, err := unix.OpenByHandleAt(mount, unix.NewFileHandle(fileidKernfs, h), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return "", errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT), err
	}
	defer unix.Close(fd)
	path, err = os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	return path, false, err
}

// walk finds the path of the directory with that inode under root ("" if
// none).
func (r *Resolver) walk(cgroupID uint64) string {
	var found string
	filepath.WalkDir(r.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil && st.Ino == cgroupID {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	return found
}
