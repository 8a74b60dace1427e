// Package deploy holds how lattrace runs on a cluster: the Helm chart in
// helm/lattrace and the manifests rendered from it in kubernetes/. It has
// no code; its tests render the chart with the real helm, decode every
// object strictly into the Kubernetes API types and check what the chart
// promises (no privileged container, three capabilities, read-only root,
// probes, read-only RBAC, a manifest that matches the chart).
package deploy
