#!/usr/bin/env bash
# The fault campaign (issue 19): two kubesink replicas (leader election on a Lease, the
# saved informer state in NATS, a JetStream sink) against the simulator and a real
# nats-server, under pod churn, with a seeded random schedule of faults: every simulator
# fault control (watches closed, 410, silenced, damaged; connections reset; the API server
# unreachable; 500s; slow answers; expired continue tokens), SIGKILL and SIGTERM restarts of
# either replica (leader hand-overs), nats-server stopped, frozen (SIGSTOP) and restarted.
# Then the faults stop, the churn stops, and two oracles judge what JetStream holds:
#   1. `kubesink fold --nats … --against-cluster`: the folded stream equals the cluster
#      (no ghost, nothing missing, no uid mismatch);
#   2. a per-key order check of every message in the stream: per key and uid, the
#      resourceVersion never goes backwards, and nothing of a uid follows its `deleted`
#      except a repeat of that `deleted` (at-least-once).
#
#   scripts/chaos.sh                       # 60 s of faults, a random seed (printed)
#   scripts/chaos.sh --seed 42             # replay a schedule
#   scripts/chaos.sh --minutes 30          # a long run
#
# Uses the target/debug binaries (built first; BIN and SIM to use others), the
# Python of the reference consumers' venv for the order check (CONSUMERS_PYTHON, with
# nats-py; scripts/test.sh sets it), curl and nats-server. Exit 0 when both oracles agree,
# 1 when one does not (the seed and the evidence are printed), 2 when the set-up fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build -q -p kubesink -p kubesink-sim   # up to date in a second after cargo test
  BIN=target/debug/kubesink SIM=target/debug/kubesink-sim
fi
SIM="${SIM:-target/debug/kubesink-sim}"
PY="${CONSUMERS_PYTHON:-python3}"
seconds=60
seed=$(( $(date +%s) % 100000 ))
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --minutes) seconds=$(( $2 * 60 )); shift 2 ;;
    *) echo "usage: $0 [--seed N] [--seconds N | --minutes N]" >&2; exit 2 ;;
  esac
done
"$PY" -c 'import nats' 2>/dev/null || { echo "chaos: $PY has no nats-py (set CONSUMERS_PYTHON)" >&2; exit 2; }
RANDOM=$seed
echo "== chaos: seed $seed, ${seconds}s of faults (replay: scripts/chaos.sh --seed $seed --seconds $seconds)"

dir=$(mktemp -d)
cleanup() {
  kill -CONT "${nats_pid:-0}" 2>/dev/null || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-}" = 1 ] && echo "kept $dir" || rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The API server: 200 pods in 4 namespaces, 40 pod changes/s.
"$SIM" --kubeconfig "$dir/kubeconfig" --pods 200 --namespaces 4 --seed "$seed" \
  --retained-events 100000 >"$dir/sim.log" 2>&1 &
for _ in $(seq 200); do [ -s "$dir/kubeconfig" ] && break; sleep 0.1; done
server=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["clusters"][0]["cluster"]["server"])' "$dir/kubeconfig")
admin() { curl -sf -X POST "$server/_sim/$1" >/dev/null || echo "chaos: admin $1 failed" >&2; }

# The broker.
nats_port=$(free_port)
start_nats() {
  nats-server -a 127.0.0.1 -p "$nats_port" -js -sd "$dir/nats" >>"$dir/nats.log" 2>&1 &
  nats_pid=$!
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && return; sleep 0.1; done
}
start_nats
nats_url="nats://127.0.0.1:$nats_port"

cat >"$dir/kubesink.toml" <<EOF
[cluster]
name = "chaos"
kubeconfig = "$dir/kubeconfig"
[leader_election]
enabled = true
lease_name = "kubesink-chaos"
lease_namespace = "default"
lease_duration = "4s"
renew_deadline = "2s"
retry_period = "500ms"
[pipeline]
linger = "20ms"
retry_initial_backoff = "50ms"
retry_max_backoff = "1s"
shutdown_timeout = "10s"
[watch]
idle_timeout = "3s"
retry_initial_backoff = "50ms"
retry_max_backoff = "1s"
[state]
backend = "nats"
interval = "3s"
[state.nats]
servers = ["$nats_url"]
bucket = "KUBESINK_CHAOS_STATE"
[log]
summary_interval = "0s"
[server]
listen = "127.0.0.1:0"
[[resources]]
api_version = "v1"
kind = "Pod"
payload = "metadata"
[[sinks]]
type = "nats"
servers = ["$nats_url"]
mode = "jetstream"
subject = "kubesink.{cluster}.{group}.{kind}.{namespace}.{name}"
[sinks.stream]
name = "CHAOS"
create = true
EOF
"$BIN" --config "$dir/kubesink.toml" check >"$dir/check.log" 2>&1 || { cat "$dir/check.log"; exit 2; }

declare -A pid
start_replica() {
  POD_NAME="replica-$1" "$BIN" --config "$dir/kubesink.toml" run >/dev/null 2>>"$dir/replica-$1.log" &
  pid[$1]=$!
}
start_replica a
start_replica b
admin "churn?rate=40&seed=$seed"

