package report

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/lattrace/lattrace/exporters/recording"
	"github.com/lattrace/lattrace/record"
)

// Model is everything the page draws, as JSON for its script. Durations
// are in milliseconds, times in seconds since the recording started.
type Model struct {
	Title  string           `json:"title"`
	Header recording.Header `json:"header"`
	End    recording.End    `json:"end"`
	// Span is the recording's length in seconds.
	Span float64 `json:"span_s"`
	// Total summarizes every exchange; Rows every peer pair, the slowest
	// in total first (at most maxRows; MoreRows counts the rest).
	Total    Row   `json:"total"`
	Rows     []Row `json:"rows"`
	MoreRows int   `json:"more_rows"`
	// Pairs are the pairs drawn, in the order of Rows.
	Pairs      []Pair     `json:"pairs"`
	Components []string   `json:"components"`
	Parts      []string   `json:"parts"`
	Options    Options    `json:"options"`
	BuiltIn    string     `json:"built_in"`
	Generated  time.Time  `json:"generated"`
	Lost       []LostLine `json:"lost,omitempty"`
}

// LostLine is one thing the recording says it could not keep.
type LostLine struct {
	What  string `json:"what"`
	Count uint64 `json:"count"`
}

// Row is one line of the summary table.
type Row struct {
	ID          string         `json:"id"`
	Key         record.PeerKey `json:"key"`
	Name        string         `json:"name"`
	Side        string         `json:"side"`
	Connections int            `json:"connections"`
	Duration    Stats          `json:"duration"`
	Retransmits uint64         `json:"retransmits"`
	Split       Split          `json:"split"`
	Dominant    string         `json:"dominant"`
	Diagnoses   []string       `json:"diagnoses"`
	// Drawn: the pair has its charts further down.
	Drawn bool `json:"drawn"`
}

// Split is the mean latency per part of the model, in ms.
type Split struct {
	Network   float64 `json:"network"`
	Transport float64 `json:"transport"`
	App       float64 `json:"app"`
}

// XY is a series of points.
type XY struct {
	T []float64 `json:"t"`
	V []float64 `json:"v"`
	// Of is how many points the series had before it was reduced.
	Of int `json:"of"`
}

// Box is a five-number summary (the seed study's box plots: whiskers at
// the minimum and maximum) with the p99 marked.
type Box struct {
	Name  string  `json:"name"`
	Count int     `json:"count"`
	Min   float64 `json:"min"`
	Q1    float64 `json:"q1"`
	Med   float64 `json:"median"`
	Q3    float64 `json:"q3"`
	Max   float64 `json:"max"`
	P99   float64 `json:"p99"`
	Mean  float64 `json:"mean"`
}

// CDFLine is one distribution's CDF.
type CDFLine struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"`
	P50    float64      `json:"p50"`
	P99    float64      `json:"p99"`
	Max    float64      `json:"max"`
}

// Stacked is the latency over time split by component: for each point
// kept, its start time and each component's value.
type Stacked struct {
	T     []float64   `json:"t"`
	Parts [][]float64 `json:"parts"` // per Model.Components, only Names'
	Names []string    `json:"names"` // the components that occur in the pair
	Total []float64   `json:"total"`
	Of    int         `json:"of"`
	// Retrans are (time, duration, retransmissions) of the exchanges
	// that retransmitted; RetransOf how many did.
	Retrans   [][3]float64 `json:"retrans"`
	RetransOf int          `json:"retrans_of"`
	P50       float64      `json:"p50"`
	P99       float64      `json:"p99"`
	Max       float64      `json:"max"`
}

// FlowLine is one connection's cwnd and srtt over time, with its
// retransmissions.
type FlowLine struct {
	Name string `json:"name"`
	// Label is the local end, enough to tell the pair's connections apart.
	Label string `json:"label"`
	Cwnd  XY     `json:"cwnd"`
	SRTT  XY     `json:"srtt"`
	// Retrans are (time, cwnd, retransmissions) where they happened.
	Retrans [][3]float64 `json:"retrans"`
	// RetransOf is how many sample points had retransmissions.
	RetransOf int `json:"retrans_of"`
}

