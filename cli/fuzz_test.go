package cli

import (
	"bytes"
	"encoding/csv"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/lattrace/lattrace/tests/fuzz"
)

// flagsBound is what running a command line up to the work may allocate:
// the commands and their flag sets, made afresh for each input, and cobra's
// help for its errors (the fixed part), and a few copies of each argument.
var flagsBound = fuzz.Bound{PerByte: 64, Fixed: 4 * fuzz.MiB}

// FuzzFlags runs a command line, its arguments separated by NUL bytes
// (which no argument can hold), as Execute does but for the work itself:
// the command is found, its flags parsed, its arguments counted, the
// environment applied, its settings checked, and an error printed as the
// one line the exit status comes with. An argument that begins with \x01
// is instead a variable, NAME=value, set as LATTRACE_NAME. What it
// accepts, written back as --flag=value, runs to the same settings.
func FuzzFlags(f *testing.F) {
	clearEnv(f)
	seeds := map[string][]any{}
	for _, cmd := range newRoot(io.Discard, io.Discard).Commands() {
		// Every flag at its default, as the code has it.
		args := []string{cmd.Name()}
		cmd.Flags().VisitAll(func(fl *pflag.Flag) { args = append(args, "--"+fl.Name+"="+encodeValue(fl)) })
		seeds["defaults-"+cmd.Name()] = []any{strings.Join(args, "\x00")}
	}
	for name, line := range map[string]string{
		"record":  "record\x00--out\x00run.lattrace\x00--duration\x0030s\x00--sample-interval\x0010ms",
		"report":  "report\x00run.lattrace\x00-o\x00report.html\x00--points\x00500",
		"flows":   "flows\x00--peers\x00--filter\x00comm:curl port:443 addr:10.0.0.0/8\x00--sort\x00rate\x00--limit\x005\x00--json",
		"top":     "top\x00--once\x00--sort\x00p50\x00--interval\x00500ms\x00--api\x00127.0.0.1:7070",
		"explain": "explain\x00p0123456789ab\x00--what-if\x0020ms",
		"daemon":  "daemon\x00--output\x00none\x00--otlp-endpoint\x00collector:4317\x00--otlp-insecure\x00--netns-dir\x00/run/netns,/var/run/netns",
		// Settings from the environment, and a variable that is none.
		"environment": "\x01METRICS_ADDR=127.0.0.1:7777\x00\x01DRAIN_INTERVAL=50ms\x00daemon\x00--output\x00none",
		"typo-env":    "\x01METRIC_ADDR=0.0.0.0:1\x00daemon",
		// Lines that printed several lines, or read without end.
		"typo":          "flow",
		"newline-value": "daemon\x00--cgroup\x00/sys/fs/cgroup\nsystem.slice",
		"config-zero":   "daemon\x00--config\x00/dev/zero",
	} {
		seeds["line-"+name] = []any{line}
	}
	fuzz.Seeds(f, seeds)
	f.Fuzz(func(t *testing.T, line string) {
		var r checked
		var args []string
		for _, a := range strings.Split(line, "\x00") {
			// Split on NUL and cut at the first "=", a name and a
			// value are ones the environment takes.
			if name, value, ok := strings.Cut(strings.TrimPrefix(a, "\x01"), "="); ok && strings.HasPrefix(a, "\x01") {
				t.Setenv(envPrefix+name, value) // restored after the input
				continue
			}
			args = append(args, a)
		}
		fuzz.Alloc(t, len(line), flagsBound, func() { r = check(args) })
		r.oneLine(t)
		if r.cmd == nil {
			return
		}
		again := []string{r.cmd.Name()}
		r.cmd.Flags().Visit(func(fl *pflag.Flag) { again = append(again, "--"+fl.Name+"="+encodeValue(fl)) })
		again = append(again, r.args...)
		r2 := check(again)
		if r2.cmd == nil {
			t.Fatalf("%q accepted, written back as %q: %s", line, again, r2.stderr)
		}
		sameSettings(t, r.cmd, r2.cmd)
	})
}

// checked is how a command line ran up to the work.
type checked struct {
	// cmd is the command whose work would run, with its arguments; nil
	// when the line failed, or asked for help.
	cmd    *cobra.Command
	args   []string
	status int
	stderr string
}

// check runs a command line as Execute does, every command's work left
// out.
func check(args []string) checked {
	var r checked
	var stderr bytes.Buffer
	root := newRoot(io.Discard, &stderr)
	for _, c := range root.Commands() {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			r.cmd, r.args = cmd, args
			return nil
		}
	}
	r.status = execute(root, args, &stderr)
	r.stderr = stderr.String()
	return r
}

