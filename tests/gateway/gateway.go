// Package gateway runs lattrace's fleet gateway for the tests: the
// Collector configs of deploy/helm/lattrace-gateway, rendered by helm as
// an install would, in an OpenTelemetry Collector of the same components
// at the release the chart's image runs (module ./collector, built once by
// build.sh).
//
//	LATTRACE_GATEWAY_OTELCOL_BIN=/path   use this binary instead of running build.sh
//	HELM=/path                           helm (default: `make helm`'s, else PATH)
package gateway

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/lattrace/lattrace/tests/buildonce"
	"github.com/lattrace/lattrace/tests/testserver"
)

var binary = buildonce.New("gateway-otelcol", "build.sh", "LATTRACE_GATEWAY_OTELCOL_BIN")

// Binary returns the path of the gateway Collector, building it on first
// use (once per test process).
func Binary() (string, error) { return binary.Path() }

// Helm finds the helm binary `make helm` builds.
func Helm() (string, error) {
	for _, p := range []string{os.Getenv("HELM"), "/var/cache/lattrace/bin/helm"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("helm not found: `make helm` builds it from the Go module proxy into /var/cache/lattrace/bin")
}

// Chart is the gateway chart's directory.
func Chart() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "deploy", "helm", "lattrace-gateway")
}

// Configs renders the chart with helm's --set values and returns each
// ConfigMap's config.yaml by the ConfigMap's name
// (lattrace-gateway-loadbalancer, lattrace-gateway-sampler).
func Configs(tb testing.TB, set ...string) map[string]string {
	tb.Helper()
	helm, err := Helm()
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{"template", "lattrace-gateway", Chart(), "--namespace", "lattrace-gateway"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("helm %v: %v\n%s", args, err, stderr.String())
	}
	configs := map[string]string{}
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			tb.Fatalf("helm's output: %v\n%s", err, doc)
		}
		if obj.Kind == "ConfigMap" {
			configs[obj.Metadata.Name] = obj.Data["config.yaml"]
		}
	}
	return configs
}

// Start runs a Collector on config (a rendered config.yaml) until the
// test ends; it is ready when the health check on port health answers.
func Start(tb testing.TB, name, config string, health int) *testserver.Process {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	return testserver.Start(tb, name, dir, bin, []string{"--config", "file:" + path}, nil,
		testserver.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/", health)))
}
