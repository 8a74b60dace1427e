package api

import (
	"cmp"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/record"
)

// SortKeys are the orders a list can be asked for, largest first.
var SortKeys = []string{"p99", "p50", "rate", "retrans", "turns", "exchanges"}

// DefaultSort is the order when none is asked for: the slowest first.
const DefaultSort = "p99"

// Query selects and orders a list.
type Query struct {
	// Sort is one of SortKeys ("" is DefaultSort).
	Sort string
	// Limit caps the list after sorting; 0 returns everything.
	Limit  int
	Filter Filter
}

// Filter keeps the entries matching every field set.
type Filter struct {
	// Comm is a substring of the owning process's name.
	Comm string
	PID  uint32
	// Port matches the local or the remote port.
	Port uint16
	// Addr matches the local or the remote address (an address or a CIDR
	// prefix; IPv4-mapped IPv6 addresses match their IPv4 form).
	Addr netip.Prefix
	// Netns is the network namespace's inode number.
	Netns uint32
	// Container is a prefix of the container id.
	Container string
	// Text is free text matched against all of the above.
	Text string
}

// filterKeys are the key:value words of ParseFilter and the query
// parameters of the list endpoints.
var filterKeys = []string{"comm", "pid", "port", "addr", "netns", "container", "q"}

// ParseFilter reads the filter a person types: words like "comm:curl
// port:8080 addr:10.0.0.0/8 netns:4026531840 pid:42 container:3f2a", any
// other word being free text.
func ParseFilter(s string) (Filter, error) {
	var f Filter
	for _, w := range strings.Fields(s) {
		k, v, ok := strings.Cut(w, ":")
		if ok && !slices.Contains(filterKeys, k) && isWord(k) && !isAddress(w) {
			return Filter{}, fmt.Errorf("unknown filter field %q (fields: comm, pid, port, addr, netns, container; other words are free text)", k)
		}
		if !ok || !slices.Contains(filterKeys, k) || k == "q" {
			// An address like ::1 or 10.0.0.1:80 is free text, not a key.
			f.Text = strings.TrimSpace(f.Text + " " + w)
			continue
		}
		if err := f.set(k, v); err != nil {
			return Filter{}, err
		}
	}
	return f, nil
}

// isWord reports whether s looks like a field name: letters only.
func isWord(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	return true
}

// maxAddressText is the longest address text isAddress parses: an IPv6
// address of 45 characters with a zone (an interface's name, 15 at most)
// in brackets and a port.
const maxAddressText = 72

