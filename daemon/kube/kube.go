// Package kube names both ends of a flow with Kubernetes objects: the local
// end from its container id (the owner's cgroup) to its pod, container and
// workload; the remote end from its address to a pod, or to the Service
// whose cluster IP or endpoints it is. It watches the API server through
// client-go informers (a watch, not a poll) and answers from memory, so a
// lookup costs a map read on the hot path.
package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/lattrace/lattrace/record"
)

// InCluster reports whether the process runs in a pod (the service
// account's environment is there). Outside, enrichment is off and nothing
// complains.
func InCluster() bool { return os.Getenv("KUBERNETES_SERVICE_HOST") != "" }

// NewInCluster connects with the pod's service account.
func NewInCluster(log *slog.Logger) (*Resolver, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return NewForConfig(cfg, log)
}

// NewForConfig connects with cfg.
//
// It talks to the API server through one REST client per API group rather
// than client-go's generated clientset: the clientset and its informer
// factory link all of Kubernetes' API groups into the binary and register
// them at start-up, tens of MiB of resident memory on every node, cluster
// or not (docs/decisions.md). Three groups are all it reads.
func NewForConfig(cfg *rest.Config, log *slog.Logger) (*Resolver, error) {
	sc := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(sc); err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
	}
	// Errors and watch frames come as unversioned meta/v1 objects.
	metav1.AddToGroupVersion(sc, schema.GroupVersion{Version: "v1"})
	codecs := serializer.NewCodecFactory(sc).WithoutConversion()
	client := func(gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.UserAgent = "lattrace"
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = codecs
		return rest.RESTClientFor(c)
	}
	core, err := client(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	apps, err := client(appsv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	disc, err := client(discoveryv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	all := func(c cache.Getter, resource string) cache.ListerWatcher {
		return cache.NewListWatchFromClient(c, resource, metav1.NamespaceAll, fields.Everything())
	}
	return New(Watches{
		Pods:           all(core, "pods"),
		Services:       all(core, "services"),
		ReplicaSets:    all(apps, "replicasets"),
		EndpointSlices: all(disc, "endpointslices"),
	}, log), nil
}

// Watches list and watch, cluster-wide, the four kinds a Resolver follows.
type Watches struct {
	Pods, Services, ReplicaSets, EndpointSlices cache.ListerWatcher
}

// Resolver holds the indexes the informers keep current.
type Resolver struct {
	watches Watches
	log     *slog.Logger

	mu         sync.RWMutex
	containers map[string]containerRef // container id (no runtime prefix) -> pod
	podIPs     map[netip.Addr]string   // pod IP -> pod key
	pods       map[string]*podInfo     // namespace/name -> pod
	serviceIPs map[netip.Addr]svcRef   // cluster IP -> Service
	svcAddrs   map[string][]netip.Addr // Service key -> its cluster IPs
	// endpoints holds, per address, the Service of each EndpointSlice
	// that lists it: an address can be behind several Services (headless
	// and ClusterIP), and a slice's update must not drop another's.
	endpoints  map[netip.Addr]map[string]svcRef
	sliceAddrs map[string][]netip.Addr // EndpointSlice key -> its addresses
	rsOwner    map[string]record.K8s   // namespace/replicaset -> Deployment
}

type containerRef struct{ pod, name string }

type svcRef struct{ namespace, name string }

type podInfo struct {
	names record.K8s // without container
	owner metav1.OwnerReference
	// What the indexes hold for the pod, to remove it without a scan.
	containerIDs []string
	ips          []netip.Addr
}

// New follows w; Start begins.
func New(w Watches, log *slog.Logger) *Resolver {
	return &Resolver{
		watches:    w,
		log:        log,
		containers: map[string]containerRef{},
		podIPs:     map[netip.Addr]string{},
		pods:       map[string]*podInfo{},
		serviceIPs: map[netip.Addr]svcRef{},
		svcAddrs:   map[string][]netip.Addr{},
		endpoints:  map[netip.Addr]map[string]svcRef{},
		sliceAddrs: map[string][]netip.Addr{},
		rsOwner:    map[string]record.K8s{},
	}
}

// stripManagedFields is the informers' transform: their caches hold every
// pod, ReplicaSet and slice of the cluster, and the managed fields, often
// most of an object, are never read.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// Start runs the informers until ctx ends and waits for their first list
// (at most timeout): names are right from the first record.
func (r *Resolver) Start(ctx context.Context, timeout time.Duration) error {
	// Each handler's registration says when it has seen the first list:
	// the informers' caches alone can be synced before the handlers that
	// build the indexes ran.
	var synced []cache.InformerSynced
	handle := func(lw cache.ListerWatcher, obj runtime.Object, set func(obj any), del func(obj any)) error {
		inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return err
		}
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    set,
			UpdateFunc: func(_, obj any) { set(obj) },
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				del(obj)
			},
		})
		if err != nil {
			return err
		}
		synced = append(synced, reg.HasSynced)
		go inf.Run(ctx.Done())
		return nil
	}
	for _, err := range []error{
		handle(r.watches.Pods, &corev1.Pod{}, locked(r, r.setPodLocked), onDelete[*corev1.Pod](r, r.removePodLocked)),
		handle(r.watches.Services, &corev1.Service{}, locked(r, r.setServiceLocked), onDelete[*corev1.Service](r, r.removeServiceLocked)),
		handle(r.watches.ReplicaSets, &appsv1.ReplicaSet{}, locked(r, r.setReplicaSetLocked), onDelete[*appsv1.ReplicaSet](r, r.removeReplicaSetLocked)),
		handle(r.watches.EndpointSlices, &discoveryv1.EndpointSlice{}, locked(r, r.setSliceLocked), onDelete[*discoveryv1.EndpointSlice](r, r.removeSliceLocked)),
	} {
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		return fmt.Errorf("kubernetes: pods, services, replicasets and endpointslices not all listed within %v (is the service account allowed to list them?)", timeout)
	}
	return nil
}

