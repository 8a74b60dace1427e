// Package memguard keeps the daemon under its memory limit. A node agent
// shares the node with everything else, and a container runtime kills it
// at its cgroup's limit: lattrace must rather shed what it holds, in an
// order it documents, and count what that loses.
//
// The limit is the daemon's memory cgroup's (v2 or v1) unless given. What
// counts against it is more than the Go heap: the kernel charges the BPF
// maps the daemon creates to its cgroup, and socket storage for every
// followed socket is the largest of them. So the guard reads the cgroup's
// own working set, not the runtime's, and:
//
//   - gives the Go runtime as its memory limit (GOMEMLIMIT, unless the
//     environment sets one) 80 % of the limit less the rest: the other
//     fifth is room for what the runtime holds for a moment above its
//     limit (a /metrics scrape of thousands of series allocates tens of
//     MiB) and for the kernel's part growing between two looks;
//   - from 75 % of the limit (or the live heap at 60 % of the runtime's
//     limit), drops the history of recent exchanges (what the live views
//     draw the last minutes of a flow from) and the exchanges held for
//     request trees not yet formed (Actions.ShedHistory does both);
//   - from 85 % (or the live heap at 70 % of the runtime's limit), drops
//     the least recently updated flows with their statistics (their peer
//     pairs keep theirs), until the live heap is back at 60 % of the
//     runtime's limit, at most a tenth of them a second, and returns the
//     freed memory to the kernel;
//   - from half of the limit needed (the kernel's part, and the live heap
//     with the collector's room or what the runtime holds when more),
//     gives the programs a budget of new sockets at each look: those that
//     fit under 88 %, followed from their birth, and none first seen
//     later. The programs keep it however late the next look comes: on a
//     busy node the daemon's looks come late exactly while a burst of new
//     sockets fills the room;
//   - once the daemon needs 88 %, stops following new sockets until it
//     needs less than 78 % (the kernel side's socket storage is charged
//     per socket).
//
// The shedding steps are judged once an interval (a second); the runtime's
// limit and the pause ten times as often, since a burst of new sockets
// fills the kernel's part faster than a second's notice allows, and every
// step as often while the live heap is near the runtime's limit (85 %).
//
// Each step is counted (Stats); the daemon puts the counts on /metrics.
package memguard

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Shares of the limit at which each step starts; below release, sockets
// are followed again.
const (
	shedHistoryAt = 0.75
	shedFlowsAt   = 0.85
	pauseAt       = 0.88
	releaseAt     = 0.78
	// goShare is the share of the limit the Go runtime's and the rest's
	// memory may take together before the runtime collects harder.
	goShare = 0.80
	// flowShare is the most of the flows dropped in one interval.
	flowShare = 0.10
	// flowsGain is the least share of the live heap a drop of flows must
	// free to be worth the next.
	flowsGain = 0.01
	// The live heap's shares of the runtime's limit at which the history
	// goes, and the flows go, down to targetHeap: the collector needs room
	// above the live heap to keep up without taking the CPU.
	historyHeap = 0.60
	flowsHeap   = 0.70
	targetHeap  = 0.60
	// urgentHeap: from this share of the runtime's limit, the live heap
	// is judged at every watch, not once an interval: records drained
	// after a burst of new sockets grow it by tens of MiB within a
	// second, and past the limit the runtime cannot hold it.
	urgentHeap = 0.85
	// gcRoom is the memory a live heap needs, as a multiple of it, for
	// the collector to keep it there without running all the time.
	gcRoom = 1.25
	// watchInterval is the time between two looks at the working set for
	// the runtime's limit and the pause alone.
	watchInterval = 100 * time.Millisecond
	// From budgetAt of the limit needed, new sockets are followed within
	// a budget, the room left under pauseAt at socketBytes each, given
	// anew at each look; below it, every one.
	budgetAt = 0.50
	// socketBytes is what a followed socket may cost: its state in the
	// kernel (a 416-byte struct in a 512-byte storage element, and the
	// socket's storage header) and the flow the daemon makes of it, with
	// a margin: too high a figure only makes the budget smaller.
	socketBytes = 2 << 10
	// minGoLimit is the least the runtime is ever given: below it, the
	// collector would run without end for no gain.
	minGoLimit = 16 << 20
)

