package record

import "time"

// Hop is one exchange of a request: both ends of it where the node holds
// both, else the one it holds.
type Hop struct {
	// Client is the requester's end, Server the responder's.
	Client *Exchange `json:"client,omitempty"`
	Server *Exchange `json:"server,omitempty"`
	// From and To name the services at each end: the pod, else the
	// command; an end off the node by its address.
	From string `json:"from"`
	To   string `json:"to"`
	// Link is how the hop was found to serve its parent's request (empty
	// on the root).
	Link LinkMethod `json:"link,omitempty"`
	// Start and End bound the hop as its requester saw it (the responder,
	// where the requester is off the node).
	Start    Mono          `json:"start_mono_ns"`
	End      Mono          `json:"end_mono_ns"`
	Duration time.Duration `json:"duration_ns"`
	// Network is the hop's time on the path (propagation and queueing),
	// Transport its time in the kernels' queues, loss recovery and
	// handshake, as the requester measured them (record.Components).
	Network   time.Duration `json:"network_ns"`
	Transport time.Duration `json:"transport_ns"`
	// Think is the responder's own time answering: its think time less
	// ChildWait, the part of it spent waiting on its children (the union
	// of their spans inside it).
	Think     time.Duration `json:"think_ns"`
	ChildWait time.Duration `json:"child_wait_ns"`
	// Turns are the hop's changes of direction (2 for a request and its
	// answer); CriticalTurns adds those of its children on its critical
	// path, recursively.
	Turns         uint32 `json:"turns"`
	CriticalTurns uint32 `json:"critical_turns"`
	// Handshake: the hop opened its connection (one more round trip).
	Handshake bool `json:"handshake,omitempty"`
	// Critical: on its parent's critical path (the children whose ends
	// the parent waited for in turn); Parallel: it overlaps a sibling.
	Critical bool   `json:"critical,omitempty"`
	Parallel bool   `json:"parallel,omitempty"`
	Children []*Hop `json:"children,omitempty"`
}

// Request is one root exchange and every hop made to answer it.
type Request struct {
	// ID names the request: its root's socket cookie and first sequence
	// number, in hex.
	ID string `json:"id"`
	// Endpoint is the service the root asked: its name and port.
	Endpoint string `json:"endpoint"`
	Root     *Hop   `json:"root"`
	// Duration is the root's, as its requester saw it.
	Duration time.Duration `json:"duration_ns"`
	// Hops counts the hops in the tree, the root's included; Truncated
	// those left out beyond the bound (Config.MaxHops).
	Hops      int `json:"hops"`
	Truncated int `json:"truncated,omitempty"`
	// CriticalTurns are the turns on the critical path; CriticalHops its
	// hops.
	CriticalTurns uint32 `json:"critical_turns"`
	CriticalHops  int    `json:"critical_hops"`
	// Dominant names the hop on the critical path with the most time of
	// its own (its duration less its critical children's).
	Dominant string `json:"dominant"`
	// Edges counts the request's exchanges and turns per service edge.
	Edges []EdgeCount `json:"edges"`
	// Detached: the root is an outbound exchange that more than one
	// inbound exchange of its process could own (ambiguous), so the
	// request it served is not known; the tree under it is.
	Detached bool `json:"detached,omitempty"`
}

// EdgeCount is what one request made on one service edge.
type EdgeCount struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Exchanges int    `json:"exchanges"`
	Turns     uint32 `json:"turns"`
}
