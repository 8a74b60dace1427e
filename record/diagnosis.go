package record

// DiagnosisName identifies a diagnosis; it is stable (metrics, scripts and
// the API use it). The names and their rules are in daemon/diagnose.
type DiagnosisName string

// Severity ranks diagnoses: SeverityInfo is how the time is spent when
// nothing is broken (a slow peer app), SeverityWarning and SeverityCritical
// are something to fix, by the share of latency at stake.
type Severity string

// Severities, lowest first.
const (
	SeverityInfo     Severity = "info"
	SeverityWarning  Severity = "warning"
	SeverityCritical Severity = "critical"
)

// Rank orders severities: 0 for info up to 2 for critical.
func (s Severity) Rank() int {
	switch s {
	case SeverityCritical:
		return 2
	case SeverityWarning:
		return 1
	}
	return 0
}

// Evidence is one number a diagnosis rests on.
type Evidence struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Unit is "ms", "%", "segments", "count", "bytes/s" or "" (a flag or
	// a plain number).
	Unit string `json:"unit"`
}

// Diagnosis is one finding about an exchange, a flow or a peer pair.
type Diagnosis struct {
	Name     DiagnosisName `json:"name"`
	Severity Severity      `json:"severity"`
	// Share is the fraction of the (mean) exchange latency this finding
	// explains, 0..1.
	Share float64 `json:"share"`
	// Summary says in one sentence, with numbers, what was seen.
	Summary  string     `json:"summary"`
	Evidence []Evidence `json:"evidence"`
	// Fix is what to change, in words a person can act on.
	Fix string `json:"fix"`
	// Related names other flows the finding points at, where there are
	// any: for bufferbloat, the flows moving data in bulk at the time.
	Related []string `json:"related,omitempty"`
}
