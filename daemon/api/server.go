package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

// Server answers the API from the daemon's live state.
type Server struct {
	agg      *aggregate.Aggregator
	hist     *history.History
	health   func() Health
	inflight func() []record.InFlight
	log      *slog.Logger
	srv      *http.Server
}

// NewServer serves agg and hist; health is called for GET /v1/health,
// inflight (which may be nil) for the exchanges in progress.
func NewServer(agg *aggregate.Aggregator, hist *history.History, health func() Health, inflight func() []record.InFlight, log *slog.Logger) *Server {
	if inflight == nil {
		inflight = func() []record.InFlight { return nil }
	}
	s := &Server{agg: agg, hist: hist, health: health, inflight: inflight, log: log}
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	return s
}

// Handler routes the endpoints of docs/api.md.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.getHealth)
	mux.HandleFunc("GET /v1/flows", s.getFlows)
	mux.HandleFunc("GET /v1/flows/{id}", s.getFlow)
	mux.HandleFunc("GET /v1/peers", s.getPeers)
	mux.HandleFunc("GET /v1/peers/{id}", s.getPeer)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s (see docs/api.md: /%s/health, /%s/flows, /%s/peers)", r.Method, r.URL.Path, Version, Version, Version))
	})
	return methodsOnly(mux)
}

// methodsOnly answers anything but GET and HEAD with a JSON 405; the mux's
// own 405 is plain text.
func methodsOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: the API is read-only", r.Method))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // a client gone away is not the daemon's error
}

