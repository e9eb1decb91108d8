#!/usr/bin/env bash
# Builds the real receivers the HTTP and OTLP sinks' tests send to (tests/receivers/: the CloudEvents Go
# SDK's HTTP binding and an OpenTelemetry Collector, pinned in go.mod) into $TOOLS_CACHE_DIR/receivers/KEY/bin, KEY a digest of
# the module's files and the Go version, and prints that directory (tests/http.rs takes it from
# RECEIVERS_BIN_DIR). About a minute and a half on 2 cores the first time (the Collector).
set -euo pipefail
cd "$(dirname "$0")/../tests/receivers"

TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"   # where the polyglot machines have it
fi
if ! command -v go >/dev/null 2>&1; then
  echo "scripts/receivers-build.sh: the Go toolchain is not on PATH (go.mod needs Go $(sed -n 's/^go //p' go.mod))" >&2
  exit 1
fi
key="$( (cat go.mod go.sum; find cmd -name '*.go' | sort | xargs cat; go version) | sha256sum | cut -c1-16)"
out="$TOOLS_CACHE_DIR/receivers/$key"
if [ ! -x "$out/bin/ce-receiver" ]; then
  echo "== building the test receivers (tests/receivers) into $out" >&2
  started=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin"
  GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$out.tmp/bin/" ./cmd/...
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "receivers built in $(( $(date +%s) - started )) s" >&2
fi
echo "$out/bin"
