package otlp

import (
	"context"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// queueCounts keeps Stats' export counters and the failing flag that Sync
// reads, as the span queue tells each exchange's fate.
type queueCounts struct{ x *Exporter }

func (c queueCounts) exported(exchanges, spans int) {
	c.x.exchangesExported.Add(uint64(exchanges))
	c.x.spansExported.Add(uint64(spans))
	c.x.failing.Store(false)
}

func (c queueCounts) dropped(why dropReason, exchanges, spans int) {
	c.x.unexported[why].Add(uint64(exchanges))
	c.x.spansDropped[why].Add(uint64(spans))
}

func (c queueCounts) exportFailed(error) {
	c.x.exportErrors.Add(1)
	c.x.failing.Store(true)
}

// countingMetricExporter counts failed metric exports, which the SDK's
// PeriodicReader only hands to the global error handler.
type countingMetricExporter struct {
	sdkmetric.Exporter
	x *Exporter
}

func (c *countingMetricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := c.Exporter.Export(ctx, rm)
	if err != nil {
		c.x.metricErrors.Add(1)
	}
	return err
}
