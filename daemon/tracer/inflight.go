package tracer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"
	"unsafe"

	"github.com/lattrace/lattrace/record"
)

// ErrNoInflight: the kernel refused the socket storage iterator, so
// exchanges in progress are not visible (see Hooks).
var ErrNoInflight = errors.New("exchanges in progress are not available: the socket storage iterator is not attached")

// InFlight reports every followed socket's exchange in progress, read from
// the kernel now: a record only exists once an exchange ends, and this is
// what the live view shows of a transfer still running. Sockets between
// exchanges are not in it. The iterator's output is decoded as it is
// read, so its cost in memory is the answer's, not that of every socket
// of the node.
func (t *Tracer) InFlight() ([]record.InFlight, error) {
	if t.inflight == nil {
		return nil, ErrNoInflight
	}
	r, err := t.inflight.Open()
	if err != nil {
		return nil, fmt.Errorf("reading exchanges in progress: %w", err)
	}
	defer r.Close()
	const size = int(unsafe.Sizeof(lattraceLtInflight{}))
	br := bufio.NewReaderSize(r, 64<<10)
	raw := make([]byte, size)
	var out []record.InFlight
	for {
		// A read may end inside a record: each is read whole.
		if _, err := io.ReadFull(br, raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, fmt.Errorf("reading exchanges in progress: %w", err)
		}
		x, _ := view[lattraceLtInflight](raw)
		if x.StartNs == 0 {
			continue
		}
		in := record.InFlight{
			Cookie:       x.Cookie,
			Flow:         flow(&x.Flow),
			Owner:        owner(&x.Owner, nil),
			ConnRole:     role(x.ConnRole),
			Start:        record.Mono(x.StartNs),
			LastActivity: record.Mono(x.LastActivityNs),
			BytesOut:     x.BytesOut,
			BytesIn:      x.BytesIn,
			Cwnd:         x.Cwnd,
			SRTT:         time.Duration(x.SrttUs) * time.Microsecond,
			Turns:        x.Turns,
		}
		if x.Role != 0 {
			in.Role = exchangeRole(x.Role)
		}
		out = append(out, in)
	}
}
