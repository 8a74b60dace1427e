package otlp_test

import (
	"context"
	"testing"
	"time"

	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/tests/otelcol"
)

// BenchmarkExchange is the exporter's cost per exchange: the metrics alone
// (most exchanges), and an exchange sampled into spans (a trace of one
// span per stage), against a real Collector.
func BenchmarkExchange(b *testing.B) {
	c := otelcol.Start(b)
	for _, bc := range []struct {
		name string
		cfg  otlp.Config
	}{
		{"metrics", otlp.Config{SlowThreshold: -1}},
		{"sampled", otlp.Config{SlowThreshold: 0, SlowRatePerSecond: -1, MaxQueueSize: 1 << 20}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := bc.cfg
			cfg.Endpoint, cfg.Insecure = c.GRPCEndpoint(), true
			x, err := otlp.New(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer x.Shutdown(context.Background())
			e := requester(1, 2, 3)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				x.Exchange(e)
			}
			b.StopTimer()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			x.ForceFlush(ctx)
		})
	}
}
