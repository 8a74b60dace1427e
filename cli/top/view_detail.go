package top

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

// A detail is drawn top-down in the order a person reads it: what it is,
// how fast, where the time goes, what is wrong, then the recent evidence
// (a flow's last exchanges, a pair's flows), which gets the lines left.

// The diagnoses and the closing table share the lines left: the table
// keeps minTableRows so the evidence never vanishes behind long
// summaries, the diagnoses minDiagLines so the finding never does.
const (
	minTableRows = 3
	minDiagLines = 2
)

func (m *model) detailBody(d *detail, h int) []string {
	if d.kind == ViewRequests {
		return m.requestBody(d, h)
	}
	if d.kind == ViewPeers {
		head, diags, tableH := m.peerSections(d, h)
		t := flowTable(d.flows, api.DefaultSort)
		empty := "no live flows in this pair"
		if !d.fetched {
			empty = "loading…"
		}
		return append(append(head, diags...), m.tableLines(t, &d.cur, tableH, empty)...)
	}
	return m.flowBody(d, h)
}

func (m *model) flowBody(d *detail, h int) []string {
	f := &d.flow
	w := m.width
	sparks := m.sparkLines(d, w)
	tableMin := 1 + min(len(d.recent), minTableRows)
	head, diags := m.fitDiags(m.identity(flowIdentity(d), w), metricLines(&f.Metrics, f.Rate, w),
		m.splitLines(f.Split, f.ComponentMeans, w), m.diagLines(&f.Metrics, f.Diagnoses, w), h-len(sparks)-tableMin)
	lines := append(append(head, diags...), sparks...)
	return append(lines, recentLines(d, w, h-len(lines))...)
}

// peerSections are a pair's lines above its flows, and the lines left for
// the flows' table (titles included).
func (m *model) peerSections(d *detail, h int) (head, diags []string, tableH int) {
	p := &d.peer
	w := m.width
	tableMin := 1 + max(min(len(d.flows), minTableRows), 1)
	head, diags = m.fitDiags(m.identity(peerIdentity(p), w), metricLines(&p.Metrics, p.Rate, w),
		m.splitLines(p.Split, p.ComponentMeans, w), m.diagLines(&p.Metrics, p.Diagnoses, w), h-tableMin)
	return head, diags, h - len(head) - len(diags)
}

// peerFlowRows is how many of a pair's flows fit on screen.
func (m *model) peerFlowRows(d *detail) int {
	if m.width < minWidth || m.height < minHeight {
		return 1
	}
	_, _, tableH := m.peerSections(d, m.bodyHeight())
	return max(tableH-1, 1)
}

// fitDiags puts the head (identity, numbers, split) over the diagnoses in
// room lines. When the diagnoses would be cut, the numbers give up their
// third line first: a finding matters more than the srtt.
func (m *model) fitDiags(ident, nums, split, diags []string, room int) (head, shown []string) {
	if len(nums) > 2 && len(ident)+len(nums)+len(split)+len(diags) > room {
		nums = nums[:2]
	}
	head = slices.Concat(ident, nums, split)
	return head, limit(diags, max(room-len(head), minDiagLines), m.st.dim.Render("…"))
}

// limit keeps at most n lines, the last of them saying some were cut.
func limit(lines []string, n int, more string) []string {
	switch {
	case len(lines) <= n:
		return lines
	case n <= 0:
		return nil
	}
	return append(lines[:n-1:n-1], more)
}

// identity draws what the entry is in at most two bold lines.
func (m *model) identity(items []string, w int) []string {
	lines := wrapItems(items, " · ", w)
	lines = lines[:min(len(lines), 2)]
	for i := range lines {
		lines[i] = m.st.title.Render(lines[i])
	}
	return lines
}

func flowIdentity(d *detail) []string {
	f := &d.flow
	items := []string{
		"flow " + sanitize(f.ID),
		processDesc(f.Owner),
		roleDesc(f.ConnRole, f.RoleSource),
		addrCell(f.Flow)[0],
		fmt.Sprintf("netns %d", f.Flow.Netns),
	}
	if f.HTTP2Framing != "" {
		items = append(items, "HTTP/2 framing "+http2FramingDesc[f.HTTP2Framing])
	}
	if f.Owner.ContainerID != "" {
		items = append(items, "container "+sanitize(f.Owner.ContainerID))
	}
	if f.PeerID != "" {
		items = append(items, "pair "+sanitize(f.PeerID))
	}
	if in := f.InFlight; in != nil && in.Start != 0 {
		items = append(items, fmt.Sprintf("in progress %s: %s out, %s in", fmtAge(d.now.Sub(in.Start)), fmtBytes(in.BytesOut), fmtBytes(in.BytesIn)))
	}
	if f.Close != nil {
		closed := "closed"
		if d.now != 0 && d.now >= f.Close.Time {
			closed += " " + fmtAge(d.now.Sub(f.Close.Time)) + " ago"
		}
		items = append(items, closed)
	}
	return items
}

