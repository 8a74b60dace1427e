package otlp

import (
	"testing"

	"github.com/lattrace/lattrace/record"
)

// The exchange span names its worst diagnosis's severity, whatever the
// order of its diagnoses, for a gateway's tail sampling to match.
func TestWorstSeverityAttribute(t *testing.T) {
	e := &record.Exchange{Diagnoses: []record.Diagnosis{
		{Name: "app_peer", Severity: record.SeverityInfo},
		{Name: "loss", Severity: record.SeverityCritical},
		{Name: "bufferbloat", Severity: record.SeverityWarning},
	}}
	for _, kv := range exchangeAttrs(e) {
		if kv.Key == "lattrace.diagnosis.severity" {
			if kv.Value.AsString() != "critical" {
				t.Errorf("severity %q, want critical", kv.Value.AsString())
			}
			return
		}
	}
	t.Error("no lattrace.diagnosis.severity on a span with diagnoses")
}

// The rate sample's share is chosen by the exchange's identity: the
// requester's and the responder's records of one exchange (ISNs swapped,
// the request's sequence number in OutSeq at one end and InSeq at the
// other) are in or out together, and the share is the ratio asked for.
func TestShareByIdentity(t *testing.T) {
	var s sampler
	s.init(Config{Ratio: 0.25, RatePerSecond: 1})
	in := 0
	const n = 100000
	for i := range uint32(n) {
		client, server, seq := 0x9e3779b9*i+1, 0x85ebca6b*i+7, i*1460+1
		req := &record.Exchange{Role: record.Requester, ISNLocal: client, ISNRemote: server, OutSeq: seq}
		resp := &record.Exchange{Role: record.Responder, ISNLocal: server, ISNRemote: client, InSeq: seq}
		a, b := s.inShare(req), s.inShare(resp)
		if a != b {
			t.Fatalf("exchange %d: requester in the share %v, responder %v", i, a, b)
		}
		if a {
			in++
		}
	}
	if got := float64(in) / n; got < 0.24 || got > 0.26 {
		t.Errorf("share %.3f of the exchanges, want 0.25", got)
	}
	s.init(Config{Ratio: 1, RatePerSecond: 1})
	if !s.inShare(&record.Exchange{ISNLocal: 1, ISNRemote: 2}) {
		t.Error("ratio 1 leaves an exchange out")
	}
}