// locked is an informer's handler that runs f under the lock on the
// objects of type T, the only type the informer watches.
func locked[T any](r *Resolver, f func(T)) func(obj any) {
	return func(obj any) {
		if o, ok := obj.(T); ok {
			r.mu.Lock()
			defer r.mu.Unlock()
			f(o)
		}
	}
}

// onDelete is the handler of deleted objects of type T: remove drops what
// the indexes hold for one.
func onDelete[T metav1.Object](r *Resolver, remove func(ns, name string)) func(obj any) {
	return locked(r, func(o T) { remove(o.GetNamespace(), o.GetName()) })
}

func key(ns, name string) string { return ns + "/" + name }

// trimRuntime strips "containerd://", "cri-o://", "docker://".
func trimRuntime(id string) string {
	if _, after, ok := strings.Cut(id, "://"); ok {
		return after
	}
	return id
}

func (r *Resolver) setPodLocked(p *corev1.Pod) {
	k := key(p.Namespace, p.Name)
	r.removePodLocked(p.Namespace, p.Name)
	// A finished pod keeps its IP in its status while the address goes to
	// another pod: it names nobody any more.
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return
	}
	info := &podInfo{names: record.K8s{Namespace: p.Namespace, Pod: p.Name, Node: p.Spec.NodeName}}
	if c := metav1.GetControllerOf(p); c != nil {
		info.owner = *c
	}
	for _, st := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, c := range st {
			if c.ContainerID != "" {
				id := trimRuntime(c.ContainerID)
				r.containers[id] = containerRef{pod: k, name: c.Name}
				info.containerIDs = append(info.containerIDs, id)
			}
		}
	}
	// A host-network pod's address is the node's: it names nobody.
	if !p.Spec.HostNetwork {
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				r.podIPs[a] = k
				info.ips = append(info.ips, a)
			}
		}
	}
	r.pods[k] = info
}

// removePodLocked drops a pod's entries, leaving those another pod has
// taken over since.
func (r *Resolver) removePodLocked(ns, name string) {
	k := key(ns, name)
	p, ok := r.pods[k]
	if !ok {
		return
	}
	delete(r.pods, k)
	for _, id := range p.containerIDs {
		if r.containers[id].pod == k {
			delete(r.containers, id)
		}
	}
	for _, ip := range p.ips {
		if r.podIPs[ip] == k {
			delete(r.podIPs, ip)
		}
	}
}

func (r *Resolver) setServiceLocked(s *corev1.Service) {
	r.removeServiceLocked(s.Namespace, s.Name)
	var ips []netip.Addr
	for _, ip := range s.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			r.serviceIPs[a] = svcRef{s.Namespace, s.Name}
			ips = append(ips, a)
		}
	}
	r.svcAddrs[key(s.Namespace, s.Name)] = ips
}

