// Command bench is `make bench`: it measures lattrace's cost, scale and
// accuracy side by side with an untraced baseline and the tools a user
// would otherwise run, and writes BENCHMARKS.md with its plots.
//
//	go run ./tests/bench/cmd/bench [--quick] [--sections rr,hooks,...] [--md BENCHMARKS.md]
package main

import (
	"os"

	"github.com/lattrace/lattrace/tests/bench"
)

func main() {
	// The load generator is this same binary, started by the benchmark in
	// a child process.
	bench.LoadgenMain()
	os.Exit(run(os.Args[1:]))
}
