// Package buildonce gives the tests a binary that a script builds, once
// per test process: the test servers (tests/otelcol, tests/kubeapi) each
// have a build.sh that builds their Go module into a cache keyed by its
// content (build.sh in this directory does the work) and prints the path.
//
//	var server = buildonce.New("kubeapi", "build.sh", "LATTRACE_KUBEAPI_BIN")
//	bin, err := server.Path()
package buildonce

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// A Binary is built by its script on the first call of Path.
type Binary struct {
	name   string // prefixes the errors
	script string // absolute
	env    string // names a prebuilt binary that replaces the script

	once sync.Once
	path string
	err  error
}

// New returns the binary script builds. script is relative to the
// directory of the source file that calls New; name prefixes the errors;
// the environment variable env, when set, is the path of a prebuilt
// binary, and the script does not run.
func New(name, script, env string) *Binary {
	b := &Binary{name: name, script: script, env: env}
	// The caller's source directory: tests run with their package
	// directory as working directory, programs (make bench) anywhere.
	if _, caller, _, ok := runtime.Caller(1); ok {
		b.script = filepath.Join(filepath.Dir(caller), script)
	} else {
		b.err = fmt.Errorf("%s: cannot locate %s (runtime.Caller failed)", name, script)
	}
	return b
}

// Path returns the path of the binary, running the script on the first
// call (once per process); a failed build's error holds the script's
// output.
func (b *Binary) Path() (string, error) {
	b.once.Do(func() {
		if p := os.Getenv(b.env); p != "" {
			b.path = p
			return
		}
		if b.err != nil {
			return
		}
		cmd := exec.Command("bash", b.script)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			b.err = fmt.Errorf("%s: %s failed: %v\n%s", b.name, b.script, err, stderr.String())
			return
		}
		b.path = strings.TrimSpace(string(out))
	})
	return b.path, b.err
}
