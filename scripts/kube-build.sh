#!/usr/bin/env bash
# Builds the real Kubernetes control plane the real-server tests run against (tests/kube/: etcd,
# kube-apiserver and kube-controller-manager from their own Go modules, pinned in go.mod) into
# $TOOLS_CACHE_DIR/kube/KEY/bin, KEY a digest of the module's files and the Go version, so a
# changed pin builds anew and an unchanged one takes no time. Prints that bin directory on
# stdout (the tests take it from KUBE_TEST_BIN_DIR, or run this script themselves).
#
# The first build on 2 cores takes several minutes (docs/testing.md has the figure); Go's own
# build cache (~/.cache/go-build) and module cache (~/go/pkg/mod) make a rebuild quicker.
set -euo pipefail
cd "$(dirname "$0")/../tests/kube"

TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
# The polyglot machines install Go in /usr/local/go; a non-interactive shell may not have it
# on PATH (it is added by ~/.bashrc).
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "scripts/kube-build.sh: the Go toolchain is not on PATH (go.mod needs Go $(sed -n 's/^go //p' go.mod))" >&2
  exit 1
fi
key="$( (cat go.mod go.sum; find cmd -name '*.go' | sort | xargs cat; go version) | sha256sum | cut -c1-16)"
out="$TOOLS_CACHE_DIR/kube/$key"
if [ ! -x "$out/bin/kube-apiserver" ] || [ ! -x "$out/bin/kube-controller-manager" ] || [ ! -x "$out/bin/etcd" ]; then
  echo "== building etcd, kube-apiserver and kube-controller-manager (tests/kube) into $out" >&2
  started=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin"
  # GOFLAGS=-mod=mod would let go.sum change: the pins are exact, so -mod=readonly; no VCS
  # stamp (the binaries carry the release's version instead).
  # The version the binaries report (`--version`, /version), as Kubernetes' own build stamps it.
  k8s="$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' go.mod)"
  minor="$(echo "$k8s" | cut -d. -f2)"
  v=k8s.io/component-base/version
  GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath \
    -ldflags="-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
    -o "$out.tmp/bin/" ./cmd/...
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "control plane built in $(( $(date +%s) - started )) s" >&2
fi
echo "$out/bin"
