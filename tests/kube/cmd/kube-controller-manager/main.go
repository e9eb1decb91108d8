// Command kube-controller-manager is the upstream controller manager's main
// (k8s.io/kubernetes/cmd/kube-controller-manager), built from the module pinned in go.mod, so
// that Deployments create ReplicaSets and Pods, the garbage collector cascades deletes and
// namespace deletion finishes in kubesink's real-server tests.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
