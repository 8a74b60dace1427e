package otlp

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// exportOptions is what lattrace sets on the SDK's OTLP exporters, the
// same for traces and metrics and for both protocols; what it leaves
// unset the SDK takes from the OTEL_EXPORTER_OTLP_* variables.
type exportOptions struct {
	endpoint string // empty: the SDK's variable, else its default
	insecure bool
	headers  map[string]string
	retry    retryConfig
	timeout  time.Duration
	dial     grpc.DialOption // gRPC only
}

// retryConfig has the fields of the RetryConfig that each of the SDK's
// exporter packages declares as a type of its own.
type retryConfig = struct {
	Enabled                                      bool
	InitialInterval, MaxInterval, MaxElapsedTime time.Duration
}

// grpcConnect caps gRPC's reconnect backoff so a backend that comes back is
// found within seconds.
var grpcConnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
	MinConnectTimeout: 5 * time.Second,
})

func (c Config) exportOptions() exportOptions {
	return exportOptions{
		endpoint: c.Endpoint,
		// Without an endpoint, OTEL_EXPORTER_OTLP_INSECURE or the
		// variable's scheme decides.
		insecure: c.Insecure && c.Endpoint != "",
		headers:  c.Headers,
		// The SDK retries within an attempt (it honours a backend's
		// RetryInfo and Retry-After); the span queue retries across
		// attempts.
		retry:   retryConfig{Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: c.ExportTimeout},
		timeout: c.ExportTimeout,
		dial:    grpcConnect,
	}
}

// sdkOptions maps o onto one SDK exporter package's options, given that
// package's constructors (dial nil for HTTP).
func sdkOptions[R ~retryConfig, O any](o exportOptions,
	dial func(...grpc.DialOption) O, retry func(R) O, timeout func(time.Duration) O,
	endpoint func(string) O, insecure func() O, headers func(map[string]string) O,
) []O {
	var opts []O
	if dial != nil {
		opts = append(opts, dial(o.dial))
	}
	opts = append(opts, retry(R(o.retry)), timeout(o.timeout))
	if o.endpoint != "" {
		opts = append(opts, endpoint(o.endpoint))
	}
	if o.insecure {
		opts = append(opts, insecure())
	}
	if len(o.headers) > 0 {
		opts = append(opts, headers(o.headers))
	}
	return opts
}

func newSpanExporter(ctx context.Context, protocol string, o exportOptions) (sdktrace.SpanExporter, error) {
	if protocol == ProtocolHTTP {
		return otlptracehttp.New(ctx, sdkOptions(o, nil, otlptracehttp.WithRetry, otlptracehttp.WithTimeout,
			otlptracehttp.WithEndpoint, otlptracehttp.WithInsecure, otlptracehttp.WithHeaders)...)
	}
	return otlptracegrpc.New(ctx, sdkOptions(o, otlptracegrpc.WithDialOption, otlptracegrpc.WithRetry, otlptracegrpc.WithTimeout,
		otlptracegrpc.WithEndpoint, otlptracegrpc.WithInsecure, otlptracegrpc.WithHeaders)...)
}

func newMetricExporter(ctx context.Context, protocol string, o exportOptions) (sdkmetric.Exporter, error) {
	if protocol == ProtocolHTTP {
		return otlpmetrichttp.New(ctx, sdkOptions(o, nil, otlpmetrichttp.WithRetry, otlpmetrichttp.WithTimeout,
			otlpmetrichttp.WithEndpoint, otlpmetrichttp.WithInsecure, otlpmetrichttp.WithHeaders)...)
	}
	return otlpmetricgrpc.New(ctx, sdkOptions(o, otlpmetricgrpc.WithDialOption, otlpmetricgrpc.WithRetry, otlpmetricgrpc.WithTimeout,
		otlpmetricgrpc.WithEndpoint, otlpmetricgrpc.WithInsecure, otlpmetricgrpc.WithHeaders)...)
}
