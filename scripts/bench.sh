#!/usr/bin/env bash
# kubesink's benchmark suite (BENCHMARKS.md): builds the release binaries and runs the driver
# (benches/suite), which starts the simulator, kubesink, an ordinary informer
# (baseline-reflector), the serde_json floor (parse-floor), nats-server and tansu, and
# measures memory, throughput, latency and CPU side by side.
#
#   scripts/bench.sh           full run (100,000 pods; the driver ~6 minutes on 2 cores, plus the release build):
#                              writes docs/bench/results-full.{md,json} and the RSS plot
#   scripts/bench.sh --quick   small sizes, a few minutes (scripts/test.sh runs it so the
#                              driver never rots); debug binaries (what cargo test already
#                              built; BENCH_RELEASE=1 for release), so its figures mean
#                              nothing; writes to $BENCH_OUT (default target/bench-quick),
#                              never into docs/
#
# Needs nats-server (scripts/test.sh installs it) and, for the Kafka figure, tansu (cached
# by scripts/test.sh; the figure is skipped without it). Figures are not asserted anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
export TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"

quick=""
if [ "${1:-}" = "--quick" ]; then quick="--quick"; fi

if [ -n "$quick" ] && [ -z "${BENCH_RELEASE:-}" ]; then
  echo "== cargo build (debug: kubesink, kubesink-sim, the suite)"
  cargo build -q -p kubesink -p kubesink-sim -p kubesink-bench --bins
  # The real-server part too, where the control plane is at hand (scripts/test.sh exports
  # KUBE_TEST_BIN_DIR): 2,000 Pods, about two minutes, so its driver does not rot either.
  if [ -n "${KUBE_TEST_BIN_DIR:-}" ]; then
    echo "== real kube-apiserver, quick (bench-suite --quick --only real-server)"
    "$TARGET/debug/bench-suite" --quick --only real-server --out "${BENCH_OUT:-$TARGET/bench-quick}"
    # The Go peers beside kubesink on the same server (scripts/peers-build.sh builds them):
    # 1,000 Pods, 3 s of churn at each rate and a gap of 100, a few minutes.
    echo "== the Go peers side by side, quick (bench-suite --quick --only peers)"
    "$TARGET/debug/bench-suite" --quick --only peers --out "${BENCH_OUT:-$TARGET/bench-quick}"
    # One cluster as 4 shards over 2 replicas against one replica holding it whole, the
    # API server's ShardedListAndWatch gate on and off (a nats-server holds the state):
    # 2,000 Pods, under a minute.
    echo "== one cluster in shards over replicas, quick (bench-suite --quick --only shards)"
    "$TARGET/debug/bench-suite" --quick --only shards --out "${BENCH_OUT:-$TARGET/bench-quick}"
    # Metadata as JSON and protobuf, whole Pods, streaming and paged lists: 1,000 Pods,
    # one round, a minute or two.
    echo "== the wire encodings and list shapes, quick (bench-suite --quick --only wire)"
    "$TARGET/debug/bench-suite" --quick --only wire --out "${BENCH_OUT:-$TARGET/bench-quick}"
    # Events beside the Collector's k8s_events receiver: 100 Events/s for 5 s, one run,
    # about 20 s.
    echo "== Events beside the Collector's k8s_events, quick (bench-suite --quick --only events)"
    "$TARGET/debug/bench-suite" --quick --only events --out "${BENCH_OUT:-$TARGET/bench-quick}"
  fi
  # The HTTP and OTLP sinks into their receivers (scripts/test.sh exports RECEIVERS_BIN_DIR):
  # 1,000 Pods and 5 s of churn per row, under a minute.
  if [ -n "${RECEIVERS_BIN_DIR:-}" ]; then
    echo "== HTTP and OTLP sinks into local receivers, quick (bench-suite --quick --only http)"
    "$TARGET/debug/bench-suite" --quick --only http --out "${BENCH_OUT:-$TARGET/bench-quick}"
  fi
  # The cost of a resource's CEL filter (the simulator only): 1,000 Pods, 5 s of churn per
  # variant, under a minute.
  echo "== filters (CEL): resource filters and routes, quick (bench-suite --quick --only filters)"
  "$TARGET/debug/bench-suite" --quick --only filters --out "${BENCH_OUT:-$TARGET/bench-quick}"
  exec "$TARGET/debug/bench-suite" --quick --out "${BENCH_OUT:-$TARGET/bench-quick}"
fi

echo "== cargo build --release (kubesink, kubesink-sim, the suite)"
cargo build --release -q -p kubesink -p kubesink-sim -p kubesink-bench --bins

if [ -n "$quick" ]; then
  exec "$TARGET/release/bench-suite" --quick --out "${BENCH_OUT:-$TARGET/bench-quick}"
fi

# The informer's state per object (a counting allocator over the LightStore).
out="${BENCH_OUT:-docs/bench}"
mkdir -p "$out"
echo "== cargo bench --bench state_size"
if cargo bench -q --bench state_size > "$out/state_size.txt"; then
  exec "$TARGET/release/bench-suite" --out "$out" --state-size "$out/state_size.txt"
fi
echo "warning: cargo bench --bench state_size failed; the informer-state figure is left out" >&2
rm -f "$out/state_size.txt"
exec "$TARGET/release/bench-suite" --out "$out"
