// Package labtrace runs lattrace's tracer, with the daemon's pipeline, over
// the network namespaces of a test lab and keeps what it reports about
// them: the harness the scenario and real-application suites share.
package labtrace

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
)

// Collector keeps the records of the namespaces it was made for. Read its
// slices with Mu held.
type Collector struct {
	Mu        sync.Mutex
	Exchanges []*record.Exchange
	Opens     []record.ConnOpen
	Closes    []record.ConnClose
	// Also receives every record kept (an exporter under test); set it
	// before Run.
	Also record.Sink

	netns map[uint32]bool
}

// NewCollector keeps the records of the namespaces with these inodes.
func NewCollector(netns ...uint32) *Collector {
	c := &Collector{netns: map[uint32]bool{}}
	for _, n := range netns {
		c.netns[n] = true
	}
	return c
}

func (c *Collector) keep(f record.Flow) bool { return c.netns[f.Netns] }

// Exchange implements record.Sink.
func (c *Collector) Exchange(e *record.Exchange) {
	if c.keep(e.Flow) {
		if c.Also != nil {
			c.Also.Exchange(e)
		}
		c.Mu.Lock()
		x := *e // the tracer reuses e
		c.Exchanges = append(c.Exchanges, &x)
		c.Mu.Unlock()
	}
}

// ConnOpen implements record.Sink.
func (c *Collector) ConnOpen(o record.ConnOpen) {
	if c.keep(o.Flow) {
		c.Mu.Lock()
		c.Opens = append(c.Opens, o)
		c.Mu.Unlock()
	}
}

// ConnClose implements record.Sink.
func (c *Collector) ConnClose(r record.ConnClose) {
	if c.keep(r.Flow) {
		c.Mu.Lock()
		c.Closes = append(c.Closes, r)
		c.Mu.Unlock()
	}
}

// Flush implements record.Sink.
func (c *Collector) Flush() {}

// Of returns the exchanges of netns that keep selects (nil: all).
func (c *Collector) Of(netns uint32, keep func(*record.Exchange) bool) []*record.Exchange {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	var out []*record.Exchange
	for _, e := range c.Exchanges {
		if e.Flow.Netns == netns && (keep == nil || keep(e)) {
			out = append(out, e)
		}
	}
	return out
}

// ClosesIn counts the connection closes reported in netns.
func (c *Collector) ClosesIn(netns uint32) int {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	n := 0
	for _, r := range c.Closes {
		if r.Flow.Netns == netns {
			n++
		}
	}
	return n
}

// NetnsInode is the inode of the named network namespace, which records
// carry as Flow.Netns.
func NetnsInode(t testing.TB, name string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+name, &st); err != nil {
		t.Fatalf("netns %s: %v", name, err)
	}
	return uint32(st.Ino)
}

// Run opens the tracer with opts (a 20 ms drain interval unless set) and
// feeds col through the daemon's pipeline until the test ends, when it
// checks that no record was lost.
func Run(t testing.TB, opts tracer.Options, col *Collector) *tracer.Tracer {
	t.Helper()
	tr, _ := Start(t, opts, col)
	return tr
}

// Start is Run with a stop: the function it returns stops the tracer
// (its programs detached, its maps gone unless opts pin them) and checks
// that no record was lost, once; the test's end does it if the test has
// not. A test stops one tracer and starts another in the middle of a run
// with it, as a daemon restarted on a busy node.
func Start(t testing.TB, opts tracer.Options, col *Collector) (*tracer.Tracer, func()) {
	t.Helper()
	if opts.DrainInterval == 0 {
		opts.DrainInterval = 20 * time.Millisecond
	}
	tr, err := tracer.Open(opts)
	if err != nil {
		t.Fatalf("tracer: %v (the tests load BPF programs: run as root)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, pipeline.New(pipeline.Config{}, col)) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("tracer: %v", err)
			}
			c, err := tr.Counters()
			if err == nil && (c.RingbufFull != 0 || c.StorageFail != 0 || c.DecodeErrors != 0) {
				t.Errorf("tracer lost records: %+v", c)
			}
			tr.Close()
		})
	}
	t.Cleanup(stop)
	return tr, stop
}
