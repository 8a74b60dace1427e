package api

import (
	"bufio"
	"bytes"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/daemon/private"
	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/record"
)

// Server answers the API from the daemon's live state.
type Server struct {
	agg      *aggregate.Aggregator
	hist     *history.History
	health   func() Health
	inflight func() []record.InFlight
	requests *requests.Tracker
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
	mux.HandleFunc("GET /v1/requests", s.getRequests)
	mux.HandleFunc("GET /v1/requests/{id}", s.getRequest)
	mux.HandleFunc("/", noEndpoint)
	return jsonOnly(mux)
}

func noEndpoint(w http.ResponseWriter, r *http.Request) {
	// The path is the caller's: quoted when it holds control characters,
	// so the error stays one line.
	p := r.URL.Path
	if strings.ContainsFunc(p, unicode.IsControl) {
		p = strconv.Quote(p)
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s (see docs/api.md: /%s/health, /%s/flows, /%s/peers, /%s/requests)", r.Method, p, Version, Version, Version, Version))
}

// jsonOnly answers with JSON what the mux would answer in plain text or
// HTML: anything but GET and HEAD (the mux's 405), and a path that is not
// clean, such as /v1/./flows or //v1/flows, which the mux redirects to its
// clean form. No client of the API writes one.
func jsonOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: the API is read-only", r.Method))
			return
		}
		if p := r.URL.Path; p != cleanPath(p) {
			noEndpoint(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// cleanPath is p as the mux cleans it before it routes: rooted, without
// empty, . or .. elements, with its trailing slash.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // a client gone away is not the daemon's error
}

// writeList writes head, whose last field is an empty list, with n entries
// in its place, each made by at as it is written (one not there any more
// is left out): a node's tens of thousands of flows are tens of megabytes
// of JSON, and more of statistics, which need not be held at once.
func writeList[T any](w http.ResponseWriter, head any, n int, at func(i int) (T, bool)) {
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
	first := true
	for i := range n {
		v, ok := at(i)
		if !ok {
			continue
		}
		if !first {
			bw.WriteByte(',')
		}
		first = false
		if enc.Encode(&v) != nil {
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

// snapshot is what one answer is made from: the time and the exchanges in
// progress, read once, and what a pass over every flow gathers, made only
// when the answer needs it. A pass holds one flow at a time
// (aggregate.EachFlow), so an answer's memory is that of its page and of a
// few words per flow, not of every flow's statistics: the daemon may be
// under a memory limit with a hundred thousand connections.
type snapshot struct {
	now record.Mono
	agg *aggregate.Aggregator
	// inflight holds the exchanges in progress now, by cookie; ins, in
	// the tracer's order, is what it points into.
	inflight map[uint64]*record.InFlight
	ins      []record.InFlight
	// peerRates sums the flows' rates per pair.
	peerRates     map[record.PeerKey]float64
	peerRatesOnce sync.Once
	// movers are the flows that moved data in bulk, the bytes of their
	// exchanges in progress included (a bufferbloat's bulk senders are
	// often still sending): the candidates diagnose.WithBulkSenders names.
	movers     []aggregate.FlowStats
	moversOnce sync.Once
}

func (s *Server) snapshot() *snapshot {
	sn := &snapshot{now: record.Now(), agg: s.agg, inflight: map[uint64]*record.InFlight{}}
	// A socket with nothing in progress comes with a zero start.
	sn.ins = slices.DeleteFunc(s.inflight(), func(in record.InFlight) bool { return in.Start == 0 })
	for i := range sn.ins {
		sn.inflight[sn.ins[i].Cookie] = &sn.ins[i]
	}
	return sn
}

// peerRatesOf is sn.peerRates, made on first use.
func (sn *snapshot) peerRatesOf() map[record.PeerKey]float64 {
	sn.peerRatesOnce.Do(func() {
		sn.peerRates = map[record.PeerKey]float64{}
		sn.agg.EachFlowRow(func(r *aggregate.FlowRow) bool {
			if r.Peer != (record.PeerKey{}) {
				sn.peerRates[r.Peer] += r.RateAt(sn.now)
			}
			return true
		})
	})
	return sn.peerRates
}

// moversOf is sn.movers, made on first use: a pass over the rows finds
// them, and only theirs are read whole.
func (sn *snapshot) moversOf() []aggregate.FlowStats {
	sn.moversOnce.Do(func() {
		recorded := map[uint64]bool{}
		var bulk []uint64
		sn.agg.EachFlowRow(func(r *aggregate.FlowRow) bool {
			moved := r.Bytes
			if f := sn.inflight[r.Cookie]; f != nil {
				recorded[r.Cookie] = true
				moved += f.BytesOut + f.BytesIn
			}
			if diagnose.MayBeBulk(moved) {
				bulk = append(bulk, r.Cookie)
			}
			return true
		})
		for _, cookie := range bulk {
			m, ok := sn.agg.FlowByCookie(cookie)
			if !ok {
				continue
			}
			if f := sn.inflight[cookie]; f != nil {
				m.Out.Bytes += f.BytesOut
				m.In.Bytes += f.BytesIn
				m.LastSeen = sn.now
			}
			sn.movers = append(sn.movers, m)
		}
		for i := range sn.ins {
			in := &sn.ins[i]
			if recorded[in.Cookie] || !diagnose.MayBeBulk(in.BytesOut+in.BytesIn) {
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

// unrecorded is the statistics of a connection known only by its exchange
// in progress (a transfer running since before its first turn).
func unrecorded(in *record.InFlight) aggregate.FlowStats {
	return aggregate.FlowStats{
		FlowKey:  record.FlowKey{Flow: in.Flow, Cookie: in.Cookie},
		Owner:    in.Owner,
		ConnRole: in.ConnRole,
	}
}

// listKey is what a list keeps of each flow it orders: its order and
// where to find it again.
type listKey struct {
	v      float64
	id     string
	cookie uint64
}

// before orders list keys: largest value first, ties by id, so the order
// is stable from one refresh to the next (SortFlows).
func (k listKey) before(o listKey) bool {
	return k.v > o.v || (k.v == o.v && k.id < o.id)
}

// topKeys keeps the first limit keys of those it is given (all with limit
// 0), in a heap whose root is the last of them.
type topKeys struct {
	limit int
	keys  []listKey
}

func (t *topKeys) Len() int           { return len(t.keys) }
func (t *topKeys) Less(i, j int) bool { return t.keys[j].before(t.keys[i]) }
func (t *topKeys) Swap(i, j int)      { t.keys[i], t.keys[j] = t.keys[j], t.keys[i] }
func (t *topKeys) Push(x any)         { t.keys = append(t.keys, x.(listKey)) }
func (t *topKeys) Pop() any {
	k := t.keys[len(t.keys)-1]
	t.keys = t.keys[:len(t.keys)-1]
	return k
}

func (t *topKeys) add(k listKey) {
	switch {
	case t.limit <= 0:
		t.keys = append(t.keys, k)
	case len(t.keys) < t.limit:
		heap.Push(t, k)
	case k.before(t.keys[0]):
		t.keys[0] = k
		heap.Fix(t, 0)
	}
}

// sorted is the keys kept, in list order.
func (t *topKeys) sorted() []listKey {
	slices.SortFunc(t.keys, func(a, b listKey) int {
		if a.before(b) {
			return -1
		}
		if b.before(a) {
			return 1
		}
		return 0
	})
	return t.keys
}

// selectFlows passes over every flow's row (aggregate.EachFlowRow), and
// the flows known only by an exchange in progress, keeping the keys of
// those match keeps, the first limit of them in sort's order; total is
// how many matched. A flow whose own owner is not known yet is filtered
// by the one its exchange in progress knows, as its answer shows it.
func (s *Server) selectFlows(sn *snapshot, sort string, limit int, match func(r *aggregate.FlowRow, o *record.Owner, id string) bool) (keys []listKey, total int) {
	top := &topKeys{limit: limit}
	recorded := map[uint64]bool{}
	consider := func(r *aggregate.FlowRow) {
		o := &r.Owner
		if in := sn.inflight[r.Cookie]; in != nil {
			recorded[r.Cookie] = true
			if !o.Known() {
				o = &in.Owner
			}
		}
		id := strconv.FormatUint(r.Cookie, 10)
		if match(r, o, id) {
			total++
			top.add(listKey{rowSortValue(r, r.RateAt(sn.now), sort), id, r.Cookie})
		}
	}
	s.agg.EachFlowRow(func(r *aggregate.FlowRow) bool {
		consider(r)
		return true
	})
	for cookie, in := range sn.inflight {
		if !recorded[cookie] {
			consider(&aggregate.FlowRow{FlowKey: record.FlowKey{Flow: in.Flow, Cookie: in.Cookie}, Owner: in.Owner})
		}
	}
	return top.sorted(), total
}

// flowByCookie is one flow's answer, built alone.
func (s *Server) flowByCookie(sn *snapshot, cookie uint64) (Flow, bool) {
	if st, ok := s.agg.FlowByCookie(cookie); ok {
		return s.flow(&st, sn), true
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
	var f Flow
	s.flowRowInto(&f, st, sn)
	s.finish(&f, sn)
	return f
}

// flowRowInto makes in f st's answer but its diagnoses and peer id: what
// filtering and sorting a list read, made for every flow of a node;
// finish completes the rows a list returns.
func (s *Server) flowRowInto(f *Flow, st *aggregate.FlowStats, sn *snapshot) {
	*f = Flow{
		ID:        strconv.FormatUint(st.Cookie, 10),
		FlowStats: *st,
		Rate:      st.RateAt(sn.now),
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
		Rate:      sn.peerRatesOf()[st.PeerKey],
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
	// Each flow of the page is read again as it is written: one that
	// went in between (closed, evicted) is left out, so a page may be a
	// row or two short of what total, counted at the selection, says.
	keys, total := s.selectFlows(sn, q.Sort, q.Limit, q.Filter.MatchRow)
	writeList(w, FlowList{APIVersion: Version, Now: sn.now, Total: total, Flows: []Flow{}}, len(keys), func(i int) (Flow, bool) {
		return s.flowByCookie(sn, keys[i].cookie)
	})
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
	page := limited(out, q.Limit)
	writeList(w, PeerList{APIVersion: Version, Now: sn.now, Total: len(out), Peers: []Peer{}}, len(page), func(i int) (Peer, bool) { return page[i], true })
}

func (s *Server) getPeer(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, st := range s.agg.Peers() {
		if st.PeerKey.ID() != id {
			continue
		}
		sn := s.snapshot()
		keys, _ := s.selectFlows(sn, DefaultSort, 0, func(r *aggregate.FlowRow, _ *record.Owner, _ string) bool { return r.Peer == st.PeerKey })
		writeList(w, PeerDetail{APIVersion: Version, Now: sn.now, Peer: s.peer(&st, sn), Flows: []Flow{}}, len(keys), func(i int) (Flow, bool) {
			return s.flowByCookie(sn, keys[i].cookie)
		})
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no peer pair %s: it expired or was never seen (ids are in the id column of /%s/peers)", id, Version))
}

// Listen opens the API's listeners: the Unix socket at socket and, when
// tcpAddr is set, a loopback TCP port. The API has no authentication: the
// socket is the daemon's user's alone (mode 0600, in a directory only that
// user can change), and TCP is refused on anything but loopback.
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
		l, err := listenLoopback(tcpAddr)
		if err != nil {
			closeAll(ls)
			return nil, err
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

// CheckAddr checks that addr, the API's TCP address, is a loopback
// host:port.
func CheckAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("API address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return notLoopback(addr)
	}
	return nil
}

func notLoopback(addr string) error {
	return fmt.Errorf("API address %q is not loopback: the API has no authentication, so it is served on 127.0.0.1 or ::1 only", addr)
}

// listenLoopback listens on addr, a loopback host:port. A name is checked
// where it was bound too: "localhost" is whatever /etc/hosts says.
func listenLoopback(addr string) (net.Listener, error) {
	if err := CheckAddr(addr); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("API address: %w", err)
	}
	if a, ok := l.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
		l.Close()
		return nil, notLoopback(addr)
	}
	return l, nil
}

// listenUnix listens on the socket at path, mode 0600. Its directory is
// created (0700) when missing and must be one no other user can change: a
// user who could would swap the socket for one of their own, which root's
// clients would then talk to, or for a link that would have the daemon
// remove or change another file.
func listenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := private.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("API socket directory: %w; remove it or choose another --api-socket", err)
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
	// A default ACL on the directory overrides the umask; the directory
	// is the daemon's own, so the name is still its socket.
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
