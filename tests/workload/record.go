package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// All *_ns fields below are CLOCK_MONOTONIC nanoseconds (see MonoNow), the
// clock of bpf_ktime_get_ns. A zero value means "did not happen" (for
// example after an error). "Read" timestamps are taken right after the
// read(2)-level call that returned the byte in question returned; "write
// start" right before the first write call, "write done" right after the
// last one returned. With TLS they refer to plaintext reads and writes on the
// TLS connection.

// ClientRecord is the client's ground truth for one request/response
// exchange; one JSON object per line in the client's output.
type ClientRecord struct {
	// Type is always "client".
	Type string `json:"type"`
	// ID is the exchange id carried in the request and response headers.
	ID uint64 `json:"id"`
	// Conn numbers the client's connections from 1; exchanges that share a
	// Conn share a TCP connection.
	Conn uint64 `json:"conn"`
	// NewConn is true when this exchange opened its connection; the
	// connect_* and tls_done_ns fields are set only then.
	NewConn bool `json:"new_conn"`
	// Local and Remote are the connection's addresses ("ip:port",
	// "[ipv6]:port"); empty if connecting failed.
	Local  string `json:"local,omitempty"`
	Remote string `json:"remote,omitempty"`
	// ConnectStartNs: before connect(2) was started.
	ConnectStartNs int64 `json:"connect_start_ns,omitempty"`
	// ConnectDoneNs: after the TCP connection was established.
	ConnectDoneNs int64 `json:"connect_done_ns,omitempty"`
	// TLSDoneNs: after the TLS handshake completed (TLS only).
	TLSDoneNs int64 `json:"tls_done_ns,omitempty"`
	// WriteStartNs: before the first write of the request.
	WriteStartNs int64 `json:"write_start_ns"`
	// WriteDoneNs: after the last write of the request returned.
	WriteDoneNs int64 `json:"write_done_ns"`
	// FirstRespByteNs: after the read that returned the response's first
	// byte. With ReadDelay the client slept before that read.
	FirstRespByteNs int64 `json:"first_resp_byte_ns"`
	// LastRespByteNs: after the read that returned the response's last byte.
	LastRespByteNs int64 `json:"last_resp_byte_ns"`
	// LastReadCallNs: before that read; on a plain TCP connection before
	// its read(2), after any wait for data. The kernel handed the last byte
	// to the client between LastReadCallNs and LastRespByteNs.
	LastReadCallNs int64 `json:"last_read_call_ns"`
	// AppRTTNs is LastRespByteNs - WriteStartNs (0 on error).
	AppRTTNs int64 `json:"app_rtt_ns"`
	// Wall is the wall-clock time read next to WriteStartNs (or next to
	// ConnectStartNs when connecting failed), for placing the record in
	// calendar time; compare the *_ns fields with kernel timestamps.
	Wall time.Time `json:"wall"`
	// ReqSize is the request size asked for (bytes, header included).
	ReqSize int `json:"req_size"`
	// RespSize is the response size asked for (bytes, header included);
	// 0 means the server's default.
	RespSize int `json:"resp_size"`
	// ReqBytes is the number of request bytes actually written.
	ReqBytes int64 `json:"req_bytes"`
	// RespBytes is the number of response bytes actually read.
	RespBytes int64 `json:"resp_bytes"`
	// WriteCalls is how many write calls the request was split into.
	WriteCalls int `json:"write_calls"`
	// ThinkNs is the think time requested in the header; -1 means the
	// server's default.
	ThinkNs int64 `json:"think_ns"`
	// ServerThinkNs is the think time the server says it applied (from the
	// response header, microsecond resolution).
	ServerThinkNs int64 `json:"server_think_ns"`
	// ServerNs is the server's own measure, from the response header, of
	// the time between reading the request's last byte and starting to
	// write the response.
	ServerNs int64 `json:"server_ns"`
	// Error is empty on success.
	Error string `json:"error,omitempty"`
	// Canceled is true when the exchange was cut short because the run's
	// context ended; such exchanges do not count as failures.
	Canceled bool `json:"canceled,omitempty"`
}

// Failed reports whether the exchange failed (cancellation excluded).
func (r ClientRecord) Failed() bool { return r.Error != "" && !r.Canceled }

