package memguard

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// write makes a file of a fake cgroup tree.
func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A v2 container without a limit of its own in a pod with one: the pod's
// limit and usage are the ones that count.
func TestV2LimitOfAnAncestor(t *testing.T) {
	root := t.TempDir()
	pod := filepath.Join(root, "kubepods", "pod1")
	ctr := filepath.Join(pod, "ctr")
	write(t, filepath.Join(root, "kubepods", "memory.max"), "209715200\n")
	write(t, filepath.Join(pod, "memory.max"), "104857600\n")
	write(t, filepath.Join(ctr, "memory.max"), "max\n")
	write(t, filepath.Join(pod, "memory.current"), "90000000\n")
	write(t, filepath.Join(pod, "memory.stat"), "anon 50000000\nfile 30000000\nshmem 1000000\nkernel 10000000\n")
	g := v2Group(ctr, root)
	if g.Limit != 104857600 || g.Limited != pod || !g.V2 {
		t.Fatalf("group %+v: want the pod's limit of 100 MiB", g)
	}
	ws, err := g.WorkingSet()
	if err != nil || ws != 90000000-29000000 {
		t.Errorf("working set %d (%v): want the pod's usage less its file pages but shared memory", ws, err)
	}
}

// v1 computes the limit over the hierarchy; the group that sets it is the
// one whose usage meets it.
func TestV1HierarchicalLimit(t *testing.T) {
	root := t.TempDir()
	pod := filepath.Join(root, "kubepods", "pod1")
	ctr := filepath.Join(pod, "ctr")
	const none = "9223372036854771712\n"
	write(t, filepath.Join(root, "kubepods", "memory.limit_in_bytes"), none)
	write(t, filepath.Join(pod, "memory.limit_in_bytes"), "104857600\n")
	write(t, filepath.Join(ctr, "memory.limit_in_bytes"), none)
	write(t, filepath.Join(ctr, "memory.stat"), "cache 1\nhierarchical_memory_limit 104857600\n")
	write(t, filepath.Join(pod, "memory.usage_in_bytes"), "80000000\n")
	write(t, filepath.Join(pod, "memory.stat"), "total_cache 20000000\ntotal_shmem 0\n")
	g := v1Group(ctr, root)
	if g.Limit != 104857600 || g.Limited != pod || g.V2 {
		t.Fatalf("group %+v: want the pod's limit", g)
	}
	if ws, err := g.WorkingSet(); err != nil || ws != 60000000 {
		t.Errorf("working set %d (%v), want 60000000", ws, err)
	}
}

// A group's path under a mount, as /proc/self/cgroup and mountinfo say
// them, a cgroup namespace's view included.
func TestDirOf(t *testing.T) {
	for _, c := range []struct {
		root, path, want string
	}{
		{"/", "/", "/sys/fs/cgroup"},
		{"/", "/kubepods/pod1/ctr", "/sys/fs/cgroup/kubepods/pod1/ctr"},
		{"/kubepods/pod1/ctr", "/kubepods/pod1/ctr", "/sys/fs/cgroup"},
		{"/kubepods/pod1/ctr", "/kubepods/pod1/ctr/sub", "/sys/fs/cgroup/sub"},
		// Outside what the mount shows: its own root is the nearest.
		{"/kubepods/pod1/ctr", "/kubepods/pod1", "/sys/fs/cgroup"},
		{"/", "/..", "/sys/fs/cgroup"},
		{"/", "/../sibling", "/sys/fs/cgroup"},
	} {
		if got := (mount{point: "/sys/fs/cgroup", root: c.root}).dirOf(c.path); got != c.want {
			t.Errorf("root %s, path %s: %s, want %s", c.root, c.path, got, c.want)
		}
	}
}

// mountinfo's lines: the cgroup2 mount and each v1 controller's, escapes
// undone.
func TestCgroupMounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mountinfo")
	write(t, path, `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 /kubepods /sys/fs/cgroup/my\040pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`)
	m, err := cgroupMounts(path)
	if err != nil {
		t.Fatal(err)
	}
	if m["memory"].point != "/sys/fs/cgroup/memory" || m["cgroup2"].point != "/sys/fs/cgroup/unified" ||
		m["pids"] != (mount{point: "/sys/fs/cgroup/my pids", root: "/kubepods"}) {
		t.Errorf("mounts %+v", m)
	}
}

// recorder is Actions that count what the guard asks.
type recorder struct {
	history, flows int
	share          float64
	// limits are the budgets of new sockets asked for, in order.
	limits []int64
	// held is memory each drop of flows frees, a chunk at a time, as
	// dropped flows would: the guard measures what a drop freed.
	held *ballast
}

