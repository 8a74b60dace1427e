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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/kubeapi"
)

// TestAPIServer runs the resolver against a real kube-apiserver with etcd
// (tests/kubeapi): the objects pass the server's validation, defaulting and
// storage, and reach the informers by a real list and watch. No kubelet or
// controller runs, so the test plays both: it writes pod statuses through
// the status subresource and the EndpointSlices by hand.
func TestAPIServer(t *testing.T) {
	cfg := kubeapi.Start(t)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	api := &apiWriter{t: t, c: client, ctx: t.Context()}

	// The small shop of TestNames, as a cluster would hold it: a
	// Deployment's ReplicaSet's pod behind a dual-stack Service, a
	// StatefulSet's pod, a DaemonSet's host-network pod, a Service
	// without pods.
	for _, ns := range []string{"shop", "infra"} {
		api.namespace(ns)
	}
	cart := api.owner(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}, Spec: appsv1.DeploymentSpec{Selector: selector("cart"), Template: template("cart")}})
	rs := api.owner(&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-7d9f", OwnerReferences: cart}, Spec: appsv1.ReplicaSetSpec{Selector: selector("cart"), Template: template("cart")}})
	db := api.owner(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"}, Spec: appsv1.StatefulSetSpec{Selector: selector("db"), Template: template("db")}})
	proxy := api.owner(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "infra", Name: "proxy"}, Spec: appsv1.DaemonSetSpec{Selector: selector("proxy"), Template: template("proxy")}})
	api.runningPod(livePod("shop", "cart-7d9f-x2", "node-a", rs, false), map[string]string{"cart": "c0ffee01", "envoy": "c0ffee02"}, "10.1.0.5", "fd00:1::5")
	api.runningPod(livePod("shop", "db-0", "node-b", db, false), map[string]string{"postgres": "dbdb01"}, "10.1.1.7")
	api.runningPod(livePod("infra", "proxy-abc", "node-a", proxy, true), nil, "192.168.0.10")
	api.service("cart", "10.96.0.20", "fd00:96::20")
	api.service("payments", "10.96.0.30")
	api.slice("cart-abcde", "cart", "10.1.0.5")

	r, err := NewForConfig(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	if err := r.Start(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	cartPod := record.K8s{Namespace: "shop", Pod: "cart-7d9f-x2", WorkloadKind: "Deployment", Workload: "cart", Node: "node-a"}
	withContainer := func(n record.K8s, c string) *record.K8s { n.Container = c; return &n }
	withService := func(n record.K8s, s string) *record.K8s { n.Service = s; return &n }
	dbPod := record.K8s{Namespace: "shop", Pod: "db-0", WorkloadKind: "StatefulSet", Workload: "db", Node: "node-b"}
	for _, c := range []struct {
		what string
		got  func() (*record.K8s, bool)
		want *record.K8s
	}{
		{"local container of a Deployment's pod", byContainer(r, "c0ffee02"), withContainer(cartPod, "envoy")},
		{"a StatefulSet's container", byContainer(r, "dbdb01"), withContainer(dbPod, "postgres")},
		{"a pod IP behind a Service", byIP(r, "10.1.0.5"), withService(cartPod, "cart")},
		{"the same pod's IPv6 address (not in the IPv4 slice)", byIP(r, "fd00:1::5"), &cartPod},
		{"an IPv4-mapped pod IP", byIP(r, "::ffff:10.1.1.7"), &dbPod},
		{"a Service's cluster IP", byIP(r, "10.96.0.30"), &record.K8s{Namespace: "shop", Service: "payments"}},
		{"a Service's IPv6 cluster IP", byIP(r, "fd00:96::20"), &record.K8s{Namespace: "shop", Service: "cart"}},
		{"the API server's own Service, which it made itself", byIP(r, "10.96.0.1"), &record.K8s{Namespace: "default", Service: "kubernetes"}},
		{"a host-network pod's (the node's) address", byIP(r, "192.168.0.10"), nil},
		{"an address outside the cluster", byIP(r, "8.8.8.8"), nil},
		{"an unknown container", byContainer(r, "feedbeef"), nil},
	} {
		got, ok := c.got()
		if (c.want == nil) != !ok || (ok && *got != *c.want) {
			t.Errorf("%s: %+v %v, want %+v", c.what, got, ok, c.want)
		}
	}

	// A graceful delete only marks a pod (no kubelet ends it): its
	// containers run out their grace period and keep their names.
	if err := client.CoreV1().Pods("shop").Delete(api.ctx, "cart-7d9f-x2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A new pod has no container ids until the kubelet writes its status.
	y3 := api.pod(livePod("shop", "cart-7d9f-y3", "node-a", rs, false), map[string]string{"cart": "c0ffee03"})
	api.setStatus(y3, map[string]string{"cart": "c0ffee03"}, "10.1.0.6")
	eventually(t, "the new pod, once its status names its container", func() bool {
		n, ok := r.ByContainer("c0ffee03")
		return ok && *n == *withContainer(record.K8s{Namespace: "shop", Pod: "cart-7d9f-y3", WorkloadKind: "Deployment", Workload: "cart", Node: "node-a"}, "cart")
	})
	// The pods' events reach the resolver in order: the graceful delete
	// has been seen.
	if n, ok := r.ByContainer("c0ffee01"); !ok || n.Pod != "cart-7d9f-x2" {
		t.Errorf("a terminating pod's container: %+v %v", n, ok)
	}

	// The kubelet's final delete; its address stays in the slice until
	// the endpoint controller (absent) updates it: the Service is named.
	zero := int64(0)
	if err := client.CoreV1().Pods("shop").Delete(api.ctx, "cart-7d9f-x2", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted pod forgotten", func() bool {
		_, byC := r.ByContainer("c0ffee01")
		n, ok := r.ByIP(netip.MustParseAddr("10.1.0.5"))
		return !byC && ok && *n == record.K8s{Namespace: "shop", Service: "cart"}
	})

	// The endpoint controller's part: the slice now lists the new pod.
	api.update(func(es *discoveryv1.EndpointSlice) {
		es.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.6"}}}
	}, "cart-abcde")
	eventually(t, "the slice's new address", func() bool {
		old, _ := r.ByIP(netip.MustParseAddr("10.1.0.5"))
		n, _ := r.ByIP(netip.MustParseAddr("10.1.0.6"))
		return old == nil && n != nil && n.Pod == "cart-7d9f-y3" && n.Service == "cart"
	})

	// A pod that finished keeps its IP in its status: it names nobody.
	db0, err := client.CoreV1().Pods("shop").Get(api.ctx, "db-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	db0.Status.Phase = corev1.PodSucceeded
	if _, err := client.CoreV1().Pods("shop").UpdateStatus(api.ctx, db0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the finished pod forgotten", func() bool {
		_, byC := r.ByContainer("dbdb01")
		_, byIP := r.ByIP(netip.MustParseAddr("10.1.1.7"))
		return !byC && !byIP
	})
	// Its address goes to a new pod, while the finished one still lists
	// it in its status.
	api.runningPod(livePod("shop", "web-1", "node-b", rs, false), map[string]string{"web": "0eb1"}, "10.1.1.7")
	eventually(t, "the address's new pod", func() bool {
		n, _ := r.ByIP(netip.MustParseAddr("10.1.1.7"))
		return n != nil && n.Pod == "web-1"
	})

	if err := client.CoreV1().Services("shop").Delete(api.ctx, "payments", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted Service forgotten", func() bool {
		_, ok := r.ByIP(netip.MustParseAddr("10.96.0.30"))
		return !ok
	})

	// An address behind two Services is named by the first by name, and
	// keeps the other when one's slice goes; an endpoint that is no pod
	// (a Service without a selector) is named by its Service.
	api.slice("cart-canary-1", "cart-canary", "10.1.0.6")
	api.slice("external-1", "external", "172.20.0.9")
	eventually(t, "the second Service's slice", func() bool {
		n, _ := r.ByIP(netip.MustParseAddr("172.20.0.9"))
		return n != nil && *n == record.K8s{Namespace: "shop", Service: "external"}
	})
	if n, _ := r.ByIP(netip.MustParseAddr("10.1.0.6")); n == nil || n.Service != "cart" {
		t.Errorf("two Services: %+v (want the first by name, cart)", n)
	}
	if err := client.DiscoveryV1().EndpointSlices("shop").Delete(api.ctx, "cart-abcde", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other Service kept", func() bool {
		n, _ := r.ByIP(netip.MustParseAddr("10.1.0.6"))
		return n != nil && n.Service == "cart-canary" && n.Pod == "cart-7d9f-y3"
	})
}

