package record

import (
	"testing"
	"time"
)

func TestSplit(t *testing.T) {
	const ms = time.Millisecond
	c := Components{Network: 10 * ms, SendWait: 5 * ms, LossRecovery: 1 * ms, Handshake: 2 * ms, Receive: 1 * ms, Peer: 3 * ms, LocalRead: 1 * ms, Think: 1 * ms}
	s := c.Split()
	if s.Network != 10*ms || s.Transport != 9*ms || s.App != 5*ms || s.Total() != c.Sum() || s.Dominant() != "network" {
		t.Errorf("%+v", s)
	}
	if (Split{}).Dominant() != "" {
		t.Error("empty split has a dominant part")
	}
}
