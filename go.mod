module github.com/lattrace/lattrace

go 1.26.8

require (
	github.com/DataDog/sketches-go v1.4.8
	github.com/cilium/ebpf v0.22.0
	github.com/spf13/cobra v1.10.2
	golang.org/x/sys v0.49.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
