#!/usr/bin/env bash
# The fault campaign (issue 19): two kubesink replicas (leader election on a Lease, the
# saved informer state in NATS, two sinks: JetStream and Kafka) against the simulator, a
# real nats-server and a real Kafka-protocol broker (tansu), under pod churn, with a seeded
# random schedule of faults: every simulator fault control (watches closed, 410, silenced,
# damaged; connections reset; the API server unreachable; 500s; slow answers; expired
# continue tokens), SIGKILL and SIGTERM restarts of either replica (leader hand-overs),
# nats-server frozen (SIGSTOP) and restarted, tansu frozen. (tansu is not restarted: its
# memory engine would lose the topic, and the oracles could no longer judge what was sent.)
# Then the faults stop, the churn stops, and three oracles judge what each destination holds:
#   1. `kubesink fold … --against-cluster`: the stream (topic) folded by key equals the
#      cluster (no ghost, nothing missing, no uid mismatch);
#   2. per key and uid, in the destination's order (scripts/chaos_check.py), the
#      resourceVersion never goes backwards, and nothing of a uid follows its `deleted`
#      except a repeat of that `deleted` (at-least-once);
#   3. folded by (key, uid), as a consumer indexing by uid does, the pairs held equal the
#      cluster's: no old uid left behind by a re-creation (scripts/chaos_check.py).
#
#   scripts/chaos.sh                       # 60 s of faults, a random seed (printed)
#   scripts/chaos.sh --seed 42             # replay a schedule
#   scripts/chaos.sh --minutes 30          # a long run
#
# Uses the target/debug binaries (built first; BIN and SIM to use others), the
# Python of the reference consumers' venv for the checks (CONSUMERS_PYTHON, with nats-py and
# confluent-kafka; scripts/test.sh sets it), curl, nats-server and tansu (TANSU_BIN, else
# the one scripts/test.sh caches in ${TOOLS_CACHE_DIR:-~/.cache/kubesink}). Exit 0 when both oracles agree,
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
"$PY" -c 'import nats, confluent_kafka' 2>/dev/null || { echo "chaos: $PY lacks nats-py or confluent-kafka (set CONSUMERS_PYTHON; scripts/test.sh builds that venv)" >&2; exit 2; }
TANSU="${TANSU_BIN:-${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}/tansu/bin/tansu}"
[ -x "$TANSU" ] || { echo "chaos: no tansu at $TANSU (set TANSU_BIN; scripts/test.sh builds it)" >&2; exit 2; }
RANDOM=$seed
echo "== chaos: seed $seed, ${seconds}s of faults (replay: scripts/chaos.sh --seed $seed --seconds $seconds)"

dir=$(mktemp -d)
cleanup() {
  kill -CONT "${nats_pid:-0}" "${tansu_pid:-0}" 2>/dev/null || true
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

kafka_port=$(free_port)
(cd "$dir" && exec "$TANSU" broker --listener-url "tcp://127.0.0.1:$kafka_port" \
  --advertised-listener-url "tcp://127.0.0.1:$kafka_port" --storage-engine memory://tansu/) \
  >"$dir/tansu.log" 2>&1 &
tansu_pid=$!
for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$kafka_port") 2>/dev/null && break; sleep 0.1; done
kafka="127.0.0.1:$kafka_port"
"$PY" - "$kafka" <<'PY' || { echo "chaos: creating the Kafka topic failed"; cat "$dir/tansu.log"; exit 2; }
import sys
from confluent_kafka.admin import AdminClient, NewTopic
admin = AdminClient({"bootstrap.servers": sys.argv[1]})  # kept: its futures need it alive
admin.create_topics([NewTopic("chaos", 3, 1)])["chaos"].result(30)
PY

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
[[sinks]]
type = "kafka"
bootstrap_servers = "$kafka"
topic = "chaos"
message_timeout = "5s"
# One record per batch: tansu 0.6 serves a fetch from inside a record batch with the next
# batch and keeps the high watermark at the last batch's base offset + 1, so a reader of
# multi-record batches can skip records (docs/kafka.md, "Findings with tansu 0.6"; seen here
# as two readers of one topic disagreeing). Kafka itself needs no such setting.
[sinks.librdkafka]
"batch.num.messages" = "1"
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
  case $((RANDOM % 15)) in
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
    14) log_fault "tansu frozen (SIGSTOP) for 2s"; kill -STOP "$tansu_pid"; sleep 2; kill -CONT "$tansu_pid" ;;
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
# Oracle 1 for each destination, until both agree (delivery may still be catching up).
fold() {
  "$BIN" --config "$dir/kubesink.toml" fold "$@" --against-cluster
}
agreed_nats="" agreed_kafka=""
deadline=$(( $(date +%s) + 180 ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  set +e
  [ -n "$agreed_nats" ] || { fold --nats "$nats_url" --stream CHAOS >"$dir/fold-nats.jsonl" 2>"$dir/fold-nats.log" && agreed_nats=1; }
  [ -n "$agreed_kafka" ] || { fold --kafka "$kafka" --topic chaos >"$dir/fold-kafka.jsonl" 2>"$dir/fold-kafka.log" && agreed_kafka=1; }
  set -e
  [ -n "$agreed_nats" ] && [ -n "$agreed_kafka" ] && break
  sleep 2
done
for d in nats kafka; do grep -h "DRIFT\|agree" "$dir/fold-$d.log" | tail -1 | sed "s/^/  fold ($d): /" || true; done

# Oracles 2 and 3 read every message each destination holds.
set +e
"$PY" scripts/chaos_check.py --server "$server" nats "$nats_url" CHAOS >"$dir/order-nats.log" 2>&1
order_nats=$?
"$PY" scripts/chaos_check.py --server "$server" kafka "$kafka" chaos >"$dir/order-kafka.log" 2>&1
order_kafka=$?
set -e
sed 's/^/  /' "$dir/order-nats.log" "$dir/order-kafka.log"
verdict() {  # $1 agreed, $2 fold file
  if [ -n "$1" ]; then echo agrees; else echo "DIFFERS ($(grep -c '"drift":"ghost"' "$2" 2>/dev/null || true) ghosts)"; fi
}
ok() { [ "$1" -eq 0 ] && echo ok || echo VIOLATED; }
echo "== chaos: seed $seed, $faults faults in ${seconds}s; NATS fold: $(verdict "$agreed_nats" "$dir/fold-nats.jsonl"), order and uid: $(ok $order_nats); Kafka fold: $(verdict "$agreed_kafka" "$dir/fold-kafka.jsonl"), order and uid: $(ok $order_kafka)"
if [ -z "$agreed_nats" ] || [ -z "$agreed_kafka" ] || [ "$order_nats" -ne 0 ] || [ "$order_kafka" -ne 0 ]; then
  echo "schedule:"; cat "$dir/schedule.log"
  for d in nats kafka; do echo "drift ($d):"; head -20 "$dir/fold-$d.jsonl"; done
  for w in a b; do echo "replica $w, last log lines:"; tail -15 "$dir/replica-$w.log"; done
  exit 1
fi
