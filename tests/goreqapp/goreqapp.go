// Package goreqapp gives the tests a Go application that answers each HTTP
// request with PostgreSQL queries and redis calls (module ./app: net/http,
// database/sql with lib/pq, go-redis v9), built once by build.sh.
//
//	LATTRACE_GOREQAPP_BIN=/path   use this binary instead of running build.sh
package goreqapp

import "github.com/lattrace/lattrace/tests/buildonce"

var binary = buildonce.New("goreqapp", "build.sh", "LATTRACE_GOREQAPP_BIN")

// Binary returns the path of the goreqapp binary, building it on first use
// (once per test process).
func Binary() (string, error) { return binary.Path() }
