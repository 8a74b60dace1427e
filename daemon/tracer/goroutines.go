package tracer

import (
	"time"

	"github.com/lattrace/lattrace/daemon/goroutines"
)

// goScanEvery is how often the node's processes are looked over for new Go
// programs: a program started since is followed by thread until then.
const goScanEvery = 2 * time.Second

// watchGoroutines keeps the programs' table of Go processes (go_procs,
// bpf/request_links.bpf.h) to the node's: the ones started since the last
// look in, the ones gone out.
func (t *Tracer) watchGoroutines() {
	procs := t.maps.Maps["go_procs"]
	if procs == nil || t.opts.NoRequestLinks || time.Since(t.lastGoScan) < goScanEvery {
		return
	}
	t.lastGoScan = time.Now()
	if t.goFinder == nil {
		t.goFinder = &goroutines.Finder{}
	}
	now := t.goFinder.Scan()
	for pid, o := range now {
		if old, ok := t.goProcs[pid]; ok && old == o {
			continue
		}
		if err := procs.Put(pid, lattraceLtGoOffsets{Goid: o.Goid, ParentGoid: o.ParentGoid}); err != nil {
			t.goFull++
			continue
		}
		t.goProcs[pid] = o
	}
	for pid := range t.goProcs {
		if _, ok := now[pid]; !ok {
			_ = procs.Delete(pid)
			delete(t.goProcs, pid)
		}
	}
	for path, err := range t.goFinder.Skipped {
		t.opts.Logger.Warn("a Go program's goroutines are not followed: its calls are linked to requests by thread and timing", "binary", path, "err", err)
		delete(t.goFinder.Skipped, path)
	}
}

// GoPrograms returns how many Go processes have their goroutines followed
// now, and how many could not be added (the table full).
func (t *Tracer) GoPrograms() (followed int, full uint64) { return len(t.goProcs), t.goFull }