// Actions are what the guard may do to shed memory; each returns how much
// it dropped (samples, flows). A nil one is skipped.
type Actions struct {
	ShedHistory func() int
	ShedFlows   func(share float64) int
	// LimitSockets bounds the sockets the programs begin to follow until
	// the next call: n < 0 every one, 0 none, else at most n more.
	LimitSockets func(n int64) error
}

// Config configures a Guard.
type Config struct {
	// Limit in bytes on the Go runtime's own memory; 0: the memory
	// cgroup's limit on everything charged to it, the kernel's BPF maps
	// included.
	Limit uint64
	// Interval between two looks at the cgroup (default 1 s).
	Interval time.Duration
	Logger   *slog.Logger
}

// Guard watches the memory cgroup and sheds.
type Guard struct {
	cfg     Config
	group   Group
	limit   uint64
	actions Actions
	// setGoLimit is false when GOMEMLIMIT came from the environment.
	setGoLimit bool
	paused     bool
	// flowsVain is the live heap after a drop of flows that lowered it
	// by less than flowsGain; flows are not dropped again until the heap
	// is below that by flowsGain. 0: flows are dropped when called for.
	flowsVain float64
	// limitFailed: a failed pause or budget was said once.
	limitFailed bool
	// bounded: the programs were given a budget last, not every socket.
	bounded bool
	// said holds a bit per step said since the level was last 0.
	said uint8

	seen, goLimit                  atomic.Uint64
	historyShed, flowsShed, pauses atomic.Uint64
	level                          atomic.Int32
}

// Stats are the guard's counters and gauges.
type Stats struct {
	Limit      uint64 // bytes; 0: none, the guard does nothing
	WorkingSet uint64 // the cgroup's, bytes, at the last look
	GoLimit    uint64 // the runtime's memory limit set last; 0: not set by the guard
	// Level is the step in force: 0 none, 1 history shed, 2 flows shed,
	// 3 new sockets not followed.
	Level int
	// HistoryShed counts exchanges dropped from the history, FlowsShed
	// flows dropped with their statistics, Pauses the times new sockets
	// stopped being followed.
	HistoryShed, FlowsShed, Pauses uint64
}

// New finds the limit and prepares a Guard; Run starts it. Without a
// limit (none set, or no memory cgroup) the guard does nothing and says
// so once.
func New(cfg Config, actions Actions) *Guard {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Guard{cfg: cfg, actions: actions, setGoLimit: os.Getenv("GOMEMLIMIT") == ""}
	group, err := FindGroup()
	g.group, g.limit = group, group.Limit
	if cfg.Limit > 0 {
		g.limit = cfg.Limit
	}
	switch {
	case g.limit == 0 && err != nil:
		cfg.Logger.Info("no memory limit: memory is not guarded", "err", err)
	case g.limit == 0:
		cfg.Logger.Info("no memory limit on the daemon's cgroup: memory is not guarded", "cgroup", group.Dir)
	default:
		cfg.Logger.Info("memory guarded", "limit_bytes", g.limit, "cgroup", group.Limited, "gomemlimit_from_env", !g.setGoLimit)
	}
	return g
}

// Run looks at the cgroup every interval until ctx is done. It first
// has the programs follow new sockets, and again as it returns: their
// control map is pinned, and a daemon that stopped (or was killed) while
// they followed none must not leave them so.
func (g *Guard) Run(ctx context.Context) {
	g.follow()
	defer g.follow()
	if g.limit == 0 {
		return
	}
	g.look()
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	w := time.NewTicker(min(watchInterval, g.cfg.Interval))
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.look()
		case <-w.C:
			g.watch()
		}
	}
}

// follow has the programs follow every new socket.
func (g *Guard) follow() {
	if g.actions.LimitSockets == nil {
		return
	}
	if err := g.actions.LimitSockets(-1); err != nil {
		g.cfg.Logger.Warn("new sockets may not be followed: the programs' pause could not be lifted", "err", err)
		return
	}
	g.paused, g.bounded = false, false
}

// look reads the working set and the runtime's memory and acts on them.
func (g *Guard) look() {
	ws, err := g.workingSet()
	if err != nil {
		return
	}
	gm, live := goMemory()
	g.act(ws, gm, live)
}

