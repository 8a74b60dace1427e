// Package deploy holds how lattrace runs on a cluster: the DaemonSet's Helm
// chart in helm/lattrace, the fleet gateway's (OpenTelemetry Collectors
// that load-balance by trace id and tail-sample) in helm/lattrace-gateway,
// and the manifests rendered from them in kubernetes/. It has no code; its
// tests render the charts with the real helm, decode every object strictly
// into the Kubernetes API types and check what the charts promise (no
// privileged container, three capabilities, read-only root, probes,
// read-only RBAC, manifests that match the charts, gateway configs that a
// Collector of the same components starts with).
package deploy
