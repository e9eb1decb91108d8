#!/usr/bin/env bash
# Crash and restart under churn, then every message folded and compared with the cluster by
# `kubesink fold --against-cluster`: what a consumer is left with after a SIGKILL.
#
#   scripts/crash-drift.sh                      # with the state journal (the default)
#   WRITE_AHEAD=false scripts/crash-drift.sh    # without it: the ghosts of docs/restarts.md
#
# A simulated cluster (300 pods, 20 deployments, 5 nodes, 10 services, 4 namespaces) churns
# pods at 50 changes/s; kubesink (`[state] backend = "file"`, `interval = "2s"`, sync
# markers, stdout appended to one file) runs 20 s, is killed with SIGKILL, stays down 10 s
# while the churn goes on, runs again 15 s; the churn stops, kubesink stops cleanly, and the
# whole file is folded. Exit code: fold's (0 agree, 1 drift). Uses the release binaries
# (`cargo build --release -p kubesink -p kubesink-sim`; set BIN/SIM to use others).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-target/release/kubesink}"
SIM="${SIM:-target/release/kubesink-sim}"
WRITE_AHEAD="${WRITE_AHEAD:-true}"
[ -x "$BIN" ] && [ -x "$SIM" ] || cargo build --release -q -p kubesink -p kubesink-sim
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

"$SIM" --kubeconfig "$dir/kubeconfig" --pods 300 --deployments 20 --nodes 5 --services 10 \
  --namespaces 4 --seed 7 >"$dir/sim.log" 2>&1 &
for _ in $(seq 100); do [ -s "$dir/kubeconfig" ] && break; sleep 0.1; done
server=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["clusters"][0]["cluster"]["server"])' "$dir/kubeconfig")
cat >"$dir/kubesink.toml" <<EOF
[cluster]
name = "demo"
kubeconfig = "$dir/kubeconfig"
[pipeline]
sync_markers = true
[state]
backend = "file"
path = "$dir/state"
interval = "2s"
write_ahead = $WRITE_AHEAD
[log]
summary_interval = "0s"
[server]
enabled = false
[[resources]]
api_version = "v1"
kind = "Pod"
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
[[resources]]
api_version = "v1"
kind = "Node"
[[resources]]
api_version = "v1"
kind = "Service"
[[sinks]]
type = "stdout"
EOF
curl -sf -X POST "$server/_sim/churn?rate=50&seed=3" >/dev/null
"$BIN" --config "$dir/kubesink.toml" run >>"$dir/out.jsonl" 2>"$dir/run1.log" &
first=$!
sleep 20
kill -KILL "$first"; wait "$first" 2>/dev/null || true
echo "first run: $(wc -l <"$dir/out.jsonl") lines, then SIGKILL; down 10 s with churn"
sleep 10
before=$(wc -l <"$dir/out.jsonl")
"$BIN" --config "$dir/kubesink.toml" run >>"$dir/out.jsonl" 2>"$dir/run2.log" &
second=$!
sleep 15
curl -sf -X POST "$server/_sim/churn?rate=0" >/dev/null
sleep 2
kill -TERM "$second"; wait "$second"
echo "second run: $(( $(wc -l <"$dir/out.jsonl") - before )) lines"
grep -h "saved state restored" "$dir/run2.log" | sed 's/^/  /' || true
set +e
"$BIN" --config "$dir/kubesink.toml" fold --file "$dir/out.jsonl" --against-cluster >"$dir/fold.jsonl" 2>"$dir/fold.log"
code=$?
set -e
grep -v '^{' "$dir/fold.log" | tail -3 || true
grep -c '"drift":"ghost"' "$dir/fold.jsonl" | sed 's/^/ghost lines: /' || true
exit "$code"
