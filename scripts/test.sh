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
# kubectl is the real client the simulator is tested with (sim/tests/kubectl.rs), and renders
# the kustomize manifests (scripts/check-deploy.sh).
if ! command -v kubectl >/dev/null 2>&1; then
  echo "note: kubectl not found; install it to run the kubectl conformance test and the deploy rendering checks (they are skipped otherwise)" >&2
fi
# The NATS sink's tests start real servers (tests/nats.rs): nats-server (Debian package) and
# openssl (TLS test certificates). Installed once; later runs find them on PATH.
if ! command -v nats-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nats-server openssl
fi

# tansu, the Kafka-protocol broker the Kafka tests start (tests/support/kafka_server.rs).
# Built once from crates.io (~7 minutes on 2 cores) and cached; skipped when present.
TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
export TOOLS_CACHE_DIR
TANSU="$TOOLS_CACHE_DIR/tansu/bin/tansu"
if [ ! -x "$TANSU" ]; then
  echo "== building tansu (Kafka-protocol test broker) into $TOOLS_CACHE_DIR/tansu"
  started=$(date +%s)
  cargo install tansu --version 0.6.0 --features dynostore --locked --root "$TOOLS_CACHE_DIR/tansu" \
    || cargo install tansu --version 0.6.0 --features dynostore --root "$TOOLS_CACHE_DIR/tansu"
  echo "tansu built in $(( $(date +%s) - started )) s"
fi
# rdkafka builds librdkafka from source: it needs a C toolchain, make, and the OpenSSL and
# zlib headers (zstd is vendored).
if command -v dpkg >/dev/null 2>&1; then
  missing=""
  for p in build-essential libssl-dev zlib1g-dev pkg-config; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "== installing$missing (for librdkafka)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $missing
  fi
fi

# The Python reference consumers (examples/consumers/python/) that tests/consumers.rs runs
# against real brokers: a venv with confluent-kafka and nats-py, cached in $TOOLS_CACHE_DIR and
# rebuilt only when the pinned versions change. The test finds it through CONSUMERS_PYTHON.
CONSUMERS_PY_PACKAGES="confluent-kafka==2.16.1 nats-py==2.16.0"
CONSUMERS_VENV="$TOOLS_CACHE_DIR/consumers-venv"
if [ "$(cat "$CONSUMERS_VENV/.installed" 2>/dev/null)" != "$CONSUMERS_PY_PACKAGES" ]; then
  echo "== installing $CONSUMERS_PY_PACKAGES into $CONSUMERS_VENV"
  if ! python3 -m venv --help >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3 python3-venv
  fi
  rm -rf "$CONSUMERS_VENV"
  python3 -m venv "$CONSUMERS_VENV"
  # shellcheck disable=SC2086
  "$CONSUMERS_VENV/bin/pip" install -q --disable-pip-version-check $CONSUMERS_PY_PACKAGES
  echo "$CONSUMERS_PY_PACKAGES" > "$CONSUMERS_VENV/.installed"
fi
export CONSUMERS_PYTHON="$CONSUMERS_VENV/bin/python"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# The library as a production build compiles it (without the test-util feature the tests
# turn on): no dead code or unused imports hidden by the test build.
cargo clippy -p kubesink --lib -- -D warnings
echo "== cargo test"
cargo test --workspace
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
