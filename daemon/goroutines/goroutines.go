// Package goroutines finds the Go programs running on the node and where
// each keeps its goroutines' ids, so that the request evidence
// (bpf/request_links.bpf.h) can follow a Go program's goroutines, which
// move between threads, instead of its threads. The offsets of goid and
// parentGoid in the runtime's g come from the binary's own DWARF, so no
// table of Go versions is kept; in a binary built without DWARF
// (-ldflags=-w) a goroutine is named by its g, and its parent is unknown.
package goroutines

import (
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Offsets are where runtime.g keeps the goroutine's id and its parent's.
type Offsets struct {
	Goid, ParentGoid uint32
}

// Of reads a binary's offsets. A Go binary without DWARF (built with
// -ldflags=-w, as `go test` and many images build them) has none: zero
// Offsets, its goroutines named by their g and their parents unknown. It
// fails for a program that is not Go, on another architecture than
// x86-64, or for a Go older than 1.21 (no parentGoid).
func Of(path string) (Offsets, error) {
	f, err := elf.Open(path)
	if err != nil {
		return Offsets{}, err
	}
	defer f.Close()
	if f.Section(".go.buildinfo") == nil && f.Section(".gopclntab") == nil {
		return Offsets{}, errNotGo
	}
	if f.Machine != elf.EM_X86_64 {
		return Offsets{}, fmt.Errorf("%s: goroutines are followed on x86-64 only", f.Machine)
	}
	d, err := f.DWARF()
	if err != nil {
		// Followed by g, without parents (Offsets zero).
		return Offsets{}, nil
	}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return Offsets{}, err
		}
		if e == nil {
			return Offsets{}, errors.New("no runtime.g in the binary's DWARF")
		}
		// runtime.g is described in the runtime's own compile unit: the
		// others' entries are skipped whole, which is most of a large
		// binary's DWARF.
		if e.Tag == dwarf.TagCompileUnit {
			if e.Val(dwarf.AttrName) != "runtime" {
				r.SkipChildren()
			}
			continue
		}
		if e.Tag != dwarf.TagStructType || e.Val(dwarf.AttrName) != "runtime.g" {
			if e.Children {
				r.SkipChildren()
			}
			continue
		}
		var o Offsets
		var goid, parent bool
		for {
			m, err := r.Next()
			if err != nil || m == nil || m.Tag == 0 {
				break
			}
			off, ok := m.Val(dwarf.AttrDataMemberLoc).(int64)
			if !ok {
				continue
			}
			switch m.Val(dwarf.AttrName) {
			case "goid":
				o.Goid, goid = uint32(off), true
			case "parentGoid":
				o.ParentGoid, parent = uint32(off), true
			}
		}
		if !goid || !parent {
			return Offsets{}, errors.New("runtime.g has no goid or parentGoid (Go before 1.21)")
		}
		return o, nil
	}
}

var errNotGo = errors.New("not a Go program")

// Program is what Finder learnt of one binary.
type Program struct {
	Offsets Offsets
	// Err says why a Go program is not followed (nil: it is).
	Err error
}

type fileID struct {
	dev, ino uint64
	mtime    int64
	size     int64
}

// Finder scans a /proc for Go processes, reading each binary once in the
// process's life (read binaries are shared by every Finder).
type Finder struct {
	Proc    string           // default /proc
	Skipped map[string]error // Go binaries not followed, by path, and why
}

// read holds what every Finder learnt of each binary, bounded by
// readMax: a node runs a few hundred binaries, a tracer restarted in the
// same process (tests) reads none twice.
var read = struct {
	sync.Mutex
	byFile map[fileID]Program
	notGo  map[fileID]bool
}{byFile: map[fileID]Program{}, notGo: map[fileID]bool{}}

const readMax = 4096

// Scan returns the Go processes, by pid: those it can follow with their
// Offsets, the others with the reason (Program.Err), whose threads are no
// evidence of anything.
func (f *Finder) Scan() map[uint32]Program {
	if f.Proc == "" {
		f.Proc = "/proc"
	}
	if f.Skipped == nil {
		f.Skipped = map[string]error{}
	}
	read.Lock()
	defer read.Unlock()
	if len(read.byFile)+len(read.notGo) > readMax {
		clear(read.byFile)
		clear(read.notGo)
	}
	out := map[uint32]Program{}
	ents, err := os.ReadDir(f.Proc)
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		exe := filepath.Join(f.Proc, e.Name(), "exe")
		var st syscall.Stat_t
		if syscall.Stat(exe, &st) != nil {
			continue
		}
		id := fileID{st.Dev, st.Ino, st.Mtim.Sec, st.Size}
		if read.notGo[id] {
			continue
		}
		p, ok := read.byFile[id]
		if !ok {
			o, err := Of(exe)
			var fe *elf.FormatError
			switch {
			case errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission):
				// The process went, or its binary is out of reach
				// for now: the next look tries again.
				continue
			case errors.Is(err, errNotGo) || errors.As(err, &fe):
				read.notGo[id] = true
				continue
			}
			p = Program{Offsets: o, Err: err}
			read.byFile[id] = p
			if err != nil {
				if target, e := os.Readlink(exe); e == nil {
					f.Skipped[target] = err
				}
			}
		}
		out[uint32(pid)] = p
	}
	return out
}
