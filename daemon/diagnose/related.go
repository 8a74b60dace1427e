package diagnose

import (
	"fmt"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/record"
)

// maxRelated is how many flows a finding names.
const maxRelated = 3

// WithBulkSenders names, in a bufferbloat finding of ds about m, the flows
// among flows that moved data in bulk while m's exchanges ran: the likely
// fillers of the queue. It fills ds in place and returns it.
func WithBulkSenders(ds []record.Diagnosis, m *aggregate.Metrics, flows []aggregate.FlowStats) []record.Diagnosis {
	for i := range ds {
		if ds[i].Name != Bufferbloat {
			continue
		}
		for j, b := range BulkSenders(m, flows) {
			if j == maxRelated {
				break
			}
			ds[i].Related = append(ds[i].Related, fmt.Sprintf("flow %d: %s pid %d %s -> %s moved %d bytes",
				b.Cookie, b.Owner.Comm, b.Owner.PID, b.Flow.Local, b.Flow.Remote, b.Out.Bytes+b.In.Bytes))
		}
	}
	return ds
}
