// Package tracer owns lattrace's BPF programs: it loads them into the kernel,
// attaches each hook on its own (a hook the kernel refuses disables only the
// features that need it), drains the ring buffer on a timer and decodes its
// records into the typed values of package record.
package tracer

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/cgroup"
	"github.com/lattrace/lattrace/daemon/streams"
	"github.com/lattrace/lattrace/record"
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
	// WakeupBytes is the fill level at which the kernel wakes the reader,
	// rounded up to a power of two (the programs test it with a mask).
	// Default: an eighth of the ring buffer, which leaves the reader seven
	// eighths to drain into while a wakeup, which costs the kernel an
	// irq_work and the reader a wake-up, stays rare (docs/decisions.md).
	WakeupBytes uint64
	// RingBufferBytes sizes the ring buffer (a power of two of at least a
	// page; default DefaultRingBufferBytes). It must hold what the node
	// makes between two drains, bursts included.
	RingBufferBytes uint32
	// NoTxTimestamps turns BPF TX timestamping off: x1 and a1 are then
	// reconstructed from snd_nxt/snd_una, as on kernels before 6.15.
	NoTxTimestamps bool
	// NoHTTP2Framing leaves HTTP/2's framing unread: the cgroup_skb
	// programs that read the preface and the 9-byte frame headers of
	// cleartext HTTP/2 (never header blocks or DATA) stay unattached.
	NoHTTP2Framing bool
	// NoRequestLinks gathers no evidence of which inbound request an
	// outbound exchange serves (bpf/request_links.bpf.h): no thread's
	// reads are remembered and no wake-up is followed; request trees
	// then link by timing alone.
	NoRequestLinks bool
	// IdleWrite is how long a complete exchange waits, its connection
	// quiet, before it is written without its next turn (on an idle
	// pooled connection that turn may be hours away); the sweep that
	// finds such exchanges runs at the same interval. Zero means
	// DefaultIdleWrite; negative, only at the next turn or the close.
	IdleWrite time.Duration
	// NetnsDirs are directories of bound network namespaces (iproute2's
	// /run/netns, where CNI plugins bind pods' too). Where the kernel
	// refuses iterators over the socket storage, the sweep visits each
	// namespace found there and in /proc; default /run/netns.
	NetnsDirs []string
	// PinPath, on a BPF filesystem, keeps the maps and links pinned there
	// after the daemon exits, so the programs trace on and the next Open
	// with the same path adopts them and reads the records made meanwhile
	// (see pin.go). Empty: everything goes with the process.
	PinPath string
	Logger  *slog.Logger

	// noStorageIters makes both iterators take their alternative, the TCP
	// iterator, as where the kernel refuses iterators over the socket
	// storage: the tests run that path on every kernel, whichever the
	// kernel's own choice is.
	noStorageIters bool
	// noListeners leaves the listener table unseeded, as where the
	// kernel refuses the TCP iterator: roles of connections open before
	// lattrace are then guessed.
	noListeners bool
}

func (o *Options) defaults() {
	if o.DrainInterval <= 0 {
		o.DrainInterval = DefaultDrainInterval
	}
	if o.RingBufferBytes == 0 {
		o.RingBufferBytes = DefaultRingBufferBytes
	}
	if o.WakeupBytes == 0 {
		o.WakeupBytes = max(uint64(o.RingBufferBytes)/8, 4096)
	}
	o.WakeupBytes = 1 << bits.Len64(o.WakeupBytes-1)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.IdleWrite == 0 {
		o.IdleWrite = DefaultIdleWrite
	}
	if o.NetnsDirs == nil {
		o.NetnsDirs = []string{"/run/netns"}
	}
}

// Validate checks options a person gave (flags, the config file) before
// anything is loaded; zero values are the defaults and always valid. Open
// does not call it: tests drain on other schedules than a person may ask
// for.
func (o Options) Validate() error {
	if o.DrainInterval != 0 && (o.DrainInterval < time.Millisecond || o.DrainInterval > 10*time.Second) {
		return fmt.Errorf("drain interval %v outside 1ms..10s", o.DrainInterval)
	}
	if o.IdleWrite > 0 && (o.IdleWrite < 100*time.Millisecond || o.IdleWrite > time.Minute) {
		return fmt.Errorf("idle write %v outside 100ms..1m (negative: off)", o.IdleWrite)
	}
	if o.RingBufferBytes != 0 {
		if err := checkRingBufferBytes(uint64(o.RingBufferBytes)); err != nil {
			return err
		}
	}
	if o.CgroupPath != "" {
		if err := cgroup.CheckV2(o.CgroupPath); err != nil {
			return err
		}
	}
	return nil
}

