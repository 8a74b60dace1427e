package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/record"
)

func newRequests() *cobra.Command {
	var asJSON, trees bool
	cmd := &cobra.Command{
		Use:   "requests [ID]",
		Short: "requests across services: per root endpoint, per service edge, and one request's tree",
		Long: `requests lists what the daemon's request trees show: each root endpoint's
requests, children per request, turns on the critical path, p50/p99 and the
hop that dominates; per service edge, exchanges and turns per root request;
per process, outbound exchanges left ambiguous. With an ID (from --trees),
one request's tree, each hop's network, transport and think time.`,
		Args: cobra.MaximumNArgs(1),
	}
	target, _ := apiFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON (schema: docs/api.md)")
	cmd.Flags().BoolVar(&trees, "trees", false, "list the recent requests too")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := api.NewClient(target())
		if err != nil {
			return usageError{err}
		}
		out := cmd.OutOrStdout()
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if len(args) == 1 {
			d, err := c.Request(cmd.Context(), args[0])
			if err != nil {
				return clientError(err, target())
			}
			if asJSON {
				return enc.Encode(d)
			}
			WriteTree(out, d.Request)
			return nil
		}
		l, err := c.Requests(cmd.Context(), trees)
		if err != nil {
			return clientError(err, target())
		}
		if asJSON {
			return enc.Encode(l)
		}
		return writeRequests(out, l, tableWidth(os.Stdout))
	}
	return cmd
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func writeRequests(w io.Writer, l api.RequestList, _ int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tREQUESTS\tCHILDREN/REQ\tCRIT TURNS/REQ\tP50\tP99\tDOMINANT HOP")
	for _, e := range l.Endpoints {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%s\t%s\t%s\n", e.Endpoint, e.Requests, e.ChildrenPerRequest, e.CriticalTurns, ms(e.P50), ms(e.P99), e.Dominant)
	}
	tw.Flush()
	if len(l.Edges) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ENDPOINT\tEDGE\tEXCHANGES/REQ\tTURNS/REQ")
		for _, e := range l.Edges {
			fmt.Fprintf(tw, "%s\t%s -> %s\t%.1f\t%.1f\n", e.Endpoint, e.From, e.To, e.ExchangesPerRequest, e.TurnsPerRequest)
		}
		tw.Flush()
	}
	if len(l.Ambiguous) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PROCESS\tPID\tAMBIGUOUS EXCHANGES")
		for _, a := range l.Ambiguous {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", a.Comm, a.PID, a.Exchanges)
		}
		tw.Flush()
	}
	if len(l.Recent) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tENDPOINT\tDURATION\tHOPS\tCRIT TURNS\tDOMINANT HOP")
		for _, r := range l.Recent {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", r.ID, r.Endpoint, ms(r.Duration), r.Hops, r.CriticalTurns, r.Dominant)
		}
		tw.Flush()
	}
	s := l.Stats
	fmt.Fprintf(w, "\n%d requests; hops linked: %d by thread, %d by goroutine, %d by hand-off, %d by parent goroutine, %d by window; unlinked: %d ambiguous, %d orphaned, %d dropped, %d truncated\n",
		s.Requests, s.Linked[record.LinkThread], s.Linked[record.LinkGoroutine], s.Linked[record.LinkHandoff], s.Linked[record.LinkGoParent], s.Linked[record.LinkWindow],
		s.Ambiguous, s.Orphaned, s.Dropped, s.Truncated)
	return nil
}

// WriteTree draws one request's tree, a hop a line: its services, its
// span, and where its time went.
func WriteTree(w io.Writer, r *record.Request) {
	fmt.Fprintf(w, "request %s to %s: %s, %d hops, %d turns on the critical path, dominant %s\n", r.ID, r.Endpoint, ms(r.Duration), r.Hops, r.CriticalTurns, r.Dominant)
	var walk func(h *record.Hop, depth int)
	walk = func(h *record.Hop, depth int) {
		mark := " "
		if h.Critical || depth == 0 {
			mark = "*"
		}
		fmt.Fprintf(w, "%s %*s%s -> %s  %s  network %s  transport %s  think %s  waiting on children %s",
			mark, 2*depth, "", h.From, h.To, ms(h.Duration), ms(h.Network), ms(h.Transport), ms(h.Think), ms(h.ChildWait))
		if h.Link != "" {
			fmt.Fprintf(w, "  (linked by %s)", h.Link)
		}
		fmt.Fprintln(w)
		for _, c := range h.Children {
			walk(c, depth+1)
		}
	}
	walk(r.Root, 0)
	if r.Truncated > 0 {
		fmt.Fprintf(w, "%d more hops not kept\n", r.Truncated)
	}
}
