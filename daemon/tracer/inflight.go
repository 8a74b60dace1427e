package tracer

import (
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
// the kernel now. A record only exists once an exchange ends; this is
// what the live view shows of a transfer still running.
func (t *Tracer) InFlight() ([]record.InFlight, error) {
	if t.inflight == nil {
		return nil, ErrNoInflight
	}
	r, err := t.inflight.Open()
	if err != nil {
		return nil, fmt.Errorf("reading exchanges in progress: %w", err)
	}
	defer r.Close()
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading exchanges in progress: %w", err)
	}
	size := int(unsafe.Sizeof(lattraceLtInflight{}))
	out := make([]record.InFlight, 0, len(raw)/size)
	for off := 0; off+size <= len(raw); off += size {
		x, _ := view[lattraceLtInflight](raw[off:])
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
	return out, nil
}
