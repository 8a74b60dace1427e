package otlp

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Config configures an Exporter. The zero value exports every exchange as a
// span to the endpoint named by the OTEL_EXPORTER_OTLP_* environment
// variables (default localhost:4317, TLS unless the endpoint says http://).
type Config struct {
	// Endpoint is host:port of an OTLP receiver; empty leaves it to
	// OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT, read by the SDK.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTP; empty takes
	// OTEL_EXPORTER_OTLP_PROTOCOL, else gRPC.
	Protocol string
	// Insecure disables TLS (with Endpoint).
	Insecure bool
	// Headers are sent with every export (also OTEL_EXPORTER_OTLP_HEADERS).
	Headers map[string]string

	// ServiceVersion is the resource's service.version; HostName its
	// host.name (default os.Hostname). service.name is "lattrace".
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override them.
	ServiceVersion string
	HostName       string
	// NodeName is the resource's k8s.node.name (default: $NODE_NAME, which
	// the DaemonSet sets from the downward API); omitted when empty.
	NodeName string

	// SlowThreshold: every exchange at least this long is exported as a
	// span, within SlowRatePerSecond; zero makes every exchange slow, a
	// negative value turns the rule off (only the rate sample is
	// exported).
	SlowThreshold time.Duration
	// SlowRatePerSecond bounds those spans per second, with as deep a
	// burst (default DefaultSlowRate; negative: no bound). Slow exchanges
	// beyond it are counted in Stats.SlowOverBudget.
	SlowRatePerSecond float64
	// RatePerSecond is the token bucket's rate for the other exchanges;
	// zero exports none of them. Burst is its depth (default
	// max(1, RatePerSecond)).
	RatePerSecond float64
	Burst         int
	// Ratio is the share of the other exchanges the rate sample draws
	// from (default 1: all), chosen by the exchange's identity (the ISNs
	// and the request's sequence number that its trace ID comes from), so
	// that the nodes at both ends of a connection choose the same
	// exchanges and a gateway gets both halves of each.
	Ratio float64

	// MaxQueueSize bounds the spans waiting for export, the batch being
	// sent included (default DefaultQueueSize). When it is full, the
	// exchanges of the lowest priority waiting make room, the oldest first
	// (the rate sample's, then the slow ones, then the diagnosed ones),
	// whole and counted.
	MaxQueueSize int
	// BatchTimeout is the longest a span waits before a batch is sent
	// (default 1 s); MaxExportBatchSize the largest batch (default 512).
	BatchTimeout       time.Duration
	MaxExportBatchSize int
	// ExportTimeout bounds one export attempt, the SDK's retries within
	// it included (default 10 s, the SDK's own default). A batch whose
	// attempt fails goes back to the queue and is tried again after a
	// backoff of 0.5 s to 5 s, until it is exported or makes room.
	ExportTimeout time.Duration
	// SyncTimeout bounds how long Sync waits for the backend to
	// acknowledge a drain's spans (default 1 s); a backend that takes
	// longer counts as failing until an export succeeds.
	SyncTimeout time.Duration

	// MetricInterval is the PeriodicReader's push interval (default 15 s).
	MetricInterval time.Duration
	// MetricReaders are extra readers of the same MeterProvider (e.g. a
	// Prometheus exporter). They read the SDK's instruments; lattrace's
	// latency metrics come from MetricsProducer, which such a reader must
	// be given as a producer too.
	MetricReaders []sdkmetric.Reader
	// MaxPeerPairs caps the distinct peer pairs (comm, remote address,
	// server port, role) in the metrics; further pairs are folded into
	// one "other" pair (default DefaultMaxPeerPairs). The SDK's cardinality limit is set
	// above it as a second bound.
	MaxPeerPairs int

	// DisableTraces and DisableMetrics turn either signal off.
	DisableTraces  bool
	DisableMetrics bool

	// ClockResyncInterval is how often the monotonic-to-wall offset is
	// re-measured (default 1 s).
	ClockResyncInterval time.Duration
}

// DefaultSlowRate is the default budget of slow spans per second. A slow
// exchange is a trace of up to eight spans (the exchange and its stages),
// so 100 a second is 800 spans a second from one node, more than a person
// reads and within what a collector takes from every node of a cluster;
// the metrics still count every exchange. What a larger budget costs in a
// connection storm is in docs/configuration.md (span_slow_rate).
const DefaultSlowRate = 100

// DefaultQueueSize is the default bound on the spans waiting for export:
// a minute of the default slow budget's spans, tens of megabytes at most.
const DefaultQueueSize = 8192

// DefaultMaxPeerPairs is the default bound on the peer pairs in the
// metrics.
const DefaultMaxPeerPairs = 2000