// writeList writes head, a FlowList or PeerList whose list is empty, with
// list in its place, one entry at a time: a node's tens of thousands of
// flows are tens of megabytes of JSON, which need not be held at once.
func writeList[T any](w http.ResponseWriter, head any, list []T) {
	b, err := json.Marshal(head)
	// The head ends with its empty list: `...,"flows":[]}`.
	if err != nil || !bytes.HasSuffix(b, []byte("[]}")) {
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("encoding the list: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.Write(b[:len(b)-2])
	enc := json.NewEncoder(bw)
	for i := range list {
		if i > 0 {
			bw.WriteByte(',')
		}
		if enc.Encode(&list[i]) != nil {
			return // a client gone away is not the daemon's error
		}
	}
	bw.WriteString("]}\n")
	_ = bw.Flush()
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(Error{Error: msg})
}

func (s *Server) getHealth(w http.ResponseWriter, _ *http.Request) {
	h := s.health()
	h.APIVersion = Version
	writeJSON(w, h)
}

// flows snapshots every flow with its rate, split and diagnoses.
// snapshot is what one answer is made from, read once.
type snapshot struct {
	now   record.Mono
	stats []aggregate.FlowStats
	// recorded indexes stats by cookie; inflight holds the exchanges in
	// progress now, by cookie.
	recorded map[uint64]int
	inflight map[uint64]*record.InFlight
	// rates are each flow's exchanges per second, and peerRates their sum
	// per pair.
	rates     map[uint64]float64
	peerRates map[record.PeerKey]float64
	// movers is every flow with what it moved, the bytes of exchanges in
	// progress included: a bufferbloat's bulk senders are often still
	// sending. It is a copy of stats, made the first time a bufferbloat
	// asks for it (moversOf).
	movers     []aggregate.FlowStats
	moversOnce sync.Once
	// ins is the exchanges in progress, in the tracer's order; inflight
	// points into it.
	ins []record.InFlight
}

// moversOf is sn.movers, made on first use.
func (sn *snapshot) moversOf() []aggregate.FlowStats {
	sn.moversOnce.Do(func() {
		sn.movers = append([]aggregate.FlowStats(nil), sn.stats...)
		for i := range sn.ins {
			in := &sn.ins[i]
			if j, ok := sn.recorded[in.Cookie]; ok {
				sn.movers[j].Out.Bytes += in.BytesOut
				sn.movers[j].In.Bytes += in.BytesIn
				sn.movers[j].LastSeen = sn.now
				continue
			}
			m := unrecorded(in)
			m.Out.Bytes, m.In.Bytes = in.BytesOut, in.BytesIn
			m.FirstSeen, m.LastSeen = in.Start, sn.now
			sn.movers = append(sn.movers, m)
		}
	})
	return sn.movers
}

func (s *Server) snapshot() *snapshot {
	sn := &snapshot{
		now: record.Now(), stats: s.agg.Flows(),
		recorded: map[uint64]int{}, inflight: map[uint64]*record.InFlight{},
		rates: map[uint64]float64{}, peerRates: map[record.PeerKey]float64{},
	}
	for i := range sn.stats {
		st := &sn.stats[i]
		sn.recorded[st.Cookie] = i
		r := st.RateAt(sn.now)
		sn.rates[st.Cookie] = r
		if st.Peer != (record.PeerKey{}) {
			sn.peerRates[st.Peer] += r
		}
	}
	// A socket with nothing in progress comes with a zero start.
	sn.ins = slices.DeleteFunc(s.inflight(), func(in record.InFlight) bool { return in.Start == 0 })
	for i := range sn.ins {
		sn.inflight[sn.ins[i].Cookie] = &sn.ins[i]
	}
	return sn
}

// unrecorded is the statistics of a connection known only by its exchange
// in progress (a transfer running since before its first turn).
func unrecorded(in *record.InFlight) aggregate.FlowStats {
	return aggregate.FlowStats{
		FlowKey:  record.FlowKey{Flow: in.Flow, Cookie: in.Cookie},
		Owner:    in.Owner,
		ConnRole: in.ConnRole,
	}
}

// flows is every flow with its rate, split and exchange in progress, and
// the flows known only by one: nothing that is moving is missing. Their
// diagnoses and peer ids are the caller's to add (finish).
func (s *Server) flows(sn *snapshot) []Flow {
	out := make([]Flow, 0, len(sn.stats)+len(sn.inflight))
	for i := range sn.stats {
		out = append(out, s.flowRow(&sn.stats[i], sn))
	}
	for cookie, in := range sn.inflight {
		if _, ok := sn.recorded[cookie]; !ok {
			st := unrecorded(in)
			out = append(out, s.flowRow(&st, sn))
		}
	}
	return out
}

// flowByCookie is one flow of flows, built alone.
func (s *Server) flowByCookie(sn *snapshot, cookie uint64) (Flow, bool) {
	if i, ok := sn.recorded[cookie]; ok {
		return s.flow(&sn.stats[i], sn), true
	}
	if in, ok := sn.inflight[cookie]; ok {
		st := unrecorded(in)
		return s.flow(&st, sn), true
	}
	return Flow{}, false
}

// diagnoses names the bulk senders behind a bufferbloat in ds among the
// snapshot's movers. None is an empty list, not null: the schema's lists
// are always lists.
func diagnoses(ds []record.Diagnosis, m *aggregate.Metrics, sn *snapshot) []record.Diagnosis {
	if ds == nil {
		ds = []record.Diagnosis{}
	}
	if !slices.ContainsFunc(ds, func(d record.Diagnosis) bool { return d.Name == diagnose.Bufferbloat }) {
		return ds
	}
	return diagnose.WithBulkSenders(ds, m, sn.moversOf())
}

// flow makes st's answer.
func (s *Server) flow(st *aggregate.FlowStats, sn *snapshot) Flow {
	f := s.flowRow(st, sn)
	s.finish(&f, sn)
	return f
}

// flowRow is st's answer but its diagnoses and peer id: what filtering and
// sorting a list read, made for every flow of a node; finish completes the
// rows a list returns.
func (s *Server) flowRow(st *aggregate.FlowStats, sn *snapshot) Flow {
	f := Flow{
		ID:        strconv.FormatUint(st.Cookie, 10),
		FlowStats: *st,
		Rate:      sn.rates[st.Cookie],
		Split:     st.Metrics.ComponentMeans.Split(),
	}
	f.Dominant = f.Split.Dominant()
	if in := sn.inflight[st.Cookie]; in != nil {
		f.InFlight = in
		// The owner of a socket whose records are all still to come is
		// known from the kernel's side already.
		if !f.Owner.Known() {
			f.Owner = in.Owner
		}
	}
	return f
}

// finish adds what flowRow leaves out.
func (s *Server) finish(f *Flow, sn *snapshot) {
	f.Diagnoses = diagnoses(diagnose.Of(&f.Metrics), &f.Metrics, sn)
	if f.Peer != (record.PeerKey{}) {
		f.PeerID = f.Peer.ID()
	}
}

// peers is every peer pair with its rate, split and diagnoses.
func (s *Server) peers(sn *snapshot) []Peer {
	stats := s.agg.Peers()
	out := make([]Peer, 0, len(stats))
	for i := range stats {
		out = append(out, s.peer(&stats[i], sn))
	}
	return out
}

// peer makes st's answer; its rate is the sum of its flows'.
func (s *Server) peer(st *aggregate.PeerStats, sn *snapshot) Peer {
	p := Peer{
		ID:        st.PeerKey.ID(),
		PeerStats: *st,
		Rate:      sn.peerRates[st.PeerKey],
		Split:     st.Metrics.ComponentMeans.Split(),
		Diagnoses: diagnoses(diagnose.OfPair(st), &st.Metrics, sn),
	}
	p.Dominant = p.Split.Dominant()
	return p
}

// limited cuts a sorted list to the query's limit.
func limited[T any](list []T, limit int) []T {
	if limit > 0 && len(list) > limit {
		return list[:limit]
	}
	return list
}

func (s *Server) getFlows(w http.ResponseWriter, r *http.Request) {
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	sn := s.snapshot()
	out := q.selectFlows(s.flows(sn))
	page := limited(out, q.Limit)
	for i := range page {
		s.finish(&page[i], sn)
	}
	writeList(w, FlowList{APIVersion: Version, Now: sn.now, Total: len(out), Flows: []Flow{}}, page)
}

func (s *Server) getFlow(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	cookie, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("flow id %q is not a number (ids are in the id column of /%s/flows)", id, Version))
		return
	}
	sn := s.snapshot()
	f, ok := s.flowByCookie(sn, cookie)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no flow %s: it closed, expired or was never seen", id))
		return
	}
	recent := s.hist.Recent(cookie)
	if recent == nil {
		recent = []history.Sample{}
	}
	writeJSON(w, FlowDetail{APIVersion: Version, Now: sn.now, Flow: f, Recent: recent})
}

