// Package requests assembles the exchanges of one node into request trees:
// one user request as the exchange that started it (the root) and every
// exchange made to answer it, hop by hop across the services on the node
// (docs/latency-model.md, "Requests across services").
//
// Two facts join exchanges. The two ends of one connection on the node
// name the same exchange by the sequence numbers both see (record.Exchange
// ISNLocal, ISNRemote, OutSeq, InSeq): together they are a hop. An
// outbound exchange (its process the requester) is a child of the inbound
// exchange (the same process the responder) it ran inside, by the
// kernel's evidence of which request its writing thread served
// (record.Served, bpf/request_links.bpf.h), checked against both
// exchanges' timelines; where the evidence names no single request, the
// outbound exchange is counted ambiguous for its process and never
// guessed. Assemble does this for a set of exchanges; Tracker does it
// live, as a record.Sink, and keeps what the API and the commands read.
package requests
