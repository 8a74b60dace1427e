package tracer

import (
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// TestVerifierRejectionSaysSo: a program the verifier refuses (a read far
// past its context) comes with EACCES, like a policy refusal; the error
// says it was the verifier, with its last line, not the kernel's policy.
func TestVerifierRejectionSaysSo(t *testing.T) {
	_, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SocketFilter,
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R0, asm.R1, 4000, asm.DWord),
			asm.Return(),
		},
		License: "GPL",
	})
	if err == nil {
		t.Fatal("the verifier accepted a read past the context")
	}
	msg := explainLoadError("loading lattrace_test", err).Error()
	t.Log(msg)
	if !strings.Contains(msg, "loading lattrace_test: the kernel's verifier refused it: ") || strings.Contains(msg, "operation not permitted") {
		t.Errorf("a verifier rejection explained as %q", msg)
	}
	if !strings.Contains(msg, "invalid bpf_context access") {
		t.Errorf("the verifier's reason is not in %q", msg)
	}
}

// TestMissingHookSaysWhatWasTried: a required hook none of whose
// alternatives the kernel has (here, sendfile's hooks of kernels before
// 6.5 made required) refuses the start with one line naming the kernel
// and every alternative tried, with the kernel's reason for each.
func TestMissingHookSaysWhatWasTried(t *testing.T) {
	saved := hooks
	t.Cleanup(func() { hooks = saved })
	hooks = append(slices.Clone(saved),
		hook{program: "lattrace_sendpages_fentry", hook: "fentry/do_tcp_sendpages", required: true, feature: "sendfile (test)", attach: attachTracing},
		hook{program: "lattrace_sendpage_fexit", hook: "fexit/tcp_sendpage", fallbackFor: "lattrace_sendpages_fentry", attach: attachTracing})
	tr, err := Open(Options{})
	if err == nil {
		tr.Close()
		t.Fatal("this kernel has tcp_sendpage and allows fentry: the test needs one without (6.5 and later, or trampolines refused)")
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"Linux " + kernelRelease(), "fentry/do_tcp_sendpages: loading lattrace_sendpages_fentry: ", "fexit/tcp_sendpage: loading lattrace_sendpage_fexit: "} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal does not say %q: %s", want, msg)
		}
	}
}