// removeServiceLocked drops a Service's cluster IPs, leaving those another
// Service has taken over since.
func (r *Resolver) removeServiceLocked(ns, name string) {
	k := key(ns, name)
	for _, ip := range r.svcAddrs[k] {
		if r.serviceIPs[ip] == (svcRef{ns, name}) {
			delete(r.serviceIPs, ip)
		}
	}
	delete(r.svcAddrs, k)
}

func (r *Resolver) setReplicaSetLocked(rs *appsv1.ReplicaSet) {
	if c := metav1.GetControllerOf(rs); c != nil {
		r.rsOwner[key(rs.Namespace, rs.Name)] = record.K8s{WorkloadKind: c.Kind, Workload: c.Name}
	} else {
		r.removeReplicaSetLocked(rs.Namespace, rs.Name)
	}
}

func (r *Resolver) removeReplicaSetLocked(ns, name string) {
	delete(r.rsOwner, key(ns, name))
}

func (r *Resolver) setSliceLocked(es *discoveryv1.EndpointSlice) {
	svc := es.Labels[discoveryv1.LabelServiceName]
	k := key(es.Namespace, es.Name)
	r.removeSliceLocked(es.Namespace, es.Name)
	if svc == "" {
		return
	}
	var addrs []netip.Addr
	for _, ep := range es.Endpoints {
		for _, a := range ep.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				if r.endpoints[ip] == nil {
					r.endpoints[ip] = map[string]svcRef{}
				}
				r.endpoints[ip][k] = svcRef{es.Namespace, svc}
				addrs = append(addrs, ip)
			}
		}
	}
	r.sliceAddrs[k] = addrs
}

func (r *Resolver) removeSliceLocked(ns, name string) {
	k := key(ns, name)
	for _, ip := range r.sliceAddrs[k] {
		delete(r.endpoints[ip], k)
		if len(r.endpoints[ip]) == 0 {
			delete(r.endpoints, ip)
		}
	}
	delete(r.sliceAddrs, k)
}

// serviceOfLocked is a Service the address is an endpoint of, in ns when
// given; of several, the first by name, so the answer is stable.
func (r *Resolver) serviceOfLocked(ip netip.Addr, ns string) (svcRef, bool) {
	var best svcRef
	for _, s := range r.endpoints[ip] {
		if (ns == "" || s.namespace == ns) && (best.name == "" || s.name < best.name) {
			best = s
		}
	}
	return best, best.name != ""
}

// workloadLocked names what runs a pod: its controller, or a
// ReplicaSet's Deployment.
func (r *Resolver) workloadLocked(p *podInfo) (kind, name string) {
	o := p.owner
	if o.Kind == "ReplicaSet" {
		if d, ok := r.rsOwner[key(p.names.Namespace, o.Name)]; ok {
			return d.WorkloadKind, d.Workload
		}
	}
	return o.Kind, o.Name
}

// namesLocked is a pod's names with its workload and, when its address
// is a Service's endpoint, the Service.
func (r *Resolver) namesLocked(k string, ip netip.Addr) (record.K8s, bool) {
	p, ok := r.pods[k]
	if !ok {
		return record.K8s{}, false
	}
	n := p.names
	n.WorkloadKind, n.Workload = r.workloadLocked(p)
	if ip.IsValid() {
		if s, ok := r.serviceOfLocked(ip, n.Namespace); ok {
			n.Service = s.name
		}
	}
	return n, true
}

// ByContainer names the pod and container a container id belongs to.
func (r *Resolver) ByContainer(id string) (*record.K8s, bool) {
	if id == "" {
		return nil, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.containers[id]
	if !ok {
		return nil, false
	}
	n, ok := r.namesLocked(c.pod, netip.Addr{})
	if !ok {
		return nil, false
	}
	n.Container = c.name
	return &n, true
}

// ByIP names the remote end: a pod by its IP (with the Service it is an
// endpoint of), or a Service by its cluster IP.
func (r *Resolver) ByIP(ip netip.Addr) (*record.K8s, bool) {
	ip = ip.Unmap()
	r.mu.RLock()
	defer r.mu.RUnlock()
	if k, ok := r.podIPs[ip]; ok {
		if n, ok := r.namesLocked(k, ip); ok {
			return &n, true
		}
	}
	if s, ok := r.serviceIPs[ip]; ok {
		return &record.K8s{Namespace: s.namespace, Service: s.name}, true
	}
	// An endpoint that is no pod: a host-network backend, or a Service
	// without a selector (the API server's own).
	if s, ok := r.serviceOfLocked(ip, ""); ok {
		return &record.K8s{Namespace: s.namespace, Service: s.name}, true
	}
	return nil, false
}