// ExchangeDiagnosis counts the exchanges one diagnosis was given to.
type ExchangeDiagnosis struct {
	Name     string `json:"name"`
	Severity string `json:"severity"`
	Count    int    `json:"count"`
	Example  string `json:"example"`
	Fix      string `json:"fix"`
}

// FlowDiagnosis is one finding given to some of a pair's connections
// (and not to the pair as a whole), with the connection where it explains
// the most latency as the example.
type FlowDiagnosis struct {
	Flows   int              `json:"flows"`
	Example string           `json:"example_flow"`
	Worst   record.Diagnosis `json:"worst"`
}

// Pair is one peer pair's charts.
type Pair struct {
	Row      Row        `json:"row"`
	Timeline Stacked    `json:"timeline"`
	Layers   []XY       `json:"layers"` // app, TCP, network RTT over time
	Boxes    []Box      `json:"boxes"`  // the same three
	CDFs     []CDFLine  `json:"cdfs"`   // the same three
	CompBox  []Box      `json:"component_boxes"`
	Flows    []FlowLine `json:"flows"`
	// FlowsOf is how many connections the pair had.
	FlowsOf int `json:"flows_of"`
	// Turns[i] counts exchanges with i turns (the last bin: that many or
	// more).
	Turns         []int               `json:"turns"`
	Diagnoses     []record.Diagnosis  `json:"diagnoses"`
	FlowDiagnoses []FlowDiagnosis     `json:"flow_diagnoses"`
	ExchangeDx    []ExchangeDiagnosis `json:"exchange_diagnoses"`
}

// Layers are the three views of one round trip: the app's, TCP's and the
// network's.
var Layers = []string{"app RTT (exchange)", "TCP RTT (srtt)", "network RTT (path)"}

func (b *builder) model(path string, end recording.End) *Model {
	m := &Model{
		Title:     "lattrace report: " + filepath.Base(path),
		Header:    b.hdr,
		End:       end,
		Span:      b.since(end.Ended),
		Options:   b.o,
		Generated: time.Now().UTC(),
		Parts:     []string{"network", "transport", "app"},
	}
	for _, c := range Components {
		m.Components = append(m.Components, c.Name)
	}
	for name, n := range end.Lost {
		m.Lost = append(m.Lost, LostLine{"tracer: " + name, n})
	}
	if end.SamplesDropped > 0 {
		m.Lost = append(m.Lost, LostLine{"RTT/cwnd samples over the bounds", end.SamplesDropped})
	}
	slices.SortFunc(m.Lost, func(a, b LostLine) int { return cmp.Compare(a.What, b.What) })

	for _, p := range b.pairs {
		slices.SortStableFunc(p.points, func(x, y point) int { return cmp.Compare(x.t, y.t) })
	}
	// The pairs whose exchanges cost the most time in all come first.
	total := func(p *pairAcc) float64 {
		var s float64
		for i := range p.points {
			s += float64(p.points[i].dur)
		}
		return s
	}
	totals := make(map[*pairAcc]float64, len(b.pairs))
	for _, p := range b.pairs {
		totals[p] = total(p)
	}
	slices.SortStableFunc(b.pairs, func(x, y *pairAcc) int { return cmp.Compare(totals[y], totals[x]) })

	var all []float64
	var allMeans [8]float64
	var allRetr uint64
	for i, p := range b.pairs {
		row, means := b.row(p)
		for j := range means {
			allMeans[j] += means[j] * float64(len(p.points))
		}
		allRetr += p.retr
		for k := range p.points {
			all = append(all, float64(p.points[k].dur))
		}
		if i < b.o.MaxPairs {
			row.Drawn = true
			m.Pairs = append(m.Pairs, b.pair(p, row))
		}
		if i < maxRows {
			m.Rows = append(m.Rows, row)
		} else {
			m.MoreRows++
		}
	}
	n := float64(len(all))
	for j := range allMeans {
		if n > 0 {
			allMeans[j] /= n
		}
	}
	m.Total = Row{Name: "all exchanges", Duration: StatsOf(all), Retransmits: allRetr, Connections: len(b.flows)}
	m.Total.Split, m.Total.Dominant = splitOf(allMeans)
	return m
}

func splitOf(means [8]float64) (Split, string) {
	s := split(means)
	return Split{ms(s.Network), ms(s.Transport), ms(s.App)}, s.Dominant()
}