// roleDesc is a connection end's role and, on a connection open before
// lattrace started, how it was told.
func roleDesc(r record.Role, from record.RoleSource) string {
	switch from {
	case record.RoleFromListener:
		return "role " + string(r) + " (open before lattrace: from the listening sockets)"
	case record.RoleGuessed:
		return "role guessed from the ports (open before lattrace; no latency samples)"
	}
	return "role " + string(r)
}

// http2FramingDesc says how a flow's HTTP/2 framing was found.
var http2FramingDesc = map[string]string{
	aggregate.HTTP2FromPreface: "from its preface",
	aggregate.HTTP2FoundMidway: "found mid-way (open before lattrace)",
	aggregate.HTTP2Searching:   "being looked for (open before lattrace; no latency samples yet)",
	aggregate.HTTP2NotFound:    "not found (open before lattrace): the connection's own exchanges",
}

func processDesc(o record.Owner) string {
	cells := processCell(o)
	comm := cells[len(cells)-1] // the narrowest is the name alone
	desc := comm
	if o.PID != 0 {
		desc = fmt.Sprintf("%s pid %d", comm, o.PID)
	}
	if k := o.K8s; k != nil && k.Pod != "" {
		desc += fmt.Sprintf(", pod %s/%s", sanitize(k.Namespace), sanitize(k.Pod))
		if k.Workload != "" {
			desc += fmt.Sprintf(" (%s %s)", strings.ToLower(k.WorkloadKind), sanitize(k.Workload))
		}
	}
	return desc
}

func peerIdentity(p *api.Peer) []string {
	items := []string{
		"peer " + sanitize(p.ID),
		sanitize(p.Comm),
		sideRemoteCell(p.PeerKey)[0],
		fmt.Sprintf("netns %d", p.Netns),
		fmt.Sprintf("cgroup %d", p.CgroupID),
		count(p.Connections, "connection"),
	}
	if c := p.ConnectLatency; c.Count > 0 {
		items = append(items, fmt.Sprintf("connect p50 %s p99 %s", fmtDur(c.P50), fmtDur(c.P99)))
	}
	return items
}

// metricLines are the numbers of the whole flow or pair, in three lines
// at most, the ones that say most first: what does not fit is left out.
func metricLines(m *aggregate.Metrics, rate float64, w int) []string {
	ex := count(m.Exchanges, "exchange")
	if m.Partial > 0 {
		ex += fmt.Sprintf(" (%d partial)", m.Partial)
	}
	if m.Unanswered > 0 {
		ex += fmt.Sprintf(" (%d unanswered)", m.Unanswered)
	}
	if m.Multiplexed > 0 {
		ex += fmt.Sprintf(" (%d multiplexed)", m.Multiplexed)
	}
	if m.Pushes > 0 {
		ex += fmt.Sprintf(" (%d pushed)", m.Pushes)
	}
	items := []string{
		ex,
		fmtRate(rate) + "/s",
		"p50 " + durOrDash(m, m.Duration.P50),
		"p90 " + durOrDash(m, m.Duration.P90),
		"p99 " + durOrDash(m, m.Duration.P99),
		"max " + durOrDash(m, m.Duration.Max),
		"mean " + durOrDash(m, m.Duration.Mean),
		count(m.Retransmits, "retransmit"),
	}
	if m.RTOs > 0 {
		items = append(items, count(m.RTOs, "timeout"))
	}
	items = append(items, turnItems(&m.Turns, hasTiming(m))...)
	if t := transferItem(m.Out, m.In); t != "" {
		items = append(items, t)
	}
	if m.Cwnd.Last > 0 {
		items = append(items, fmt.Sprintf("cwnd %d (%d..%d)", m.Cwnd.Last, m.Cwnd.Min, m.Cwnd.Max))
	}
	if m.RTT.SRTTLast > 0 {
		items = append(items, "srtt "+fmtDur(m.RTT.SRTTLast))
	}
	if m.RTT.Min > 0 {
		items = append(items, "min rtt "+fmtDur(m.RTT.Min))
	}
	items = append(items, fmt.Sprintf("out %s in %s", fmtBytes(m.Out.Bytes), fmtBytes(m.In.Bytes)))
	lines := wrapItems(items, " · ", w)
	return lines[:min(len(lines), 3)]
}

