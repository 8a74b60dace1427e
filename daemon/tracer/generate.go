package tracer

// The BPF objects and their Go bindings are generated from bpf/ and committed,
// so that `go build` works on a machine without clang; CI regenerates them and
// fails when the committed copies are stale (make check-generate).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type lt_conn_close -type lt_conn_open -type lt_exchange -type lt_progress -type lt_inflight -type lt_exchange_role -type lt_exchange_flag -type lt_flow -type lt_owner -type lt_header -type lt_counter -type lt_record_kind -type lt_role -type lt_layout -type lt_h2_flag -type lt_h2_frame -type lt_h2_event -type lt_h2_event_kind -type lt_wait_cause -type lt_control -type lt_control_slot -type lt_link -type lt_served -type lt_link_method -type lt_go_offsets lattrace ../../bpf/lattrace.bpf.c -- -I../../bpf
