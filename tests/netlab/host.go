package netlab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Host is one end of the lab: a network namespace with one interface (Ifname)
// that reaches the other host through the relay.
type Host struct {
	Name   string // "A" or "B"
	Netns  string // namespace name, as shown by `ip netns list`
	Ifname string // the host's interface: "a0" or "b0"
	MAC    net.HardwareAddr
	IPv4   netip.Addr // in a /24 shared with the other host
	IPv6   netip.Addr // ULA in a /64 shared with the other host
}

// Command returns a command that runs name inside the host's namespace, via
// `ip netns exec` (which also gives the command a /sys of that namespace).
// A nil ctx means context.Background().
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if ctx == nil {
		ctx = context.Background()
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Netns, name}, args...)...)
}

// Do runs fn on an OS thread that is inside the host's namespace, and returns
// its error. Sockets (net.Listen, net.Dial, syscalls) created by fn belong to
// the namespace for their whole life and may be used from any goroutine
// afterwards. Goroutines that fn starts do NOT run in the namespace.
func (h *Host) Do(fn func() error) error { return doInNetns(h.Netns, fn) }

// Listen opens a listener inside the host's namespace (see Do).
func (h *Host) Listen(network, address string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// Dial connects from inside the host's namespace (see Do). A nil d means a
// zero net.Dialer; d.Control can set socket options such as TCP_CONGESTION
// before the connect.
func (h *Host) Dial(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	var c net.Conn
	err := h.Do(func() (err error) {
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// sysctlPath maps "net.ipv4.tcp_congestion_control" to its /proc/sys file.
// Keys may also be given in path form ("net/ipv4/conf/a0.100/rp_filter") when
// a component itself contains a dot.
func sysctlPath(key string) (string, error) {
	p := key
	if !strings.Contains(key, "/") {
		p = strings.ReplaceAll(key, ".", "/")
	}
	p = filepath.Clean("/proc/sys/" + p)
	if !strings.HasPrefix(p, "/proc/sys/") {
		return "", fmt.Errorf("bad sysctl key %q", key)
	}
	return p, nil
}

// Sysctl sets a sysctl as seen from the host's namespace. Keys under net.
// are per namespace (tcp_congestion_control, tcp_slow_start_after_idle, ...);
// others are global and a write changes them for the whole machine.
//
// A non-root namespace may only make an algorithm its default when the root
// namespace lists it in net.ipv4.tcp_allowed_congestion_control (EPERM
// otherwise). Scenarios need cubic and bbr as namespace defaults whatever
// the machine allows, so Sysctl adds the algorithm to the root's allowed
// list first: that only widens what unprivileged sockets may pick with
// TCP_CONGESTION and leaves the root's own default unchanged.
func (h *Host) Sysctl(key, value string) error {
	p, err := sysctlPath(key)
	if err != nil {
		return err
	}
	if strings.HasSuffix(p, "/net/ipv4/tcp_congestion_control") {
		if err := allowCongestionControl(value); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, h.Netns, err)
		}
	}
	// /proc/sys/net resolves to the namespace of the thread that opens it,
	// hence Do rather than a plain write.
	return h.Do(func() error {
		if err := os.WriteFile(p, []byte(value), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, h.Netns, err)
		}
		return nil
	})
}

// allowCongestionControl adds cc to the root namespace's allowed list. It
// runs on a thread outside any lab namespace, like every goroutine not
// inside Host.Do.
func allowCongestionControl(cc string) error {
	const allowed = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
	b, err := os.ReadFile(allowed)
	if err != nil {
		return err
	}
	list := strings.Fields(string(b))
	if slices.Contains(list, cc) {
		return nil
	}
	return os.WriteFile(allowed, []byte(strings.Join(append(list, cc), " ")), 0)
}

// ReadSysctl reads a sysctl as seen from the host's namespace, trimmed.
func (h *Host) ReadSysctl(key string) (string, error) {
	p, err := sysctlPath(key)
	if err != nil {
		return "", err
	}
	var v string
	err = h.Do(func() error {
		b, err := os.ReadFile(p)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v, err
}

// NetStats returns the namespace's SNMP counters from /proc/net/snmp and
// /proc/net/netstat, keyed "Tcp.RetransSegs", "TcpExt.TCPLostRetransmit",
// "Ip.InReceives", ... (the same names nstat prints, with a dot).
func (h *Host) NetStats() (map[string]int64, error) {
	out := map[string]int64{}
	err := h.Do(func() error {
		// /proc/net follows the thread group leader's namespace; the
		// thread-self view follows this (namespaced) thread.
		for _, f := range []string{"snmp", "netstat"} {
			b, err := os.ReadFile("/proc/thread-self/net/" + f)
			if err != nil {
				return err
			}
			if err := parseSNMP(b, out); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
		}
		return nil
	})
	return out, err
}

// parseSNMP reads the /proc/net/snmp layout: pairs of lines, a header line
// of names and a line of values, both starting with "Proto:".
func parseSNMP(b []byte, out map[string]int64) error {
	sc := bufio.NewScanner(bytes.NewReader(b))
	var hdr []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.HasSuffix(f[0], ":") {
			continue
		}
		if hdr == nil || hdr[0] != f[0] {
			hdr = f
			continue
		}
		proto := strings.TrimSuffix(f[0], ":")
		for i := 1; i < len(f) && i < len(hdr); i++ {
			v, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				continue // e.g. Tcp.MaxConn is -1, still parses; skip oddities
			}
			out[proto+"."+hdr[i]] = v
		}
		hdr = nil
	}
	return sc.Err()
}
