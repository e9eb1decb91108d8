#!/usr/bin/env bash
# Resident memory of kubesink binaries side by side on the simulator: for each size, each
# round, each binary in turn (the order rotated by round), one Pod watch (payload $PAYLOAD,
# default "metadata") into the stdout sink; after the sync marker, 5 s of quiet (or, with
# CHURN=N, 20 s of N changes/s), then VmRSS, RssAnon, RssFile and VmHWM of
# /proc/<pid>/status, in kB. Prints one TSV line per run. WATCH='initial_list = "list"'
# (any lines of the [watch] section) sets how the Pods are read.
#
#   benches/memory-floor.sh "0 10000 100000" 3 target/release/kubesink /tmp/kubesink-before
#
# Arguments: the Pod counts, the rounds, then the binaries (the first one's name is what
# the simulator binary is found beside unless SIM is set).
set -euo pipefail
sizes=$1; rounds=$2; shift 2; bins=("$@")
SIM=${SIM:-$(dirname "${bins[0]}")/kubesink-sim}
PAYLOAD=${PAYLOAD:-metadata}
printf 'pods\tround\tbinary\tVmRSS\tRssAnon\tRssFile\tVmHWM\n'
for n in $sizes; do
  for r in $(seq "$rounds"); do
    order=("${bins[@]}")
    for _ in $(seq $(( (r - 1) % ${#bins[@]} ))); do order=("${order[@]:1}" "${order[0]}"); done
    for bin in "${order[@]}"; do
      d=$(mktemp -d)
      "$SIM" --kubeconfig "$d/kc" --pods "$n" --namespaces 20 --nodes 10 --seed 1 >"$d/sim.log" 2>&1 &
      sim=$!
      for _ in $(seq 1200); do [ -s "$d/kc" ] && break; sleep 0.1; done
      printf '[cluster]\nname = "mem"\nkubeconfig = "%s"\n[server]\nlisten = "127.0.0.1:0"\n[pipeline]\nsync_markers = true\n[watch]\n%s\n[[resources]]\napi_version = "v1"\nkind = "Pod"\npayload = "%s"\n[[sinks]]\ntype = "stdout"\n' "$d/kc" "${WATCH:-}" "$PAYLOAD" >"$d/k.toml"
      "$bin" --config "$d/k.toml" run >"$d/out.jsonl" 2>"$d/err.log" &
      k=$!
      for _ in $(seq 3000); do grep -q '"op":"synced"' "$d/out.jsonl" 2>/dev/null && break; sleep 0.1; done
      sleep 5
      if [ -n "${CHURN:-}" ]; then
        server=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["clusters"][0]["cluster"]["server"])' "$d/kc")
        curl -sf -X POST "$server/_sim/churn?rate=$CHURN" >/dev/null
        sleep 20
      fi
      field() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$k/status"; }
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$r" "$bin" "$(field VmRSS)" "$(field RssAnon)" "$(field RssFile)" "$(field VmHWM)"
      kill "$k" "$sim" 2>/dev/null || true
      wait "$k" "$sim" 2>/dev/null || true
      rm -rf "$d"
    done
  done
done
