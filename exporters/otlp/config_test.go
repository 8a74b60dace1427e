package otlp_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/lattrace/lattrace/exporters/otlp"
)

// flagDefaults is the Config the daemon's flags give when none is set.
func flagDefaults() otlp.Config {
	return otlp.Config{SlowThreshold: 100 * ms, RatePerSecond: 10, SlowRatePerSecond: otlp.DefaultSlowRate, Ratio: 1}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*otlp.Config)
		want string // the error, "" for none
	}{
		{"flag defaults", func(*otlp.Config) {}, ""},
		{"grpc", func(c *otlp.Config) { c.Protocol = otlp.ProtocolGRPC }, ""},
		{"http", func(c *otlp.Config) { c.Protocol = otlp.ProtocolHTTP }, ""},
		{"unknown protocol", func(c *otlp.Config) { c.Protocol = "udp" }, `--otlp-protocol "udp": want grpc or http/protobuf`},
		{"no rate sample", func(c *otlp.Config) { c.RatePerSecond = 0 }, ""},
		{"negative rate", func(c *otlp.Config) { c.RatePerSecond = -1 }, "--span-rate -1 is negative"},
		{"NaN rate", func(c *otlp.Config) { c.RatePerSecond = math.NaN() }, "--span-rate NaN: want a number of spans per second"},
		{"unbounded slow spans", func(c *otlp.Config) { c.SlowRatePerSecond = -1 }, ""},
		{"zero slow rate", func(c *otlp.Config) { c.SlowRatePerSecond = 0 }, "--span-slow-rate 0: want more than 0, or a negative value for no bound"},
		{"NaN slow rate", func(c *otlp.Config) { c.SlowRatePerSecond = math.NaN() }, "--span-slow-rate NaN: want a number of spans per second"},
		{"no slow rule", func(c *otlp.Config) { c.SlowThreshold = -1 }, ""},
		{"a tenth by identity", func(c *otlp.Config) { c.Ratio = 0.1 }, ""},
		{"zero ratio", func(c *otlp.Config) { c.Ratio = 0 }, "--span-ratio 0: want more than 0 and at most 1 (--span-rate 0 samples none)"},
		{"ratio above 1", func(c *otlp.Config) { c.Ratio = 1.5 }, "--span-ratio 1.5: want more than 0 and at most 1 (--span-rate 0 samples none)"},
		{"NaN ratio", func(c *otlp.Config) { c.Ratio = math.NaN() }, "--span-ratio NaN: want more than 0 and at most 1 (--span-rate 0 samples none)"},
		{"negative queue", func(c *otlp.Config) { c.MaxQueueSize = -1 }, "MaxQueueSize -1 is negative (0 is the default)"},
		{"negative burst", func(c *otlp.Config) { c.Burst = -2 }, "Burst -2 is negative (0 is the default)"},
		{"negative batch timeout", func(c *otlp.Config) { c.BatchTimeout = -time.Second }, "BatchTimeout -1s is negative (0 is the default)"},
		{"negative resync", func(c *otlp.Config) { c.ClockResyncInterval = -ms }, "ClockResyncInterval -1ms is negative (0 is the default)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := flagDefaults()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

// New fills the defaults in before it validates, so a Config built in code
// may leave the slow rate zero; what Validate refuses New refuses too, and
// OTEL_EXPORTER_OTLP_PROTOCOL is checked where it is read.
func TestNewValidates(t *testing.T) {
	off := otlp.Config{DisableTraces: true, DisableMetrics: true}
	x, err := otlp.New(context.Background(), off)
	if err != nil {
		t.Fatalf("New with the zero slow rate: %v", err)
	}
	_ = x.Shutdown(context.Background())

	bad := off
	bad.MaxQueueSize = -1
	if _, err := otlp.New(context.Background(), bad); err == nil || err.Error() != "otlp: MaxQueueSize -1 is negative (0 is the default)" {
		t.Errorf("New with a negative queue: %v", err)
	}

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")
	if _, err := otlp.New(context.Background(), off); err == nil || err.Error() != `otlp: protocol "udp": want grpc or http/protobuf` {
		t.Errorf("New with OTEL_EXPORTER_OTLP_PROTOCOL=udp: %v", err)
	}
	http := off
	http.Protocol = otlp.ProtocolHTTP
	x, err = otlp.New(context.Background(), http)
	if err != nil {
		t.Fatalf("New with a protocol given and a bad variable: %v", err)
	}
	_ = x.Shutdown(context.Background())
}
