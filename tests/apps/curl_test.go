package apps

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/record"
)

// curl fetching from nginx over TLS 1.3, a new connection (and handshake)
// per request: each connection's first exchange is its set-up, the
// request is the next one, and connection_per_request is named, as it
// really is there.
func TestCurlConnectionPerRequest(t *testing.T) {
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newApp(t, cc)
			port := uint16(a.nginx() + 1)
			url := fmt.Sprintf("https://%s:%d/1024.bin", a.server(), port)
			const n = 15
			var setups, requests []time.Duration
			for range n {
				out := a.client("curl", "-sSk", "--tlsv1.3", "-o", "/dev/null", "-w", "%{time_appconnect} %{time_pretransfer} %{time_total}\n", url)
				f := strings.Fields(out)
				if len(f) != 3 {
					t.Fatalf("curl's timing: %q", out)
				}
				secs := func(s string) time.Duration {
					v, err := strconv.ParseFloat(s, 64)
					if err != nil {
						t.Fatalf("curl's timing %q: %v", out, err)
					}
					return time.Duration(v * float64(time.Second))
				}
				setups = append(setups, secs(f[0]))
				requests = append(requests, secs(f[2])-secs(f[1]))
			}
			client, server := a.ends(port)
			// Around each request: the TLS handshake's exchange (the
			// connection's set-up), and close_notify, unanswered.
			a.check("curl over TLS, a connection per request ("+cc+")", client, server, truth{requests: n, samples: n, extra: n,
				p50: quantile(requests, 0.5), p99: quantile(requests, 0.99), setup: true,
				expected: []record.DiagnosisName{diagnose.ConnPerRequest}})

			agg := aggregate.New(aggregate.Config{})
			var firsts []time.Duration
			for _, e := range client {
				agg.AddExchange(e)
				if e.First {
					firsts = append(firsts, e.Duration)
				}
			}
			if got, want := median(firsts), median(setups); !within(got, want, 0.05, time.Millisecond) {
				t.Errorf("connection set-up %v (median), curl's own connect and TLS %v", got, want)
			}
			fired := false
			for _, p := range agg.Peers() {
				fired = fired || find(diagnose.OfPair(&p), diagnose.ConnPerRequest)
			}
			if !fired {
				t.Errorf("connection_per_request did not fire on a connection per request")
			}
		})
	}
}
