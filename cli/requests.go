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
	var rows [][]any
	for _, e := range l.Endpoints {
		rows = append(rows, []any{e.Endpoint, e.Requests, fmt.Sprintf("%.1f", e.ChildrenPerRequest), fmt.Sprintf("%.1f", e.CriticalTurns), ms(e.P50), ms(e.P99), e.Dominant})
	}
	table(w, "ENDPOINT\tREQUESTS\tCHILDREN/REQ\tCRIT TURNS/REQ\tP50\tP99\tDOMINANT HOP", rows, true)
	edgeTables(w, l, "ENDPOINT")
	rows = nil
	for _, r := range l.Recent {
		ep := r.Endpoint
		if r.Detached {
			ep += " (detached)"
		}
		rows = append(rows, []any{r.ID, ep, ms(r.Duration), r.Hops, r.CriticalTurns, r.Dominant})
	}
	table(w, "ID\tENDPOINT\tDURATION\tHOPS\tCRIT TURNS\tDOMINANT HOP", rows, false)
	s := l.Stats
	fmt.Fprintf(w, "\n%d requests; hops linked: %d by thread, %d by goroutine, %d by hand-off, %d by parent goroutine, %d by window; unlinked: %d ambiguous, %d orphaned, %d dropped, %d shed, %d truncated\n",
		s.Requests, s.Linked[record.LinkThread], s.Linked[record.LinkGoroutine], s.Linked[record.LinkHandoff], s.Linked[record.LinkGoParent], s.Linked[record.LinkWindow],
		s.Ambiguous, s.Orphaned, s.Dropped, s.Shed, s.Truncated)
	return nil
}

// writeRequestEdges writes what `flows` adds of the request trees.
func writeRequestEdges(w io.Writer, l api.RequestList) { edgeTables(w, l, "REQUESTS TO") }

// edgeTables writes per service edge under each root endpoint (its column
// headed endpoint) exchanges and turns per request, and per process the
// exchanges left ambiguous.
func edgeTables(w io.Writer, l api.RequestList, endpoint string) {
	var rows [][]any
	for _, e := range l.Edges {
		rows = append(rows, []any{e.Endpoint, e.From + " -> " + e.To, fmt.Sprintf("%.1f", e.ExchangesPerRequest), fmt.Sprintf("%.1f", e.TurnsPerRequest)})
	}
	table(w, endpoint+"\tEDGE\tEXCHANGES/REQ\tTURNS/REQ", rows, false)
	rows = nil
	for _, a := range l.Ambiguous {
		rows = append(rows, []any{a.Comm, a.PID, a.Exchanges})
	}
	table(w, "PROCESS\tPID\tAMBIGUOUS EXCHANGES", rows, false)
}

// table writes a header and its rows, tab-separated cells aligned; an
// empty table is left out, unless always, after a blank line when it is
// not the first.
func table(w io.Writer, header string, rows [][]any, always bool) {
	if len(rows) == 0 && !always {
		return
	}
	if !always {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// WriteTree draws one request's tree, a hop a line: its services, its
// span, and where its time went.
func WriteTree(w io.Writer, r *record.Request) {
	fmt.Fprintf(w, "request %s to %s: %s, %d hops, %d turns on the critical path, dominant %s\n", r.ID, r.Endpoint, ms(r.Duration), r.Hops, r.CriticalTurns, r.Dominant)
	if r.Detached {
		fmt.Fprintf(w, "detached: more than one request of %s could have made its first hop, so whose request this served is not known\n", r.Root.From)
	}
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
