package record

import "time"

// Split is latency grouped the way the model names its parts: network
// (propagation + queueing), transport (send wait, loss recovery, handshake,
// receive) and app (peer think time, local read, local think time). The
// three add up to the components' sum.
type Split struct {
	Network   time.Duration `json:"network_ns"`
	Transport time.Duration `json:"transport_ns"`
	App       time.Duration `json:"app_ns"`
}

// Split groups c's top-level components into the model's three parts.
func (c Components) Split() Split {
	return Split{
		Network:   c.Network,
		Transport: c.SendWait + c.LossRecovery + c.Handshake + c.Receive,
		App:       c.Peer + c.LocalRead + c.Think,
	}
}

// Total is the sum of the three parts.
func (s Split) Total() time.Duration { return s.Network + s.Transport + s.App }

// Dominant names the largest part: "network", "transport" or "app"; ""
// when there is no timing.
func (s Split) Dominant() string {
	if s.Total() <= 0 {
		return ""
	}
	switch {
	case s.Network >= s.Transport && s.Network >= s.App:
		return "network"
	case s.Transport >= s.App:
		return "transport"
	}
	return "app"
}
