package kubeapi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The server is the real one: it has the release's version, validates what
// it is given, and lets in only the token Start hands out.
func TestStart(t *testing.T) {
	cfg := Start(t)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.Major != "1" || v.Minor != "37" {
		t.Errorf("server version %s.%s, want 1.37 (k8s.io/kubernetes v1.37.2)", v.Major, v.Minor)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "no-containers"}}
	if _, err := client.CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("a pod without containers: %v, want Invalid", err)
	}

	anon := rest.AnonymousClientConfig(cfg)
	anonClient, err := kubernetes.NewForConfig(anon)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonClient.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("without the token: %v, want Unauthorized", err)
	}
}