// turnItems are the turns per exchange and, when the exchanges come in
// bursts of more than one, per burst: what distance multiplies when an
// application makes several calls for one of its own requests. Turns of
// exchanges whose start was missed are cut short: not shown.
func turnItems(t *aggregate.Turns, timed bool) []string {
	if !timed {
		return nil
	}
	items := []string{fmt.Sprintf("%.1f turns/exchange (max %d)", t.PerExchangeMean, t.PerExchangeMax)}
	if t.Bursts > 0 && t.ExchangesPerBurstMean > 1 {
		items = append(items, fmt.Sprintf("%.1f exchanges / %.1f turns per burst", t.ExchangesPerBurstMean, t.PerBurstMean))
	}
	return items
}

// transferItem is the rate of the large messages each way that had any:
// what the path carried when asked to carry much.
func transferItem(out, in aggregate.Direction) string {
	var parts []string
	if out.Transfers > 0 {
		parts = append(parts, "out "+fmtByteRate(out.TransferRate))
	}
	if in.Transfers > 0 {
		parts = append(parts, "in "+fmtByteRate(in.TransferRate))
	}
	if len(parts) == 0 {
		return ""
	}
	return "transfers " + strings.Join(parts, ", ")
}

// splitLines draw the split as a wide bar, then each part with the
// component means it is made of.
func (m *model) splitLines(s record.Split, c record.Components, w int) []string {
	total := s.Total()
	if total <= 0 {
		return []string{"split: no timed exchanges yet"}
	}
	label := dominantLabels(s)[0]
	suffix := fmt.Sprintf(" %s · mean %s", label, fmtDur(total))
	bw := min(w-len("split ")-width(suffix), 60)
	lines := []string{"split " + bar(s, bw, m.st.paint) + suffix}
	parts := splitParts(s)
	items := [numParts][]string{
		{"propagation " + fmtDur(c.Propagation) + " + queueing " + fmtDur(c.Queueing)},
		{sendWait(c), "loss recovery " + fmtDur(c.LossRecovery), "handshake " + fmtDur(c.Handshake), "receive " + fmtDur(c.Receive)},
		{"peer " + fmtDur(c.Peer), "local read " + fmtDur(c.LocalRead), "think " + fmtDur(c.Think)},
	}
	for i := range numParts {
		name := m.st.parts[i].Render(partGlyph(i) + " " + pad(partName(i), 9, false))
		lead := fmt.Sprintf(" %6s %3d%%  ", fmtDur(parts[i]), pctOf(parts[i], total))
		indent := 11 + width(lead)
		// Transport has the most components: it may take a second line.
		wrapped := wrapItems(items[i], " · ", w-indent)
		for j, l := range wrapped[:min(len(wrapped), 2)] {
			if j == 0 {
				lines = append(lines, name+lead+l)
			} else {
				lines = append(lines, strings.Repeat(" ", indent)+l)
			}
		}
	}
	return lines
}

// sendWait names the send wait's causes that took any time.
func sendWait(c record.Components) string {
	var causes []string
	for _, k := range []struct {
		name string
		d    time.Duration
	}{{"cwnd", c.SendWaitCwnd}, {"rwnd", c.SendWaitRwnd}, {"sndbuf", c.SendWaitSndbuf}, {"pacing", c.SendWaitPacing}, {"flow control", c.SendWaitFlowControl}, {"other", c.SendWaitOther}} {
		if k.d > 0 {
			causes = append(causes, k.name+" "+fmtDur(k.d))
		}
	}
	s := "send wait " + fmtDur(c.SendWait)
	if len(causes) > 0 {
		s += " (" + strings.Join(causes, ", ") + ")"
	}
	return s
}

// diagLines are every diagnosis, its severity coloured, then its fix.
func (m *model) diagLines(met *aggregate.Metrics, ds []record.Diagnosis, w int) []string {
	if len(ds) == 0 {
		if !hasTiming(met) {
			return []string{m.st.dim.Render("no diagnosis yet: no timed exchanges")}
		}
		return []string{m.st.dim.Render("no diagnosis: no part of the latency stands out")}
	}
	var lines []string
	for _, d := range ds {
		sev := sanitize(string(d.Severity))
		text := fmt.Sprintf("%s %.0f%% %s: %s", sev, 100*d.Share, sanitize(string(d.Name)), sanitize(d.Summary))
		for i, l := range wrap(text, w-2) {
			if i == 0 {
				// The severity is the line's first word: colour it alone.
				lines = append(lines, m.st.sev(d.Severity)+l[len(sev):])
				continue
			}
			lines = append(lines, "  "+l)
		}
		lines = append(lines, relatedLines(d.Related, w)...)
		if d.Fix != "" {
			for _, l := range wrap("fix: "+sanitize(d.Fix), w-2) {
				lines = append(lines, "  "+l)
			}
		}
	}
	return lines
}