// ServerRecord is the server's ground truth for one exchange (Kind
// "exchange") or one bulk stream (Kind "bulk-up" or "bulk-down").
type ServerRecord struct {
	// Type is always "server".
	Type string `json:"type"`
	// Kind is "exchange", "bulk-up" or "bulk-down".
	Kind string `json:"kind"`
	// ID is the exchange id from the request header.
	ID uint64 `json:"id"`
	// Conn numbers the server's accepted connections from 1.
	Conn uint64 `json:"conn"`
	// Local is the server's address, Peer the client's.
	Local string `json:"local"`
	Peer  string `json:"peer"`
	// AcceptNs: after accept(2) returned the connection.
	AcceptNs int64 `json:"accept_ns"`
	// TLSDoneNs: after the server's TLS handshake completed (TLS only).
	TLSDoneNs int64 `json:"tls_done_ns,omitempty"`
	// FirstReqByteNs: after the read that returned the request's first byte.
	FirstReqByteNs int64 `json:"first_req_byte_ns"`
	// LastReqByteNs: after the read that returned the request's last byte
	// (bulk-up: the last byte of the stream).
	LastReqByteNs int64 `json:"last_req_byte_ns"`
	// LastReadCallNs: before that read (exchanges); on a plain TCP
	// connection before its read(2), after any wait for data. The kernel
	// handed the last byte to the server between LastReadCallNs and
	// LastReqByteNs.
	LastReadCallNs int64 `json:"last_read_call_ns,omitempty"`
	// ThinkStartNs and ThinkEndNs bracket the injected think time.
	ThinkStartNs int64 `json:"think_start_ns,omitempty"`
	ThinkEndNs   int64 `json:"think_end_ns,omitempty"`
	// RespWriteStartNs: before the first write of the response (after
	// taking the connection's write lock); bulk-down: of the stream.
	RespWriteStartNs int64 `json:"resp_write_start_ns"`
	// RespWriteDoneNs: after the last write of the response returned.
	RespWriteDoneNs int64 `json:"resp_write_done_ns"`
	// Wall is the wall-clock time read next to FirstReqByteNs.
	Wall time.Time `json:"wall"`
	// ReqBytes is the number of request bytes read (header included;
	// bulk-up: header plus stream).
	ReqBytes int64 `json:"req_bytes"`
	// RespSize is the response length the server decided to send (request's
	// resp_len or the server default).
	RespSize int64 `json:"resp_size"`
	// RespBytes is the number of response bytes actually written.
	RespBytes int64 `json:"resp_bytes"`
	// ThinkNs is the think time applied (requested or server default).
	ThinkNs int64 `json:"think_ns"`
	// Error is empty on success.
	Error string `json:"error,omitempty"`
}

// BulkResult describes one bulk stream as seen by the client.
type BulkResult struct {
	// Type is always "bulk".
	Type string `json:"type"`
	// Direction is "up" (client to server) or "down".
	Direction string `json:"direction"`
	// ID is the id sent in the bulk header.
	ID     uint64 `json:"id"`
	Local  string `json:"local,omitempty"`
	Remote string `json:"remote,omitempty"`
	// ConnectStartNs, ConnectDoneNs, TLSDoneNs: as in ClientRecord.
	ConnectStartNs int64 `json:"connect_start_ns"`
	ConnectDoneNs  int64 `json:"connect_done_ns,omitempty"`
	TLSDoneNs      int64 `json:"tls_done_ns,omitempty"`
	// StartNs: up: before the first payload write; down: after the bulk
	// header was written.
	StartNs int64 `json:"start_ns"`
	// EndNs: up: after the server's ack was read; down: after the read
	// that returned the last byte.
	EndNs int64 `json:"end_ns"`
	// Wall is the wall-clock time read next to StartNs.
	Wall time.Time `json:"wall"`
	// Bytes is the payload moved: up: written by the client; down: read.
	Bytes int64 `json:"bytes"`
	// AckedBytes (up only) is the payload the server says it received.
	AckedBytes int64 `json:"acked_bytes"`
	// GoodputBps is payload bits per second over EndNs-StartNs (up: the
	// acked bytes).
	GoodputBps float64 `json:"goodput_bps"`
	// Error is empty on success.
	Error string `json:"error,omitempty"`
}

// Summary condenses client records. The latencies are app RTTs
// (last response byte - request write start) of successful exchanges.
type Summary struct {
	Count    int // exchanges
	Errors   int // failed exchanges (cancellation excluded)
	Canceled int // exchanges cut short by cancellation
	Min      time.Duration
	P50      time.Duration
	P99      time.Duration
	Max      time.Duration
	Mean     time.Duration
}

// Summarize computes a Summary (nearest-rank percentiles).
func Summarize(recs []ClientRecord) Summary {
	s := Summary{Count: len(recs)}
	var rtts []time.Duration
	var sum time.Duration
	for _, r := range recs {
		switch {
		case r.Canceled:
			s.Canceled++
		case r.Error != "":
			s.Errors++
		default:
			d := time.Duration(r.AppRTTNs)
			rtts = append(rtts, d)
			sum += d
		}
	}
	if len(rtts) == 0 {
		return s
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(rtts))+0.999999) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(rtts) {
			i = len(rtts) - 1
		}
		return rtts[i]
	}
	s.Min, s.Max = rtts[0], rtts[len(rtts)-1]
	s.P50, s.P99 = rank(0.50), rank(0.99)
	s.Mean = sum / time.Duration(len(rtts))
	return s
}

// String renders the summary on one line.
func (s Summary) String() string {
	str := fmt.Sprintf("%d exchanges, %d errors", s.Count, s.Errors)
	if s.Canceled > 0 {
		str += fmt.Sprintf(", %d canceled", s.Canceled)
	}
	if ok := s.Count - s.Errors - s.Canceled; ok > 0 {
		str += fmt.Sprintf("; app RTT min %v p50 %v p99 %v max %v mean %v",
			round(s.Min), round(s.P50), round(s.P99), round(s.Max), round(s.Mean))
	}
	return str
}

func round(d time.Duration) time.Duration {
	if d > time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d
}

// ReadJSONL decodes JSON lines (as written by the client and server) into
// values of type T, e.g. ReadJSONL[ClientRecord](f).
func ReadJSONL[T any](r io.Reader) ([]T, error) {
	var out []T
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return out, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}

// jsonlWriter serialises records to an io.Writer, one per line.
type jsonlWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func (j *jsonlWriter) write(v any) {
	if j == nil || j.w == nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	b = append(b, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil {
		_, j.err = j.w.Write(b)
	}
}