func (s *Server) getPeers(w http.ResponseWriter, r *http.Request) {
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	sn := s.snapshot()
	out := q.Peers(s.peers(sn))
	writeList(w, PeerList{APIVersion: Version, Now: sn.now, Total: len(out), Peers: []Peer{}}, limited(out, q.Limit))
}

func (s *Server) getPeer(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, st := range s.agg.Peers() {
		if st.PeerKey.ID() != id {
			continue
		}
		sn := s.snapshot()
		flows := []Flow{}
		for i := range sn.stats {
			if sn.stats[i].Peer == st.PeerKey {
				flows = append(flows, s.flow(&sn.stats[i], sn))
			}
		}
		SortFlows(flows, DefaultSort)
		writeJSON(w, PeerDetail{APIVersion: Version, Now: sn.now, Peer: s.peer(&st, sn), Flows: flows})
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no peer pair %s: it expired or was never seen (ids are in the id column of /%s/peers)", id, Version))
}

// Listen opens the API's listeners: the Unix socket at socket (mode 0600,
// in a directory only root can enter when lattrace creates it) and, when
// tcpAddr is set, a loopback TCP port. The API has no authentication, so
// TCP is refused on anything but loopback.
func Listen(socket, tcpAddr string) ([]net.Listener, error) {
	var ls []net.Listener
	if socket != "" {
		l, err := listenUnix(socket)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	if tcpAddr != "" {
		host, _, err := net.SplitHostPort(tcpAddr)
		if err != nil {
			closeAll(ls)
			return nil, fmt.Errorf("API address %q: %w", tcpAddr, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			closeAll(ls)
			return nil, fmt.Errorf("API address %q is not loopback: the API has no authentication, so it is served on 127.0.0.1 or ::1 only", tcpAddr)
		}
		l, err := net.Listen("tcp", tcpAddr)
		if err != nil {
			closeAll(ls)
			return nil, fmt.Errorf("API address: %w", err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		l.Close()
	}
}

func listenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("API socket directory: %w", err)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("API socket %s exists and is not a socket; remove it or choose another --api-socket", path)
		}
		// A socket nobody answers on is left over from a daemon that was
		// killed; one that answers belongs to a daemon still running.
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another lattrace daemon is serving at %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale API socket: %w", err)
		}
	}
	// The socket is created with the process umask; narrowing it for the
	// bind leaves no moment when another user could connect.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("API socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("API socket: %w", err)
	}
	return l, nil
}

// Serve answers on ls until Close. It returns once every listener stopped.
func (s *Server) Serve(ls []net.Listener) {
	done := make(chan struct{}, len(ls))
	for _, l := range ls {
		go func() {
			if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("API server", "addr", l.Addr().String(), "err", err)
			}
			done <- struct{}{}
		}()
	}
	for range ls {
		<-done
	}
}

// Close stops serving and closes the listeners (removing the socket file).
func (s *Server) Close() error { return s.srv.Close() }
