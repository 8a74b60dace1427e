package tracer

import (
	"testing"

	"github.com/lattrace/lattrace/daemon/streams"
)

// TestStreamsNumbering holds the streams package's numbering of HTTP/2
// events and send-wait causes to the kernel's, which h2Event converts by
// value.
func TestStreamsNumbering(t *testing.T) {
	kinds := map[streams.Kind]lattraceLtH2EventKind{
		streams.FrameOut: lattraceLtH2EventKindLT_H2FRAME_OUT, streams.FrameIn: lattraceLtH2EventKindLT_H2FRAME_IN,
		streams.Write: lattraceLtH2EventKindLT_H2WRITE, streams.Read: lattraceLtH2EventKindLT_H2READ, streams.Lost: lattraceLtH2EventKindLT_H2LOST,
	}
	for k, want := range kinds {
		if uint32(k) != uint32(want) {
			t.Errorf("streams kind %d, the kernel's %d", k, want)
		}
	}
	causes := map[streams.Cause]lattraceLtWaitCause{
		streams.CauseOther: lattraceLtWaitCauseLT_WAIT_OTHER, streams.CauseCwnd: lattraceLtWaitCauseLT_WAIT_CWND,
		streams.CauseRwnd: lattraceLtWaitCauseLT_WAIT_RWND, streams.CauseSndbuf: lattraceLtWaitCauseLT_WAIT_SNDBUF,
		streams.CausePacing: lattraceLtWaitCauseLT_WAIT_PACING,
	}
	for c, want := range causes {
		if uint32(c) != uint32(want) {
			t.Errorf("streams cause %d, the kernel's %d", c, want)
		}
	}
}
