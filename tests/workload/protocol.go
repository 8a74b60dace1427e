package workload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Wire format. Every message on a workload connection starts with a fixed
// HeaderSize-byte header, big endian:
//
//	offset size field
//	0      4    magic        Magic ("LATR")
//	4      1    version      Version
//	5      1    kind         Kind (request, response, bulk-up, bulk-down, bulk-ack)
//	6      2    flags        reserved, zero
//	8      8    id           exchange id chosen by the client, echoed by the server
//	16     4    req_len      total request length in bytes, header included
//	20     4    resp_len     total response length in bytes, header included (0 in a request: server default)
//	24     4    think_us     server think time in microseconds (ThinkServerDefault: server default)
//	28     4    reserved     zero
//	32     8    aux          kind-specific, see Header.Aux
//
// A request is the header followed by req_len-HeaderSize bytes of padding.
// The response is a header (kind response, same id) followed by padding up
// to exactly resp_len bytes.
const (
	// Magic is the first four bytes of every header ("LATR").
	Magic uint32 = 0x4C415452
	// Version is the protocol version carried in every header.
	Version uint8 = 1
	// HeaderSize is the fixed header length; it is also the smallest
	// request or response.
	HeaderSize = 40
	// MaxMessageSize bounds a request or response (bulk streams are not
	// bounded).
	MaxMessageSize = 64 << 20
	// ThinkServerDefault in Header.ThinkMicros asks the server to apply its
	// configured default think time.
	ThinkServerDefault uint32 = 0xFFFFFFFF
	// maxThink is the largest think time a header can carry explicitly.
	maxThink = time.Duration(ThinkServerDefault-1) * time.Microsecond
)

// Kind is the message type in a header.
type Kind uint8

const (
	// KindRequest: client to server, one exchange.
	KindRequest Kind = 1
	// KindResponse: server to client, answers the request with the same id.
	KindResponse Kind = 2
	// KindBulkUp: client streams bytes to the server after the header until
	// it shuts down its write side; the server answers with KindBulkAck.
	KindBulkUp Kind = 3
	// KindBulkDown: the server streams bytes to the client after the header,
	// Aux bytes of them (0: until the client closes).
	KindBulkDown Kind = 4
	// KindBulkAck: server to client at the end of a bulk-up stream; Aux is
	// the number of payload bytes the server received.
	KindBulkAck Kind = 5
)

func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindResponse:
		return "response"
	case KindBulkUp:
		return "bulk-up"
	case KindBulkDown:
		return "bulk-down"
	case KindBulkAck:
		return "bulk-ack"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Header is the decoded fixed message header.
type Header struct {
	Kind  Kind
	Flags uint16
	// ID identifies the exchange; the response carries the request's ID.
	ID uint64
	// ReqLen is the total request length including the header. In a
	// response it echoes the request length the server read.
	ReqLen uint32
	// RespLen is the total response length including the header. In a
	// request 0 means "the server's default response size".
	RespLen uint32
	// ThinkMicros is the server think time in microseconds. In a request
	// ThinkServerDefault means "the server's default"; in a response it is
	// the think time the server applied.
	ThinkMicros uint32
	// Aux depends on Kind: in a response, the nanoseconds the server spent
	// between reading the last request byte and starting to write the
	// response (think time plus scheduling); in KindBulkDown, the number of
	// bytes to stream (0: unbounded); in KindBulkAck, the payload bytes
	// received. Zero otherwise.
	Aux uint64
}

// ErrBadMagic is returned when a header does not start with Magic.
var ErrBadMagic = errors.New("workload: bad magic (not a workload peer?)")

// Put encodes h into b, which must be at least HeaderSize bytes long.
func (h Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.BigEndian.PutUint32(b[0:], Magic)
	b[4] = Version
	b[5] = byte(h.Kind)
	binary.BigEndian.PutUint16(b[6:], h.Flags)
	binary.BigEndian.PutUint64(b[8:], h.ID)
	binary.BigEndian.PutUint32(b[16:], h.ReqLen)
	binary.BigEndian.PutUint32(b[20:], h.RespLen)
	binary.BigEndian.PutUint32(b[24:], h.ThinkMicros)
	binary.BigEndian.PutUint32(b[28:], 0)
	binary.BigEndian.PutUint64(b[32:], h.Aux)
}

// ParseHeader decodes the first HeaderSize bytes of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("workload: short header (%d bytes)", len(b))
	}
	if binary.BigEndian.Uint32(b[0:]) != Magic {
		return Header{}, ErrBadMagic
	}
	if b[4] != Version {
		return Header{}, fmt.Errorf("workload: unsupported protocol version %d", b[4])
	}
	return Header{
		Kind:        Kind(b[5]),
		Flags:       binary.BigEndian.Uint16(b[6:]),
		ID:          binary.BigEndian.Uint64(b[8:]),
		ReqLen:      binary.BigEndian.Uint32(b[16:]),
		RespLen:     binary.BigEndian.Uint32(b[20:]),
		ThinkMicros: binary.BigEndian.Uint32(b[24:]),
		Aux:         binary.BigEndian.Uint64(b[32:]),
	}, nil
}

// thinkToMicros encodes a think time for the header; d < 0 means the server
// default.
func thinkToMicros(d time.Duration) uint32 {
	if d < 0 {
		return ThinkServerDefault
	}
	return uint32(d / time.Microsecond)
}

// fillPadding writes the padding pattern into b (bytes 'a'..'z' repeating,
// so a packet capture shows where padding is).
func fillPadding(b []byte) {
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
}

// messageBuf returns a buffer of n bytes whose bytes past the header hold the
// padding pattern, reusing *buf when it is large enough.
func messageBuf(buf *[]byte, n int) []byte {
	if cap(*buf) < n {
		nb := make([]byte, n)
		fillPadding(nb)
		*buf = nb
	}
	return (*buf)[:n]
}