// watch reads the working set and sets the runtime's limit and the pause
// by it, between two looks.
func (g *Guard) watch() {
	ws, err := g.workingSet()
	if err != nil {
		return
	}
	gm, live := goMemory()
	g.watched(ws, gm, live)
}

// watched is watch on a working set of ws, the runtime holding gm of it
// and its live heap live.
func (g *Guard) watched(ws, gm uint64, live float64) {
	goLimit, _ := g.limitRuntime(ws, gm)
	if live > urgentHeap*goLimit {
		// A live heap at the runtime's limit grows past it: every step
		// is taken now, not at the next look.
		g.act(ws, gm, live)
		return
	}
	// The level (and what it says) follows at the next look.
	g.pause(ws, g.need(ws, gm, live))
}

// limitRuntime records the working set ws, the runtime holding gm of it,
// gives the runtime the rest of the limit, and returns that and ws's share
// of the limit.
func (g *Guard) limitRuntime(ws, gm uint64) (goLimit, share float64) {
	g.seen.Store(ws)
	// What the runtime holds can be shed; the rest (the kernel's maps,
	// the binary's pages) cannot, but by following fewer sockets.
	other := float64(ws - min(ws, gm))
	goLimit = max(float64(g.limit)*goShare-other, minGoLimit)
	if g.setGoLimit {
		debug.SetMemoryLimit(int64(goLimit))
		g.goLimit.Store(uint64(goLimit))
	}
	return goLimit, float64(ws) / float64(g.limit)
}

// need is the share of the limit the daemon needs, by which new sockets
// are left: the working set ws less what the runtime holds (gm), plus the
// live heap with the collector's room (gcRoom), or gm when more. What the
// runtime holds can be low for a moment (just after flows were dropped
// and the pages returned) while the live heap it will grow back to is
// not: judged on ws then, the pause was lifted, a burst of new sockets
// filled the room, and the heap growing back met the limit.
func (g *Guard) need(ws, gm uint64, live float64) float64 {
	other := float64(ws - min(ws, gm))
	return (other + max(float64(gm), gcRoom*live)) / float64(g.limit)
}

// act takes the steps a working set of ws calls for, the runtime holding
// gm of it and its live heap live.
func (g *Guard) act(ws, gm uint64, live float64) {
	goLimit, share := g.limitRuntime(ws, gm)
	g.cfg.Logger.Debug("memory", "working_set", ws, "go", gm, "live_heap", live, "go_limit", uint64(goLimit), "share", share)
	var took [len(Steps)]bool
	if (share >= shedHistoryAt || live > historyHeap*goLimit) && g.actions.ShedHistory != nil {
		took[1] = true
		g.historyShed.Add(uint64(g.actions.ShedHistory()))
	}
	// The flows go as far as the live heap exceeds its share of the
	// runtime's limit: a heap at that limit makes the collector run
	// without end, and the daemon stops answering. Where the kernel's
	// part is what fills the cgroup, dropping flows gains nothing: the
	// pause below is the step that helps.
	// And only while dropping them lowers the heap: where something else
	// holds it (an export queue during an outage), they would all go for
	// nothing. That is judged again once the heap has come down.
	shedFlows := (share >= shedFlowsAt || live > flowsHeap*goLimit) && live > targetHeap*goLimit
	if g.flowsVain > 0 && live < g.flowsVain*(1-flowsGain) {
		g.flowsVain = 0
	}
	if shedFlows && g.flowsVain == 0 && g.actions.ShedFlows != nil {
		took[2] = true
		// What the drop frees is the live heap just before it less just
		// after it. The last collection's figure will not do for before:
		// records read since (a backlog drained under pressure) make
		// flows, and a drop measured against it looked vain while it
		// freed what they added, and the flows then grew unchecked.
		runtime.GC()
		_, before := goMemory()
		n := g.actions.ShedFlows(min(flowShare, 1-targetHeap*goLimit/live))
		g.flowsShed.Add(uint64(n))
		if n > 0 {
			// The runtime returns freed pages lazily; the cgroup must
			// see them go now, or the next look sheds again for nothing.
			// The collection it runs also tells what the flows held.
			debug.FreeOSMemory()
			if _, after := goMemory(); after > before*(1-flowsGain) {
				g.flowsVain = after
				g.cfg.Logger.Warn("memory pressure: the flows hold little of the heap, so they are no longer dropped until it comes down",
					"live_heap_bytes", uint64(after), "flows_dropped", n)
			}
		}
	}
	took[3] = g.pause(ws, g.need(ws, gm, live))
	level := 0
	for step := range took {
		if took[step] {
			level = step
		}
	}
	// Each step taken now and not said since the guard was last at rest
	// is said, in order: a step can come first after a higher one (the
	// pause, between two looks, before the flows).
	g.level.Store(int32(level))
	if level == 0 {
		g.said = 0
	}
	for step := 1; step < len(took); step++ {
		if took[step] && g.said&(1<<step) == 0 {
			g.said |= 1 << step
			g.cfg.Logger.Warn("memory pressure: shedding", "step", Steps[step], "working_set_bytes", ws, "limit_bytes", g.limit)
		}
	}
}

