// Package kernels is the kernel matrix: it boots the kernels production
// nodes run (Debian's 6.1 and 6.12, fetched by setup.sh through make
// setup) in a VM and runs a subset of the suite inside each, against that
// kernel: the hooks' alternatives, the lab's delay, think-time, loss and
// bulk scenarios, nginx and nghttpd. The host's own kernel runs the whole
// suite.
package kernels
