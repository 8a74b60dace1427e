// Command kubeapi is a real Kubernetes API server for lattrace's tests:
// kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app, the code the
// release binary runs) in-process, backed by an embedded single-member etcd
// (go.etcd.io/etcd/server/v3/embed), both on loopback. No controller manager,
// scheduler or kubelet runs: the objects a test creates stay exactly as it
// wrote them (status included, through the status subresource).
//
//	kubeapi -dir DIR -port PORT
//
// DIR (it must exist) receives etcd's data, the serving certificates, the
// service-account signing key, a static token file and, once /readyz answers
// ok, DIR/kubeconfig: the test waits for that file and connects with it.
// SIGTERM or SIGINT stops the API server, then etcd.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	fs := flag.NewFlagSet("kubeapi", flag.ContinueOnError)
	dir := fs.String("dir", "", "working directory (must exist): etcd data, certificates, keys, kubeconfig")
	port := fs.Int("port", 0, "kube-apiserver's secure port on 127.0.0.1")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *dir == "" || *port <= 0 || *port > 65535 || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "kubeapi: usage: kubeapi -dir DIR -port PORT")
		os.Exit(2)
	}
	if err := run(*dir, *port); err != nil {
		fmt.Fprintln(os.Stderr, "kubeapi:", err)
		os.Exit(1)
	}
}

func run(dir string, port int) error {
	etcd, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()

	token, err := writeCredentials(dir)
	if err != nil {
		return err
	}
	certDir := filepath.Join(dir, "certs")
	cmd := app.NewAPIServerCommand() // installs the SIGTERM/SIGINT handler that stops it
	cmd.SetArgs([]string{
		"--etcd-servers=http://" + etcd.Clients[0].Addr().String(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// Self-signed serving certificate for localhost/127.0.0.1; the
		// kubeconfig trusts it (apiserver.crt carries its CA too).
		"--cert-dir=" + certDir,
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		// Dual stack, so Services can have an IPv6 cluster IP as well.
		"--service-cluster-ip-range=10.96.0.0/16,fd00:96::/112",
		// The ServiceAccount admission plugin refuses pods until a
		// controller has made the namespace's default account: none runs.
		"--disable-admission-plugins=ServiceAccount",
		// The master endpoints reconciler would publish 127.0.0.1, which
		// Endpoints validation refuses (loopback), and log it every 10 s.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
	})
	code := make(chan int, 1)
	go func() { code <- cli.Run(cmd) }()

	server := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitReady(server, token, code); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(dir, "kubeconfig"), server, token, filepath.Join(certDir, "apiserver.crt")); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "kubeapi: ready at", server)
	if c := <-code; c != 0 {
		return fmt.Errorf("kube-apiserver exited with status %d", c)
	}
	return nil
}

// startEtcd starts a single-member etcd on loopback ports the kernel picks.
func startEtcd(dataDir string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	cfg.LogLevel = "error"
	// A test's etcd is thrown away with its directory: fsync buys nothing.
	cfg.UnsafeNoFsync = true
	// Port 0 for both: the API server is told the client port etcd got,
	// and no peer ever connects to a single member.
	loopback := []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = loopback, loopback
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = loopback, loopback
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("etcd: not ready within 60s")
	}
}

// writeCredentials makes the service-account signing key and a static
// token for an administrator (system:masters), and returns the token.
func writeCredentials(dir string) (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pemKey, 0o600); err != nil {
		return "", err
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	line := token + `,admin,admin,"system:masters"` + "\n"
	return token, os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(line), 0o600)
}

// waitReady polls /readyz until it answers 200, the server exits, or two
// minutes pass (a cold start on two shared cores takes a few seconds).
func waitReady(server, token string, exited <-chan int) error {
	// The serving certificate does not exist until the server made it:
	// readiness is checked without verifying it; the kubeconfig verifies.
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case c := <-exited:
			return fmt.Errorf("kube-apiserver exited with status %d before it was ready", c)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver at %s not ready within 2 minutes", server)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func writeKubeconfig(path, server, token, caFile string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeapi"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubeapi"] = &clientcmdapi.Context{Cluster: "kubeapi", AuthInfo: "admin"}
	cfg.CurrentContext = "kubeapi"
	// Written aside and renamed: a reader never sees half a file.
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
