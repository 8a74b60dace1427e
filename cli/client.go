package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/api"
)

// apiEnv names the daemon's API for every client command when --api is
// not given.
const apiEnv = "LATTRACE_API"

// apiFlag adds --api to a client command; target tells where it points.
func apiFlag(cmd *cobra.Command) (target func() string, explicit func() bool) {
	var addr string
	cmd.Flags().StringVar(&addr, "api", "", "the daemon's API: a socket path or loopback host:port (default $"+apiEnv+", else "+api.DefaultSocket+")")
	target = func() string {
		switch {
		case addr != "":
			return addr
		case os.Getenv(apiEnv) != "":
			return os.Getenv(apiEnv)
		}
		return api.DefaultSocket
	}
	// Only the flag is a demand: $LATTRACE_API sets where to look first,
	// and top may still trace in-process when nothing answers there.
	explicit = func() bool { return addr != "" }
	return target, explicit
}

// clientError turns the API client's errors into the line a person needs.
func clientError(err error, target string) error {
	switch {
	case errors.Is(err, api.ErrNoDaemon):
		return fmt.Errorf("no lattrace daemon at %s: start one with `sudo lattrace daemon` (or deploy the DaemonSet), or run `sudo lattrace top`, which traces in-process", target)
	case errors.Is(err, api.ErrPermission):
		return fmt.Errorf("permission denied: the API socket %s is root-only (mode 0600); run as root (sudo)", target)
	}
	return err
}

// terminal reports whether fd is a terminal, and its size.
func terminal(f *os.File) (ok bool, width, height int) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return false, 0, 0
	}
	return true, int(ws.Col), int(ws.Row)
}

// tableWidth is the width plain tables are written to: the terminal's,
// else $COLUMNS, else wide enough for every column.
func tableWidth(f *os.File) int {
	if ok, w, _ := terminal(f); ok && w > 0 {
		return max(w, 80)
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return max(n, 80)
	}
	return 160
}
