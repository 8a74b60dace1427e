package tracer

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// setConfig sets the programs' configuration (struct lt_config in
// bpf/lattrace.h, the variable cfg) from opts, as one value; what opts
// does not decide keeps the object's default. filter says whether tracing
// is limited to a cgroup's tasks.
func setConfig(spec *ebpf.CollectionSpec, opts Options, filter bool) (lattraceLtConfig, error) {
	var cfg lattraceLtConfig
	v := spec.Variables["cfg"]
	if err := v.Get(&cfg); err != nil {
		return cfg, fmt.Errorf("reading the BPF configuration: %w", err)
	}
	cfg.WakeupBytes = opts.WakeupBytes
	cfg.UseTxTstamp = boolByte(!opts.NoTxTimestamps)
	cfg.FilterCgroup = boolByte(filter)
	cfg.NoLinks = boolByte(opts.NoRequestLinks)
	cfg.IdleWriteNs = uint64(max(opts.IdleWrite, 0))
	if err := v.Set(cfg); err != nil {
		return cfg, fmt.Errorf("setting the BPF configuration: %w", err)
	}
	return cfg, nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
