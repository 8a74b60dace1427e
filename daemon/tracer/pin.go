package tracer

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/private"
)

// Pinning keeps the kernel side alive between daemons (restarts, upgrades,
// a kill -9): the maps and links live in a bpffs directory, the programs go
// on following every socket while no daemon runs, their records wait in the
// pinned ring buffer, and the next daemon adopts it all.
//
// Layout of the directory:
//
//	<dir>/socks, h2socks, paths, events, counters,
//	      cgroup_filter, control                          the programs' maps
//	<dir>/lt_state                                        generation, output cursors and marks
//	<dir>/links/<program>                                 one link per attached hook
//
// A daemon adopts the links as they are when they run the very programs it
// would load (same object, same settings: the generation); otherwise it
// replaces them one by one on the same maps.

// pinnedMaps are the maps whose contents must survive the daemon: per-socket
// state (exchanges in progress, HTTP/2 framing), path RTTs, the ring buffer
// with its unread records, the counters, the cgroup filter and the
// control element.
var pinnedMaps = []string{"socks", "h2socks", "paths", "events", "counters", "cgroup_filter", "control"}

const (
	stateMapName = "lt_state"
	linksDir     = "links"
)

// stateKey names a slot of the state map.
type stateKey [16]byte

func keyOf(name string) (k stateKey) {
	copy(k[:], name)
	return k
}

// stateValue is a slot: for an output's cursor, the ring buffer map it
// refers to (its kernel id) and the position up to which that output has
// written everything out; for the generation, the hash and zero.
type stateValue struct {
	A, B uint64
}

const generationKey = "generation"

// pinDir is a locked pin directory: one daemon at a time may read a pinned
// ring buffer, or they would steal each other's records.
type pinDir struct {
	path string
	lock *os.File
}

func openPinDir(path string) (*pinDir, error) {
	if err := checkBPFFS(filepath.Clean(path)); err != nil {
		return nil, err
	}
	// The pins are the daemon's (mode 0600); a directory another user
	// could change would let them unpin, or put in place of a pin
	// what the daemon then adopts.
	for _, d := range []string{path, filepath.Join(path, linksDir)} {
		if err := private.MkdirAll(d); err != nil {
			return nil, fmt.Errorf("pin directory: %w; remove it or choose another --pin-path", err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pin directory %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("pin directory %s is in use by another lattrace daemon", path)
		}
		return nil, fmt.Errorf("locking pin directory %s: %w", path, err)
	}
	return &pinDir{path: path, lock: f}, nil
}

func (p *pinDir) close() error {
	if p == nil {
		return nil
	}
	return p.lock.Close() // releases the lock
}

func (p *pinDir) linkPath(program string) string {
	return filepath.Join(p.path, linksDir, program)
}

// checkBPFFS says in one line why pinning cannot work when dir, or the
// nearest of its parents that exists, is not on a BPF filesystem (bpffs is
// not mounted at boot everywhere; in a pod, the pin directory itself is the
// mount).
func checkBPFFS(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			if st.Type != unix.BPF_FS_MAGIC {
				return fmt.Errorf("%s is not on a BPF filesystem: mount one (mount -t bpf bpf /sys/fs/bpf) or choose another --pin-path", dir)
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return fmt.Errorf("pin path %s: %w", dir, err)
		}
	}
}

// generation identifies the programs a daemon would load: the object's bytes
// and every load-time setting. Equal generations may adopt each other's links.
func generation(settings string) uint64 {
	h := sha256.New()
	h.Write(_LattraceBytes)
	h.Write([]byte(settings))
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

// loadPinnedMaps opens the pinned maps, creating those that are missing. A
// map an older version left with another layout cannot be reused: its pin
// is removed (its contents, e.g. exchanges in progress, are lost, which is
// said) and a new one made. fresh reports whether any map is new, in which
// case pinned links, which use the old maps, must not be adopted.
func (t *Tracer) loadPinnedMaps(spec *ebpf.CollectionSpec, dir string) (fresh bool, err error) {
	for _, name := range pinnedMaps {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			fresh = true
		}
	}
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	for name, m := range mapsOnly.Maps {
		if slices.Contains(pinnedMaps, name) {
			m.Pinning = ebpf.PinByName
		}
	}
	opts := ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	coll, err := ebpf.NewCollectionWithOptions(mapsOnly, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		t.opts.Logger.Warn("pinned maps of another lattrace version have another layout: replacing them; exchanges in progress and unread records of that version are lost",
			"pin_path", dir, "err", err)
		for _, name := range pinnedMaps {
			os.Remove(filepath.Join(dir, name))
		}
		fresh = true
		coll, err = ebpf.NewCollectionWithOptions(mapsOnly, opts)
	}
	if err != nil {
		return false, explainLoadError("creating pinned BPF maps", err)
	}
	t.maps = coll
	state, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name: stateMapName, Type: ebpf.Hash, KeySize: 16, ValueSize: 16, MaxEntries: 16, Pinning: ebpf.PinByName,
	}, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		return false, explainLoadError("creating pinned state map", err)
	}
	t.state = state
	return fresh, nil
}

