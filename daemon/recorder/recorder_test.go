package recorder

import (
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/recording"
)

func TestValidate(t *testing.T) {
	good := Config{Out: "run.lattrace", Duration: time.Minute, Sampling: recording.DefaultSampling}
	if err := good.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Out = "" }, "--out FILE is required"},
		{func(c *Config) { c.Duration = 500 * time.Millisecond }, "--duration 500ms outside 1s..24h"},
		{func(c *Config) { c.Duration = MaxDuration + time.Second }, "outside 1s..24h"},
		{func(c *Config) { c.Sampling.Interval = 0 }, "--sample-interval 0s"},
		{func(c *Config) { c.Sampling.Max = 0 }, "--max-samples"},
		{func(c *Config) { c.Tracer = tracer.Options{DrainInterval: time.Hour} }, "drain interval 1h0m0s outside 1ms..10s"},
	} {
		cfg := good
		c.change(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", cfg, err, c.want)
		}
	}
}