// ballast is memory a test holds.
type ballast [][]byte

// last is the budget asked for last; 1 when none was.
func (r *recorder) last() int64 {
	if len(r.limits) == 0 {
		return 1
	}
	return r.limits[len(r.limits)-1]
}

// pauses counts the budgets of none.
func (r *recorder) pauses() int {
	n := 0
	for _, l := range r.limits {
		if l == 0 {
			n++
		}
	}
	return n
}

// holding is a recorder whose drops of flows free n chunks of 4 MiB.
func holding(n int) *recorder {
	r := &recorder{held: &ballast{}}
	for range n {
		b := make([]byte, 4<<20)
		for i := range b {
			b[i] = 1
		}
		*r.held = append(*r.held, b)
	}
	return r
}

func (r *recorder) actions() Actions {
	return Actions{
		ShedHistory: func() int { r.history++; return 10 },
		ShedFlows: func(share float64) int {
			r.flows++
			r.share = share
			if r.held != nil && len(*r.held) > 0 {
				(*r.held)[0] = nil
				*r.held = (*r.held)[1:]
			}
			return 5
		},
		LimitSockets: func(n int64) error { r.limits = append(r.limits, n); return nil },
	}
}

// The steps come in their order as the working set rises, each said in
// the log, and new sockets are followed again under 78 %.
func TestStepsInOrder(t *testing.T) {
	var log strings.Builder
	r := holding(4)
	g := &Guard{cfg: Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, limit: 1000 << 20, actions: r.actions()}
	const mib = 1 << 20
	// The runtime holds 100 MiB, 50 of them live: far below its limit.
	g.act(700*mib, 100*mib, 50*mib)
	if r.history != 0 || r.flows != 0 || r.pauses() != 0 || g.Stats().Level != 0 {
		t.Fatalf("at 70 %%: %+v, level %d; want nothing shed", r, g.Stats().Level)
	}
	if want := int64(180*mib) / socketBytes; r.last() != want {
		t.Fatalf("at 70 %%: a budget of %d new sockets, want the %d that fit in the 180 MiB under 88 %%", r.last(), want)
	}
	g.act(800*mib, 100*mib, 50*mib)
	if r.history != 1 || r.flows != 0 || g.Stats().Level != 1 {
		t.Fatalf("at 80 %%: %+v, level %d; want the history shed", r, g.Stats().Level)
	}
	// The runtime's limit is 800 less the 770 it does not hold: its live
	// heap of 80 is above 60 % of it, so flows go, a tenth at most. The
	// daemon needs 770 and the 100 the runtime holds (more than the live
	// heap's 80 with the collector's room): below the pause's 88 %.
	g.act(870*mib, 100*mib, 80*mib)
	if r.history != 2 || r.flows != 1 || r.share <= 0 || r.share > flowShare || g.Stats().Level != 2 {
		t.Fatalf("at 87 %%: %+v, level %d; want flows shed too", r, g.Stats().Level)
	}
	g.act(950*mib, 100*mib, 90*mib)
	if r.pauses() != 1 || r.last() != 0 || g.Stats().Level != 3 || g.Stats().Pauses != 1 {
		t.Fatalf("at 95 %%: %+v, level %d; want new sockets left unfollowed", r, g.Stats().Level)
	}
	g.act(850*mib, 100*mib, 10*mib)
	if r.last() != 0 {
		t.Fatalf("at 85 %%, paused: %v; want it to stay until 78 %%", r.limits)
	}
	g.act(700*mib, 100*mib, 10*mib)
	if r.last() <= 0 || r.pauses() != 1 || g.Stats().Level != 0 {
		t.Fatalf("at 70 %%: %v, level %d; want sockets followed again, within a budget", r.limits, g.Stats().Level)
	}
	for _, step := range Steps[1:] {
		if !strings.Contains(log.String(), step) {
			t.Errorf("the log does not say %q:\n%s", step, log.String())
		}
	}
	if h, f := strings.Index(log.String(), Steps[1]), strings.Index(log.String(), Steps[2]); h > f {
		t.Errorf("the flows were said before the history:\n%s", log.String())
	}
	if s := g.Stats(); s.HistoryShed != 40 || s.FlowsShed != 10 {
		t.Errorf("stats %+v: want 4 sheds of the history (10 each) and 2 of flows (5 each)", s)
	}
}

