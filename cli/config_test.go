package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lattrace.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The file sets what nothing else does; the environment beats the file;
// a flag beats both.
func TestConfigPrecedence(t *testing.T) {
	path := writeConfig(t, "output: none\nmetrics_addr: 127.0.0.1:9999\ndrain_interval: 50ms\notlp_endpoint: collector:4317\n")
	t.Setenv("LATTRACE_METRICS_ADDR", "127.0.0.1:7777")
	cmd := newDaemon()
	if err := cmd.ParseFlags([]string{"--drain-interval", "20ms"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfig(cmd, path); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"output": "none", "metrics-addr": "127.0.0.1:7777", "drain-interval": "20ms", "otlp-endpoint": "collector:4317", "api-socket": "/run/lattrace/api.sock",
	} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("%s = %q, want %q", flag, got, want)
		}
	}
}

// Bad input names the key, the file and the line, or the variable.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ body, env, want string }{
		{"output: none\ncolour: red\n", "", `:2: unknown key "colour" (known: active_flows, api_addr, api_socket,`},
		{"drain_interval: soon\n", "", `:1: drain_interval: "soon": time: invalid duration`},
		{"metrics_max_peer_pairs: many\n", "", `:1: metrics_max_peer_pairs: "many"`},
		{"output: none\noutput: jsonl\n", "", `:2: key "output" given twice`},
		{"otlp_insecure: [true]\n", "", `:1: otlp_insecure: want a single value`},
		{"- output\n", "", `:1: want a mapping`},
		{"output:\n", "", `:1: output: no value`},
		{"span_rate: lots\ndrain_interval: soon\n", "", `; `},
		{"", "LATTRACE_SPAN_RATE=lots", `LATTRACE_SPAN_RATE="lots"`},
	} {
		path := writeConfig(t, c.body)
		if k, v, ok := strings.Cut(c.env, "="); ok {
			t.Setenv(k, v)
		}
		cmd := newDaemon()
		err := applyConfig(cmd, path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.body, err, c.want)
		}
		if k, _, ok := strings.Cut(c.env, "="); ok {
			os.Unsetenv(k)
		}
	}
	if err := applyConfig(newDaemon(), "/nonexistent/lattrace.yaml"); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("missing file: %v", err)
	}
	// Any file may be named: one that never ends is not read to its end.
	if err := applyConfig(newDaemon(), "/dev/zero"); err == nil || !strings.Contains(err.Error(), "/dev/zero: larger than 64 KiB: not a settings file") {
		t.Errorf("/dev/zero: %v", err)
	}
	// An empty file sets nothing.
	if err := applyConfig(newDaemon(), writeConfig(t, "")); err != nil {
		t.Errorf("empty file: %v", err)
	}
}

// docs/configuration.md lists every setting of the daemon.
func TestConfigDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	cmd := newDaemon()
	keys := []string{"log_level"}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" {
			keys = append(keys, configKey(f.Name))
		}
	})
	for _, k := range keys {
		if !strings.Contains(string(doc), "| `"+k+"` |") {
			t.Errorf("docs/configuration.md does not list %q", k)
		}
	}
}

// The chart's ConfigMap (as rendered into deploy/kubernetes) is a config
// file the daemon takes.
func TestConfigOfTheChart(t *testing.T) {
	cmd := newDaemon()
	if err := applyConfig(cmd, writeConfig(t, string(chartConfig(t)))); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("metrics-addr").Value.String(); got != "0.0.0.0:9464" {
		t.Errorf("metrics-addr %q", got)
	}
}

// LATTRACE_CONFIG names the file; a LATTRACE_ variable that is no setting
// is an error, not silence.
func TestConfigEnvironment(t *testing.T) {
	var out, errb strings.Builder
	t.Setenv("LATTRACE_CONFIG", writeConfig(t, "colour: red\n"))
	if code := Execute([]string{"daemon"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown key "colour"`) {
		t.Errorf("LATTRACE_CONFIG: exit %d, %q", code, errb.String())
	}
	os.Unsetenv("LATTRACE_CONFIG")
	t.Setenv("LATTRACE_METRIC_ADDR", "0.0.0.0:1")
	err := applyConfig(newDaemon(), "")
	if err == nil || !strings.Contains(err.Error(), "LATTRACE_METRIC_ADDR is not a setting of lattrace daemon") {
		t.Errorf("misspelt variable: %v", err)
	}
	os.Unsetenv("LATTRACE_METRIC_ADDR")
	t.Setenv("LATTRACE_API", "/tmp/x.sock") // the clients' variable
	if err := applyConfig(newDaemon(), ""); err != nil {
		t.Errorf("LATTRACE_API: %v", err)
	}
}
