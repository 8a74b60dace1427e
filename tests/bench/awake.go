package bench

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Awake keeps the vCPUs from halting while it runs. On this VM an idle vCPU
// halts into the hypervisor, and waking it costs more than the tracer does
// (kernel-facts): a request/response loop on an idle machine measures
// wake-ups, not the tracer. Two ways, in order of preference:
//
//   - The guest's haltpoll idle driver polls for up to guest_halt_poll_ns
//     before halting; the kernel's default is 200 µs, this VM boots with 0.
//     With the default restored, a vCPU woken within the window never left
//     the guest, as on a cloud VM with the stock setting or on bare metal.
//   - Without that driver, a `nice -n 19` busy loop on each CPU. It keeps
//     the vCPUs in the guest, but every wake-up preempts it and, when the
//     two vCPUs share a physical core, it takes the core's execution units
//     from the thread that works: measured here, the loopback round trip
//     took 34 µs beside busy loops and 13-18 µs with haltpoll polling, so a
//     tracer's few µs looked two to three times smaller than they are.
type Awake struct {
	// Method says which, for the report.
	Method string
	cmds   []*exec.Cmd
	// restore puts the poll window back as it was.
	restore func() error
}

// haltPollNs is the haltpoll driver's poll window, and haltPollDefault the
// kernel's default for it (drivers/cpuidle/governors/haltpoll.c).
const (
	haltPollNs       = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
	haltPollDriver   = "/sys/devices/system/cpu/cpuidle/current_driver"
	haltPollGovernor = "/sys/devices/system/cpu/cpuidle/current_governor"
	haltPollDefault  = 200000
)

// KeepAwake starts keeping the vCPUs awake.
func KeepAwake() (*Awake, error) {
	a, err := haltPoll()
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return a, err
	}
	return spin()
}

// haltPoll widens the haltpoll window to the kernel's default if it is
// narrower (fs.ErrNotExist without the driver).
func haltPoll() (*Awake, error) {
	// The window is the haltpoll governor's, of the haltpoll driver:
	// under another it does nothing.
	for _, p := range []string{haltPollDriver, haltPollGovernor} {
		v, err := sysfsWord(p)
		if err != nil {
			return nil, err
		}
		if v != "haltpoll" {
			return nil, fmt.Errorf("%s is %q: %w", p, v, fs.ErrNotExist)
		}
	}
	v, err := sysfsWord(haltPollNs)
	if err != nil {
		return nil, err
	}
	was, err := strconv.Atoi(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %q: %w", haltPollNs, v, err)
	}
	if was >= haltPollDefault {
		return &Awake{Method: fmt.Sprintf("haltpoll idle polling (guest_halt_poll_ns %d, as this machine had it)", was)}, nil
	}
	a := &Awake{Method: fmt.Sprintf("haltpoll idle polling (guest_halt_poll_ns %d, the kernel's default; this machine had %d)", haltPollDefault, was)}
	if err := os.WriteFile(haltPollNs, []byte(strconv.Itoa(haltPollDefault)), 0); err != nil {
		return nil, fmt.Errorf("%s: %w", haltPollNs, err)
	}
	a.restore = func() error {
		if err := os.WriteFile(haltPollNs, []byte(strconv.Itoa(was)), 0); err != nil {
			return fmt.Errorf("%s left at %d: putting back %d: %w", haltPollNs, haltPollDefault, was, err)
		}
		return nil
	}
	return a, nil
}

// sysfsWord reads a one-word sysfs file.
func sysfsWord(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// spin starts a `nice -n 19` busy loop on each CPU.
func spin() (*Awake, error) {
	a := &Awake{Method: "a `nice -n 19` busy loop on each CPU (no haltpoll idle driver here)"}
	for cpu := range runtime.NumCPU() {
		argv := append(pinned(cpu), "nice", "-n", "19", "sh", "-c", "while :; do :; done")
		c := exec.Command(argv[0], argv[1:]...)
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			a.Stop()
			return nil, err
		}
		a.cmds = append(a.cmds, c)
	}
	return a, nil
}

// Stop lets the vCPUs idle as before; the error says the poll window
// could not be put back.
func (a *Awake) Stop() error {
	for _, c := range a.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	a.cmds = nil
	var err error
	if a.restore != nil {
		err = a.restore()
		a.restore = nil
	}
	return err
}

// AwakeKind reduces a recorded Method to the way it kept the vCPUs awake,
// "haltpoll" or "busy loops" (runs from before it was recorded used busy
// loops): what decides whether two runs' rates compare.
func AwakeKind(method string) string {
	if strings.HasPrefix(method, "haltpoll") {
		return "haltpoll"
	}
	return "busy loops"
}
