// Command lattrace is the single binary: daemon, live views and tools.
package main

import (
	"os"

	"github.com/lattrace/lattrace/cli"
)

func main() {
	os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
}
