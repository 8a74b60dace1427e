package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// Configuration comes from three places, the later winning: a YAML file
// (--config), environment variables (LATTRACE_<FLAG>, e.g.
// LATTRACE_METRICS_ADDR), and flags. The file's keys are the flags' names
// with underscores (metrics_addr: 127.0.0.1:9464), so there is one list of
// settings, one set of defaults and one validation: each value goes
// through its flag's own parser. docs/configuration.md lists them.

// envPrefix starts the environment variable of every setting.
const envPrefix = "LATTRACE_"

// clientEnv are variables of the other commands, not settings.
var clientEnv = []string{apiEnv}

// configKey is the file key and environment suffix of a flag.
func configKey(flag string) string { return strings.ReplaceAll(flag, "-", "_") }

// applyConfig sets the flags the command line did not set from the
// environment, then from the file at path (if any). Errors name the key,
// the file and line, or the variable.
func applyConfig(cmd *cobra.Command, path string) error {
	fs := cmd.Flags()
	fromFile := map[string]*yaml.Node{}
	if path != "" {
		var err error
		if fromFile, err = readConfigFile(path, fs); err != nil {
			return err
		}
	}
	var errs []error
	// A variable that names no setting is a typo that would otherwise be
	// ignored without a word.
	var keys []string
	fs.VisitAll(func(f *pflag.Flag) { keys = append(keys, envPrefix+strings.ToUpper(configKey(f.Name))) })
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !slices.Contains(keys, name) && !slices.Contains(clientEnv, name) {
			errs = append(errs, fmt.Errorf("%s is not a setting of lattrace %s (see docs/configuration.md)", name, cmd.Name()))
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		key := configKey(f.Name)
		env := envPrefix + strings.ToUpper(key)
		if v, ok := os.LookupEnv(env); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", env, v, err))
			}
			return
		}
		if n, ok := fromFile[key]; ok {
			if n.Tag == "!!null" {
				errs = append(errs, fmt.Errorf("%s:%d: %s: no value (leave the key out for the default)", path, n.Line, key))
				return
			}
			if err := f.Value.Set(n.Value); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %s: %q: %v", path, n.Line, key, n.Value, err))
			}
		}
	})
	// One line, as every error lattrace prints.
	if len(errs) > 0 {
		var msgs []string
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// maxConfigFile bounds a settings file: every setting with a long value
// takes a few kilobytes.
const maxConfigFile = 64 << 10

// readConfigFile reads a flat YAML mapping of keys to scalar values and
// refuses keys that are not settings of this command.
func readConfigFile(path string, fs *pflag.FlagSet) (map[string]*yaml.Node, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	// Read no further than a settings file can reach: --config names any
	// file, /dev/zero included.
	b, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if len(b) > maxConfigFile {
		return nil, fmt.Errorf("%s: larger than %d KiB: not a settings file (a few dozen lines of key: value)", path, maxConfigFile>>10)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	out := map[string]*yaml.Node{}
	if len(doc.Content) == 0 {
		return out, nil // an empty file sets nothing
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of settings (key: value)", path, root.Line)
	}
	var known []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" && f.Name != "help" {
			known = append(known, configKey(f.Name))
		}
	})
	slices.Sort(known)
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch {
		case !slices.Contains(known, k.Value):
			return nil, fmt.Errorf("%s:%d: unknown key %q (known: %s)", path, k.Line, k.Value, strings.Join(known, ", "))
		case out[k.Value] != nil:
			return nil, fmt.Errorf("%s:%d: key %q given twice", path, k.Line, k.Value)
		case v.Kind != yaml.ScalarNode:
			return nil, fmt.Errorf("%s:%d: %s: want a single value", path, v.Line, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}
