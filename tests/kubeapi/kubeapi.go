// Package kubeapi runs a real Kubernetes API server for lattrace's tests.
//
// The server is the program in ./server (its own Go module): kube-apiserver in-process with an
// embedded etcd, both on loopback, a static admin token, AlwaysAllow authorization, and no
// controller, scheduler or kubelet, so the objects a test writes stay as written. build.sh builds
// it once into a cache keyed by the module's content; Start builds it (once per test process),
// starts one server per call on a free loopback port, and stops it when the test ends.
//
//	cfg := kubeapi.Start(t)
//	client := kubernetes.NewForConfigOrDie(cfg)
//
// Environment:
//
//	LATTRACE_KUBEAPI_BIN=/path   use this server binary instead of running build.sh
package kubeapi

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lattrace/lattrace/tests/buildonce"
)

var binary = buildonce.New("kubeapi", "build.sh", "LATTRACE_KUBEAPI_BIN")

// Binary returns the path of the server binary, building it with build.sh on first use (once per
// process). LATTRACE_KUBEAPI_BIN overrides it.
func Binary() (string, error) { return binary.Path() }

// startTimeout bounds a start: a cold one takes a few seconds (etcd, then the API server's
// bootstrap: the default Service, priority classes, RBAC roles).
const startTimeout = 2 * time.Minute

// Start starts an API server and returns a client configuration for it (an administrator). The
// server is stopped, and its log shown if the test failed, when the test ends.
func Start(tb testing.TB) *rest.Config {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	logPath := filepath.Join(dir, "kubeapi.log")
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "-dir", dir, "-port", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that a test's Ctrl-C handling never reaches it first; Pdeathsig so
	// that it (and its etcd, in the same process) dies with the test binary even when Cleanup never
	// runs (e.g. a go test -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("kubeapi: start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	readLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	tb.Cleanup(func() {
		stop(cmd, done)
		if tb.Failed() {
			tb.Logf("kube-apiserver log (%s):\n%s", logPath, readLog())
		}
	})

	// The server writes its kubeconfig (renamed into place) once /readyz answers.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(kubeconfig); err == nil {
			break
		}
		select {
		case <-done:
			tb.Fatalf("kubeapi: exited before it was ready (%v):\n%s", cmd.ProcessState, readLog())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("kubeapi: not ready after %v:\n%s", startTimeout, readLog())
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		tb.Fatalf("kubeapi: %v", err)
	}
	cfg.UserAgent = "lattrace-test"
	return cfg
}

// stop shuts the server down (SIGTERM: the API server, then etcd), killing it after 10 s.
func stop(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
