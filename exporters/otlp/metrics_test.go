package otlp

import (
	"net/netip"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/sdk/instrumentation"

	"github.com/lattrace/lattrace/record"
)

// A server that speaks first (MySQL's greeting) once made its connections'
// exchanges look reversed; the pair's server port comes from the
// connection's role, so each client's ephemeral port is no series of its
// own.
func TestPairsKeyedByConnectionRole(t *testing.T) {
	m := newMetrics(instrumentation.Scope{Name: ScopeName}, 100)
	for _, clientPort := range []uint16{40001, 40002, 40003} {
		for _, e := range []record.Exchange{
			// The client's end, whatever its exchanges' role was taken as.
			{Role: record.Responder, ConnRole: record.RoleClient, Flow: record.Flow{
				Local: netip.MustParseAddrPort("10.0.0.1:" + strconv.Itoa(int(clientPort))), Remote: netip.MustParseAddrPort("10.0.0.2:3306")}},
			// The server's end.
			{Role: record.Requester, ConnRole: record.RoleServer, Flow: record.Flow{
				Local: netip.MustParseAddrPort("10.0.0.2:3306"), Remote: netip.MustParseAddrPort("10.0.0.1:" + strconv.Itoa(int(clientPort)))}},
		} {
			m.exchange(&e)
		}
	}
	ports := map[uint16]bool{}
	for k := range m.pairs {
		ports[k.port] = true
	}
	if len(ports) != 1 || !ports[3306] {
		t.Errorf("pairs keyed by server ports %v, want only 3306", ports)
	}
}
