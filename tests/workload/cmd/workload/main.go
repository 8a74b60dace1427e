// Command workload runs lattrace's ground-truth TCP workload: a
// request/response server, a client that records app-level timestamps of
// every exchange, and a bulk stream for background traffic. See package
// github.com/lattrace/lattrace/tests/workload for the protocol and the
// record schema.
//
//	workload server --listen [::]:7000 --think 30ms --out server.jsonl
//	workload client --addr 127.0.0.1:7000 --req 100 --resp 1000 --interval 1s --count 20 --out client.jsonl
//	workload bulk   --addr 127.0.0.1:7000 --duration 10s
//
// Exit status: 0 on success, 1 when an exchange or the run failed, 2 for
// bad flags.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/tests/workload"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// runtimeError marks failures that are not the user's flags (exit 1).
type runtimeError struct{ err error }

func (e runtimeError) Error() string { return e.err.Error() }

// run executes the command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	name := "workload"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	var re runtimeError
	if errors.As(err, &re) {
		fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		return 1
	}
	fmt.Fprintf(stderr, "%s: %s (see --help)\n", name, msg)
	return 2
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "workload",
		Short:         "lattrace ground-truth TCP workload (server, client, bulk)",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	root.AddCommand(serverCmd(stdout, stderr), clientCmd(stdout, stderr), bulkCmd(stdout, stderr))
	return root
}

// sizeValue is a byte-count flag: a plain number or one with a suffix
// k/M/G (powers of 1000) or Ki/Mi/Gi (powers of 1024), "B" optional.
type sizeValue struct{ p *int64 }

func (s sizeValue) String() string {
	if s.p == nil {
		return "0"
	}
	return strconv.FormatInt(*s.p, 10)
}
func (s sizeValue) Type() string { return "size" }
func (s sizeValue) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s.p = n
	return nil
}

func parseSize(v string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(v))
	i := 0
	if i < len(t) && (t[i] == '-' || t[i] == '+') {
		i++
	}
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	num, suffix := t[:i], strings.TrimSuffix(t[i:], "b")
	mult := map[string]int64{"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}[suffix]
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || mult == 0 {
		return 0, fmt.Errorf("invalid size %q (want bytes, e.g. 1000, 64KiB, 10M)", v)
	}
	if n > (1<<62)/mult || n < -(1<<62)/mult {
		return 0, fmt.Errorf("size %q too large", v)
	}
	return n * mult, nil
}

func sizeFlag(cmd *cobra.Command, p *int64, name string, def int64, usage string) {
	*p = def
	cmd.Flags().Var(sizeValue{p}, name, usage)
}

// openOut opens an output path: "" none, "-" stdout, else a new file.
func openOut(path string, stdout io.Writer) (io.Writer, func() error, error) {
	switch path {
	case "":
		return nil, func() error { return nil }, nil
	case "-":
		return stdout, func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, runtimeError{err}
	}
	return f, f.Close, nil
}

// tlsFlags are the client-side TLS flags shared by client and bulk.
type tlsFlags struct {
	on         bool
	ca         string
	serverName string
}

func (t *tlsFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&t.on, "tls", false, "use TLS")
	cmd.Flags().StringVar(&t.ca, "ca", "", "PEM certificate(s) to trust (e.g. the server's --ca-out); default: skip verification")
	cmd.Flags().StringVar(&t.serverName, "server-name", "", "TLS server name to verify (default: the --addr host)")
}

func (t *tlsFlags) config() (*tls.Config, error) {
	if !t.on || (t.ca == "" && t.serverName == "") {
		return nil, nil
	}
	conf := &tls.Config{ServerName: t.serverName}
	if t.ca != "" {
		pem, err := os.ReadFile(t.ca)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca: no PEM certificate in %s", t.ca)
		}
		conf.RootCAs = pool
	}
	return conf, nil
}

func serverCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfg                         workload.ServerConfig
		resp, rcvbuf, sndbuf, chunk int64
		nodelay                     bool
		cert, key, caOut, out       string
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "serve request/response exchanges and bulk streams until SIGINT/SIGTERM",
		Args:  cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "[::]:7000", "listen address host:port (IPv6 in brackets)")
	f.DurationVar(&cfg.DefaultThink, "think", 0, "think time for requests that ask for the server default")
	sizeFlag(cmd, &resp, "resp", 1000, "response size (bytes, header included, min 40) for requests that ask for the server default")
	f.BoolVar(&cfg.TLS, "tls", false, "serve TLS (self-signed certificate unless --cert/--key)")
	f.StringVar(&cert, "cert", "", "TLS certificate PEM file (with --key)")
	f.StringVar(&key, "key", "", "TLS private key PEM file (with --cert)")
	f.StringVar(&caOut, "ca-out", "", "write the generated self-signed certificate (PEM) here, for the client's --ca")
	f.BoolVar(&nodelay, "nodelay", true, "set TCP_NODELAY on accepted connections")
	sizeFlag(cmd, &rcvbuf, "rcvbuf", 0, "SO_RCVBUF for accepted connections (0: system default)")
	sizeFlag(cmd, &sndbuf, "sndbuf", 0, "SO_SNDBUF for accepted connections (0: system default)")
	f.DurationVar(&cfg.ReadDelay, "read-delay", 0, "slow reader: sleep before reading each request")
	sizeFlag(cmd, &chunk, "read-chunk", 0, "slow reader: read at most this many bytes per read call (0: 64KiB)")
	f.DurationVar(&cfg.ReadGap, "read-gap", 0, "slow reader: sleep before each read call that continues a request")
	f.BoolVar(&cfg.Serial, "serial", false, "handle a connection's requests one at a time (default: concurrently, responses may be out of order)")
	f.IntVar(&cfg.MaxInFlight, "max-inflight", 256, "requests handled concurrently per connection")
	f.StringVar(&out, "out", "", "write server records as JSON lines to this file (\"-\": stdout)")

	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg.DefaultRespSize = clampInt(resp)
		cfg.RcvBuf, cfg.SndBuf, cfg.ReadChunk = clampInt(rcvbuf), clampInt(sndbuf), clampInt(chunk)
		cfg.Nagle = !nodelay
		if (cert == "") != (key == "") {
			return errors.New("--cert and --key go together")
		}
		if cert != "" {
			if !cfg.TLS {
				return errors.New("--cert/--key need --tls")
			}
			c, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return fmt.Errorf("loading --cert/--key: %w", err)
			}
			cfg.TLSCert = &c
		}
		if caOut != "" && (!cfg.TLS || cert != "") {
			return errors.New("--ca-out needs --tls without --cert")
		}
		if err := cfg.Validate(); err != nil {
			return err
		}
		w, closeOut, err := openOut(out, stdout)
		if err != nil {
			return err
		}
		var n, failed atomic.Int64
		cfg.Out = w
		cfg.DiscardRecords = true
		cfg.OnRecord = func(r workload.ServerRecord) {
			n.Add(1)
			if r.Error != "" {
				failed.Add(1)
			}
		}
		srv, err := workload.Listen(cfg)
		if err != nil {
			closeOut()
			return runtimeError{err}
		}
		if caOut != "" {
			if err := os.WriteFile(caOut, srv.SelfSigned().CertPEM, 0o644); err != nil {
				srv.Close()
				closeOut()
				return runtimeError{err}
			}
		}
		fmt.Fprintf(stderr, "workload server: listening on %s (tls=%v think=%v resp=%d)\n", srv.Addr(), cfg.TLS, cfg.DefaultThink, cfg.DefaultRespSize)
		_, serr := srv.Serve(cmd.Context())
		cerr := closeOut()
		fmt.Fprintf(stderr, "workload server: stopped after %d records (%d with errors)\n", n.Load(), failed.Load())
		if serr != nil {
			return runtimeError{serr}
		}
		if cerr != nil {
			return runtimeError{cerr}
		}
		return nil
	}
	return cmd
}