// A look that jumps from nothing to flows says both steps, in order.
func TestJumpSaysEveryStep(t *testing.T) {
	var log strings.Builder
	r := &recorder{}
	g := &Guard{cfg: Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, limit: 1000 << 20, actions: r.actions()}
	g.act(900<<20, 100<<20, 90<<20)
	h, f := strings.Index(log.String(), Steps[1]), strings.Index(log.String(), Steps[2])
	if h < 0 || f < 0 || h > f {
		t.Errorf("a jump to 90 %% logged:\n%s", log.String())
	}
}

// Without a limit the guard does nothing but have new sockets followed,
// at its start and its end.
func TestNoLimit(t *testing.T) {
	r := &recorder{}
	g := &Guard{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, actions: r.actions()}
	g.Run(t.Context())
	if len(r.limits) != 2 || r.limits[0] != -1 || r.limits[1] != -1 || r.history+r.flows != 0 {
		t.Errorf("without a limit: %+v", r)
	}
}

// When dropping flows frees next to nothing (something else holds the
// heap: here a buffer of the test's own), the guard stops dropping them
// rather than drop them all, until the heap comes down.
func TestFlowsNotDroppedInVain(t *testing.T) {
	var log strings.Builder
	r := &recorder{}
	g := &Guard{cfg: Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, limit: 1000 << 20, actions: r.actions()}
	held := make([]byte, 64<<20)
	for i := range held {
		held[i] = 1
	}
	// The runtime's limit is its least (800 less the 850 it does not hold
	// is below that); the live heap (the buffer) is above 60 % of it.
	live := float64(len(held))
	g.act(950<<20, 100<<20, live)
	g.act(950<<20, 100<<20, live)
	g.act(950<<20, 100<<20, live)
	if r.flows != 1 || !strings.Contains(log.String(), "no longer dropped") {
		t.Errorf("flows dropped %d times with the heap held elsewhere, want once:\n%s", r.flows, log.String())
	}
	// Once the heap comes down, flows go again when called for.
	g.act(950<<20, 100<<20, live/2)
	if r.flows != 2 {
		t.Errorf("flows dropped %d times once the heap came down, want 2", r.flows)
	}
	if held[len(held)-1] != 1 {
		t.Fatal("the buffer changed")
	}
}

// Just after flows were dropped and their pages returned, the runtime
// holds little while its live heap is what it will grow back to: the
// pause stays while the kernel's part and that heap, with the collector's
// room, need 78 % or more, though the working set is below.
func TestPauseHeldWhileHeapGrowsBack(t *testing.T) {
	r := &recorder{}
	g := &Guard{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, limit: 1000 << 20, actions: r.actions()}
	const mib = 1 << 20
	g.watched(950*mib, 150*mib, 100*mib)
	if r.pauses() != 1 || r.last() != 0 {
		t.Fatalf("at 95 %%: %v; want new sockets left", r.limits)
	}
	// 700 of 1000, the runtime holding 50 of it, its live heap 120: the
	// daemon needs 650 + 150.
	g.watched(700*mib, 50*mib, 120*mib)
	if r.last() != 0 {
		t.Fatalf("working set at 70 %%, need at 80 %%: %v; want the pause kept", r.limits)
	}
	g.watched(700*mib, 50*mib, 80*mib)
	if r.last() <= 0 {
		t.Fatalf("need at 75 %%: %v; want sockets followed again", r.limits)
	}
}

// Below half the limit needed, every new socket is followed (and those
// first seen later, open before lattrace); from half, a budget is given at
// each look; back below half, the bound is lifted once.
func TestBudgetFromHalf(t *testing.T) {
	r := &recorder{}
	g := &Guard{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, limit: 1000 << 20, actions: r.actions()}
	const mib = 1 << 20
	g.watched(400*mib, 100*mib, 50*mib)
	if len(r.limits) != 0 {
		t.Fatalf("at 40 %%: %v; want no bound asked for", r.limits)
	}
	g.watched(600*mib, 100*mib, 50*mib)
	g.watched(600*mib, 100*mib, 50*mib)
	if want := int64(280*mib) / socketBytes; len(r.limits) != 2 || r.limits[0] != want || r.limits[1] != want {
		t.Fatalf("at 60 %%: %v; want a budget of %d at each look", r.limits, want)
	}
	g.watched(400*mib, 100*mib, 50*mib)
	g.watched(400*mib, 100*mib, 50*mib)
	if len(r.limits) != 3 || r.limits[2] != -1 {
		t.Fatalf("back at 40 %%: %v; want the bound lifted once", r.limits)
	}
}
