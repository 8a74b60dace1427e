// Command bench is `make bench`: it measures lattrace's cost, scale and
// accuracy side by side with an untraced baseline and the tools a user
// would otherwise run, and writes BENCHMARKS.md with its plots.
//
//	go run ./tests/bench/cmd/bench [--quick] [--sections rr,hooks,...] [--md BENCHMARKS.md]
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/lattrace/lattrace/tests/bench"
)

func main() {
	// The load generator is this same binary, started by the benchmark in
	// a child process.
	if len(os.Args) == 3 && os.Args[1] == "loadgen" {
		var cfg bench.LoadConfig
		if err := json.Unmarshal([]byte(os.Args[2]), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, "bench loadgen:", err)
			os.Exit(2)
		}
		if err := bench.RunLoad(cfg, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench loadgen:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run(os.Args[1:]))
}
