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
