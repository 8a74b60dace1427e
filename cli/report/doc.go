// Package report turns a recording (exporters/recording) into one HTML
// page a person reads in a browser, offline, with the plots a latency
// study draws by hand, for every peer pair lattrace saw. A summary table comes
// first (mean, p50, p99, standard deviation, max, the latency split and
// the diagnoses per pair); then, for the pairs that cost the most time,
// latency over time stacked by component with retransmissions marked, the
// app, TCP and network RTT side by side (over time, as box plots and as
// CDFs), each component's box plot, turns per exchange, each connection's
// cwnd and srtt with its retransmissions, and the diagnoses with their
// evidence.
//
// The page carries its data as JSON and draws it with Apache ECharts,
// vendored in assets/echarts and inlined, so it needs no network. Large
// recordings are reduced before they reach the page (downsample.go) in
// ways that keep the extremes: a million exchanges make a page of a few
// MB that opens in seconds, and their p99, max and retransmissions are on
// it.
package report