// pause stops following new sockets once the daemon needs (see need)
// pauseAt of the limit, and follows them again once it needs less than
// releaseAt; in between, and down to budgetAt, the programs follow no more
// new sockets than fit under pauseAt until the next look. It returns
// whether new sockets are left.
func (g *Guard) pause(ws uint64, need float64) bool {
	if g.actions.LimitSockets == nil {
		return false
	}
	switch {
	case !g.paused && need >= pauseAt:
		if !g.limitSockets(0) {
			break
		}
		g.paused = true
		g.pauses.Add(1)
		g.cfg.Logger.Warn("memory near the limit: new sockets are not followed until the daemon needs less than 78 % of it",
			"working_set_bytes", ws, "limit_bytes", g.limit, "needed_share", need)
	case g.paused && need < releaseAt:
		if g.limitSockets(g.budget(need)) {
			g.paused = false
			g.cfg.Logger.Info("memory needed back under 78 % of the limit: new sockets are followed again, within a budget", "working_set_bytes", ws, "needed_share", need)
		}
	case !g.paused && need >= budgetAt:
		g.limitSockets(g.budget(need))
	case !g.paused && g.bounded:
		g.limitSockets(-1)
	}
	return g.paused
}

// budget is the new sockets that fit between need and pauseAt.
func (g *Guard) budget(need float64) int64 {
	return max(int64((pauseAt-need)*float64(g.limit)), 0) / socketBytes
}

// limitSockets gives the programs their budget of new sockets (0 none,
// -1 every one), and says a failure once.
func (g *Guard) limitSockets(n int64) bool {
	err := g.actions.LimitSockets(n)
	if err != nil {
		if !g.limitFailed {
			g.limitFailed = true
			g.cfg.Logger.Warn("memory near the limit, and new sockets could not be limited", "err", err)
		}
		return false
	}
	g.bounded = n >= 0
	return true
}

// Steps name the levels of Stats.Level, in the words of a sentence
// ("shedding the ...").
var Steps = [...]string{"none", "history of recent exchanges", "least recently updated flows", "new sockets (not followed)"}

// workingSet is the cgroup's when the limit is the cgroup's; with a limit
// given instead, the Go runtime's own memory (the cgroup may hold other
// processes, and the kernel's memory of the BPF maps is not the
// process's to count).
func (g *Guard) workingSet() (uint64, error) {
	if g.cfg.Limit == 0 {
		return g.group.WorkingSet()
	}
	held, _ := goMemory()
	return held, nil
}

// goMemory is the memory the Go runtime holds from the kernel (mapped and
// not released), and its live heap as of the last collection.
func goMemory() (held uint64, live float64) {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	total, released := s[0].Value.Uint64(), s[1].Value.Uint64()
	return total - min(released, total), float64(s[2].Value.Uint64())
}

// Stats returns the counters.
func (g *Guard) Stats() Stats {
	return Stats{
		Limit: g.limit, WorkingSet: g.seen.Load(), GoLimit: g.goLimit.Load(), Level: int(g.level.Load()),
		HistoryShed: g.historyShed.Load(), FlowsShed: g.flowsShed.Load(), Pauses: g.pauses.Load(),
	}
}
