// Package tracer owns lattrace's BPF programs: it loads them into the kernel,
// attaches each hook on its own (a hook the kernel refuses disables only the
// features that need it), drains the ring buffer on a timer and decodes its
// records into the typed values of package record.
package tracer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

// Options configure Open. The zero value is usable.
type Options struct {
	// CgroupPath limits tracing to the sockets of tasks in this cgroup v2
	// subtree (sockops attaches there; tracepoints test the task); empty
	// means the whole node.
	CgroupPath string
	// KernelBTF is a BTF file describing the running kernel, for kernels
	// that do not expose /sys/kernel/btf/vmlinux; empty means that file.
	KernelBTF string
	// DrainInterval is how often user space empties the ring buffer when the
	// kernel has not woken it (it wakes it only past WakeupBytes).
	DrainInterval time.Duration
	// WakeupBytes is the fill level at which the kernel wakes the reader.
	WakeupBytes uint64
	// NoTxTimestamps turns BPF TX timestamping off: x1 and a1 are then
	// reconstructed from snd_nxt/snd_una, as on kernels before 6.15.
	NoTxTimestamps bool
	Logger         *slog.Logger
}

func (o *Options) defaults() {
	if o.DrainInterval <= 0 {
		o.DrainInterval = 100 * time.Millisecond
	}
	if o.WakeupBytes == 0 {
		o.WakeupBytes = 256 * 1024
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Tracer is a loaded and attached set of lattrace programs.
type Tracer struct {
	opts    Options
	maps    *ebpf.Collection
	progs   []*ebpf.Program
	links   []link.Link
	linksMu sync.Mutex
	hooks   []HookStatus
	reader  *ringbuf.Reader
	// inflight walks the socket storage for exchanges in progress; nil
	// when the kernel refused the iterator.
	inflight *link.Iter

	decoded, decodeErrors atomic.Uint64
}

// Open checks that this kernel can run lattrace, loads the programs and
// attaches every hook it can. It fails only when a required hook is missing.
func Open(opts Options) (*Tracer, error) {
	opts.defaults()
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	kernelTypes, err := kernelBTF(opts.KernelBTF)
	if err != nil {
		return nil, err
	}
	// An explicit cgroup limits tracing to its subtree; the default is the
	// whole node (sockops still needs a cgroup: the root).
	filter := opts.CgroupPath != ""
	if !filter {
		if opts.CgroupPath, err = Cgroup2Root(); err != nil {
			return nil, err
		}
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones
	// (and this library on them) ignore it. Failure to raise it is only
	// worth a line: the load below says what really went wrong.
	if err := rlimit.RemoveMemlock(); err != nil {
		opts.Logger.Debug("could not raise RLIMIT_MEMLOCK", "err", err)
	}

	spec, err := loadLattrace()
	if err != nil {
		return nil, fmt.Errorf("reading embedded BPF object: %w", err)
	}
	for name, v := range map[string]any{
		"wakeup_bytes":  opts.WakeupBytes,
		"use_tx_tstamp": !opts.NoTxTimestamps,
		"filter_cgroup": filter,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	t := &Tracer{opts: opts}
	if err := t.loadMaps(spec); err != nil {
		return nil, err
	}
	if filter {
		if err := t.setCgroupFilter(opts.CgroupPath); err != nil {
			t.Close()
			return nil, err
		}
	}
	if err := t.attachAll(spec, kernelTypes); err != nil {
		t.Close()
		return nil, err
	}
	if t.reader, err = ringbuf.NewReader(t.maps.Maps["events"]); err != nil {
		t.Close()
		return nil, fmt.Errorf("opening ring buffer: %w", err)
	}
	return t, nil
}

// loadMaps creates the maps once, so that each program can then be loaded
// on its own against them: one program the verifier refuses must not take
// the others down with it.
func (t *Tracer) loadMaps(spec *ebpf.CollectionSpec) error {
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	coll, err := ebpf.NewCollection(mapsOnly)
	if err != nil {
		return explainLoadError("creating BPF maps", err)
	}
	t.maps = coll
	return nil
}

func (t *Tracer) attachAll(spec *ebpf.CollectionSpec, kernelTypes *btf.Spec) error {
	var missing []string
	for _, h := range hooks {
		err := t.attach(spec, kernelTypes, h)
		st := HookStatus{Program: h.program, Hook: h.hook, Required: h.required, Feature: h.feature, Attached: err == nil}
		if err != nil {
			st.Error = err.Error()
			if h.required {
				missing = append(missing, fmt.Sprintf("%s (%v)", h.hook, err))
			} else {
				t.opts.Logger.Warn("optional hook unavailable; feature disabled", "hook", h.hook, "feature", h.feature, "err", err)
			}
		}
		t.hooks = append(t.hooks, st)
	}
	if len(missing) > 0 {
		return fmt.Errorf("required kernel hooks unavailable: %s", strings.Join(missing, "; "))
	}
	return nil
}

func (t *Tracer) attach(spec *ebpf.CollectionSpec, kernelTypes *btf.Spec, h hook) error {
	one := spec.Copy()
	for name := range one.Programs {
		if name != h.program {
			delete(one.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{
		MapReplacements: t.maps.Maps,
		Programs:        ebpf.ProgramOptions{KernelTypes: kernelTypes},
	})
	if err != nil {
		return explainLoadError("loading "+h.program, err)
	}
	prog := coll.DetachProgram(h.program)
	coll.Close()
	t.progs = append(t.progs, prog)
	l, err := h.attach(prog, t)
	if err != nil {
		return err
	}
	t.links = append(t.links, l)
	return nil
}

// Hooks reports what was attached and what was not.
func (t *Tracer) Hooks() []HookStatus { return append([]HookStatus(nil), t.hooks...) }

// Programs returns the loaded programs by name, for statistics.
func (t *Tracer) Programs() map[string]*ebpf.Program {
	out := make(map[string]*ebpf.Program, len(t.progs))
	for _, p := range t.progs {
		info, err := p.Info()
		if err == nil {
			out[info.Name] = p
		}
	}
	return out
}

// Close detaches every hook and frees the programs and maps.
func (t *Tracer) Close() error {
	var errs []error
	if t.reader != nil {
		errs = append(errs, t.reader.Close())
	}
	errs = append(errs, t.detach())
	for _, p := range t.progs {
		errs = append(errs, p.Close())
	}
	if t.maps != nil {
		t.maps.Close()
	}
	return errors.Join(errs...)
}

// detach closes every link; safe to call again.
func (t *Tracer) detach() error {
	t.linksMu.Lock()
	defer t.linksMu.Unlock()
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	return errors.Join(errs...)
}

// kernelBTF returns nil to mean "the running kernel's own BTF", after
// checking it exists, or the spec read from an explicit file.
func kernelBTF(path string) (*btf.Spec, error) {
	if path == "" {
		if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
			return nil, errors.New("this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing): lattrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y, or a BTF file for it given with --kernel-btf")
		}
		return nil, nil
	}
	spec, err := btf.LoadSpec(path)
	if err != nil {
		return nil, fmt.Errorf("reading kernel BTF from %s: %w", path, err)
	}
	return spec, nil
}

// explainLoadError turns the kernel's answer into one line a person can act
// on; the verifier log stays available at debug level through %+v.
func explainLoadError(what string, err error) error {
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: permission denied: lattrace needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN", what)
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%s: the kernel's verifier refused it: %v", what, ve)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// setCgroupFilter puts the cgroup directory in the map the programs test
// tasks against (bpf_current_task_under_cgroup).
func (t *Tracer) setCgroupFilter(path string) error {
	dir, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	defer dir.Close()
	if err := t.maps.Maps["cgroup_filter"].Put(uint32(0), uint32(dir.Fd())); err != nil {
		return fmt.Errorf("cgroup filter %s: %w", path, err)
	}
	return nil
}
