//go:build tools

// Package kube only names the Kubernetes commands that deploy/e2e builds
// (go build k8s.io/kubernetes/cmd/...), so that go.mod and go.sum pin
// everything they need.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
