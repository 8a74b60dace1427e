package tracer

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

// TestNoPayloadRead proves from the compiled object that lattrace reads
// metadata only: it lists every helper each program calls and every kernel
// field it reads (all kernel reads are CO-RE relocations, vmlinux.h being
// preserve_access_index), and fails on a helper that reads user memory or
// packet bytes, or on a field that holds or points at payload. The one
// exception is HTTP/2's framing (README, "What lattrace reads"): its two
// programs, and only they, load bytes of segments (bpf/http2.bpf.h: the
// preface, frame headers). User memory is read in one place: a Go
// program's goroutine id and its parent's, 8 bytes each from the runtime's
// g (bpf/request_links.bpf.h), which goroutineID checks call by call.
func TestNoPayloadRead(t *testing.T) {
	spec, err := loadLattrace()
	if err != nil {
		t.Fatal(err)
	}
	forbiddenHelpers := []asm.BuiltinFunc{
		asm.FnProbeRead, asm.FnProbeReadStr, asm.FnProbeReadUser, asm.FnProbeReadUserStr,
		asm.FnCopyFromUser, asm.FnCopyFromUserTask, asm.FnSkbLoadBytes, asm.FnSkbLoadBytesRelative,
		asm.FnSkbPullData, asm.FnMsgPullData, asm.FnXdpLoadBytes, asm.FnDynptrFromMem, asm.FnStrtol,
	}
	// Payload lives behind these: an skb's data pointer and fragments, a
	// message's iovecs, a socket's queues of data. (sk_buff.head and .end
	// are read only to find skb_shared_info, whose tskey says which byte a
	// TX timestamp is for; the out-of-order queue's root is only compared
	// with NULL.)
	forbiddenFields := regexp.MustCompile(`^(sk_buff\.(data|tail|data_len)|skb_shared_info\.(frags|frag_list)|msghdr|iov_iter|iovec|kvec|bio_vec|sk_msg|sock\.(sk_receive_queue|sk_write_queue|sk_error_queue)|tcp_sock\.out_of_order_queue\.rb_node\..+)`)
	framing := map[string]bool{"lattrace_h2_egress": true, "lattrace_h2_ingress": true}
	re := regexp.MustCompile(`^CORERelocation\(([a-z_]+), (\w+):"([^"]*)"\[([0-9:]+)\]`)
	fields := map[string]bool{}
	for name, p := range spec.Programs {
		var helpers []string
		for i := range p.Instructions {
			ins := &p.Instructions[i]
			if ins.IsBuiltinCall() {
				fn := asm.BuiltinFunc(ins.Constant)
				switch {
				case fn == asm.FnProbeReadUser && goroutineID(p.Instructions, i):
				case slices.Contains(forbiddenHelpers, fn) && !(framing[name] && fn == asm.FnSkbLoadBytes):
					t.Errorf("%s calls %s, which can read payload or user memory", name, fn)
				}
				if !slices.Contains(helpers, fn.String()) {
					helpers = append(helpers, fn.String())
				}
			}
			if relo := btf.CORERelocationMetadata(ins); relo != nil {
				m := re.FindStringSubmatch(relo.String())
				if m == nil || !strings.HasPrefix(m[1], "byte_") && m[1] != "field_exists" {
					continue // type and enum relocations read nothing
				}
				path := fieldPath(t, spec.Types, m[3], m[4])
				fields[path] = true
				if forbiddenFields.MatchString(path) {
					t.Errorf("%s reads %s, which holds or points at payload", name, path)
				}
			}
		}
		slices.Sort(helpers)
		t.Logf("%s helpers: %s", name, strings.Join(helpers, " "))
	}
	var all []string
	for f := range fields {
		all = append(all, f)
	}
	slices.Sort(all)
	t.Logf("kernel fields read (%d): %s", len(all), strings.Join(all, " "))
	if len(all) < 20 {
		t.Errorf("only %d fields found: the relocation parsing is broken", len(all))
	}
}

// goroutineID reports whether the helper call at ins[i] reads 8 bytes
// into the stack (a goroutine id, never a buffer): the size argument (R2)
// is the constant 8 and the destination (R1) the frame, set just before.
func goroutineID(ins asm.Instructions, i int) bool {
	size, dst := false, false
	for j := i - 1; j >= 0 && j >= i-8; j-- {
		in := ins[j]
		if in.Dst == asm.R2 && in.OpCode.ALUOp() == asm.Mov && in.OpCode.Source() == asm.ImmSource {
			size = size || in.Constant == 8
		}
		if in.Dst == asm.R1 && (in.Src == asm.RFP || in.OpCode.ALUOp() == asm.Add) {
			dst = true
		}
	}
	return size && dst
}

// fieldPath names the field a CO-RE accessor ("0:3:1") reaches in the
// struct or union named typ: "sock.__sk_common.skc_state".
func fieldPath(t *testing.T, types *btf.Spec, typ, accessor string) string {
	t.Helper()
	cands, err := types.AnyTypesByName(typ)
	if err != nil || len(cands) == 0 {
		t.Fatalf("type %s: %v", typ, err)
	}
	cur := btf.UnderlyingType(cands[0])
	path := []string{typ}
	idx := strings.Split(accessor, ":")
	for _, s := range idx[1:] { // the first index steps over an array of the type itself
		i, _ := strconv.Atoi(s)
		switch v := cur.(type) {
		case *btf.Struct:
			path = append(path, v.Members[i].Name)
			cur = btf.UnderlyingType(v.Members[i].Type)
		case *btf.Union:
			path = append(path, v.Members[i].Name)
			cur = btf.UnderlyingType(v.Members[i].Type)
		case *btf.Array:
			cur = btf.UnderlyingType(v.Type)
		default:
			return strings.Join(path, ".")
		}
	}
	return strings.Join(path, ".")
}