// relatedLines list what a diagnosis points at (the bulk flows behind a
// bufferbloat), one entry a line, under a "related:" lead.
func relatedLines(related []string, w int) []string {
	const lead = "related: "
	var lines []string
	for i, r := range related {
		indent := strings.Repeat(" ", 2+len(lead))
		for j, l := range wrap(sanitize(r), w-len(indent)) {
			if i == 0 && j == 0 {
				lines = append(lines, "  "+lead+l)
				continue
			}
			lines = append(lines, indent+l)
		}
	}
	return lines
}

// sparkLines draw the flow's recent duration, srtt and cwnd, oldest on
// the left, each with its range.
func (m *model) sparkLines(d *detail, w int) []string {
	if !d.fetched {
		return []string{"recent exchanges: loading…"}
	}
	if len(d.recent) == 0 {
		return []string{"recent exchanges: none kept for this flow"}
	}
	var dur, srtt, cwnd []float64
	for _, s := range d.recent {
		// A partial exchange's duration is cut short: not a point on the
		// curve.
		v := float64(s.Duration)
		if s.Partial {
			v = 0
		}
		dur = append(dur, v)
		srtt = append(srtt, float64(s.SRTT))
		cwnd = append(cwnd, float64(s.CwndEnd))
	}
	asDur := func(v float64) string { return fmtDur(time.Duration(v)) }
	asSeg := func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
	series := []struct {
		name string
		vals []float64
		f    func(float64) string
	}{{"duration", dur, asDur}, {"srtt", srtt, asDur}, {"cwnd", cwnd, asSeg}}
	var lines []string
	for _, s := range series {
		// The range label is at most ~24 cells; the line takes the rest.
		line, lo, hi, ok := sparkline(s.vals, min(w-10-26, 64))
		if !ok {
			lines = append(lines, fmt.Sprintf("%-9s not measured", s.name))
			continue
		}
		lines = append(lines, fmt.Sprintf("%-9s %s  min %s max %s", s.name, line, s.f(lo), s.f(hi)))
	}
	return lines
}

// recentLines are the flow's last exchanges, newest first, as many as fit
// in h lines.
func recentLines(d *detail, w, h int) []string {
	if h < 2 || len(d.recent) == 0 {
		return nil
	}
	t := &table{cols: []column{
		{titles: []string{"AGE"}, right: true},
		{titles: []string{"DURATION"}, right: true},
		{titles: []string{"NETWORK"}, right: true},
		{titles: []string{"TRANSPORT"}, right: true},
		{titles: []string{"APP"}, right: true},
		{titles: []string{"OUT"}, right: true},
		{titles: []string{"IN"}, right: true},
		{titles: []string{"RETR"}, right: true},
		{titles: []string{"TURNS"}, right: true},
		{titles: []string{"CWND"}, right: true},
		{name: "srtt", titles: []string{"SRTT"}, right: true},
		{name: "role", titles: []string{"ROLE"}},
	}, stages: []stage{dropCol("role"), dropCol("srtt")}}
	for i := len(d.recent) - 1; i >= 0 && len(t.rows) < h-1; i-- {
		t.rows = append(t.rows, recentRow(&d.recent[i], d.now))
	}
	ws := t.layout(w, false)
	lines := []string{truncate(t.header(ws), w)}
	for i := range t.rows {
		lines = append(lines, truncate(t.line(&t.rows[i], ws, nil), w))
	}
	return lines
}

func recentRow(s *history.Sample, now record.Mono) tableRow {
	sp := splitOfSample(s.Components)
	dur := fmtDur(s.Duration)
	if s.Partial {
		// Its start predates lattrace: the duration is a lower bound.
		dur = ">" + dur
	}
	return tableRow{cells: [][]string{
		{fmtAge(now.Sub(s.Time))},
		{dur},
		{fmtDur(sp.Network)},
		{fmtDur(sp.Transport)},
		{fmtDur(sp.App)},
		{fmtBytes(s.BytesOut)},
		{fmtBytes(s.BytesIn)},
		{strconv.FormatUint(uint64(s.Retransmits), 10)},
		{strconv.FormatUint(uint64(s.Turns), 10)},
		{fmtCwnd(s.CwndEnd)},
		{durOrZero(s.SRTT)},
		{sanitize(string(s.Role))},
	}}
}