func byContainer(r *Resolver, id string) func() (*record.K8s, bool) {
	return func() (*record.K8s, bool) { return r.ByContainer(id) }
}

func byIP(r *Resolver, ip string) func() (*record.K8s, bool) {
	return func() (*record.K8s, bool) { return r.ByIP(netip.MustParseAddr(ip)) }
}

func selector(app string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
}

func template(app string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: app, Image: "example.invalid/" + app}}},
	}
}

// livePod is a pod as the scheduler left it: on a node, owned by its
// controller, without status.
func livePod(ns, name, node string, owner []metav1.OwnerReference, hostNetwork bool) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, OwnerReferences: owner},
		Spec:       corev1.PodSpec{NodeName: node, HostNetwork: hostNetwork},
	}
}

// apiWriter writes objects to the API server, failing the test on the
// first refusal.
type apiWriter struct {
	t   *testing.T
	c   kubernetes.Interface
	ctx context.Context
}

func (a *apiWriter) namespace(name string) {
	a.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// owner creates a workload and returns the controller reference its
// children carry (the server requires the owner's uid).
func (a *apiWriter) owner(obj metav1.Object) []metav1.OwnerReference {
	created := a.create(obj).(metav1.Object)
	var kind string
	switch obj.(type) {
	case *appsv1.Deployment:
		kind = "Deployment"
	case *appsv1.ReplicaSet:
		kind = "ReplicaSet"
	case *appsv1.StatefulSet:
		kind = "StatefulSet"
	case *appsv1.DaemonSet:
		kind = "DaemonSet"
	}
	return []metav1.OwnerReference{*metav1.NewControllerRef(created, schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: kind})}
}

