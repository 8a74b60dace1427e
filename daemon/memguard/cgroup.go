package memguard

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Group is the memory cgroup the daemon is charged to, v2's or v1's, and
// where in it the numbers are read.
type Group struct {
	// Dir is the cgroup's directory; Limited is the directory whose limit
	// is the tightest on the way to the hierarchy's root (a pod's, above
	// a container's), whose usage is the one that meets it.
	Dir, Limited string
	V2           bool
	// Limit is the tightest hard limit in bytes; 0 when none.
	Limit uint64
}

// errNoMemcg: no memory cgroup (no controller mounted).
var errNoMemcg = errors.New("no memory cgroup found in /proc/self/cgroup and /proc/self/mountinfo")

// maxLimit is above any real limit: v1 writes "no limit" as a page count
// rounded from 2^63.
const maxLimit = 1 << 62

// FindGroup finds the calling process's memory cgroup: v2's when the
// memory controller is on in its v2 group, else v1's memory hierarchy
// (a v1 hybrid host such as this project's own has cgroup2 at
// /sys/fs/cgroup/unified without the memory controller).
func FindGroup() (Group, error) {
	paths, err := procCgroups("/proc/self/cgroup")
	if err != nil {
		return Group{}, err
	}
	mounts, err := cgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return Group{}, err
	}
	if m, ok := mounts["cgroup2"]; ok {
		if p, ok := paths[""]; ok {
			dir := m.dirOf(p)
			if b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers")); err == nil && hasWord(string(b), "memory") {
				return v2Group(dir, m.point), nil
			}
		}
	}
	if m, ok := mounts["memory"]; ok {
		if p, ok := paths["memory"]; ok {
			return v1Group(m.dirOf(p), m.point), nil
		}
	}
	return Group{}, errNoMemcg
}

// v2Group reads the limits from dir up to the hierarchy's root.
func v2Group(dir, root string) Group {
	g := Group{Dir: dir, Limited: dir, V2: true}
	for d := dir; ; d = filepath.Dir(d) {
		if n, ok := readLimit(filepath.Join(d, "memory.max")); ok && (g.Limit == 0 || n < g.Limit) {
			g.Limit, g.Limited = n, d
		}
		if d == root || d == filepath.Dir(d) || !strings.HasPrefix(d, root) {
			return g
		}
	}
}

// v1Group reads the limit v1 computes over the hierarchy itself, and finds
// the group on the way to root that sets it, whose usage meets it.
func v1Group(dir, root string) Group {
	g := Group{Dir: dir, Limited: dir}
	if n := statKey(filepath.Join(dir, "memory.stat"), "hierarchical_memory_limit"); n > 0 && n < maxLimit {
		g.Limit = n
	} else if n, ok := readLimit(filepath.Join(dir, "memory.limit_in_bytes")); ok {
		g.Limit = n
	}
	for d := dir; g.Limit > 0; d = filepath.Dir(d) {
		if n, ok := readLimit(filepath.Join(d, "memory.limit_in_bytes")); ok && n == g.Limit {
			g.Limited = d
			break
		}
		if d == root || d == filepath.Dir(d) || !strings.HasPrefix(d, root) {
			break
		}
	}
	return g
}

// WorkingSet is what the cgroup holding the limit is charged now and the
// kernel could not reclaim: its usage less the pages of files, which it
// reclaims before it kills (shared memory aside, which is charged as a
// file's but cannot go without swap). A daemon that writes its JSON lines
// or a recording fills the page cache without being the nearer a kill.
func (g Group) WorkingSet() (uint64, error) {
	usageFile, file, shmem := "memory.usage_in_bytes", "total_cache", "total_shmem"
	if g.V2 {
		usageFile, file, shmem = "memory.current", "file", "shmem"
	}
	b, err := os.ReadFile(filepath.Join(g.Limited, usageFile))
	if err != nil {
		return 0, err
	}
	usage, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", usageFile, err)
	}
	stat := filepath.Join(g.Limited, "memory.stat")
	if f, s := statKey(stat, file), statKey(stat, shmem); f >= s && f-s < usage {
		usage -= f - s
	}
	return usage, nil
}

// readLimit reads a limit file: a number, or "max" (none).
func readLimit(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n >= maxLimit {
		return 0, false
	}
	return n, true
}

// statKey is one key of a flat keyed file (memory.stat); 0 when absent.
func statKey(path, key string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// procCgroups reads /proc/PID/cgroup: each controller's path, "" for v2's.
func procCgroups(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// mount is where a cgroup hierarchy is mounted, and which of its groups
// is the mount's root (a container sees its own group as /).
type mount struct{ point, root string }

// dirOf is the directory of the group at path (as /proc/PID/cgroup says
// it) under this mount.
func (m mount) dirOf(path string) string {
	rel, err := filepath.Rel(m.root, path)
	// A path above the namespace's root reads /.. (Rel would clean it
	// away).
	if err != nil || strings.HasPrefix(rel, "..") || path == "/.." || strings.HasPrefix(path, "/../") {
		// The group is outside what this mount shows: its own root is
		// the nearest there is (a cgroup namespace's view).
		rel = "."
	}
	return filepath.Join(m.point, rel)
}

// cgroupMounts reads /proc/PID/mountinfo: the cgroup2 mount, and each v1
// controller's.
func cgroupMounts(path string) (map[string]mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]mount{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root point options... - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, after := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(after) < 3 {
			continue
		}
		m := mount{point: unescape(fields[4]), root: unescape(fields[3])}
		switch after[0] {
		case "cgroup2":
			if _, seen := out["cgroup2"]; !seen {
				out["cgroup2"] = m
			}
		case "cgroup":
			for _, o := range strings.Split(after[2], ",") {
				if _, seen := out[o]; !seen {
					out[o] = m
				}
			}
		}
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}
