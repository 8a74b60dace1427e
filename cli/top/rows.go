package top

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/record"
)

// sortColumn names the column sort key orders by; "" marks none.
func sortColumn(key string) string {
	switch key {
	case "retrans":
		return "retr"
	case "exchanges":
		return "exch"
	}
	return key
}

// Columns both lists share, after the ones naming the row.
func metricColumns(sortKey string) []column {
	return []column{
		{name: "rate", titles: []string{"EX/S"}, right: true},
		{name: "p50", titles: []string{"P50"}, right: true},
		{name: "p99", titles: []string{"P99"}, right: true},
		{name: "retr", titles: []string{"RETR"}, right: true},
		{name: "turns", titles: []string{"TURNS"}, right: true},
		// The exchange count has no room at 80 columns unless it is what
		// the rows are sorted by.
		{name: "exch", titles: []string{"EXCH"}, right: true, optional: sortKey != "exchanges"},
	}
}

func splitColumns() []column {
	return []column{
		{name: "bar", titles: []string{"SPLIT"}, bar: true, barWant: 10, grow: 30},
		{name: "dom", titles: []string{""}},
		{name: "diag", titles: []string{"DIAGNOSIS", "DIAG"}},
	}
}

// metricCells are the cells of metricColumns.
func metricCells(m *aggregate.Metrics, rate float64) [][]string {
	return [][]string{
		{fmtRate(rate)},
		{durOrDash(m, m.Duration.P50)},
		{durOrDash(m, m.Duration.P99)},
		{fmtCount(m.Retransmits)},
		{strconv.FormatFloat(m.Turns.PerExchangeMean, 'f', 1, 64)},
		{fmtCount(m.Exchanges)},
	}
}

// diagCell names the finding that explains the most latency.
func diagCell(d []record.Diagnosis) []string {
	if len(d) == 0 {
		return []string{"-"}
	}
	return []string{sanitize(string(d[0].Name))}
}

// flowTable lays out flows, in the order given.
func flowTable(flows []api.Flow, sortKey string) *table {
	t := &table{sortCol: sortColumn(sortKey)}
	t.cols = append(t.cols,
		column{name: "id", titles: []string{"ID"}},
		column{name: "proc", titles: []string{"PROCESS", "PROC"}},
		column{name: "addr", titles: []string{"LOCAL -> REMOTE", "REMOTE"}, middle: true},
	)
	t.cols = append(t.cols, metricColumns(sortKey)...)
	t.cols = append(t.cols,
		column{name: "srtt", titles: []string{"SRTT"}, right: true, optional: true},
		column{name: "cwnd", titles: []string{"CWND"}, right: true, optional: true},
	)
	t.cols = append(t.cols, splitColumns()...)
	t.stages = []stage{
		{"diag", 12}, {"addr", 24}, {"proc", 12}, {"bar", 6}, {"dom", 0},
		{"diag", 9}, {"addr", 15}, {"proc", 8}, {"bar", 4}, {"diag", 6},
		{"addr", 12}, {"proc", 6}, {"id", 6}, {"bar", 2}, {"diag", 3},
		{"addr", 8}, {"proc", 4}, {"id", 4},
	}
	for i := range flows {
		t.rows = append(t.rows, flowRow(&flows[i]))
	}
	return t
}

func flowRow(f *api.Flow) tableRow {
	m := &f.Metrics
	cells := [][]string{{sanitize(f.ID)}, processCell(f.Owner), addrCell(f.Flow)}
	cells = append(cells, metricCells(m, f.Rate)...)
	cells = append(cells, []string{durOrZero(m.RTT.SRTTLast)}, []string{fmtCwnd(m.Cwnd.Last)})
	cells = append(cells, nil, dominantLabels(f.Split), diagCell(f.Diagnoses))
	return tableRow{id: f.ID, cells: cells, split: f.Split}
}

// processCell shows the owner; the pid is what goes first when it is
// narrow, the name being what a person recognises.
func processCell(o record.Owner) []string {
	comm := sanitize(o.Comm)
	if comm == "" {
		comm = "?"
	}
	if o.PID == 0 {
		return []string{comm}
	}
	return []string{fmt.Sprintf("%s %d", comm, o.PID), comm}
}

// addrCell gives up the local address before the local port, and both
// before the remote end, which is what a flow is mostly known by.
func addrCell(f record.Flow) []string {
	l, r := fmtAddrPort(f.Local), fmtAddrPort(f.Remote)
	return []string{
		l + " -> " + r,
		fmt.Sprintf(":%d -> %s", f.Local.Port(), r),
		r,
	}
}

// peerTable lays out peer pairs, in the order given.
func peerTable(peers []api.Peer, sortKey string) *table {
	t := &table{sortCol: sortColumn(sortKey)}
	t.cols = append(t.cols,
		column{name: "id", titles: []string{"ID"}},
		column{name: "proc", titles: []string{"PROCESS", "PROC"}},
		column{name: "remote", titles: []string{"SIDE REMOTE", "REMOTE"}, middle: true},
	)
	t.cols = append(t.cols, metricColumns(sortKey)...)
	t.cols = append(t.cols,
		column{name: "conns", titles: []string{"CONNS"}, right: true, optional: true},
	)
	t.cols = append(t.cols, splitColumns()...)
	t.stages = []stage{
		{"diag", 12}, {"remote", 24}, {"proc", 10}, {"bar", 6}, {"dom", 0},
		{"diag", 9}, {"remote", 16}, {"id", 10}, {"proc", 7}, {"bar", 4},
		{"diag", 6}, {"remote", 13}, {"id", 8}, {"proc", 5}, {"bar", 2},
		{"diag", 3}, {"remote", 8}, {"id", 5},
	}
	for i := range peers {
		t.rows = append(t.rows, peerRow(&peers[i]))
	}
	return t
}

func peerRow(p *api.Peer) tableRow {
	m := &p.Metrics
	comm := sanitize(p.Comm)
	if comm == "" {
		comm = "?"
	}
	cells := [][]string{{sanitize(p.ID)}, {comm}, sideRemoteCell(p.PeerKey)}
	cells = append(cells, metricCells(m, p.Rate)...)
	cells = append(cells, []string{fmtCount(p.Connections)})
	cells = append(cells, nil, dominantLabels(p.Split), diagCell(p.Diagnoses))
	return tableRow{id: p.ID, cells: cells, split: p.Split}
}

// sideRemoteCell says which end the local program is: a client names the
// service it calls, a server its own port and who calls it.
func sideRemoteCell(k aggregate.PeerKey) []string {
	switch k.Side {
	case record.RoleServer:
		s := fmt.Sprintf(":%d <- %s", k.LocalPort, fmtAddr(k.Remote))
		return []string{"server " + s, s}
	case record.RoleClient:
		r := remoteEndpoint(k)
		return []string{"client -> " + r, "-> " + r, r}
	}
	return []string{fmt.Sprintf("%s %s", k.Side, remoteEndpoint(k)), remoteEndpoint(k)}
}

func remoteEndpoint(k aggregate.PeerKey) string {
	if !k.Remote.IsValid() {
		return "-"
	}
	return fmtAddrPort(netip.AddrPortFrom(k.Remote, k.RemotePort))
}

// durOrZero prints a duration the kernel reports as zero when unmeasured.
func durOrZero(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmtDur(d)
}

// fmtCwnd prints a window in segments; zero is "not read".
func fmtCwnd(n uint32) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(uint64(n), 10)
}
