#!/usr/bin/env bash
# Builds the Go peers of `bench-suite --only peers` into $TOOLS_CACHE_DIR/peers/KEY/bin, KEY a
# digest of both modules' files and the Go version, and prints that directory (the bench suite
# takes it from PEERS_BIN_DIR, or runs this script itself): benches/peers (peer-informer:
# client-go informers, pinned at the control plane's release) and benches/peers/otelcol
# (otelcol-k8sobjects: an OpenTelemetry Collector with the k8sobjects and k8s_events receivers, its own module
# because it brings its own client-go). About three minutes on 2 cores the first time (most of
# it the Collector); Go's build and module caches make a rebuild quicker.
set -euo pipefail
cd "$(dirname "$0")/../benches/peers"

TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"   # where the polyglot machines have it
fi
if ! command -v go >/dev/null 2>&1; then
  echo "scripts/peers-build.sh: the Go toolchain is not on PATH (go.mod needs Go $(sed -n 's/^go //p' go.mod))" >&2
  exit 1
fi
key="$( (cat go.mod go.sum otelcol/go.mod otelcol/go.sum; find cmd otelcol/cmd -name '*.go' | sort | xargs cat; go version) | sha256sum | cut -c1-16)"
out="$TOOLS_CACHE_DIR/peers/$key"
if [ ! -x "$out/bin/peer-informer" ] || [ ! -x "$out/bin/otelcol-k8sobjects" ]; then
  echo "== building the Go peers (benches/peers) into $out" >&2
  started=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin"
  GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$out.tmp/bin/" ./cmd/...
  (cd otelcol && GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$out.tmp/bin/" ./cmd/...)
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "peers built in $(( $(date +%s) - started )) s" >&2
fi
echo "$out/bin"
