package otlp

import (
	"context"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// countingSpanExporter sits between the span queue and the SDK's
// exporter, where each batch's fate is known: it keeps the queue depth,
// Stats' span counters and the failing flag that Sync reads.
type countingSpanExporter struct {
	sdktrace.SpanExporter
	x *Exporter
}

func (c *countingSpanExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.x.pending.Add(-int64(len(spans)))
	err := c.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		c.x.exportErrors.Add(1)
		c.x.spansFailed.Add(uint64(len(spans)))
		c.x.failing.Store(true)
	} else {
		c.x.spansExported.Add(uint64(len(spans)))
		c.x.failing.Store(false)
	}
	return err
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
