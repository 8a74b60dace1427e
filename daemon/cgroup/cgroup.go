// Package cgroup finds the cgroup v2 hierarchy and checks directories in it:
// sockops programs attach to a cgroup v2 directory, the tracer's filter
// tests tasks against one, and containers are named from it.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Root finds where the unified cgroup hierarchy is mounted: at
// /sys/fs/cgroup on most systems, /sys/fs/cgroup/unified on hybrid ones.
func Root() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) or give --cgroup")
}

// CheckV2 tells whether path is a directory of a cgroup v2 hierarchy, the
// only place sockops programs attach.
func CheckV2(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup %s is not in a cgroup v2 hierarchy (sockops attach only there)", path)
	}
	return nil
}