// runningPod creates a pod whose containers (name -> id) run, with ips as
// its addresses, as a kubelet would report it.
func (a *apiWriter) runningPod(p *corev1.Pod, containers map[string]string, ips ...string) {
	a.setStatus(a.pod(p, containers), containers, ips...)
}

// pod creates p with the containers (name -> id) in its spec, and returns
// it as stored.
func (a *apiWriter) pod(p *corev1.Pod, containers map[string]string) *corev1.Pod {
	for name := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: name, Image: "example.invalid/" + name})
	}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "main", Image: "example.invalid/main"}}
	}
	return a.create(p).(*corev1.Pod)
}

// setStatus writes what a kubelet reports of a running pod: its
// containers' runtime ids and its addresses (the node's for a
// host-network pod).
func (a *apiWriter) setStatus(p *corev1.Pod, containers map[string]string, ips ...string) {
	a.t.Helper()
	now := metav1.Now()
	st := corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "192.168.0.10", HostIPs: []corev1.HostIP{{IP: "192.168.0.10"}}, StartTime: &now}
	if p.Spec.HostNetwork {
		st.HostIP, st.HostIPs = ips[0], []corev1.HostIP{{IP: ips[0]}}
	}
	st.PodIP = ips[0]
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
	}
	for _, c := range p.Spec.Containers {
		id, ok := containers[c.Name]
		if !ok {
			id = c.Name + "-0"
		}
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:0", ContainerID: "containerd://" + id,
			Ready: true, Started: new(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	p.Status = st
	if _, err := a.c.CoreV1().Pods(p.Namespace).UpdateStatus(a.ctx, p, metav1.UpdateOptions{}); err != nil {
		a.t.Fatalf("status of pod %s/%s: %v", p.Namespace, p.Name, err)
	}
}

// service creates a ClusterIP Service in shop on the given cluster IPs
// (IPv4 first), dual-stack when there are two.
func (a *apiWriter) service(name string, ips ...string) {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": name},
			Ports:      []corev1.ServicePort{{Port: 80}},
			ClusterIP:  ips[0],
			ClusterIPs: ips,
		},
	}
	if len(ips) > 1 {
		dual := corev1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &dual
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
	a.create(s)
}

// slice creates the EndpointSlice the endpoint controller would keep for
// a Service in shop.
func (a *apiWriter) slice(name, svc string, addrs ...string) {
	port, proto := int32(80), corev1.ProtocolTCP
	a.create(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: addrs}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	})
}

// update rewrites an EndpointSlice in shop.
func (a *apiWriter) update(change func(*discoveryv1.EndpointSlice), name string) {
	a.t.Helper()
	es, err := a.c.DiscoveryV1().EndpointSlices("shop").Get(a.ctx, name, metav1.GetOptions{})
	if err == nil {
		change(es)
		_, err = a.c.DiscoveryV1().EndpointSlices("shop").Update(a.ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		a.t.Fatalf("endpointslice %s: %v", name, err)
	}
}

// create writes obj and returns what the server stored.
func (a *apiWriter) create(obj any) any {
	a.t.Helper()
	var (
		out any
		err error
	)
	opts := metav1.CreateOptions{}
	switch o := obj.(type) {
	case *corev1.Namespace:
		out, err = a.c.CoreV1().Namespaces().Create(a.ctx, o, opts)
	case *corev1.Pod:
		out, err = a.c.CoreV1().Pods(o.Namespace).Create(a.ctx, o, opts)
	case *corev1.Service:
		out, err = a.c.CoreV1().Services(o.Namespace).Create(a.ctx, o, opts)
	case *discoveryv1.EndpointSlice:
		out, err = a.c.DiscoveryV1().EndpointSlices(o.Namespace).Create(a.ctx, o, opts)
	case *appsv1.Deployment:
		out, err = a.c.AppsV1().Deployments(o.Namespace).Create(a.ctx, o, opts)
	case *appsv1.ReplicaSet:
		out, err = a.c.AppsV1().ReplicaSets(o.Namespace).Create(a.ctx, o, opts)
	case *appsv1.StatefulSet:
		out, err = a.c.AppsV1().StatefulSets(o.Namespace).Create(a.ctx, o, opts)
	case *appsv1.DaemonSet:
		out, err = a.c.AppsV1().DaemonSets(o.Namespace).Create(a.ctx, o, opts)
	default:
		a.t.Fatalf("create: no client for %T", obj)
	}
	if err != nil {
		a.t.Fatalf("create %T: %v", obj, err)
	}
	return out
}
