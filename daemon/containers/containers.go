// Package containers names the container a socket's owner runs in, from the
// cgroup id the kernel side records: on cgroup v2 the id is the inode of the
// cgroup's directory, and container runtimes put the container id in that
// directory's name (docker-<id>.scope, cri-containerd-<id>.scope,
// crio-<id>.scope, or a bare 64-hex directory). Nothing but the cgroup file
// system is read, so it works inside and outside Kubernetes alike.
package containers

import (
	"io/fs"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
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

// find walks the hierarchy for the directory with that inode: done once
// per new cgroup, so its cost is paid at container start, not per record.
func (r *Resolver) find(cgroupID uint64) string {
	var found string
	filepath.WalkDir(r.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil && st.Ino == cgroupID {
			if m := containerID.FindStringSubmatch(path); m != nil {
				found = m[1]
			}
			return filepath.SkipAll
		}
		return nil
	})
	return found
}
