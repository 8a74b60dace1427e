package tracer

import (
	"context"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lattrace/lattrace/daemon/goroutines"
)

// goScanEvery is how often the node's processes are looked over for new Go
// programs: a program started since is followed by thread until then.
const goScanEvery = 2 * time.Second

// watchGoroutines keeps the programs' table of Go processes (go_procs,
// bpf/request_links.bpf.h) to the node's, every goScanEvery until ctx
// ends: the ones started since the last look in, the ones gone out.
func (t *Tracer) watchGoroutines(ctx context.Context) {
	procs := t.maps.Maps["go_procs"]
	if procs == nil || t.opts.NoRequestLinks {
		return
	}
	finder := &goroutines.Finder{}
	tick := time.NewTicker(goScanEvery)
	defer tick.Stop()
	for {
		t.lookForGo(procs, finder)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// lookForGo is one look of watchGoroutines.
func (t *Tracer) lookForGo(procs *ebpf.Map, finder *goroutines.Finder) {
	now := finder.Scan()
	t.goMu.Lock()
	defer t.goMu.Unlock()
	for pid, p := range now {
		o := lattraceLtGoOffsets{Goid: p.Offsets.Goid, ParentGoid: p.Offsets.ParentGoid}
		if p.Err != nil {
			// Its threads run any goroutine: no evidence at all.
			o = lattraceLtGoOffsets{Goid: goUnfollowed, ParentGoid: goUnfollowed}
		}
		if old, ok := t.goProcs[pid]; ok && old == o {
			continue
		}
		if err := procs.Put(pid, o); err != nil {
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
	for path, err := range finder.Skipped {
		t.opts.Logger.Warn("a Go program's goroutines are not followed: its calls are linked to requests by timing alone", "binary", path, "err", err)
		delete(finder.Skipped, path)
	}
}

// goUnfollowed is LT_GO_UNFOLLOWED (bpf/lattrace.h), which bpf2go does not
// carry over (a #define).
const goUnfollowed = 0xffffffff

// GoPrograms returns how many Go processes have their goroutines followed
// now, how many are Go programs that cannot be (no evidence gathered in
// them), and how many could not be added (the table full).
func (t *Tracer) GoPrograms() (followed, unfollowed int, full uint64) {
	t.goMu.Lock()
	defer t.goMu.Unlock()
	for _, o := range t.goProcs {
		if o.Goid == goUnfollowed {
			unfollowed++
		} else {
			followed++
		}
	}
	return followed, unfollowed, t.goFull
}

// goFollowed reports whether the evidence follows pid's goroutines.
func (t *Tracer) goFollowed(pid uint32) bool {
	t.goMu.Lock()
	defer t.goMu.Unlock()
	o, ok := t.goProcs[pid]
	return ok && o.Goid != goUnfollowed
}
