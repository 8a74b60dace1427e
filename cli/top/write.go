package top

import (
	"bufio"
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
// colour, no cursor movement) at most width columns wide (at least 80):
// a header line, then one line per flow. No column is marked sorted: the
// caller chose the order.
func WriteFlows(w io.Writer, l api.FlowList, width int) error {
	return writePlain(w, flowTable(l.Flows, ""), width)
}

// WritePeers prints l's peer pairs like WriteFlows.
func WritePeers(w io.Writer, l api.PeerList, width int) error {
	return writePlain(w, peerTable(l.Peers, ""), width)
}

func writePlain(w io.Writer, t *table, total int) error {
	total = max(total, minWidth)
	ws := t.layout(total)
	bw := bufio.NewWriter(w)
	put := func(s string) {
		// Trailing padding is noise to a script reading the lines.
		bw.WriteString(strings.TrimRight(truncate(s, total), " "))
		bw.WriteByte('\n')
	}
	put(t.header(ws))
	for i := range t.rows {
		put(t.line(&t.rows[i], ws, nil))
	}
	return bw.Flush()
}
