#!/usr/bin/env bash
# Records list and watch exchanges from the real kube-apiserver the real-server tests build
# (tests/kube, scripts/kube-build.sh) into tests/fixtures/k8s-replays/v1-MINOR/, the shape
# tests/fixtures.rs replays (and the simulator serves again). Run it after changing the
# Kubernetes pin in tests/kube/go.mod, then commit the new directory.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBE_TEST_BIN_DIR="$(scripts/kube-build.sh)"
export KUBE_TEST_BIN_DIR
minor="$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes v1\.\([0-9]*\)\..*$/\1/p' tests/kube/go.mod)"
out="tests/fixtures/k8s-replays/v1-$minor"
mkdir -p "$out"
RECORD_REPLAYS_INTO="$PWD/$out" cargo test --test real_record -- --nocapture
echo "recorded into $out:"
ls -l "$out"
