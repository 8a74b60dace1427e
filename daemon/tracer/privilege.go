package tracer

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// checkPrivileges fails early, with the capabilities to grant, when the
// process could not load programs: the kernel's own EPERM surfaces deep in
// feature probes with messages that point elsewhere.
func checkPrivileges() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(uint(c)%32)) != 0 }
	if has(unix.CAP_SYS_ADMIN) && has(unix.CAP_NET_ADMIN) {
		return nil
	}
	var missing []string
	for _, c := range []struct {
		cap  int
		name string
	}{{unix.CAP_BPF, "CAP_BPF"}, {unix.CAP_PERFMON, "CAP_PERFMON"}, {unix.CAP_NET_ADMIN, "CAP_NET_ADMIN"}} {
		if !has(c.cap) && !(c.cap != unix.CAP_NET_ADMIN && has(unix.CAP_SYS_ADMIN)) {
			missing = append(missing, c.name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return errors.New("permission denied: lattrace needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN; this process lacks " + strings.Join(missing, ", "))
}
