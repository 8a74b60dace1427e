package kube

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/lattrace/lattrace/record"
)

func ctrl(kind, name string) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{Kind: kind, Name: name, Controller: &yes, APIVersion: "apps/v1"}}
}

func pod(ns, name, node, ip string, owner []metav1.OwnerReference, containers map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, OwnerReferences: owner},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
	for c, id := range containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, ContainerID: "containerd://" + id})
	}
	return p
}

// cluster is a small shop: a Deployment's pod behind a Service, a
// StatefulSet's pod, a host-network pod, and a Service without pods.
func cluster() *fake.Clientset {
	return fake.NewSimpleClientset(
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-7d9f", OwnerReferences: ctrl("Deployment", "cart")}},
		pod("shop", "cart-7d9f-x2", "node-a", "10.1.0.5", ctrl("ReplicaSet", "cart-7d9f"), map[string]string{"cart": "c0ffee01", "envoy": "c0ffee02"}),
		pod("shop", "db-0", "node-b", "10.1.1.7", ctrl("StatefulSet", "db"), map[string]string{"postgres": "dbdb01"}),
		func() *corev1.Pod {
			p := pod("kube-system", "proxy-abc", "node-a", "192.168.0.10", ctrl("DaemonSet", "proxy"), nil)
			p.Spec.HostNetwork = true
			return p
		}(),
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20", "fd00::20"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "payments"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.30", ClusterIPs: []string{"10.96.0.30"}}},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "cart-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: "cart"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.5"}}},
		},
	)
}

// fakeWatches lists and watches the fake cluster through its typed
// clients, as NewForConfig does a real one through REST clients.
func fakeWatches(c *fake.Clientset) Watches {
	lw := func(list func(metav1.ListOptions) (runtime.Object, error), watch func(metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
		// The fake says it cannot stream a watch-list; the reflector then
		// lists first, as with an older API server.
		return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListFunc: list, WatchFunc: watch}, c)
	}
	ctx := context.Background()
	core, apps, disc := c.CoreV1(), c.AppsV1(), c.DiscoveryV1()
	return Watches{
		Pods: lw(func(o metav1.ListOptions) (runtime.Object, error) { return core.Pods("").List(ctx, o) },
			func(o metav1.ListOptions) (watch.Interface, error) { return core.Pods("").Watch(ctx, o) }),
		Services: lw(func(o metav1.ListOptions) (runtime.Object, error) { return core.Services("").List(ctx, o) },
			func(o metav1.ListOptions) (watch.Interface, error) { return core.Services("").Watch(ctx, o) }),
		ReplicaSets: lw(func(o metav1.ListOptions) (runtime.Object, error) { return apps.ReplicaSets("").List(ctx, o) },
			func(o metav1.ListOptions) (watch.Interface, error) { return apps.ReplicaSets("").Watch(ctx, o) }),
		EndpointSlices: lw(func(o metav1.ListOptions) (runtime.Object, error) { return disc.EndpointSlices("").List(ctx, o) },
			func(o metav1.ListOptions) (watch.Interface, error) { return disc.EndpointSlices("").Watch(ctx, o) }),
	}
}

func start(t *testing.T, c *fake.Clientset) *Resolver {
	t.Helper()
	r := New(fakeWatches(c), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := r.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNames(t *testing.T) {
	r := start(t, cluster())
	for _, c := range []struct {
		what string
		got  func() (*record.K8s, bool)
		want *record.K8s
	}{
		{"local container of a Deployment's pod", func() (*record.K8s, bool) { return r.ByContainer("c0ffee02") },
			&record.K8s{Namespace: "shop", Pod: "cart-7d9f-x2", Container: "envoy", WorkloadKind: "Deployment", Workload: "cart", Node: "node-a"}},
		{"a StatefulSet's container", func() (*record.K8s, bool) { return r.ByContainer("dbdb01") },
			&record.K8s{Namespace: "shop", Pod: "db-0", Container: "postgres", WorkloadKind: "StatefulSet", Workload: "db", Node: "node-b"}},
		{"a pod IP behind a Service", func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr("10.1.0.5")) },
			&record.K8s{Namespace: "shop", Pod: "cart-7d9f-x2", WorkloadKind: "Deployment", Workload: "cart", Service: "cart", Node: "node-a"}},
		{"an IPv4-mapped pod IP", func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr("::ffff:10.1.1.7")) },
			&record.K8s{Namespace: "shop", Pod: "db-0", WorkloadKind: "StatefulSet", Workload: "db", Node: "node-b"}},
		{"a Service's cluster IP", func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr("10.96.0.30")) },
			&record.K8s{Namespace: "shop", Service: "payments"}},
		{"a Service's IPv6 cluster IP", func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr("fd00::20")) },
			&record.K8s{Namespace: "shop", Service: "cart"}},
		{"a host-network pod's (the node's) address", func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr("192.168.0.10")) }, nil},
		{"an address outside the cluster", func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr("8.8.8.8")) }, nil},
		{"an unknown container", func() (*record.K8s, bool) { return r.ByContainer("feedbeef") }, nil},
		{"no container", func() (*record.K8s, bool) { return r.ByContainer("") }, nil},
	} {
		got, ok := c.got()
		if (c.want == nil) != !ok || (ok && *got != *c.want) {
			t.Errorf("%s: %+v %v, want %+v", c.what, got, ok, c.want)
		}
	}
}

