package top

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/record"
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

// Columns both lists share, after the ones naming the row. None of them
// is ever narrowed: a number is shown whole or not at all.
func metricColumns() []column {
	return []column{
		{name: "rate", titles: []string{"EX/S"}, right: true},
		{name: "p50", titles: []string{"P50"}, right: true},
		{name: "p99", titles: []string{"P99"}, right: true},
		{name: "retr", titles: []string{"RETR"}, right: true},
		{name: "turns", titles: []string{"TURNS"}, right: true},
		{name: "exch", titles: []string{"EXCH"}, right: true},
	}
}

func splitColumns() []column {
	return []column{
		{name: "bar", titles: []string{"SPLIT"}, bar: true, barWant: 10, grow: 30},
		// The label's short form is for the screen: plain output
		// spells the part out.
		{name: "dom", titles: []string{""}, whole: true},
		{name: "diag", titles: []string{"DIAGNOSIS", "DIAG"}, whole: true},
	}
}

// lastResort are the stages once everything of less value is gone: the
// least telling numbers, then the address is cut in its middle. Only an
// address or an id far longer than usual gets there at 80 columns.
func lastResort(addr string) []stage {
	return []stage{hideCol("bar"), hideCol("turns"), hideCol("retr"), hideCol("rate"), cutTo(addr, 8)}
}

// withoutSortDrop keeps the column the rows are sorted by on screen: it
// is what the person asked to see.
func withoutSortDrop(stages []stage, sortCol string) []stage {
	out := stages[:0]
	for _, s := range stages {
		if !(s.drop && s.col == sortCol) {
			out = append(out, s)
		}
	}
	return out
}

// metricCells are the cells of metricColumns. Without a complete exchange
// the quantiles and turns are of cut-short exchanges: not shown.
func metricCells(m *aggregate.Metrics, rate float64) [][]string {
	turns := "-"
	if hasTiming(m) {
		turns = strconv.FormatFloat(m.Turns.PerExchangeMean, 'f', 1, 64)
	}
	return [][]string{
		{fmtRate(rate)},
		{durOrDash(m, m.Duration.P50)},
		{durOrDash(m, m.Duration.P99)},
		{fmtCount(m.Retransmits)},
		{turns},
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

// flowDiagCell is diagCell, or for a flow with nothing to say yet and a
// transfer under way, how far it has got: a running upload is what a
// person looks for after a bufferbloat finding.
func flowDiagCell(f *api.Flow) []string {
	if in := f.InFlight; len(f.Diagnoses) == 0 && in != nil && in.Start != 0 && in.BytesOut+in.BytesIn >= 64<<10 {
		return []string{"moving " + fmtBytes(in.BytesOut+in.BytesIn)}
	}
	return diagCell(f.Diagnoses)
}

// flowTable lays out flows, in the order given. The id is never
// narrowed: it is what `lattrace explain` takes. Below it, the address
// gives up the local end before anything cuts the remote one.
func flowTable(flows []api.Flow, sortKey string) *table {
	t := &table{sortCol: sortColumn(sortKey)}
	t.cols = append(t.cols,
		column{name: "id", titles: []string{"ID"}, whole: true},
		column{name: "proc", titles: []string{"PROCESS", "PROC"}, whole: true},
		column{name: "addr", titles: []string{"LOCAL -> REMOTE", "LOCAL -> REMOTE", "REMOTE"}, middle: true, whole: true},
	)
	t.cols = append(t.cols, metricColumns()...)
	t.cols = append(t.cols,
		column{name: "srtt", titles: []string{"SRTT"}, right: true},
		column{name: "cwnd", titles: []string{"CWND"}, right: true},
	)
	t.cols = append(t.cols, splitColumns()...)
	// The exchange count has no room at 80 columns unless it is what
	// the rows are sorted by.
	t.stages = withoutSortDrop(append([]stage{
		dropCol("cwnd"), dropCol("srtt"), dropCol("exch"),
		cutTo("diag", 12), cutTo("proc", 12), shrinkTo("bar", 6), shrinkTo("addr", 24), shrinkTo("dom", 0),
		cutTo("diag", 9), shrinkTo("addr", 0), cutTo("proc", 8), shrinkTo("bar", 5),
		cutTo("diag", 6), cutTo("proc", 6),
		hideCol("diag"), hideCol("dom"), hideCol("proc"),
	}, lastResort("addr")...), t.sortCol)
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
	cells = append(cells, nil, dominantLabels(f.Split), flowDiagCell(f))
	return tableRow{id: f.ID, cells: cells, split: f.Split}
}

// processCell shows the owner; the pid is what goes first when it is
// narrow, the name being what a person recognises.
func processCell(o record.Owner) []string {
	comm := sanitize(o.Comm)
	if comm == "" {
		comm = "?"
	}
	var cells []string
	// In a cluster the pod says more than the pid; kept while there is room.
	if k := o.K8s; k != nil && k.Pod != "" {
		cells = append(cells, fmt.Sprintf("%s %s/%s", comm, sanitize(k.Namespace), sanitize(k.Pod)))
	}
	if o.PID == 0 {
		return append(cells, comm)
	}
	return append(cells, fmt.Sprintf("%s %d", comm, o.PID), comm)
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

// peerTable lays out peer pairs, in the order given. Pairs that differ
// only by their namespace tell apart by the NETNS column, which gives way
// only below 100 columns or so.
func peerTable(peers []api.Peer, sortKey string) *table {
	t := &table{sortCol: sortColumn(sortKey)}
	t.cols = append(t.cols,
		column{name: "id", titles: []string{"ID"}, whole: true},
		column{name: "proc", titles: []string{"PROCESS", "PROC"}, whole: true},
		column{name: "remote", titles: []string{"SIDE REMOTE", "REMOTE"}, middle: true, whole: true},
	)
	t.cols = append(t.cols, metricColumns()...)
	t.cols = append(t.cols,
		column{name: "netns", titles: []string{"NETNS"}, right: true},
		column{name: "conns", titles: []string{"CONNS"}, right: true},
	)
	t.cols = append(t.cols, splitColumns()...)
	t.stages = withoutSortDrop(append([]stage{
		dropCol("exch"), dropCol("conns"),
		cutTo("diag", 12), cutTo("proc", 10), shrinkTo("bar", 6), shrinkTo("dom", 0),
		cutTo("diag", 9), cutTo("proc", 7), shrinkTo("bar", 5), cutTo("diag", 6), cutTo("proc", 5),
		hideCol("diag"), hideCol("dom"), dropCol("netns"), hideCol("proc"),
	}, lastResort("remote")...), t.sortCol)
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
	cells = append(cells, []string{strconv.FormatUint(uint64(p.Netns), 10)}, []string{fmtCount(p.Connections)})
	cells = append(cells, nil, dominantLabels(p.Split), diagCell(p.Diagnoses))
	return tableRow{id: p.ID, cells: cells, split: p.Split}
}

// sideRemoteCell says which end the local program is: a client names the
// service it calls, a server its own port and who calls it. The side word
// stays at every width: without it a server's caller reads as a service.
func sideRemoteCell(k record.PeerKey) []string {
	switch k.Side {
	case record.RoleServer:
		return []string{fmt.Sprintf("server :%d <- %s", k.LocalPort, fmtAddr(k.Remote))}
	case record.RoleClient:
		return []string{"client -> " + remoteEndpoint(k)}
	}
	side := sanitize(string(k.Side))
	if side == "" {
		side = string(record.RoleUnknown)
	}
	return []string{side + " " + remoteEndpoint(k)}
}

func remoteEndpoint(k record.PeerKey) string {
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