// Protocols the exporter speaks (OTEL_EXPORTER_OTLP_PROTOCOL's values).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Validate checks c as a person gave it (flags, the config file): its
// messages name the daemon's flags, which are also the file's keys. Every
// rate is given there, so a zero SlowRatePerSecond is refused rather than
// read as the default. New fills the defaults in first, so a Config built
// in code may leave any field zero.
func (c Config) Validate() error {
	if p := c.Protocol; p != "" && p != ProtocolGRPC && p != ProtocolHTTP {
		return fmt.Errorf("--otlp-protocol %q: want %s or %s", p, ProtocolGRPC, ProtocolHTTP)
	}
	if c.RatePerSecond < 0 {
		return fmt.Errorf("--span-rate %v is negative", c.RatePerSecond)
	}
	if c.SlowRatePerSecond == 0 {
		return fmt.Errorf("--span-slow-rate 0: want more than 0, or a negative value for no bound")
	}
	// A NaN rate compares false with everything: its token bucket would
	// never refill, and the sample would stop without a word.
	if math.IsNaN(c.RatePerSecond) {
		return fmt.Errorf("--span-rate NaN: want a number of spans per second")
	}
	if math.IsNaN(c.SlowRatePerSecond) {
		return fmt.Errorf("--span-slow-rate NaN: want a number of spans per second")
	}
	if !(c.Ratio > 0 && c.Ratio <= 1) {
		return fmt.Errorf("--span-ratio %v: want more than 0 and at most 1 (--span-rate 0 samples none)", c.Ratio)
	}
	// The fields below have no flag: zero means the default, and a
	// negative value is a mistake rather than a choice.
	for _, f := range []struct {
		name     string
		v        any
		negative bool
	}{
		{"Burst", c.Burst, c.Burst < 0},
		{"MaxQueueSize", c.MaxQueueSize, c.MaxQueueSize < 0},
		{"MaxExportBatchSize", c.MaxExportBatchSize, c.MaxExportBatchSize < 0},
		{"MaxPeerPairs", c.MaxPeerPairs, c.MaxPeerPairs < 0},
		{"BatchTimeout", c.BatchTimeout, c.BatchTimeout < 0},
		{"ExportTimeout", c.ExportTimeout, c.ExportTimeout < 0},
		{"SyncTimeout", c.SyncTimeout, c.SyncTimeout < 0},
		{"MetricInterval", c.MetricInterval, c.MetricInterval < 0},
		{"ClockResyncInterval", c.ClockResyncInterval, c.ClockResyncInterval < 0},
	} {
		if f.negative {
			return fmt.Errorf("%s %v is negative (0 is the default)", f.name, f.v)
		}
	}
	return nil
}

// defaults fills in the zero fields but Protocol, which resolveProtocol
// takes from the environment once Validate has checked what was given.
// Negative values are left for Validate to refuse.
func (c *Config) defaults() {
	if c.SyncTimeout == 0 {
		c.SyncTimeout = time.Second
	}
	if c.MaxQueueSize == 0 {
		c.MaxQueueSize = DefaultQueueSize
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = time.Second
	}
	if c.MaxExportBatchSize == 0 {
		c.MaxExportBatchSize = 512
	}
	if c.ExportTimeout == 0 {
		c.ExportTimeout = 10 * time.Second
	}
	if c.MetricInterval == 0 {
		c.MetricInterval = 15 * time.Second
	}
	if c.MaxPeerPairs == 0 {
		c.MaxPeerPairs = DefaultMaxPeerPairs
	}
	if c.Burst == 0 {
		c.Burst = max(1, int(c.RatePerSecond))
	}
	if c.Ratio == 0 {
		c.Ratio = 1
	}
	if c.SlowRatePerSecond == 0 {
		c.SlowRatePerSecond = DefaultSlowRate
	}
	if c.ClockResyncInterval == 0 {
		c.ClockResyncInterval = time.Second
	}
	if c.NodeName == "" {
		c.NodeName = os.Getenv("NODE_NAME")
	}
	if c.HostName == "" {
		c.HostName, _ = os.Hostname()
	}
}

// resolveProtocol sets an empty Protocol from OTEL_EXPORTER_OTLP_PROTOCOL,
// else gRPC. lattrace reads the variable itself: the SDK's exporters speak
// one protocol each and leave the choice to their user.
func (c *Config) resolveProtocol() error {
	if c.Protocol != "" {
		return nil
	}
	c.Protocol = cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), ProtocolGRPC)
	if c.Protocol != ProtocolGRPC && c.Protocol != ProtocolHTTP {
		return fmt.Errorf("protocol %q: want %s or %s", c.Protocol, ProtocolGRPC, ProtocolHTTP)
	}
	return nil
}