// The informers watch: a new pod is named and a deleted one forgotten
// without a restart.
func TestWatch(t *testing.T) {
	c := cluster()
	r := start(t, c)
	ctx := context.Background()
	if _, err := c.CoreV1().Pods("shop").Create(ctx, pod("shop", "cart-7d9f-y3", "node-a", "10.1.0.6", ctrl("ReplicaSet", "cart-7d9f"), map[string]string{"cart": "c0ffee03"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new pod", func() bool {
		n, ok := r.ByContainer("c0ffee03")
		return ok && n.Pod == "cart-7d9f-y3" && n.Workload == "cart"
	})
	if err := c.CoreV1().Pods("shop").Delete(ctx, "cart-7d9f-x2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Its address is still in the Service's slice until the endpoint
	// controller (absent from a fake cluster) updates it: the Service, not
	// the pod, is named.
	eventually(t, "the deleted pod forgotten", func() bool {
		_, byC := r.ByContainer("c0ffee01")
		n, _ := r.ByIP(netip.MustParseAddr("10.1.0.5"))
		return !byC && (n == nil || n.Pod == "")
	})
	if err := c.CoreV1().Services("shop").Delete(ctx, "payments", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted Service forgotten", func() bool {
		_, ok := r.ByIP(netip.MustParseAddr("10.96.0.30"))
		return !ok
	})
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("never saw %s", what)
}

func TestOutsideACluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if InCluster() {
		t.Error("in a cluster without its environment")
	}
}

// A finished Job's pod keeps its IP in its status; the address goes to a
// live pod, which must keep its name.
func TestFinishedPodNamesNobody(t *testing.T) {
	done := pod("batch", "report-1", "node-a", "10.1.2.3", ctrl("Job", "report"), map[string]string{"report": "d0d0"})
	done.Status.Phase = corev1.PodSucceeded
	live := pod("shop", "web-1", "node-a", "10.1.2.3", ctrl("ReplicaSet", "web-1"), nil)
	r := start(t, fake.NewSimpleClientset(done, live))
	n, ok := r.ByIP(netip.MustParseAddr("10.1.2.3"))
	if !ok || n.Pod != "web-1" {
		t.Errorf("the address names %+v", n)
	}
	if _, ok := r.ByContainer("d0d0"); ok {
		t.Error("a finished pod's container is named")
	}
}

// An address behind two Services (headless and ClusterIP) keeps one when
// the other's slice goes; an endpoint that is no pod is named by its
// Service.
func TestSharedEndpoints(t *testing.T) {
	slice := func(name, svc string, addrs ...string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: addrs}},
		}
	}
	c := fake.NewSimpleClientset(
		pod("shop", "db-0", "node-b", "10.1.1.7", ctrl("StatefulSet", "db"), nil),
		slice("db-headless-1", "db-headless", "10.1.1.7"),
		slice("db-1", "db", "10.1.1.7"),
		slice("kubernetes", "kubernetes", "192.168.0.2"),
	)
	r := start(t, c)
	if n, _ := r.ByIP(netip.MustParseAddr("10.1.1.7")); n == nil || n.Service != "db" {
		t.Errorf("two Services: %+v (want the first by name, db)", n)
	}
	if err := c.DiscoveryV1().EndpointSlices("shop").Delete(context.Background(), "db-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other Service kept", func() bool {
		n, _ := r.ByIP(netip.MustParseAddr("10.1.1.7"))
		return n != nil && n.Service == "db-headless" && n.Pod == "db-0"
	})
	if n, _ := r.ByIP(netip.MustParseAddr("192.168.0.2")); n == nil || n.Service != "kubernetes" || n.Pod != "" {
		t.Errorf("an endpoint that is no pod: %+v", n)
	}
}
