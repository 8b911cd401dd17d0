#!/usr/bin/env bash
# Regenerate this wrapper module for a Kubernetes version bump:
#   K8S=v1.37.2 ./gen.sh
# k8s.io/kubernetes requires its staging modules at v0.0.0 and maps them with
# `replace => ./staging/...`, which Go ignores in a dependency, so every staging
# module is pinned here to the matching v0.N.P release instead.
set -euo pipefail
K8S=${K8S:-v1.37.2}; STG=v0.${K8S#v1.}
cd "$(dirname "$0")"
rm -f go.mod go.sum
go mod init taugrid.dev/devcluster/k8s
MOD=$(go mod download -json "k8s.io/kubernetes@$K8S" | grep '"GoMod"' | cut -d'"' -f4)
for m in $(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[a-z0-9-]+) => \./staging/.*#\2#p' "$MOD"); do
  go mod edit -replace="$m=$m@$STG"
done
go mod edit -godebug=default=go1.26
go mod edit -require="k8s.io/kubernetes@$K8S"
go get -tool k8s.io/kubernetes/cmd/kube-apiserver@$K8S k8s.io/kubernetes/cmd/kube-controller-manager@$K8S \
  k8s.io/kubernetes/cmd/kube-scheduler@$K8S k8s.io/kubernetes/cmd/kubectl@$K8S \
  k8s.io/kubernetes/cmd/kubelet@$K8S
go mod tidy
