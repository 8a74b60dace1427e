package apps

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// HTTP/2 in clear (h2c) between nghttpd and h2load, one stream at a time
// and ten at once on one connection. nghttpd writes its SETTINGS as it
// accepts, racing the client's preface: the client is still the
// requester.
func TestHTTP2(t *testing.T) {
	for _, cc := range congestionControls {
		for _, streams := range []int{1, 10} {
			t.Run(fmt.Sprintf("%s m%d", cc, streams), func(t *testing.T) {
				a := newApp(t, cc)
				const port = 8081
				a.file("www/1024.bin", strings.Repeat("x", 1024))
				a.serve(port, "nghttpd", "--no-tls", "-d", filepath.Join(a.dir, "www"), "-a", a.server().String(), strconv.Itoa(port))
				const n = 200
				logFile := filepath.Join(a.dir, "h2load.log")
				a.client("h2load", "-n", strconv.Itoa(n), "-c", "1", "-m", strconv.Itoa(streams), "--log-file="+logFile,
					fmt.Sprintf("http://%s:%d/1024.bin", a.server(), port))
				lats := h2loadLatencies(t, logFile)
				client, server := a.ends(port)
				// Around the requests: the preface and SETTINGS
				// exchange, and the GOAWAY at the end, unanswered.
				a.check(fmt.Sprintf("nghttpd + h2load -m %d (%s)", streams, cc), client, server,
					truth{requests: len(lats), samples: n / streams, extra: 2, p50: quantile(lats, 0.5), p99: quantile(lats, 0.99),
						multiplexed: streams > 1})
			})
		}
	}
}

// h2loadLatencies reads h2load's --log-file: start, status, duration (us).
func h2loadLatencies(t *testing.T, path string) []time.Duration {
	t.Helper()
	out := microsColumn(t, path, 2)
	if len(out) == 0 {
		t.Fatalf("no requests in h2load's log")
	}
	return out
}
