#!/usr/bin/env bash
# CPU seconds (user + system, /proc/<pid>/stat) two kubesink binaries spend until their sync
# marker, 100,000 whole Pods on the simulator into the stdout sink, three rounds, the order
# alternated; prints round, binary, CPU s, seconds to the marker.
#
#   benches/cpu-sync.sh target/release/kubesink /tmp/kubesink-before
#
# SIM: the simulator binary (default: beside the first binary).
set -euo pipefail
SIM=${SIM:-$(dirname "$1")/kubesink-sim}
for r in 1 2 3; do
  order=("$@"); [ $((r % 2)) -eq 0 ] && order=("${order[1]}" "${order[0]}")
  for bin in "${order[@]}"; do
    d=$(mktemp -d)
    "$SIM" --kubeconfig "$d/kc" --pods 100000 --namespaces 20 --nodes 10 --seed 1 >"$d/sim.log" 2>&1 &
    sim=$!
    for _ in $(seq 1200); do [ -s "$d/kc" ] && break; sleep 0.1; done
    printf '[cluster]\nname = "mem"\nkubeconfig = "%s"\n[server]\nlisten = "127.0.0.1:0"\n[pipeline]\nsync_markers = true\n[[resources]]\napi_version = "v1"\nkind = "Pod"\n[[sinks]]\ntype = "stdout"\n' "$d/kc" >"$d/k.toml"
    start=$(date +%s.%N)
    "$bin" --config "$d/k.toml" run >"$d/out.jsonl" 2>"$d/err.log" &
    k=$!
    for _ in $(seq 6000); do grep -q '"op":"synced"' "$d/out.jsonl" 2>/dev/null && break; sleep 0.05; done
    end=$(date +%s.%N)
    read -r ut st < <(awk '{print $14, $15}' /proc/$k/stat)
    printf '%s\t%s\t%.2f\t%.2f\n' "$r" "$bin" "$(echo "($ut+$st)/100" | bc -l)" "$(echo "$end-$start" | bc -l)"
    kill "$k" "$sim" 2>/dev/null || true; wait "$k" "$sim" 2>/dev/null || true; rm -rf "$d"
  done
done
