package apps

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/workload"
)

// nginx serving static files to wrk over one keep-alive connection,
// HTTP/1.1 in clear and over TLS: 1 KB answers in one round trip, 100 KB
// ones take the window's rounds. nginx writes a header and then the body,
// which a paced sender (BBR) sends after the write has returned.
func TestNginx(t *testing.T) {
	for _, cc := range congestionControls {
		for _, tls := range []bool{false, true} {
			for _, size := range []int{1 << 10, 100 << 10} {
				name := fmt.Sprintf("%s %dKB tls=%v", cc, size>>10, tls)
				t.Run(name, func(t *testing.T) {
					a := newApp(t, cc)
					port := a.nginx()
					url := fmt.Sprintf("http://%s:%d/%d.bin", a.server(), port, size)
					extra := 1 // the request in flight when wrk stops
					if tls {
						port++
						url = fmt.Sprintf("https://%s:%d/%d.bin", a.server(), port, size)
						extra += 2 // the TLS handshake: one exchange with TLS 1.3, two with 1.2
					}
					script := a.file("latencies.lua", wrkLatencies)
					wire := a.capture(uint16(port))
					w := wrkReport(t, a.client("wrk", "-t1", "-c1", "-d3s", "-s", script, url))
					client, server := a.ends(uint16(port))
					a.check("nginx + wrk "+name, client, server, truth{requests: w.requests, samples: w.requests, extra: extra,
						p50: quantile(w.latencies, 0.5), p99: quantile(w.latencies, 0.99), corrected: w.correct, setup: tls,
						departures: departures(t, wire, uint16(port))})
					// The control of TestHTTP2's frame counts.
					a.noHTTP2Frames(uint16(port))
				})
			}
		}
	}
}

// sendfile: nginx sends plain bodies with sendfile, corked with their
// header (sendfile and tcp_nopush on, as in Debian's configuration), in
// the kernel matrix, where it goes through tcp_sendpage on 6.1 and the
// uncork's departure through the fentry that stands in for TX timestamps
// (__tcp_transmit_skb). On a kernel
// with TX timestamps a corked answer that leaves at the uncork, before
// the socket's first held-back write switched them on, is seen to leave
// only at the next incoming segment (README, Kernels): the host's suite
// writes bodies instead.
var sendfile = emulated

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// nginx starts nginx in B with files of 1 KB and 100 KB; it listens on
// the port it returns, and with TLS on the next one.
func (a *app) nginx() int {
	a.t.Helper()
	const port = 8080
	for _, size := range []int{1 << 10, 100 << 10} {
		a.file(fmt.Sprintf("www/%d.bin", size), strings.Repeat("x", size))
	}
	cert, key := a.selfSigned()
	conf := a.nginxConf(fmt.Sprintf(`listen %[1]s:%[2]d;
		listen %[1]s:%[3]d ssl;
		ssl_certificate %[4]s;
		ssl_certificate_key %[5]s;
		ssl_protocols TLSv1.2 TLSv1.3;`, a.server(), port, port+1, cert, key))
	a.serve(port, "nginx", "-c", conf, "-p", a.dir)
	return port
}

// nginxConf writes nginx's configuration: one server, with listen (its
// listen and TLS directives), serving the test's www directory over
// kept-alive connections, plain bodies through sendfile where the suite
// says so.
func (a *app) nginxConf(listen string) string {
	a.t.Helper()
	return a.file("nginx.conf", fmt.Sprintf(`daemon off;
user root;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 64; }
http {
	access_log off;
	sendfile %[2]s;
	tcp_nopush %[2]s;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	keepalive_requests 1000000;
	server {
		%[3]s
		root %[1]s/www;
	}
}
`, a.dir, onOff(sendfile), listen))
}

// selfSigned writes a certificate for B's address (the workload's
// self-signed one) and its key.
func (a *app) selfSigned() (certFile, keyFile string) {
	a.t.Helper()
	ss, err := workload.NewSelfSigned(a.server().String())
	if err != nil {
		a.t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(ss.Cert.PrivateKey)
	if err != nil {
		a.t.Fatal(err)
	}
	return a.file("cert.pem", string(ss.CertPEM)),
		a.file("key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})))
}

// wrkLatencies makes wrk print every latency it recorded (in us, with
// its count), its run time and requests when it is done.
const wrkLatencies = `done = function(summary, latency, requests)
  io.write(string.format("requests %d duration_us %d\n", summary.requests, summary.duration))
  for i = 1, #latency do
    local v, c = latency(i)
    io.write(string.format("latency_us %d %d\n", v, c))
  end
end
`

var (
	wrkLatency = regexp.MustCompile(`(?m)^latency_us (\d+) (\d+)$`)
	wrkSummary = regexp.MustCompile(`(?m)^requests (\d+) duration_us (\d+)$`)
)

// wrkRun is what wrk reported of a run on one connection.
type wrkRun struct {
	requests  int
	latencies []time.Duration
	interval  time.Duration // the run time over the requests
}

// correct applies to ds what wrk does to its latencies before it reports
// them (stats_correct: a correction for coordinated omission): each
// latency of two intervals or more also counts as itself less one
// interval, less two, and so on while above one interval. wrk's quantiles
// are of the corrected set, so lattrace's are compared corrected alike.
func (w wrkRun) correct(ds []time.Duration) []time.Duration {
	out := slices.Clone(ds)
	for _, d := range ds {
		us := d.Microseconds()
		iv := w.interval.Microseconds()
		if iv <= 0 || us < 2*iv {
			continue
		}
		for m := us - iv; m > iv; m -= iv {
			out = append(out, time.Duration(m)*time.Microsecond)
		}
	}
	return out
}

// wrkReport reads what wrkLatencies printed.
func wrkReport(t *testing.T, out string) wrkRun {
	t.Helper()
	var w wrkRun
	m := wrkSummary.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary in wrk's report:\n%s", out)
	}
	w.requests, _ = strconv.Atoi(m[1])
	us, _ := strconv.Atoi(m[2])
	if w.requests == 0 {
		t.Fatalf("wrk completed no request:\n%s", out)
	}
	w.interval = time.Duration(us/w.requests) * time.Microsecond
	for _, m := range wrkLatency.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.Atoi(m[1])
		c, _ := strconv.Atoi(m[2])
		for range c {
			w.latencies = append(w.latencies, time.Duration(v)*time.Microsecond)
		}
	}
	if len(w.latencies) == 0 {
		t.Fatalf("no latencies in wrk's report:\n%s", out)
	}
	return w
}
