package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 keeps named namespaces (bind mounts of
// /proc/<pid>/ns/net), so `ip netns` and this package see the same names.
const netnsDir = "/run/netns"

// doInNetns runs fn on a fresh goroutine locked to its OS thread, with that
// thread moved into the named namespace. A fresh goroutine keeps the
// caller's thread (possibly locked for its own reasons) untouched.
func doInNetns(name string, fn func() error) error {
	target, err := os.Open(filepath.Join(netnsDir, name))
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the runtime then ends this thread when the
			// goroutine exits, so no goroutine ever runs in the wrong netns.
			errc <- errors.Join(ferr, fmt.Errorf("setns back from %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func run(name string, args ...string) error {
	return runInput(nil, name, args...)
}

// runInput runs a setup command with a deadline: setup must never hang a
// test run, and iproute2 answers in milliseconds when healthy.
func runInput(stdin []byte, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// deleteNetns does what `ip netns del` does, in-process: the name is a bind
// mount; once it is detached and no process or socket holds the namespace
// the kernel destroys it with its interfaces (a veth dies with its peer).
func deleteNetns(name string) error {
	p := filepath.Join(netnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Auto-generated lab prefixes are "lt<pid>-<start>-<n>": start is the
// process start time (jiffies since boot, base 36) so that a recycled pid
// does not keep a dead lab alive, n a per-process counter.
var (
	labCounter  atomic.Int64
	autoNameRE  = regexp.MustCompile(`^lt([0-9]+)-([0-9a-z]+)-[0-9]+-[abm]$`)
	selfStartID = processStartID(os.Getpid())
)

func autoPrefix() string {
	return fmt.Sprintf("lt%d-%s-%d", os.Getpid(), selfStartID, labCounter.Add(1))
}

// processStartID returns the start time of pid as base-36 jiffies, or "" if
// the process does not exist or has exited.
func processStartID(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// comm may contain spaces and parentheses: fields restart after the
	// last ')'. starttime is field 22, i.e. the 20th after comm.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	// A zombie (killed, not yet waited for by its parent) holds no lab.
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return ""
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return ""
	}
	return strconv.FormatUint(v, 36)
}

// ReapStale deletes the namespaces of labs whose process is gone (killed
// with SIGKILL, crashed, or a test binary that timed out). Labs with a
// caller-chosen Prefix are not recognised and never reaped. New calls it;
// it returns the names it removed.
func ReapStale() ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var removed []string
	var errs []error
	alive := map[string]bool{}
	for _, e := range ents {
		m := autoNameRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		key := m[1] + "-" + m[2]
		live, seen := alive[key]
		if !seen {
			pid, _ := strconv.Atoi(m[1])
			live = processStartID(pid) == m[2]
			alive[key] = live
		}
		if live {
			continue
		}
		if err := deleteNetns(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// ethtoolSet flips one legacy ethtool feature (ETHTOOL_S*) through the
// SIOCETHTOOL ioctl, which saves depending on the ethtool binary.
func ethtoolSet(fd int, ifname string, cmd uint32, val uint32) error {
	ev := struct{ cmd, data uint32 }{cmd, val}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&ev)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&ev)
	if errno != 0 {
		return errno
	}
	return nil
}

func ethtoolGet(fd int, ifname string, cmd uint32) (uint32, error) {
	ev := struct{ cmd, data uint32 }{cmd, 0}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&ev)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&ev)
	if errno != 0 {
		return 0, errno
	}
	return ev.data, nil
}

// offloadFeatures are turned off on every veth end. With them on, a0 would
// hand the relay 64 KB TSO/GSO super-packets (or GRO would build them on
// ma0), and frames with CHECKSUM_PARTIAL whose checksum is never filled in:
// re-injected through a packet socket, B's stack would drop those as corrupt,
// and the rate limiter would see one 64 KB "frame" instead of 45. Turning tx
// checksumming off is the part that matters most: without it the kernel
// masks every GSO feature per packet and segments and checksums in software
// before the veth, even for TSO bits the legacy ioctls do not reach (6.18's
// tx-tcp-accecn-segmentation stays "on" in ethtool -k). The tests check the
// result on the wire: no frame above MTU+14.
var offloadFeatures = []struct {
	name     string
	get, set uint32
}{
	{"tx-checksumming", unix.ETHTOOL_GTXCSUM, unix.ETHTOOL_STXCSUM},
	{"tcp-segmentation-offload", unix.ETHTOOL_GTSO, unix.ETHTOOL_STSO},
	{"generic-segmentation-offload", unix.ETHTOOL_GGSO, unix.ETHTOOL_SGSO},
	{"generic-receive-offload", unix.ETHTOOL_GGRO, unix.ETHTOOL_SGRO},
}

// disableOffloads must run inside the interface's namespace.
func disableOffloads(ifname string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for _, f := range offloadFeatures {
		if err := ethtoolSet(fd, ifname, f.set, 0); err != nil {
			return fmt.Errorf("%s: disable %s: %w", ifname, f.name, err)
		}
	}
	return nil
}

// offloadsOn lists the offload features still enabled on ifname; it must run
// inside the interface's namespace.
func offloadsOn(ifname string) ([]string, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var on []string
	for _, f := range offloadFeatures {
		v, err := ethtoolGet(fd, ifname, f.get)
		if err != nil {
			return nil, fmt.Errorf("%s: read %s: %w", ifname, f.name, err)
		}
		if v != 0 {
			on = append(on, f.name)
		}
	}
	return on, nil
}
