package tracer

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// ProbeStorageIterator loads the smallest iterator over a socket storage map
// there is and reports whether this kernel allows one. Some kernels and
// sandboxes refuse iterators over map elements (EPERM) while they allow
// every tracepoint and even task or TCP iterators: then the optional hook
// that reads exchanges in progress is off. Tests use it to know what to
// expect without trusting lattrace's own load.
func ProbeStorageIterator() error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       ebpf.Tracing,
		AttachType: ebpf.AttachTraceIter,
		AttachTo:   "bpf_sk_storage_map",
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.LoadImm(asm.R0, 0, asm.DWord),
			asm.Return(),
		},
	})
	if err != nil {
		return explainLoadError("loading an iterator over socket storage", err)
	}
	return p.Close()
}