// row summarizes a pair; means are its components' means.
func (b *builder) row(p *pairAcc) (Row, [8]float64) {
	durs := make([]float64, len(p.points))
	var means [8]float64
	for i := range p.points {
		durs[i] = float64(p.points[i].dur)
		for j, c := range p.points[i].comp {
			means[j] += float64(c)
		}
	}
	for j := range means {
		means[j] /= float64(max(len(p.points), 1))
	}
	r := Row{
		ID: pairID(p.key), Key: p.key, Name: PairName(p.key), Side: string(p.key.Side),
		Connections: len(p.flows), Duration: StatsOf(durs), Retransmits: p.retr,
	}
	r.Split, r.Dominant = splitOf(means)
	for _, d := range p.diagnoses {
		r.Diagnoses = append(r.Diagnoses, string(d.Name))
	}
	return r, means
}

// pair draws one pair.
func (b *builder) pair(p *pairAcc, row Row) Pair {
	pts := p.points
	n := len(pts)
	t := make([]float64, n)
	col := func(f func(*point) float64) []float64 {
		out := make([]float64, n)
		for i := range pts {
			out[i] = f(&pts[i])
		}
		return out
	}
	for i := range pts {
		t[i] = pts[i].t
	}
	out := Pair{Row: row, Diagnoses: p.diagnoses, FlowsOf: len(p.flows), CompBox: []Box{}}

	// Latency over time, stacked: the exchanges kept are each interval's
	// fastest and slowest, so the envelope, p99 and max are all there.
	dur := col(func(x *point) float64 { return float64(x.dur) })
	keep := MinMax(t, dur, b.o.Points)
	// Empty lists, not nulls: the page's script maps over them.
	st := Stacked{Of: n, P50: row.Duration.P50, P99: row.Duration.P99, Max: row.Duration.Max,
		T: []float64{}, Total: []float64{}, Names: []string{}, Parts: [][]float64{}, Retrans: [][3]float64{}}
	for _, i := range keep {
		st.T = append(st.T, t[i])
		st.Total = append(st.Total, dur[i])
	}
	for j, c := range Components {
		occurs := false
		for i := range pts {
			if pts[i].comp[j] > 0 {
				occurs = true
				break
			}
		}
		if !occurs {
			continue
		}
		vals := make([]float64, len(keep))
		for k, i := range keep {
			vals[k] = float64(pts[i].comp[j])
		}
		st.Names = append(st.Names, c.Name)
		st.Parts = append(st.Parts, vals)
	}
	retr := col(func(x *point) float64 { return float64(x.retr) })
	for _, i := range Markers(t, retr, b.o.MaxMarkers) {
		st.Retrans = append(st.Retrans, [3]float64{t[i], dur[i], retr[i]})
	}
	for _, r := range retr {
		if r > 0 {
			st.RetransOf++
		}
	}
	out.Timeline = st

	// App vs TCP vs network RTT, each reduced on its own values.
	layers := [][]float64{dur, col(func(x *point) float64 { return float64(x.srtt) }), col(func(x *point) float64 { return float64(x.net) })}
	for li, v := range layers {
		vt, vv := t, v
		if li > 0 { // an RTT the kernel did not give is no point
			vt, vv = nonzero(t, v)
		}
		xy := XY{Of: len(vv), T: []float64{}, V: []float64{}}
		for _, i := range MinMax(vt, vv, b.o.Points) {
			xy.T = append(xy.T, vt[i])
			xy.V = append(xy.V, vv[i])
		}
		out.Layers = append(out.Layers, xy)
		sorted := slices.Clone(vv)
		s := StatsOf(sorted)
		out.Boxes = append(out.Boxes, boxOf(Layers[li], s))
		out.CDFs = append(out.CDFs, CDFLine{Name: Layers[li], Points: CDF(sorted, b.o.CDFPoints), P50: s.P50, P99: s.P99, Max: s.Max})
	}
	for j, c := range Components {
		if !slices.Contains(st.Names, c.Name) {
			continue
		}
		v := col(func(x *point) float64 { return float64(x.comp[j]) })
		out.CompBox = append(out.CompBox, boxOf(c.Name, StatsOf(v)))
	}

	out.Turns = make([]int, maxTurnsBin+1)
	for i := range pts {
		out.Turns[min(int(pts[i].turns), maxTurnsBin)]++
	}
	for len(out.Turns) > 3 && out.Turns[len(out.Turns)-1] == 0 {
		out.Turns = out.Turns[:len(out.Turns)-1]
	}

	out.Flows = b.flowLines(p)
	// Connections' findings the pair's do not already say (one slow
	// connection among many), one line per finding.
	byName := map[record.DiagnosisName]*FlowDiagnosis{}
	for _, fi := range p.flows {
		f := b.flows[fi]
		for _, d := range b.flowDx[f.key] {
			if slices.ContainsFunc(p.diagnoses, func(x record.Diagnosis) bool { return x.Name == d.Name }) {
				continue
			}
			x := byName[d.Name]
			if x == nil {
				x = &FlowDiagnosis{}
				byName[d.Name] = x
			}
			x.Flows++
			if x.Example == "" || d.Share > x.Worst.Share {
				x.Example, x.Worst = flowName(f), d
			}
		}
	}
	out.FlowDiagnoses = []FlowDiagnosis{}
	for _, x := range byName {
		out.FlowDiagnoses = append(out.FlowDiagnoses, *x)
	}
	slices.SortFunc(out.FlowDiagnoses, func(a, b FlowDiagnosis) int {
		return cmp.Or(cmp.Compare(b.Worst.Share, a.Worst.Share), cmp.Compare(a.Worst.Name, b.Worst.Name))
	})
	for _, x := range p.exDiag {
		out.ExchangeDx = append(out.ExchangeDx, *x)
	}
	slices.SortFunc(out.ExchangeDx, func(a, b ExchangeDiagnosis) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func nonzero(t, v []float64) ([]float64, []float64) {
	var ot, ov []float64
	for i := range v {
		if v[i] > 0 {
			ot = append(ot, t[i])
			ov = append(ov, v[i])
		}
	}
	return ot, ov
}

func boxOf(name string, s Stats) Box {
	return Box{Name: name, Count: s.Count, Min: s.Min, Q1: s.P25, Med: s.P50, Q3: s.P75, Max: s.Max, P99: s.P99, Mean: s.Mean}
}

func flowName(f *flowAcc) string {
	return fmt.Sprintf("%s → %s (cookie %d)", f.key.Flow.Local, f.key.Flow.Remote, f.key.Cookie)
}

// flowLines draws the cwnd and srtt of the pair's most sampled flows.
func (b *builder) flowLines(p *pairAcc) []FlowLine {
	flows := slices.Clone(p.flows)
	slices.SortStableFunc(flows, func(x, y int) int { return cmp.Compare(len(b.flows[y].samples), len(b.flows[x].samples)) })
	out := []FlowLine{}
	for _, fi := range flows {
		f := b.flows[fi]
		if len(out) == b.o.FlowsPerPair || len(f.samples) == 0 {
			break
		}
		s := f.samples
		slices.SortStableFunc(s, func(x, y sample) int { return cmp.Compare(x.t, y.t) })
		t := make([]float64, len(s))
		cwnd := make([]float64, len(s))
		srtt := make([]float64, len(s))
		retr := make([]float64, len(s))
		for i := range s {
			t[i], cwnd[i], srtt[i], retr[i] = s[i].t, float64(s[i].cwnd), float64(s[i].srtt), float64(s[i].retr)
		}
		fl := FlowLine{Name: flowName(f), Label: f.key.Flow.Local.String(), Cwnd: XY{Of: len(s)}, SRTT: XY{Of: len(s)}, Retrans: [][3]float64{}}
		for _, i := range MinMax(t, cwnd, b.o.Points) {
			fl.Cwnd.T = append(fl.Cwnd.T, t[i])
			fl.Cwnd.V = append(fl.Cwnd.V, cwnd[i])
		}
		for _, i := range MinMax(t, srtt, b.o.Points) {
			fl.SRTT.T = append(fl.SRTT.T, t[i])
			fl.SRTT.V = append(fl.SRTT.V, srtt[i])
		}
		for _, r := range retr {
			if r > 0 {
				fl.RetransOf++
			}
		}
		for _, i := range Markers(t, retr, b.o.MaxMarkers) {
			fl.Retrans = append(fl.Retrans, [3]float64{t[i], cwnd[i], retr[i]})
		}
		out = append(out, fl)
	}
	return out
}
