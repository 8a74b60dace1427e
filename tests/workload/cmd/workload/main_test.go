package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/workload"
)

// With WORKLOAD_MAIN=1 the test binary behaves as the workload command, so
// the tests can run it as a subprocess without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("WORKLOAD_MAIN") == "1" {
		main()
	}
	os.Exit(m.Run())
}

func command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "WORKLOAD_MAIN=1")
	return cmd
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"client", "--addr", "127.0.0.1:7000", "--req", "-5"}, "workload client: invalid request size -5: must be between the 40-byte header"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--req", "0"}, "invalid request size 0"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--resp", "10"}, "invalid response size 10"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--resp", "-1k"}, "invalid response size -1000"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--mode", "burst"}, `unknown mode "burst" (want "persistent" or "per-request")`},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--think", "-1ms"}, "invalid think time -1ms"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--count", "-3"}, "invalid count -3"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--mode", "per-request", "--depth", "4"}, "pipelining depth 4 needs mode persistent"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--req", "12parsecs"}, `invalid size "12parsecs"`},
		{[]string{"client", "--req", "100"}, "missing server address"},
		{[]string{"client", "--addr", "::1:7000"}, "invalid address"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"client", "--addr", "127.0.0.1:7000", "extra"}, `unknown command "extra"`},
		{[]string{"server", "--resp", "20"}, "workload server: invalid response size 20"},
		{[]string{"server", "--think", "-5ms"}, "invalid think time -5ms"},
		{[]string{"server", "--rcvbuf", "-1"}, "invalid socket buffer size"},
		{[]string{"server", "--cert", "x.pem"}, "--cert and --key go together"},
		{[]string{"bulk", "--addr", "127.0.0.1:7000", "--direction", "sideways"}, `unknown bulk direction "sideways"`},
		{[]string{"bulk", "--addr", "127.0.0.1:7000", "--bytes", "-1"}, "invalid byte count -1"},
		{[]string{"frobnicate"}, `unknown command "frobnicate" for "workload"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		msg := stderr.String()
		if code != 2 || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line containing %q", tc.args, code, msg, tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%v: wrote to stdout: %q", tc.args, stdout.String())
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "100": 100, "1k": 1000, "64KiB": 65536, "10M": 10_000_000, "2Mi": 2 << 20, "1GB": 1e9, "-5": -5} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "k", "1x", "1.5M", "99999999999999999999"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

// The built command end to end: server (TLS, self-signed CA written out),
// client trusting that CA, a bulk stream, and SIGTERM stopping the server
// cleanly with its records written. Exit statuses as documented.
func TestCommandEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	ca, sout, cout := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.jsonl"), filepath.Join(dir, "client.jsonl")

	srv := command(ctx, "server", "--listen", "127.0.0.1:0", "--think", "3ms", "--resp", "2000", "--tls", "--ca-out", ca, "--out", sout)
	srvErr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	sc := bufio.NewScanner(srvErr)
	if !sc.Scan() {
		t.Fatalf("server said nothing: %v", sc.Err())
	}
	line := sc.Text()
	_, rest, ok := strings.Cut(line, "listening on ")
	if !ok {
		t.Fatalf("unexpected server line %q", line)
	}
	addr := strings.Fields(rest)[0]
	var srvRest bytes.Buffer
	srvDone := make(chan struct{})
	go func() {
		for sc.Scan() {
			srvRest.WriteString(sc.Text() + "\n")
		}
		close(srvDone)
	}()

	cl := command(ctx, "client", "--addr", addr, "--tls", "--ca", ca, "--req", "1KiB", "--count", "5", "--mode", "per-request", "--out", cout)
	var clErr bytes.Buffer
	cl.Stderr = &clErr
	if err := cl.Run(); err != nil {
		t.Fatalf("client: %v; stderr %s", err, clErr.String())
	}
	if !strings.Contains(clErr.String(), "workload client: 5 exchanges, 0 errors; app RTT min") {
		t.Errorf("client summary %q", clErr.String())
	}
	f, err := os.Open(cout)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadJSONL[workload.ClientRecord](f)
	f.Close()
	if err != nil || len(recs) != 5 {
		t.Fatalf("client records: %d, %v", len(recs), err)
	}
	for _, r := range recs {
		if r.ReqBytes != 1024 || r.RespBytes != 2000 || r.ServerThinkNs != int64(3*time.Millisecond) || r.TLSDoneNs == 0 {
			t.Errorf("client record %+v", r)
		}
	}

	bulk := command(ctx, "bulk", "--addr", addr, "--tls", "--duration", "200ms", "--direction", "down", "--out", "-")
	var bOut, bErr bytes.Buffer
	bulk.Stdout, bulk.Stderr = &bOut, &bErr
	if err := bulk.Run(); err != nil {
		t.Fatalf("bulk: %v; stderr %s", err, bErr.String())
	}
	res, err := workload.ReadJSONL[workload.BulkResult](&bOut)
	if err != nil || len(res) != 1 || res[0].GoodputBps <= 0 || !strings.Contains(bErr.String(), "goodput") {
		t.Errorf("bulk result %+v (%v), stderr %q", res, err, bErr.String())
	}

	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-srvDone
	if err := srv.Wait(); err != nil {
		t.Fatalf("server exit after SIGTERM: %v; stderr %s", err, srvRest.String())
	}
	if !strings.Contains(srvRest.String(), "stopped after 6 records (0 with errors)") {
		t.Errorf("server stop line %q", srvRest.String())
	}
	f, err = os.Open(sout)
	if err != nil {
		t.Fatal(err)
	}
	srecs, err := workload.ReadJSONL[workload.ServerRecord](f)
	f.Close()
	if err != nil || len(srecs) != 6 {
		t.Fatalf("server records: %d, %v", len(srecs), err)
	}

	// Failed exchanges: exit 1. Bad flags: exit 2, from the real binary.
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"client", "--addr", addr, "--count", "1"}, 1}, // server gone
		{[]string{"client", "--addr", addr, "--resp", "10"}, 2},
	} {
		c := command(ctx, tc.args...)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		err := c.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
			t.Errorf("%v: %v, want exit %d; stderr %s", tc.args, err, tc.code, stderr.String())
		}
	}
}