faults=0
log_fault() { faults=$((faults + 1)); printf '  %5ss  %s\n' "$(( $(date +%s) - t0 ))" "$1" | tee -a "$dir/schedule.log"; }
t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt "$seconds" ]; do
  r=${pid[a]}; who=a
  if [ $((RANDOM % 2)) -eq 1 ]; then r=${pid[b]}; who=b; fi
  case $((RANDOM % 14)) in
    0) log_fault "close every watch"; admin close-watches ;;
    1) log_fault "next 2 watches answer 410"; admin "fail-watches?count=2" ;;
    2) log_fault "reset every connection mid-stream"; admin reset-connections ;;
    3) ms=$(( (RANDOM % 4 + 1) * 500 )); log_fault "API server unreachable for ${ms}ms"; admin "unreachable?on=true&for_ms=$ms" ;;
    4) log_fault "damage the next watch event"; admin "damage-watch-events?count=1&kind=truncated" ;;
    5) log_fault "next 3 requests answer 500"; admin "fail-requests?count=3&status=500" ;;
    6) log_fault "open watches go silent"; admin silence-open-watches ;;
    7) log_fault "answers slowed by 300ms for a while"; admin "delay?ms=300" ;;
    8) log_fault "the next continue token expires"; admin "expire-continue?count=1" ;;
    9|10) log_fault "SIGKILL replica $who, restarted"; kill -KILL "$r" 2>/dev/null || true; wait "$r" 2>/dev/null || true
       sleep "0.$((RANDOM % 10))"; start_replica "$who" ;;
    11) log_fault "SIGTERM replica $who, restarted"; kill -TERM "$r" 2>/dev/null || true; wait "$r" 2>/dev/null || true; start_replica "$who" ;;
    12) log_fault "nats-server frozen (SIGSTOP) for 2s"; kill -STOP "$nats_pid"; sleep 2; kill -CONT "$nats_pid" ;;
    13) log_fault "nats-server restarted"; kill -TERM "$nats_pid"; wait "$nats_pid" 2>/dev/null || true; sleep "0.$((RANDOM % 10))"; start_nats ;;
  esac
  sleep "$((RANDOM % 3)).$((RANDOM % 10))"
  [ $((RANDOM % 4)) -eq 0 ] && admin "delay?ms=0"
  # A replica that exited on its own (lost its lease: code 3) is restarted, as a Deployment would.
  for w in a b; do kill -0 "${pid[$w]}" 2>/dev/null || { wait "${pid[$w]}" 2>/dev/null || true; start_replica "$w"; }; done
done

echo "== faults stop ($faults injected); churn stops; waiting for the stream to agree with the cluster"
admin clear-faults
admin "churn?rate=0"
for w in a b; do kill -0 "${pid[$w]}" 2>/dev/null || start_replica "$w"; done
agreed=""
deadline=$(( $(date +%s) + 180 ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  set +e
  "$BIN" --config "$dir/kubesink.toml" fold --nats "$nats_url" --stream CHAOS --against-cluster \
    >"$dir/fold.jsonl" 2>"$dir/fold.log"
  code=$?
  set -e
  if [ "$code" -eq 0 ]; then agreed=1; break; fi
  sleep 2
done
grep -h "DRIFT\|agree" "$dir/fold.log" | tail -1 | sed 's/^/  fold: /' || true

# The order check reads every message of the stream.
set +e
"$PY" - "$nats_url" <<'PY' >"$dir/order.log" 2>&1
import asyncio, json, sys
import nats

async def main(url):
    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info("CHAOS")
    last = info.state.last_seq
    sub = await js.subscribe("kubesink.>", stream="CHAOS", ordered_consumer=True)
    seen, rv, deleted, problems = 0, {}, {}, []
    while seen < last and info.state.messages:
        try:
            m = await sub.next_msg(timeout=10)
        except Exception:
            break
        seen = m.metadata.sequence.stream
        msg = json.loads(m.data)
        if msg.get("op") == "synced":
            continue
        key, uid, op = msg["key"], msg["uid"], msg["op"]
        try:
            n = int(msg["resourceVersion"])
        except ValueError:
            continue
        k = (key, uid)
        if k in deleted and op != "deleted":
            problems.append(f"{key} uid {uid}: {op} at rv {n} (stream seq {seen}) after its deleted at rv {deleted[k]}")
        if k in rv and n < rv[k]:
            problems.append(f"{key} uid {uid}: rv {n} (stream seq {seen}, {op}) after rv {rv[k]}")
        rv[k] = max(rv.get(k, 0), n)
        if op == "deleted":
            deleted[k] = n
    await nc.close()
    print(f"order check: {seen} messages, {len(rv)} (key, uid) pairs, {len(problems)} problems")
    for p in problems[:50]:
        print("  " + p)
    sys.exit(1 if problems else 0)

asyncio.run(main(sys.argv[1]))
PY
order=$?
set -e
sed 's/^/  /' "$dir/order.log"
ghosts=$(grep -c '"drift":"ghost"' "$dir/fold.jsonl" 2>/dev/null || true)
if [ -n "$agreed" ]; then verdict="agrees"; else verdict="DIFFERS (${ghosts:-0} ghosts)"; fi
echo "== chaos: seed $seed, $faults faults in ${seconds}s; fold: $verdict; order: $([ "$order" -eq 0 ] && echo ok || echo VIOLATED)"
if [ -z "$agreed" ] || [ "$order" -ne 0 ]; then
  echo "schedule:"; cat "$dir/schedule.log"
  echo "drift:"; head -20 "$dir/fold.jsonl"
  for w in a b; do echo "replica $w, last log lines:"; tail -15 "$dir/replica-$w.log"; done
  exit 1
fi