// oneLine fails t unless a failed line printed one line, and a line that
// did not fail printed nothing.
func (r checked) oneLine(t *testing.T) {
	t.Helper()
	switch {
	case r.status == 0 && r.stderr != "",
		r.status != 0 && (strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") || !strings.HasPrefix(r.stderr, "lattrace: ")):
		t.Fatalf("exit status %d with %q: want one line on a failure, nothing otherwise", r.status, r.stderr)
	case r.status != 0 && r.status != 1 && r.status != 2:
		t.Fatalf("exit status %d", r.status)
	}
}

// configBound is what running the daemon's command line with a settings
// file may allocate: flagsBound's fixed part, and per byte of YAML the
// parser's nodes, about a hundred bytes for the two bytes of the shortest
// key or value.
var configBound = fuzz.Bound{PerByte: 256, Fixed: 4 * fuzz.MiB}

// FuzzConfig runs the daemon's command line with a settings file
// (--config), as FuzzFlags runs a command line. What it accepts, written
// back as a settings file of the values that differ from the defaults,
// gives the same settings.
func FuzzConfig(f *testing.F) {
	clearEnv(f)
	base := check([]string{"daemon"})
	if base.cmd == nil {
		f.Fatalf("the daemon's defaults: %s", base.stderr)
	}
	defaults := settings(base.cmd, nil)
	all, err := yaml.Marshal(defaults)
	if err != nil {
		f.Fatal(err)
	}
	fuzz.Seeds(f, map[string][]any{
		"defaults": {all},
		"chart":    {chartConfig(f)},
		"docs":     {[]byte("output: none\nmetrics_addr: 127.0.0.1:9999\ndrain_interval: 50ms\notlp_endpoint: collector:4317\n")},
	})
	path := filepath.Join(f.TempDir(), "lattrace.yaml")
	f.Fuzz(func(t *testing.T, file []byte) {
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		var r checked
		fuzz.Alloc(t, len(file), configBound, func() { r = check([]string{"daemon", "--config", path}) })
		r.oneLine(t)
		if r.cmd == nil {
			return
		}
		again, err := yaml.Marshal(settings(r.cmd, defaults))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, again, 0o600); err != nil {
			t.Fatal(err)
		}
		r2 := check([]string{"daemon", "--config", path})
		if r2.cmd == nil {
			t.Fatalf("%q accepted, written back as %q: %s", file, again, r2.stderr)
		}
		sameSettings(t, r.cmd, r2.cmd)
	})
}

// settings are cmd's settings as a settings file has them, by key, but
// those at the value in skip.
func settings(cmd *cobra.Command, skip map[string]string) map[string]string {
	out := map[string]string{}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		k, v := configKey(fl.Name), encodeValue(fl)
		if fl.Name != "config" && fl.Name != "help" && (skip == nil || skip[k] != v) {
			out[k] = v
		}
	})
	return out
}

// encodeValue is a flag's value as its parser takes it: a list's as
// comma-separated values (its String has brackets).
func encodeValue(fl *pflag.Flag) string {
	s, ok := fl.Value.(pflag.SliceValue)
	if !ok {
		return fl.Value.String()
	}
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	w.Write(s.GetSlice())
	w.Flush()
	return strings.TrimSuffix(b.String(), "\n")
}

// sameSettings fails t when two commands' flags hold different values.
func sameSettings(t *testing.T, a, b *cobra.Command) {
	t.Helper()
	a.Flags().VisitAll(func(fl *pflag.Flag) {
		if got := b.Flags().Lookup(fl.Name).Value.String(); got != fl.Value.String() {
			t.Fatalf("--%s: %q, written back and read again %q", fl.Name, fl.Value.String(), got)
		}
	})
}

// clearEnv unsets lattrace's variables for the test: the commands read
// them, and a fuzz input must meet the flags alone.
func clearEnv(f *testing.F) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) || strings.HasPrefix(k, "OTEL_") {
			f.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// chartConfig is the settings file the Helm chart gives the daemon.
func chartConfig(tb testing.TB) []byte {
	m, err := os.ReadFile("../deploy/kubernetes/lattrace.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	_, block, ok := strings.Cut(string(m), "config.yaml: |\n")
	if !ok {
		tb.Fatal("no config.yaml in the manifest's ConfigMap")
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if !strings.HasPrefix(l, "    ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(l, "    "))
	}
	return []byte(strings.Join(lines, "\n") + "\n")
}