// DefaultDrainInterval is how often the ring buffer is emptied unless told
// otherwise. A drain has a fixed cost besides its records (the runtime's
// wake-ups, an export round trip to sync the OTLP backend), which matters
// at low rates (docs/decisions.md); a quarter of a second is still fresher
// than anything that reads the outputs (the live view refreshes every
// second).
const DefaultDrainInterval = 250 * time.Millisecond

// DefaultIdleWrite is how long a complete exchange's connection stays
// quiet before the exchange is written without its next turn: with the
// sweep at the same interval and the drain after it, a completed exchange
// is out within about a second of its last byte.
const DefaultIdleWrite = 500 * time.Millisecond

// DefaultRingBufferBytes is the ring buffer's size unless told otherwise.
const DefaultRingBufferBytes = 8 << 20

// checkRingBufferBytes says whether n can size the ring buffer: the
// kernel wants a power of two of at least a page.
func checkRingBufferBytes(n uint64) error {
	page := uint64(os.Getpagesize())
	if n < page || n > 1<<30 || n&(n-1) != 0 {
		return fmt.Errorf("ring buffer size %d: want a power of two from %d (a page) to 1 GiB", n, page)
	}
	return nil
}

// Tracer is a loaded and attached set of lattrace programs.
type Tracer struct {
	opts    Options
	maps    *ebpf.Collection
	progs   []*ebpf.Program
	links   []link.Link
	linksMu sync.Mutex
	hooks   []HookStatus
	ring    *ring
	ringID  uint64 // the ring buffer map's kernel id: output cursors refer to it
	// pos is the ring position just past the record being delivered.
	pos uint64
	// These belong to the draining goroutine: the exchange record every
	// delivery reuses, and the command and congestion control names
	// records repeat.
	ex           record.Exchange
	comms, congs names
	// streams cuts followed HTTP/2 connections into exchanges per stream
	// from their events, decoded into h2ev.
	streams *streams.Assembler
	h2ev    streams.Event
	// inflight walks the socket storage for exchanges in progress; nil
	// when the kernel refused the iterator.
	inflight *link.Iter
	// sweep writes idle complete exchanges (sweep.go); nil when the
	// kernel refused both its iterators. sweepNetns: it is the TCP
	// iterator, opened in each network namespace in turn.
	sweep      *link.Iter
	sweepNetns *namespaces
	lastSweep  time.Time
	// lastPrune: when the listener tables were last pruned of namespaces
	// that are gone (pruneListeners).
	lastPrune time.Time
	// The Go processes whose goroutines the programs follow
	// (goroutines.go), and how many the table had no room for.
	goMu    sync.Mutex // goProcs and goFull, read by GoPrograms
	goProcs map[uint32]lattraceLtGoOffsets
	goFull  uint64
	// With PinPath: the locked directory and the state map (generation,
	// output cursors).
	pin   *pinDir
	state *ebpf.Map
	gen   uint64

	// flushed is the ring position every sink has flushed up to; durable
	// the outputs whose sync the release of records also waits for. relMu
	// orders releases (the reader's and the outputs' sync callbacks) and
	// released is set once the ring is unmapped.
	flushed  atomic.Uint64
	relMu    sync.Mutex
	durable  []*resumed
	released bool

	decoded, decodeErrors, replaySkipped, replayedUnsure, releasedUnsynced, unswept, unseeded, h2Replaced, unwrittenAtStop atomic.Uint64
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
		if opts.CgroupPath, err = cgroup.Root(); err != nil {
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
	if err := checkRingBufferBytes(uint64(opts.RingBufferBytes)); err != nil {
		return nil, err
	}
	spec.Maps["events"].MaxEntries = opts.RingBufferBytes
	cfg, err := setConfig(spec, opts, filter)
	if err != nil {
		return nil, err
	}
	t := &Tracer{opts: opts, streams: streams.New(), goProcs: map[uint32]lattraceLtGoOffsets{}}
	adopt := false
	if opts.PinPath != "" {
		if t.pin, err = openPinDir(opts.PinPath); err != nil {
			return nil, err
		}
		fresh, err := t.loadPinnedMaps(spec, opts.PinPath)
		if err != nil {
			t.Close()
			return nil, err
		}
		gen := generation(fmt.Sprintf("%+v cgroup=%s", cfg, opts.CgroupPath))
		adopt = !fresh && t.pinnedGeneration() == gen
		if !adopt {
			// The new generation's links replace the old ones below;
			// until it is stored, a crash leaves nothing to adopt.
			t.state.Delete(keyOf(generationKey))
			// The path table is a cache whose units other programs may
			// read otherwise (its buckets' width changed once); it
			// refills from the next RTT samples.
			if err := clearArray(t.maps.Maps["paths"]); err != nil {
				t.Close()
				return nil, fmt.Errorf("clearing the pinned path RTT table: %w", err)
			}
		}
		t.gen = gen
	} else if err = t.loadMaps(spec); err != nil {
		return nil, err
	}
	if filter {
		if err := t.setCgroupFilter(opts.CgroupPath); err != nil {
			t.Close()
			return nil, err
		}
	}
	if err := t.attachAll(spec, kernelTypes, adopt); err != nil {
		t.Close()
		return nil, err
	}
	events := t.maps.Maps["events"]
	if info, ierr := events.Info(); ierr == nil {
		id, _ := info.ID()
		t.ringID = uint64(id)
	}
	if t.ring, err = newRing(events); err != nil {
		t.Close()
		return nil, fmt.Errorf("opening ring buffer: %w", err)
	}
	if opts.PinPath != "" {
		// Now the pinned links run this generation's programs.
		if err := t.state.Put(keyOf(generationKey), stateValue{A: t.gen}); err != nil {
			t.Close()
			return nil, fmt.Errorf("storing the pinned programs' generation: %w", err)
		}
		opts.Logger.Info("kernel side pinned", "pin_path", opts.PinPath, "adopted", adopt,
			"unread_bytes", t.ring.backlog())
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

// attachAll attaches every hook, or with adopt takes over the links the
// previous daemon pinned for the same programs. Of a hook's alternatives
// the first the kernel accepts is used; one line says which were used.
func (t *Tracer) attachAll(spec *ebpf.CollectionSpec, kernelTypes *btf.Spec, adopt bool) error {
	kernel := kernelTypes
	if kernel == nil {
		var err error
		if kernel, err = btf.LoadKernelSpec(); err != nil {
			return fmt.Errorf("reading the kernel's BTF: %w", err)
		}
	}
	release := kernelRelease()
	attached := map[string]bool{} // by the program of the hook an alternative stands in for
	tried := map[string][]string{}
	var used []string
	feature := map[string]string{}
	for _, h := range hooks {
		if h.fallbackFor == "" {
			feature[h.program] = h.feature
		}
	}
	for _, h := range hooks {
		primary := h.program
		if h.fallbackFor != "" {
			primary = h.fallbackFor
		}
		if attached[primary] || (h.only != nil && !h.only(kernel)) || (h.off != nil && h.off(&t.opts)) {
			continue
		}
		adopted, err := t.attachHook(spec, kernelTypes, kernel, h, adopt)
		st := HookStatus{Program: h.program, Hook: h.hook, Required: h.required, Feature: feature[primary], Attached: err == nil, Adopted: adopted, FallbackFor: h.fallbackFor}
		if h.reduced != "" {
			st.Feature += " (" + h.reduced + ")"
		}
		if err != nil {
			st.Error = err.Error()
			tried[primary] = append(tried[primary], fmt.Sprintf("%s: %v", h.hook, err))
		} else {
			attached[primary] = true
			if h.iterator {
				used = append(used, h.hook+" ("+h.program+")")
			} else {
				used = append(used, h.hook)
			}
			if h.reduced != "" {
				t.opts.Logger.Warn("hook attached through an alternative that sees less", "hook", h.hook, "sees_less", h.reduced)
			}
		}
		t.hooks = append(t.hooks, st)
	}
	var missing []string
	for _, h := range hooks {
		if h.fallbackFor != "" || attached[h.program] || len(tried[h.program]) == 0 {
			continue
		}
		why := strings.Join(tried[h.program], "; ")
		if h.required {
			missing = append(missing, why)
		} else {
			t.opts.Logger.Warn("optional hook unavailable; feature disabled", "kernel", release, "feature", h.feature, "tried", why)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("required kernel hooks unavailable on Linux %s, every alternative tried: %s", release, strings.Join(missing, "; "))
	}
	t.opts.Logger.Info("kernel hooks attached", "kernel", release, "hooks", strings.Join(used, ", "))
	return nil
}

// attachHook attaches one alternative, or with adopt takes over the link
// the previous daemon pinned for it.
func (t *Tracer) attachHook(spec *ebpf.CollectionSpec, kernelTypes, kernel *btf.Spec, h hook, adopt bool) (adopted bool, err error) {
	if h.fits != nil {
		if err := h.fits(kernel); err != nil {
			return false, err
		}
	}
	pinned := t.pin != nil && h.pinned()
	if pinned && adopt {
		if adopted, err = t.adopt(h); adopted || err != nil {
			return adopted, err
		}
	}
	if pinned {
		t.unpinOld(h)
	}
	if err := t.attach(spec, kernelTypes, h); err != nil {
		return false, err
	}
	if pinned {
		if err := t.links[len(t.links)-1].Pin(t.pin.linkPath(h.program)); err != nil {
			return false, fmt.Errorf("pinning: %w", err)
		}
	}
	return false, nil
}

// kernelRelease is the running kernel's release, as uname -r says it.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown)"
	}
	return unix.ByteSliceToString(u.Release[:])
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

// Close detaches every hook and frees the programs and maps; pinned ones
// stay in the kernel for the next daemon.
func (t *Tracer) Close() error {
	var errs []error
	t.relMu.Lock()
	t.released = true
	t.relMu.Unlock()
	if t.ring != nil {
		errs = append(errs, t.ring.close())
	}
	errs = append(errs, t.detach(true))
	for _, p := range t.progs {
		errs = append(errs, p.Close())
	}
	if t.maps != nil {
		t.maps.Close()
	}
	if t.state != nil {
		t.state.Close()
	}
	errs = append(errs, t.pin.close())
	return errors.Join(errs...)
}

// detach closes the links of every hook, so that nothing more is traced;
// with iterators too, every link. Safe to call again.
func (t *Tracer) detach(iterators bool) error {
	t.linksMu.Lock()
	defer t.linksMu.Unlock()
	var errs []error
	kept := t.links[:0]
	for _, l := range t.links {
		if _, iter := l.(*link.Iter); iter && !iterators {
			kept = append(kept, l)
			continue
		}
		errs = append(errs, l.Close())
	}
	t.links = kept
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

// verifierReason is the verifier's last line that says something: the
// log ends with statistics (instructions processed, stack depth).
func verifierReason(log []string) string {
	for i := len(log) - 1; i >= 0; i-- {
		l := strings.TrimSpace(log[i])
		if l != "" && !strings.HasPrefix(l, "processed ") && !strings.HasPrefix(l, "verification time") && !strings.HasPrefix(l, "stack depth") {
			return l
		}
	}
	return "(no log)"
}

// explainLoadError turns the kernel's answer into one line a person can act
// on; the verifier log stays available at debug level through %+v.
func explainLoadError(what string, err error) error {
	// A verifier rejection comes with EACCES too: it is told first, by
	// the verifier's own last line.
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%s: the kernel's verifier refused it: %s", what, verifierReason(ve.Log))
	}
	switch {
	case errors.Is(err, btf.ErrNotFound):
		return fmt.Errorf("%s: not in this kernel (%v)", what, err)
	case errors.Is(err, os.ErrPermission):
		// checkPrivileges has passed by now: with the capabilities in
		// hand, EPERM is the kernel's policy for this kind of program.
		if checkPrivileges() == nil {
			return fmt.Errorf("%s: the kernel refused it (operation not permitted, although lattrace has the capabilities it needs: this kernel or its sandbox does not allow this kind of program)", what)
		}
		return fmt.Errorf("%s: permission denied: lattrace needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN", what)
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
