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
# kubectl is the real client the simulator is tested with (sim/tests/kubectl.rs).
if ! command -v kubectl >/dev/null 2>&1; then
  echo "note: kubectl not found; install it to run the kubectl conformance test (it is skipped otherwise)" >&2
fi
# The NATS sink's tests start real servers (tests/nats.rs): nats-server (Debian package) and
# openssl (TLS test certificates). Installed once; later runs find them on PATH.
if ! command -v nats-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nats-server openssl
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