func clampInt(v int64) int {
	// Sizes beyond this are rejected by validation anyway; keep the sign
	// and magnitude so that error messages show what was given.
	return int(min(max(v, -(1<<40)), 1<<40))
}

func clientCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfg                              workload.ClientConfig
		req, resp, rcvbuf, sndbuf, chunk int64
		mode, out                        string
		nodelay                          bool
		slowEvery                        int
		slowThink                        time.Duration
		tf                               tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "client",
		Short: "run request/response exchanges and record their app-level timestamps",
		Args:  cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "", "server address host:port (IPv6 in brackets), required")
	sizeFlag(cmd, &req, "req", 100, "request size in bytes, header included (min 40)")
	sizeFlag(cmd, &resp, "resp", 0, "wanted response size in bytes, header included (min 40; 0: the server's --resp)")
	f.DurationVar(&cfg.Think, "think", 0, "server think time to request (default: the server's --think)")
	f.IntVar(&slowEvery, "slow-every", 0, "every this many exchanges (ids n, 2n, ...), ask for --slow-think instead (0: none)")
	f.DurationVar(&slowThink, "slow-think", 0, "server think time of the --slow-every exchanges")
	f.DurationVar(&cfg.Interval, "interval", 0, "time between exchange starts (0: back to back)")
	f.IntVar(&cfg.Count, "count", 10, "number of exchanges (0: no limit)")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop starting exchanges after this long (0: no limit; with --count 0 too, run until interrupted)")
	f.StringVar(&mode, "mode", string(workload.ModePersistent), "persistent (one connection) or per-request (new connection per exchange)")
	tf.add(cmd)
	f.BoolVar(&nodelay, "nodelay", true, "set TCP_NODELAY (false: leave Nagle's algorithm on)")
	f.IntVar(&cfg.WriteChunks, "chunks", 1, "split each request into this many write calls")
	f.DurationVar(&cfg.ChunkGap, "chunk-gap", 0, "sleep between the write calls of a request")
	f.IntVar(&cfg.Depth, "depth", 1, "pipelining depth: requests in flight on the connection (persistent mode)")
	f.DurationVar(&cfg.ReadDelay, "read-delay", 0, "slow reader: sleep before reading each response")
	sizeFlag(cmd, &chunk, "read-chunk", 0, "slow reader: read at most this many bytes per read call (0: 64KiB)")
	f.DurationVar(&cfg.ReadGap, "read-gap", 0, "slow reader: sleep before each read call that continues a response")
	sizeFlag(cmd, &rcvbuf, "rcvbuf", 0, "SO_RCVBUF, set before connecting (0: system default)")
	sizeFlag(cmd, &sndbuf, "sndbuf", 0, "SO_SNDBUF, set before connecting (0: system default)")
	f.DurationVar(&cfg.ConnectTimeout, "connect-timeout", 5*time.Second, "timeout for connect plus TLS handshake")
	f.StringVar(&out, "out", "", "write client records as JSON lines to this file (\"-\": stdout)")

	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if !cmd.Flags().Changed("think") {
			cfg.Think = workload.ServerThink
		} else if cfg.Think < 0 {
			return fmt.Errorf("invalid think time %v: must not be negative", cfg.Think)
		}
		if slowEvery < 0 || slowThink < 0 || (slowEvery > 0) != (slowThink > 0) {
			return fmt.Errorf("invalid --slow-every %d / --slow-think %v: give both, positive", slowEvery, slowThink)
		}
		if slowEvery > 0 {
			cfg.PerExchange = func(id uint64, s *workload.ExchangeSpec) {
				if id%uint64(slowEvery) == 0 {
					s.Think = slowThink
				}
			}
		}
		m, err := workload.ParseMode(mode)
		if err != nil {
			return err
		}
		cfg.Mode = m
		cfg.ReqSize, cfg.RespSize = clampInt(req), clampInt(resp)
		if req == 0 {
			return fmt.Errorf("invalid request size 0: must be at least the %d-byte header", workload.HeaderSize)
		}
		cfg.RcvBuf, cfg.SndBuf, cfg.ReadChunk = clampInt(rcvbuf), clampInt(sndbuf), clampInt(chunk)
		cfg.Nagle = !nodelay
		cfg.TLS = tf.on
		if err := cfg.Validate(); err != nil {
			return err
		}
		if cfg.TLSConfig, err = tf.config(); err != nil {
			return err
		}
		w, closeOut, err := openOut(out, stdout)
		if err != nil {
			return err
		}
		cfg.Out = w
		recs, rerr := workload.RunClient(cmd.Context(), cfg)
		cerr := closeOut()
		fmt.Fprintf(stderr, "workload client: %s\n", workload.Summarize(recs))
		if rerr == nil && cerr != nil {
			rerr = cerr
		}
		if rerr != nil {
			return runtimeError{rerr}
		}
		return nil
	}
	return cmd
}

func bulkCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfg                       workload.BulkConfig
		bytes, ws, rcvbuf, sndbuf int64
		out                       string
		nodelay                   bool
		tf                        tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "bulk",
		Short: "stream bytes one way (background traffic) and report goodput",
		Args:  cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "", "server address host:port (IPv6 in brackets), required")
	f.StringVar(&cfg.Direction, "direction", workload.BulkUp, "up (client to server) or down (server to client)")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "stream for this long (0: no limit)")
	sizeFlag(cmd, &bytes, "bytes", 0, "stop after this many payload bytes (0: no limit)")
	sizeFlag(cmd, &ws, "write-size", 64<<10, "bytes per write call (up)")
	tf.add(cmd)
	f.BoolVar(&nodelay, "nodelay", true, "set TCP_NODELAY")
	sizeFlag(cmd, &rcvbuf, "rcvbuf", 0, "SO_RCVBUF, set before connecting (0: system default)")
	sizeFlag(cmd, &sndbuf, "sndbuf", 0, "SO_SNDBUF, set before connecting (0: system default)")
	f.DurationVar(&cfg.ConnectTimeout, "connect-timeout", 5*time.Second, "timeout for connect plus TLS handshake")
	f.StringVar(&out, "out", "", "write the result as a JSON line to this file (\"-\": stdout)")

	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg.Bytes = bytes
		cfg.WriteSize, cfg.RcvBuf, cfg.SndBuf = clampInt(ws), clampInt(rcvbuf), clampInt(sndbuf)
		if ws == 0 {
			return errors.New("invalid write size 0: must be positive")
		}
		cfg.Nagle = !nodelay
		cfg.TLS = tf.on
		if err := cfg.Validate(); err != nil {
			return err
		}
		var err error
		if cfg.TLSConfig, err = tf.config(); err != nil {
			return err
		}
		w, closeOut, err := openOut(out, stdout)
		if err != nil {
			return err
		}
		res, rerr := workload.RunBulk(cmd.Context(), cfg)
		if w != nil {
			b, _ := json.Marshal(res)
			if _, err := w.Write(append(b, '\n')); err != nil && rerr == nil {
				rerr = err
			}
		}
		if err := closeOut(); err != nil && rerr == nil {
			rerr = err
		}
		secs := float64(res.EndNs-res.StartNs) / 1e9
		if res.StartNs != 0 {
			fmt.Fprintf(stderr, "workload bulk: %s %d bytes in %.3fs, goodput %.1f Mbit/s\n", res.Direction, res.Bytes, secs, res.GoodputBps/1e6)
		}
		if rerr != nil {
			return runtimeError{rerr}
		}
		return nil
	}
	return cmd
}