// pinnedGeneration is the generation of the programs the pinned links run.
func (t *Tracer) pinnedGeneration() uint64 {
	var v stateValue
	if err := t.state.Lookup(keyOf(generationKey), &v); err != nil {
		return 0
	}
	return v.A
}

// adopt takes over a pinned link of the same generation; ok is false when
// there is none to take.
func (t *Tracer) adopt(h hook) (ok bool, err error) {
	l, err := link.LoadPinnedLink(t.pin.linkPath(h.program), nil)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("adopting pinned link of %s: %w", h.program, err)
	}
	info, err := l.Info()
	if err == nil {
		if prog, perr := ebpf.NewProgramFromID(info.Program); perr == nil {
			t.progs = append(t.progs, prog)
		}
	}
	t.links = append(t.links, l)
	return true, nil
}

// unpinOld detaches the link an older generation left for this program.
// The hook is then dark until the new link is attached, a gap of about a
// millisecond: better than running both programs on one socket's state.
func (t *Tracer) unpinOld(h hook) {
	l, err := link.LoadPinnedLink(t.pin.linkPath(h.program), nil)
	if err != nil {
		return
	}
	l.Unpin()
	l.Close()
}

// Cursor is how far a durable output got, for Resume.
type cursor struct {
	ringID uint64
	pos    uint64
}

// An output's cursor (out:) is how far it wrote everything; its sent mark
// (sent:) how far the records handed to it may reach (Resume).
func (t *Tracer) loadCursor(name string) cursor { return t.loadSlot("out:" + name) }

func (t *Tracer) storeCursor(name string, c cursor) error { return t.storeSlot("out:"+name, c) }

func (t *Tracer) loadMark(name string) cursor { return t.loadSlot("sent:" + name) }

func (t *Tracer) storeMark(name string, c cursor) error { return t.storeSlot("sent:"+name, c) }

func (t *Tracer) loadSlot(key string) cursor {
	var v stateValue
	if t.state == nil || t.state.Lookup(keyOf(key), &v) != nil {
		return cursor{}
	}
	return cursor{ringID: v.A, pos: v.B}
}

func (t *Tracer) storeSlot(key string, c cursor) error {
	if t.state == nil {
		return nil
	}
	return t.state.Put(keyOf(key), stateValue{A: c.ringID, B: c.pos})
}

// Cleanup removes everything a daemon pinned under dir: the links (which
// detaches the programs) and the maps. It refuses while a daemon holds the
// directory. It returns what it removed.
func Cleanup(dir string) ([]string, error) {
	// Detaching the programs is root's: say so before anything else.
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	p, err := openPinDir(dir)
	if err != nil {
		return nil, err
	}
	defer p.close()
	var removed []string
	entries, _ := os.ReadDir(filepath.Join(dir, linksDir))
	for _, e := range entries {
		path := filepath.Join(dir, linksDir, e.Name())
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			l.Unpin()
			l.Close()
		} else if err := os.Remove(path); err != nil {
			return removed, fmt.Errorf("removing %s: %w", path, err)
		}
		removed = append(removed, path)
	}
	if err := os.Remove(filepath.Join(dir, linksDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return removed, err
	}
	entries, _ = os.ReadDir(dir)
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if err := os.Remove(path); err != nil {
			return removed, fmt.Errorf("removing %s: %w", path, err)
		}
		removed = append(removed, path)
	}
	if err := os.Remove(dir); err != nil {
		return removed, fmt.Errorf("removing %s: %w", dir, err)
	}
	return removed, nil
}

// clearArray zeroes every slot of an array map.
func clearArray(m *ebpf.Map) error {
	zero := make([]byte, m.ValueSize())
	for i := range m.MaxEntries() {
		if err := m.Put(i, zero); err != nil {
			return err
		}
	}
	return nil
}
