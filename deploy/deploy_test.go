package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/lattrace/lattrace/tests/gateway"
)

const (
	chart    = "helm/lattrace"
	manifest = "kubernetes/lattrace.yaml"
)

// helm finds the helm binary `make helm` builds.
func helm(t *testing.T) string {
	t.Helper()
	p, err := gateway.Helm()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s%s", name, args, err, out, stderr.String())
	}
	return out
}

// templateArgs renders the chart as helm install does.
var templateArgs = []string{"template", "lattrace", chart, "--namespace", "lattrace"}

// render runs helm template with extra values.
func render(t *testing.T, set ...string) []byte {
	t.Helper()
	args := slices.Clone(templateArgs)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(t, helm(t), args...)
}

// decode splits a manifest and decodes every object strictly into the
// API types: an unknown or misplaced field is an error. It returns the
// objects and the kinds it could not type (CRDs' objects).
func decode(t *testing.T, m []byte) ([]runtime.Object, []string) {
	t.Helper()
	codecs := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)
	var objs []runtime.Object
	var untyped []string
	for _, doc := range bytes.Split(m, []byte("\n---")) {
		if !bytes.Contains(doc, []byte("kind:")) {
			continue
		}
		if bytes.Contains(doc, []byte("kind: ServiceMonitor")) {
			untyped = append(untyped, "ServiceMonitor") // the Prometheus Operator's CRD
			continue
		}
		obj, _, err := codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("not a valid object: %v\n%s", err, doc)
		}
		objs = append(objs, obj)
	}
	return objs, untyped
}

func TestHelmLint(t *testing.T) {
	out := run(t, helm(t), "lint", "--strict", chart)
	if !strings.Contains(string(out), "0 chart(s) failed") {
		t.Errorf("helm lint:\n%s", out)
	}
}

// TestChart checks what the chart promises, on the default values and
// with every option on.
func TestChart(t *testing.T) {
	for _, set := range [][]string{nil, {"prometheus.serviceMonitor=true", "otlp.endpoint=collector.obs:4317", "memlockCapability=true"}} {
		objs, untyped := decode(t, render(t, set...))
		kinds := map[string]int{}
		var ds *appsv1.DaemonSet
		var cm *corev1.ConfigMap
		for _, o := range objs {
			kinds[o.GetObjectKind().GroupVersionKind().Kind]++
			switch v := o.(type) {
			case *appsv1.DaemonSet:
				ds = v
			case *corev1.ConfigMap:
				cm = v
			case *rbacv1.ClusterRole:
				for _, r := range v.Rules {
					for _, verb := range r.Verbs {
						if !slices.Contains([]string{"get", "list", "watch"}, verb) {
							t.Errorf("ClusterRole allows %q on %v: the daemon only reads", verb, r.Resources)
						}
					}
				}
			}
		}
		for _, k := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap"} {
			if kinds[k] != 1 {
				t.Errorf("%v: %d %s", set, kinds[k], k)
			}
		}
		if set != nil && (kinds["Service"] != 1 || !slices.Contains(untyped, "ServiceMonitor")) {
			t.Errorf("serviceMonitor=true: Service %d, untyped %v", kinds["Service"], untyped)
		}
		if ds == nil || cm == nil {
			t.Fatal("no DaemonSet or ConfigMap")
		}
		checkDaemonSet(t, ds, set != nil)
		conf := cm.Data["config.yaml"]
		if !strings.Contains(conf, `metrics_addr: "0.0.0.0:9464"`) || !strings.Contains(conf, `pin_path: "/sys/fs/bpf/lattrace"`) || (set != nil) != strings.Contains(conf, `otlp_endpoint: "collector.obs:4317"`) {
			t.Errorf("config.yaml:\n%s", conf)
		}
	}
}

func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, memlock bool) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	if pod.HostNetwork || pod.HostPID || pod.ServiceAccountName == "" {
		t.Errorf("host network %v, host PID %v, service account %q", pod.HostNetwork, pod.HostPID, pod.ServiceAccountName)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("tolerations %+v: want to run on every node", pod.Tolerations)
	}
	c := pod.Containers[0]
	want := slices.Clone(chartCapabilities)
	if memlock {
		want = append(want, "SYS_RESOURCE")
	}
	checkSecurity(t, c.SecurityContext, want)
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("probe %+v: want /healthz on the metrics port", p)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	if !slices.Equal(c.Args, []string{"daemon", "--config", "/etc/lattrace/config.yaml"}) {
		t.Errorf("args %v", c.Args)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, p := range []string{"/sys/fs/cgroup", "/run/lattrace", "/etc/lattrace", "/sys/fs/bpf/lattrace"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("no mount at %s", p)
		}
	}
	// Pinning needs the node's bpffs, but only lattrace's own directory of
	// it: the rest holds other agents' maps.
	for _, v := range pod.Volumes {
		if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/sys/fs/bpf") && v.HostPath.Path != "/sys/fs/bpf/lattrace" {
			t.Errorf("volume %s mounts %s of the node's bpffs, beyond lattrace's directory", v.Name, v.HostPath.Path)
		}
	}
	if ann := ds.Spec.Template.Annotations; ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9464" {
		t.Errorf("scrape annotations %v", ann)
	}
}

