package record

// Sink receives records as the tracer decodes them, on its reading
// goroutine: it must not block for long, or the ring buffer fills and the
// kernel counts drops. Pipeline stages and outputs are sinks.
type Sink interface {
	// Exchange gets a record valid until it returns: the tracer reuses
	// it for the next one, so a sink that keeps it keeps a copy.
	Exchange(*Exchange)
	ConnOpen(ConnOpen)
	ConnClose(ConnClose)
	// Flush is called after each drain of the ring buffer, so a sink can
	// batch its output per drain instead of per record. The drained records
	// are released to the kernel after Flush returns.
	Flush()
}