// isAddress reports whether s is an IP address or address:port, which
// may begin with letters (dead::beef).
func isAddress(s string) bool {
	// Longer than any address, with its port or prefix length and an IPv6
	// zone's usual name: not one. netip's errors quote the whole text, and
	// a long word would cost three of them.
	if len(s) > maxAddressText {
		return false
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	if _, err := netip.ParseAddrPort(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}

func (f *Filter) set(k, v string) error {
	switch k {
	case "comm":
		f.Comm = v
	case "container":
		f.Container = v
	case "q":
		f.Text = v
	case "pid":
		return setPositive(&f.PID, v, "pid %q is not a process id")
	case "port":
		return setPositive(&f.Port, v, "port %q is not a port number (1-65535)")
	case "netns":
		return setPositive(&f.Netns, v, "netns %q is not a namespace inode number")
	case "addr":
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return fmt.Errorf("addr %q is not an IP address or prefix", v)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		// Flows carry IPv4 addresses unmapped: so does a prefix of
		// IPv4-mapped addresses, or it would match none of them.
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		f.Addr = p.Masked()
	}
	return nil
}

// setPositive sets *dst to v, a whole number from 1 to the largest an N
// holds; else the error is format with v.
func setPositive[N uint16 | uint32](dst *N, v, format string) error {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 || n > uint64(^N(0)) {
		return fmt.Errorf(format, v)
	}
	*dst = N(n)
	return nil
}

// String writes f back in ParseFilter's syntax.
func (f Filter) String() string {
	var w []string
	add := func(k, v string) { w = append(w, k+":"+v) }
	if f.Comm != "" {
		add("comm", f.Comm)
	}
	if f.PID != 0 {
		add("pid", strconv.FormatUint(uint64(f.PID), 10))
	}
	if f.Port != 0 {
		add("port", strconv.FormatUint(uint64(f.Port), 10))
	}
	if f.Addr.IsValid() {
		add("addr", f.Addr.String())
	}
	if f.Netns != 0 {
		add("netns", strconv.FormatUint(uint64(f.Netns), 10))
	}
	if f.Container != "" {
		add("container", f.Container)
	}
	if f.Text != "" {
		w = append(w, f.Text)
	}
	return strings.Join(w, " ")
}

// Empty reports whether f keeps everything.
func (f Filter) Empty() bool { return f == Filter{} }

// Values encodes q as the list endpoints' query parameters.
func (q Query) Values() url.Values {
	v := url.Values{}
	if q.Sort != "" {
		v.Set("sort", q.Sort)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	f := q.Filter
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("comm", f.Comm)
	set("container", f.Container)
	set("q", f.Text)
	if f.PID != 0 {
		v.Set("pid", strconv.FormatUint(uint64(f.PID), 10))
	}
	if f.Port != 0 {
		v.Set("port", strconv.FormatUint(uint64(f.Port), 10))
	}
	if f.Netns != 0 {
		v.Set("netns", strconv.FormatUint(uint64(f.Netns), 10))
	}
	if f.Addr.IsValid() {
		v.Set("addr", f.Addr.String())
	}
	return v
}

// ParseQuery reads the list endpoints' query parameters; unknown ones and
// bad values are errors that name the parameter.
func ParseQuery(v url.Values) (Query, error) {
	var q Query
	for k, vals := range v {
		if len(vals) != 1 {
			return Query{}, fmt.Errorf("parameter %q given %d times", k, len(vals))
		}
		val := vals[0]
		switch {
		case k == "sort":
			if !slices.Contains(SortKeys, val) {
				return Query{}, fmt.Errorf("sort %q is not one of %s", val, strings.Join(SortKeys, ", "))
			}
			q.Sort = val
		case k == "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return Query{}, fmt.Errorf("limit %q is not a count (0 for no limit)", val)
			}
			q.Limit = n
		case slices.Contains(filterKeys, k):
			if err := q.Filter.set(k, val); err != nil {
				return Query{}, err
			}
		default:
			return Query{}, fmt.Errorf("unknown parameter %q (known: sort, limit, %s)", k, strings.Join(filterKeys, ", "))
		}
	}
	return q, nil
}

// Flows returns the flows of all that pass q's filter, in q's order, in a
// new slice: what a client shows of a list it holds.
func (q Query) Flows(all []Flow) []Flow { return q.selectFlows(slices.Clone(all)) }

// selectFlows is Flows in all's own memory: what GET /v1/flows lists
// before its limit.
func (q Query) selectFlows(all []Flow) []Flow {
	out := all[:0]
	for i := range all {
		if q.Filter.MatchFlow(&all[i]) {
			out = append(out, all[i])
		}
	}
	SortFlows(out, q.Sort)
	return out
}

// Peers returns the peer pairs of all that q selects, like Flows.
func (q Query) Peers(all []Peer) []Peer {
	out := passing(all, q.Filter.MatchPeer)
	SortPeers(out, q.Sort)
	return out
}

// passing returns the entries of all that match, in order, in a new slice.
func passing[T any](all []T, match func(*T) bool) []T {
	out := make([]T, 0, len(all))
	for i := range all {
		if match(&all[i]) {
			out = append(out, all[i])
		}
	}
	return out
}

// MatchFlow reports whether fl passes the filter.
func (f Filter) MatchFlow(fl *Flow) bool {
	o := &fl.Owner
	return f.match(o.Comm, o.PID, o.ContainerID, fl.Flow.Netns,
		[]netip.AddrPort{fl.Flow.Local, fl.Flow.Remote}, fl.ID)
}

// MatchRow reports whether the flow of row r, owned by o (its own owner,
// or the one its exchange in progress knows), passes the filter.
func (f Filter) MatchRow(r *aggregate.FlowRow, o *record.Owner, id string) bool {
	return f.match(o.Comm, o.PID, o.ContainerID, r.Flow.Netns,
		[]netip.AddrPort{r.Flow.Local, r.Flow.Remote}, id)
}

// MatchPeer reports whether p passes the filter. A pair has no single
// process: PID never matches it.
func (f Filter) MatchPeer(p *Peer) bool {
	if f.PID != 0 {
		return false
	}
	eps := []netip.AddrPort{netip.AddrPortFrom(p.Remote, p.RemotePort)}
	if p.LocalPort != 0 {
		eps = append(eps, netip.AddrPortFrom(netip.Addr{}, p.LocalPort))
	}
	return f.match(p.Comm, 0, "", p.Netns, eps, p.ID)
}

func (f Filter) match(comm string, pid uint32, container string, netns uint32, eps []netip.AddrPort, id string) bool {
	if f.Comm != "" && !strings.Contains(comm, f.Comm) {
		return false
	}
	if f.PID != 0 && pid != f.PID {
		return false
	}
	if f.Container != "" && !strings.HasPrefix(container, f.Container) {
		return false
	}
	if f.Netns != 0 && netns != f.Netns {
		return false
	}
	if f.Port != 0 && !slices.ContainsFunc(eps, func(e netip.AddrPort) bool { return e.Port() == f.Port }) {
		return false
	}
	if f.Addr.IsValid() && !slices.ContainsFunc(eps, func(e netip.AddrPort) bool { return f.Addr.Contains(e.Addr().Unmap()) }) {
		return false
	}
	if f.Text != "" {
		hay := []string{comm, container, id, strconv.FormatUint(uint64(netns), 10)}
		if pid != 0 {
			hay = append(hay, strconv.FormatUint(uint64(pid), 10))
		}
		for _, e := range eps {
			if e.Addr().IsValid() {
				hay = append(hay, netip.AddrPortFrom(e.Addr().Unmap(), e.Port()).String())
			}
			hay = append(hay, ":"+strconv.FormatUint(uint64(e.Port()), 10))
		}
		for _, word := range strings.Fields(f.Text) {
			if !slices.ContainsFunc(hay, func(h string) bool { return strings.Contains(h, word) }) {
				return false
			}
		}
	}
	return true
}

// sortValue is what key orders by, for any flow or pair.
func sortValue(m *aggregate.Metrics, rate float64, key string) float64 {
	switch key {
	case "p50":
		return float64(m.Duration.P50)
	case "rate":
		return rate
	case "retrans":
		return float64(m.Retransmits)
	case "turns":
		return m.Turns.PerExchangeMean
	case "exchanges":
		return float64(m.Exchanges)
	}
	return float64(m.Duration.P99)
}

// rowSortValue is sortValue for a flow's row.
func rowSortValue(r *aggregate.FlowRow, rate float64, key string) float64 {
	switch key {
	case "p50":
		return float64(r.P50)
	case "rate":
		return rate
	case "retrans":
		return float64(r.Retransmits)
	case "turns":
		return r.TurnsPerExchange
	case "exchanges":
		return float64(r.Exchanges)
	}
	return float64(r.P99)
}

// SortFlows orders flows by key, largest first, ties by id so the order
// is stable from one refresh to the next.
func SortFlows(flows []Flow, key string) {
	sortBy(flows, func(f *Flow) (float64, string) { return sortValue(&f.Metrics, f.Rate, key), f.ID })
}

// SortPeers orders peer pairs like SortFlows.
func SortPeers(peers []Peer, key string) {
	sortBy(peers, func(p *Peer) (float64, string) { return sortValue(&p.Metrics, p.Rate, key), p.ID })
}

// sortBy orders list by value, largest first, then by id. It sorts the
// values and moves each entry once: an entry is over a kilobyte, and a
// node's tens of thousands of flows took longer to swap than to list.
func sortBy[T any](list []T, of func(*T) (float64, string)) {
	type sortKey struct {
		v  float64
		id string
		i  int
	}
	keys := make([]sortKey, len(list))
	for i := range list {
		v, id := of(&list[i])
		keys[i] = sortKey{v, id, i}
	}
	slices.SortFunc(keys, func(a, b sortKey) int {
		return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.id, b.id), cmp.Compare(a.i, b.i))
	})
	// Entry j comes from keys[j].i: follow each cycle of that
	// permutation, holding one entry aside.
	done := make([]bool, len(list))
	for start := range list {
		if done[start] {
			continue
		}
		held := list[start]
		j := start
		for {
			done[j] = true
			from := keys[j].i
			if from == start {
				list[j] = held
				break
			}
			list[j] = list[from]
			j = from
		}
	}
}