// TestManifestMatchesChart: kubernetes/lattrace.yaml and
// kubernetes/lattrace-gateway.yaml are the charts rendered with their
// defaults (make manifests), for those who apply plain YAML.
func TestManifestMatchesChart(t *testing.T) {
	for _, m := range []struct {
		path   string
		render func(*testing.T, ...string) []byte
	}{{manifest, render}, {gatewayManifest, renderGateway}} {
		got, err := os.ReadFile(m.path)
		if err != nil {
			t.Fatal(err)
		}
		if want := m.render(t, "createNamespace=true"); !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make manifests` and commit it", m.path)
		}
		objs, _ := decode(t, got)
		if objs[0].GetObjectKind().GroupVersionKind().Kind != "Namespace" {
			t.Errorf("%s does not create its namespace first: kubectl apply would fail", m.path)
		}
	}
}

// One port for /metrics, the probes and the scrape: changing it moves all
// of them, and setting the daemon's metrics_addr behind the chart's back
// is refused.
func TestMetricsPort(t *testing.T) {
	objs, _ := decode(t, render(t, "metricsPort=9100"))
	for _, o := range objs {
		switch v := o.(type) {
		case *corev1.ConfigMap:
			if !strings.Contains(v.Data["config.yaml"], `metrics_addr: "0.0.0.0:9100"`) {
				t.Errorf("config.yaml:\n%s", v.Data["config.yaml"])
			}
		case *appsv1.DaemonSet:
			c := v.Spec.Template.Spec.Containers[0]
			if c.Ports[0].ContainerPort != 9100 || c.Ports[0].Name != "metrics" || v.Spec.Template.Annotations["prometheus.io/port"] != "9100" {
				t.Errorf("ports %+v annotations %v", c.Ports, v.Spec.Template.Annotations)
			}
		}
	}
	args := append(slices.Clone(templateArgs), "--set", "config.metrics_addr=127.0.0.1:1")
	if out, err := exec.Command(helm(t), args...).CombinedOutput(); err == nil || !strings.Contains(string(out), "set metricsPort") {
		t.Errorf("config.metrics_addr accepted: %v\n%s", err, out)
	}
}

// chartCapabilities are the capabilities every kernel needs
// (docs/reliability.md#who-may-talk-to-it; tests/e2e runs the daemon with
// exactly these, and without each).
var chartCapabilities = []corev1.Capability{"BPF", "PERFMON", "NET_ADMIN"}

// checkSecurity wants the container not privileged, unable to gain
// privileges, on a read-only root under the runtime's default seccomp
// profile, with every capability dropped but caps.
func checkSecurity(t *testing.T, sc *corev1.SecurityContext, caps []corev1.Capability) {
	t.Helper()
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, caps) {
		t.Errorf("security context %+v, capabilities %+v: want not privileged, read-only root, RuntimeDefault seccomp, drop ALL, add %v", sc, sc.Capabilities, caps)
	}
}

// TestNetnsSweep: the per-namespace sweep's needs are granted only when
// asked for, each with what needs it: CAP_SYS_ADMIN and the node's
// /run/netns, then the host's PID namespace with CAP_SYS_PTRACE; extra
// capabilities come last. The host's network namespace never.
func TestNetnsSweep(t *testing.T) {
	for _, c := range []struct {
		set     []string
		hostPID bool
		netns   bool
		caps    []corev1.Capability
	}{
		{nil, false, false, chartCapabilities},
		{[]string{"netnsSweep.hostPID=true"}, false, false, chartCapabilities},
		{[]string{"netnsSweep.enabled=true"}, false, true, append(slices.Clone(chartCapabilities), "SYS_ADMIN")},
		{[]string{"netnsSweep.enabled=true", "netnsSweep.hostPID=true"}, true, true, append(slices.Clone(chartCapabilities), "SYS_ADMIN", "SYS_PTRACE")},
		{[]string{"capabilities.extra={SYS_RESOURCE}"}, false, false, append(slices.Clone(chartCapabilities), "SYS_RESOURCE")},
	} {
		objs, _ := decode(t, render(t, c.set...))
		for _, o := range objs {
			ds, ok := o.(*appsv1.DaemonSet)
			if !ok {
				continue
			}
			pod := ds.Spec.Template.Spec
			checkSecurity(t, pod.Containers[0].SecurityContext, c.caps)
			if pod.HostPID != c.hostPID || pod.HostNetwork {
				t.Errorf("%v: host PID %v, host network %v; want host PID %v, never host network", c.set, pod.HostPID, pod.HostNetwork, c.hostPID)
			}
			var mount *corev1.VolumeMount
			for i, m := range pod.Containers[0].VolumeMounts {
				if m.MountPath == "/run/netns" {
					mount = &pod.Containers[0].VolumeMounts[i]
				}
			}
			if (mount != nil) != c.netns || (mount != nil && (!mount.ReadOnly || mount.MountPropagation == nil || *mount.MountPropagation != corev1.MountPropagationHostToContainer)) {
				t.Errorf("%v: /run/netns mount %+v, want it (read-only, from the host) %v", c.set, mount, c.netns)
			}
		}
	}
}
