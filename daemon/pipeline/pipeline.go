// Package pipeline is what happens to every record between the tracer and
// the outputs, built in one place for every command that traces (`lattrace
// daemon`, `top` tracing in-process, `record`). The stages run in this order
// on the tracer's reading goroutine, for each exchange:
//
//  1. enrich: the owner's container (from its cgroup id) and, in a
//     cluster, its pod, and the peer's pod or Service;
//  2. attribute: the exchange's components from its timeline (the latency
//     model, package latency), and whether it is a latency sample; those
//     that are not are counted by reason (Rejected);
//  3. diagnose: what made the exchange slow (package diagnose);
//  4. fan out: every output in turn, in the order given.
//
// A connection's close is enriched with its owner's names; its open has no
// owner yet and goes straight to the outputs. A stage never blocks: the
// resolvers answer from their caches, and outputs must not wait either
// (record.Sink).
package pipeline

import (
	"sync/atomic"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/cgroup"
	"github.com/lattrace/lattrace/daemon/containers"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/daemon/kube"
	"github.com/lattrace/lattrace/daemon/latency"
	"github.com/lattrace/lattrace/record"
)

// Config says where the enrich stage finds names. A nil resolver leaves its
// names out.
type Config struct {
	// Containers names each owner's container; HostContainers gives the
	// host's.
	Containers *containers.Resolver
	// Kube names pods and Services, in a cluster.
	Kube *kube.Resolver
}

// HostContainers names containers from this host's cgroup v2 hierarchy;
// nil when none is mounted.
func HostContainers() *containers.Resolver {
	root, err := cgroup.Root()
	if err != nil {
		return nil
	}
	return containers.New(root)
}

// Pipeline is a record.Sink that runs the stages and hands every record to
// its outputs.
type Pipeline struct {
	cfg     Config
	outputs []record.Sink
	// rejected counts, by RejectReasons, the exchanges that are no
	// latency sample by the model's own rules.
	rejected []atomic.Uint64
}

// RejectReasons name the reasons an exchange that the model attributes
// is no latency sample, where nothing else (partial, unanswered) made it
// none already, as the aggregates count them: overlap (its request and
// answer overlap, or the answer came sooner than the path allows:
// Multiplexed), then each record.Rejection of the model's guard.
var RejectReasons = append([]string{"overlap"}, rejections()...)

func rejections() []string {
	out := make([]string, len(record.Rejections))
	for i, r := range record.Rejections {
		out[i] = string(r)
	}
	return out
}

// Rejected returns the counts of RejectReasons so far.
func (p *Pipeline) Rejected() []uint64 {
	out := make([]uint64, len(p.rejected))
	for i := range p.rejected {
		out[i] = p.rejected[i].Load()
	}
	return out
}

func (p *Pipeline) countRejected(e *record.Exchange) {
	if e.Partial || e.Unanswered {
		return
	}
	if e.Multiplexed {
		p.rejected[0].Add(1)
		return
	}
	for i, r := range RejectReasons[1:] {
		if string(e.Rejected) == r {
			p.rejected[i+1].Add(1)
			return
		}
	}
}

// New builds a pipeline that ends in outputs, fed in that order.
func New(cfg Config, outputs ...record.Sink) *Pipeline {
	return &Pipeline{cfg: cfg, outputs: outputs, rejected: make([]atomic.Uint64, len(RejectReasons))}
}

// Exchange runs every stage on e, then gives it to each output.
func (p *Pipeline) Exchange(e *record.Exchange) {
	p.enrichOwner(&e.Owner)
	if p.cfg.Kube != nil {
		e.Peer, _ = p.cfg.Kube.ByIP(e.Flow.Remote.Addr())
	}
	latency.Attribute(e)
	p.countRejected(e)
	e.Diagnoses = diagnose.Exchange(e)
	for _, o := range p.outputs {
		o.Exchange(e)
	}
}

// ConnOpen gives o to each output.
func (p *Pipeline) ConnOpen(o record.ConnOpen) {
	for _, out := range p.outputs {
		out.ConnOpen(o)
	}
}

// ConnClose names c's owner, then gives it to each output.
func (p *Pipeline) ConnClose(c record.ConnClose) {
	p.enrichOwner(&c.Owner)
	for _, o := range p.outputs {
		o.ConnClose(c)
	}
}

// Flush flushes each output.
func (p *Pipeline) Flush() {
	for _, o := range p.outputs {
		o.Flush()
	}
}

func (p *Pipeline) enrichOwner(o *record.Owner) {
	if p.cfg.Containers != nil {
		o.ContainerID = p.cfg.Containers.ContainerID(o.CgroupID)
	}
	if p.cfg.Kube != nil {
		o.K8s, _ = p.cfg.Kube.ByContainer(o.ContainerID)
	}
}

// Live is the output that keeps the state the API and the live views read:
// agg's statistics per flow and peer pair and, when hist is not nil, each
// flow's recent exchanges. At every flush it retires what has expired.
func Live(agg *aggregate.Aggregator, hist *history.History) record.Sink {
	return live{agg, hist}
}

type live struct {
	agg  *aggregate.Aggregator
	hist *history.History
}

func (l live) Exchange(e *record.Exchange) {
	l.agg.AddExchange(e)
	if l.hist != nil {
		l.hist.Add(e)
	}
}

func (l live) ConnOpen(o record.ConnOpen)   { l.agg.AddConnOpen(o) }
func (l live) ConnClose(c record.ConnClose) { l.agg.AddConnClose(c) }
func (l live) Flush()                       { l.agg.Expire(record.Now()) }
