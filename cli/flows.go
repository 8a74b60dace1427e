package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/cli/top"
	"github.com/lattrace/lattrace/daemon/api"
)

// listFlags are the selection flags `flows` and `top` share.
type listFlags struct {
	sort   string
	filter string
	peers  bool
}

func (l *listFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&l.sort, "sort", api.DefaultSort, "order, largest first: "+strings.Join(api.SortKeys, ", "))
	f.StringVar(&l.filter, "filter", "", `keep matching rows: "comm:NAME pid:N port:N addr:IP[/BITS] netns:INODE container:ID" or free text`)
	f.BoolVar(&l.peers, "peers", false, "peer pairs instead of flows")
}

func (l *listFlags) query() (api.Query, error) {
	if !slices.Contains(api.SortKeys, l.sort) {
		return api.Query{}, usageError{fmt.Errorf("--sort %q: want one of %s", l.sort, strings.Join(api.SortKeys, ", "))}
	}
	flt, err := api.ParseFilter(l.filter)
	if err != nil {
		return api.Query{}, usageError{fmt.Errorf("--filter: %w", err)}
	}
	if l.peers && flt.PID != 0 {
		return api.Query{}, usageError{fmt.Errorf("--filter pid: a peer pair has no single process; filter pairs by comm, or list flows")}
	}
	return api.Query{Sort: l.sort, Filter: flt}, nil
}

func newFlows() *cobra.Command {
	var lf listFlags
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "flows",
		Short: "list the flows (or peer pairs) the daemon sees, once, as a table or JSON",
		Args:  cobra.NoArgs,
	}
	target, _ := apiFlag(cmd)
	lf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON (schema: docs/api.md)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many rows (0: all)")
	var q api.Query
	var c *api.Client
	cmd.PreRunE = func(*cobra.Command, []string) error {
		var err error
		if q, err = lf.query(); err != nil {
			return err
		}
		if limit < 0 {
			return usageError{fmt.Errorf("--limit %d is negative", limit)}
		}
		q.Limit = limit
		if c, err = api.NewClient(target()); err != nil {
			return usageError{err}
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var err error
		if lf.peers {
			err = printList(cmd, c.Peers, q, asJSON, top.WritePeers, target())
		} else {
			err = printList(cmd, c.Flows, q, asJSON, top.WriteFlows, target())
		}
		if err != nil || asJSON {
			return err
		}
		// Where the daemon makes request trees, the service edges' turns
		// per request and the processes' ambiguous exchanges follow.
		if l, err := c.Requests(cmd.Context(), false); err == nil {
			writeRequestEdges(cmd.OutOrStdout(), l)
		}
		return nil
	}
	return cmd
}

// printList asks the daemon for one list and prints it: the API's JSON,
// or the table write draws.
func printList[L any](cmd *cobra.Command, get func(context.Context, api.Query) (L, error), q api.Query,
	asJSON bool, write func(io.Writer, L, int) error, target string) error {
	l, err := get(cmd.Context(), q)
	if err != nil {
		return clientError(err, target)
	}
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	return write(out, l, tableWidth(os.Stdout))
}
