package top

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/lattrace/lattrace/daemon/api"
)

// minWidth and minHeight are the smallest terminal the live view draws in;
// the plain table is never laid out narrower than minWidth either.
const (
	minWidth  = 80
	minHeight = 24
)

// WriteFlows prints l's flows, in their order, as a plain table (no
// colour, no cursor movement): a header line, then one line per flow, or
// "(none)", and "(N more not shown)" when l.Total says a limit left some
// out. width (at least 80) decides which optional columns show; ids,
// addresses, process and diagnosis names are never cut, so a line may be
// wider. No column is marked sorted: the caller chose the order.
func WriteFlows(w io.Writer, l api.FlowList, width int) error {
	return writePlain(w, flowTable(l.Flows, ""), width, l.Total-len(l.Flows))
}

// WritePeers prints l's peer pairs like WriteFlows.
func WritePeers(w io.Writer, l api.PeerList, width int) error {
	return writePlain(w, peerTable(l.Peers, ""), width, l.Total-len(l.Peers))
}

// WriteRequests prints l's recent requests that f keeps, newest first,
// like WriteFlows: ID, endpoint ("(detached)" after it when whose request
// it served is not known), duration, hops, turns on the critical path and
// the dominant hop. Without trees in l (asked without them, or none yet)
// it prints "(none)". f is applied as the requests view applies it: a
// request passes when one of its hops does, free text also matching its
// id, endpoint and service names.
func WriteRequests(w io.Writer, l api.RequestList, f api.Filter, width int) error {
	return writePlain(w, requestTable(requestRows(l.Recent, f)), width, 0)
}

func writePlain(w io.Writer, t *table, total, more int) error {
	ws := t.layout(max(total, minWidth), true)
	bw := bufio.NewWriter(w)
	put := func(s string) {
		// Trailing padding is noise to a script reading the lines.
		bw.WriteString(strings.TrimRight(s, " "))
		bw.WriteByte('\n')
	}
	put(t.header(ws))
	for i := range t.rows {
		put(t.line(&t.rows[i], ws, nil))
	}
	if len(t.rows) == 0 {
		put("(none)")
	}
	if more > 0 {
		put(fmt.Sprintf("(%d more not shown)", more))
	}
	return bw.Flush()
}
