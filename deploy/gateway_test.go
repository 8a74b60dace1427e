package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/lattrace/lattrace/tests/gateway"
	"github.com/lattrace/lattrace/tests/testserver"
)

const (
	gatewayChart    = "helm/lattrace-gateway"
	gatewayManifest = "kubernetes/lattrace-gateway.yaml"
)

// renderGateway runs helm template on the gateway chart as helm install
// does, with extra values.
func renderGateway(t *testing.T, set ...string) []byte {
	t.Helper()
	args := []string{"template", "lattrace-gateway", gatewayChart, "--namespace", "lattrace-gateway"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(t, helm(t), args...)
}

func TestGatewayHelmLint(t *testing.T) {
	out := run(t, helm(t), "lint", "--strict", gatewayChart)
	if !strings.Contains(string(out), "0 chart(s) failed") {
		t.Errorf("helm lint:\n%s", out)
	}
}

// TestGatewayChart: two tiers of Collectors, each a Deployment with its
// config, probes on the health endpoint and no privilege; the daemons'
// Service in front of the load balancers, a headless one over the
// samplers; and both configs accepted by a Collector built with the same
// components at the image's release: `validate` checks each component's
// settings, and starting it checks the rest (a sampling policy's type is
// only checked as the processor starts), on the defaults and with a
// static resolver.
func TestGatewayChart(t *testing.T) {
	bin, err := gateway.Binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range [][]string{nil, {"loadBalancer.resolver.static.hostnames={10.0.0.5:4317,10.0.0.6:4317}", "sampler.keepPercent=1"}} {
		ports := testserver.FreePorts(t, 4)
		health := ports[2]
		objs, _ := decode(t, renderGateway(t, append(slices.Clone(set), fmt.Sprintf("ports.otlpGrpc=%d", ports[0]),
			fmt.Sprintf("ports.otlpHttp=%d", ports[1]), fmt.Sprintf("ports.health=%d", health), fmt.Sprintf("ports.metrics=%d", ports[3]))...))
		deployments := map[string]*appsv1.Deployment{}
		services := map[string]*corev1.Service{}
		configs := map[string]string{}
		for _, o := range objs {
			switch v := o.(type) {
			case *appsv1.Deployment:
				deployments[v.Name] = v
			case *corev1.Service:
				services[v.Name] = v
			case *corev1.ConfigMap:
				configs[v.Name] = v.Data["config.yaml"]
			}
		}
		for _, tier := range []string{"loadbalancer", "sampler"} {
			name := "lattrace-gateway-" + tier
			d := deployments[name]
			if d == nil || configs[name] == "" || services[name] == nil {
				t.Fatalf("%v: tier %s: deployment %v, config %d bytes, service %v", set, tier, d != nil, len(configs[name]), services[name] != nil)
			}
			checkCollector(t, d, name)
			path := filepath.Join(t.TempDir(), tier+".yaml")
			if err := os.WriteFile(path, []byte(configs[name]), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(bin, "validate", "--config", "file:"+path).CombinedOutput(); err != nil {
				t.Errorf("%v: the %s config is refused by the Collector: %v\n%s\n%s", set, tier, err, out, configs[name])
				continue
			}
			// Ready when its health check answers, or the test fails
			// with its output.
			col := testserver.Start(t, tier, filepath.Dir(path), bin, []string{"--config", "file:" + path}, nil,
				testserver.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/", health)))
			col.Kill()
		}
		if s := services["lattrace-gateway-sampler"]; s.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("sampler service cluster IP %q: the load balancer needs every pod's address (headless)", s.Spec.ClusterIP)
		}
		lb := configs["lattrace-gateway-loadbalancer"]
		if !strings.Contains(lb, "routing_key: traceID") {
			t.Errorf("the load balancer does not route by trace id:\n%s", lb)
		}
		static := set != nil
		if static != strings.Contains(lb, "10.0.0.6:4317") || static == strings.Contains(lb, "lattrace-gateway-sampler.lattrace-gateway.svc.cluster.local") {
			t.Errorf("%v: resolver:\n%s", set, lb)
		}
		sampler := configs["lattrace-gateway-sampler"]
		for _, want := range []string{"key: lattrace.diagnosis.severity", `values: ["warning","critical"]`, "threshold_ms: 100"} {
			if !strings.Contains(sampler, want) {
				t.Errorf("sampler config lacks %q:\n%s", want, sampler)
			}
		}
	}
}

func checkCollector(t *testing.T, d *appsv1.Deployment, name string) {
	t.Helper()
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s: security context %+v: want non-root, read-only root, no escalation, drop ALL", name, sc)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "health" {
			t.Errorf("%s: probe %+v: want the health_check extension's port", name, p)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: resources %+v", name, c.Resources)
	}
	if d.Spec.Template.Annotations["checksum/config"] == "" {
		t.Errorf("%s: no config checksum: a new config would not roll the pods", name)
	}
}

// TestGatewayValue: the lattrace chart's gateway value points the daemons
// at the gateway's load-balancing Service, and refuses a second endpoint.
func TestGatewayValue(t *testing.T) {
	objs, _ := decode(t, render(t, "gateway.enabled=true"))
	found := false
	for _, o := range objs {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			found = strings.Contains(cm.Data["config.yaml"], `otlp_endpoint: "lattrace-gateway-loadbalancer.lattrace-gateway.svc:4317"`)
		}
	}
	if !found {
		t.Error("gateway.enabled=true does not point otlp_endpoint at the gateway's load balancer")
	}
	args := append(slices.Clone(templateArgs), "--set", "gateway.enabled=true", "--set", "otlp.endpoint=collector.obs:4317")
	out, err := exec.Command(helm(t), args...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not both") {
		t.Errorf("gateway and otlp.endpoint together: err %v\n%s", err, out)
	}
}
