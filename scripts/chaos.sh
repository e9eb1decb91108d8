#!/usr/bin/env bash
# The fault campaign: two kubesink replicas (leader election on a Lease, the
# saved informer state in NATS or in Kafka (a compacted topic on tansu; --state, else drawn
# from the seed: even seeds NATS, odd Kafka), two sinks: JetStream and Kafka; replica a pages its lists, 50
# a page, replica b streams them) watching Pods, ConfigMaps and Secrets (payload "full", sync
# markers on) against the simulator, a real nats-server and a real Kafka-protocol broker
# (tansu), under pod churn, with a seeded random schedule of faults: every simulator fault
# control (watches closed, 410, silenced, damaged; connections reset; the API server
# unreachable; 500s; slow answers; expired continue tokens of replica a's paged relists),
# SIGKILL and SIGTERM restarts of either replica, SIGSTOP of either replica for longer than
# the lease (the woken deposed leader must exit 3; restarted), names deleted and created
# again with a new uid (a Pod, a ConfigMap, a Secret), ConfigMap and Secret updates,
# nats-server frozen and restarted, tansu frozen. (tansu is not restarted: its memory engine
# would lose the topic, and the oracles could no longer judge what was sent.)
# The campaign cannot pass vacuously: an admin or API call that fails fails it; each
# simulator fault scheduled must show in the simulator's faultEffects counters; each kill,
# stop or freeze of the leader must be followed by a hand-over ("became the leader"); a
# replica exiting unscheduled (a crash, or exit 3 without a freeze) fails it.
# Then the faults stop, the churn stops, and the oracles judge what each destination holds:
#   1. `kubesink fold … --against-cluster --compare-resource-version`: the stream (topic)
#      folded by key equals the cluster (no ghost, nothing missing, no uid mismatch, no stale
#      resourceVersion);
#   2. scripts/chaos_check.py: leader epochs honoured (late writes of a deposed leader skipped,
#      a zombie more than one hand-over late a problem); per key and uid, in the destination's
#      order, the resourceVersion never goes backwards, and nothing of a uid follows its
#      `deleted` except a repeat of that `deleted`; folded by (key, uid) the pairs held equal
#      the cluster's with its resourceVersion and content; no Secret data; some key re-created.
#
#   scripts/chaos.sh                       # 60 s of faults, a random seed (printed)
#   scripts/chaos.sh --seed 42             # replay a schedule
#   scripts/chaos.sh --minutes 30          # a long run
#   scripts/chaos.sh --plant lost-update   # must fail: a stale copy published (NATS), an
#                                          #   update dropped from what is read (Kafka)
#   scripts/chaos.sh --plant zombie        # must fail: an old message with an epoch two
#                                          #   hand-overs old published after the run
#   scripts/chaos.sh --plant missing-fault # must fail: one kind of fault never sent
#   scripts/chaos.sh --state kafka         # the saved state in Kafka whatever the seed
#
# Uses the target/debug binaries (built first; BIN and SIM to use others), the
# Python of the reference consumers' venv for the checks (CONSUMERS_PYTHON, with nats-py and
# confluent-kafka; scripts/test.sh sets it), curl, nats-server and tansu (TANSU_BIN, else
# the one scripts/test.sh caches in ${TOOLS_CACHE_DIR:-~/.cache/kubesink}). Exit 0 when every
# oracle and check agrees, 1 when one does not (the seed and the evidence are printed), 2 when
# the set-up fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build -q -p kubesink -p kubesink-sim   # up to date in a second after cargo test
  BIN=target/debug/kubesink SIM=target/debug/kubesink-sim
fi
SIM="${SIM:-target/debug/kubesink-sim}"
PY="${CONSUMERS_PYTHON:-python3}"
seconds=60
plant=""
state=""
seed=$(( $(date +%s) % 100000 ))
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --minutes) seconds=$(( $2 * 60 )); shift 2 ;;
    --plant) plant="$2"; shift 2
      case "$plant" in lost-update|zombie|missing-fault) ;; *) echo "chaos: --plant lost-update|zombie|missing-fault" >&2; exit 2 ;; esac ;;
    --state) state="$2"; shift 2
      case "$state" in nats|kafka) ;; *) echo "chaos: --state nats|kafka" >&2; exit 2 ;; esac ;;
    *) echo "usage: $0 [--seed N] [--seconds N | --minutes N] [--plant lost-update|zombie|missing-fault] [--state nats|kafka]" >&2; exit 2 ;;
  esac
done
# The state backend: both are shared by the replicas; a seed replays with the same one.
[ -n "$state" ] || { [ $((seed % 2)) -eq 0 ] && state=nats || state=kafka; }
"$PY" -c 'import nats, confluent_kafka' 2>/dev/null || { echo "chaos: $PY lacks nats-py or confluent-kafka (set CONSUMERS_PYTHON; scripts/test.sh builds that venv)" >&2; exit 2; }
TANSU="${TANSU_BIN:-${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}/tansu/bin/tansu}"
[ -x "$TANSU" ] || { echo "chaos: no tansu at $TANSU (set TANSU_BIN; scripts/test.sh builds it)" >&2; exit 2; }
RANDOM=$seed
echo "== chaos: seed $seed, ${seconds}s of faults, state in $state (replay: scripts/chaos.sh --seed $seed --seconds $seconds${plant:+ --plant $plant})"

dir=$(mktemp -d)
cleanup() {
  kill -CONT "${nats_pid:-0}" "${tansu_pid:-0}" 2>/dev/null || true
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-}" = 1 ] && echo "kept $dir" || rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The API server: 200 pods in 4 namespaces, 40 pod changes/s. It reports Kubernetes 1.32,
# where `initial_list = "auto"` streams JSON lists: replica b's lists are streaming lists.
"$SIM" --kubeconfig "$dir/kubeconfig" --pods 200 --namespaces 4 --seed "$seed" \
  --retained-events 100000 --server-version 1.32 >"$dir/sim.log" 2>&1 &
for _ in $(seq 200); do [ -s "$dir/kubeconfig" ] && break; sleep 0.1; done
server=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["clusters"][0]["cluster"]["server"])' "$dir/kubeconfig")
# Every admin or API call of the campaign must succeed: a fault that was never injected
# would make the run pass vacuously.
fail() { echo "== chaos: FAILED: $*"; exit 1; }
admin() { curl -sf -X POST "$server/_sim/$1" >/dev/null || fail "admin call /_sim/$1 failed"; }
stats() { curl -sf "$server/_sim/stats" || fail "GET /_sim/stats failed"; }
lease() {  # holder and leaseTransitions of the Lease, "replica-a 3"
  # Read again when the read fails: a "next 3 requests answer 500" fault answers this read
  # too, and a leader read as "none" was SIGSTOPped as a follower, so its lost lease after
  # SIGCONT was a problem nothing explained (seed 58362).
  local body
  for _ in 1 2 3 4 5 6; do
    body=$(curl -sf "$server/apis/coordination.k8s.io/v1/namespaces/default/leases/kubesink-chaos" 2>/dev/null) && break
    sleep 0.1
  done
  printf '%s' "$body" |
    python3 -c 'import json,sys; s=json.load(sys.stdin)["spec"]; print(s.get("holderIdentity") or "none", s.get("leaseTransitions", 0))' 2>/dev/null || echo "none 0"
}
# ConfigMaps and Secrets beside the churned Pods; re-creations of a name with a new uid.
cat >"$dir/kube.py" <<'PY'
import json, random, sys, urllib.request, urllib.error
server, action, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
def call(method, path, body=None):
    req = urllib.request.Request(server + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
def obj(kind, ns, name, i):
    o = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": ns, "labels": {"app": "chaos"}}}
    if kind == "ConfigMap": o["data"] = {"v": str(i)}
    if kind == "Secret": o["stringData"] = {"password": f"hunter{i}"}
    return o
if action == "seed":  # 10 ConfigMaps and 10 Secrets in default
    for i in range(10):
        call("POST", "/api/v1/namespaces/default/configmaps", obj("ConfigMap", "default", f"cm-{i}", i))
        call("POST", "/api/v1/namespaces/default/secrets", obj("Secret", "default", f"secret-{i}", i))
elif action == "update":  # change one ConfigMap and one Secret
    i = rnd.randrange(10)
    for plural, kind, name in (("configmaps", "ConfigMap", f"cm-{i}"), ("secrets", "Secret", f"secret-{i}")):
        o = call("GET", f"/api/v1/namespaces/default/{plural}/{name}")
        if kind == "ConfigMap": o["data"] = {"v": str(rnd.randrange(10**6))}
        else:  # a Secret's data never leaves kubesink: a data-only change sends nothing (and keeps
               # the resourceVersion sent), so a label changes too and the final state can be compared
            o["data"] = None; o["stringData"] = {"password": str(rnd.randrange(10**6))}
            o["metadata"].setdefault("labels", {})["rev"] = str(rnd.randrange(10**6))
        call("PUT", f"/api/v1/namespaces/default/{plural}/{name}", o)
    print(f"cm-{i}, secret-{i}")
elif action == "recreate":  # delete a Pod, a ConfigMap and a Secret, create each again: same name, new uid
    done = []
    pods = call("GET", "/api/v1/pods")["items"]
    for _ in range(5):
        p = rnd.choice(pods)["metadata"]
        try:
            old = call("GET", f"/api/v1/namespaces/{p['namespace']}/pods/{p['name']}")
            call("DELETE", f"/api/v1/namespaces/{p['namespace']}/pods/{p['name']}")
        except urllib.error.HTTPError as e:
            if e.code == 404: continue  # the churn deleted it first
            raise
        new = {"apiVersion": "v1", "kind": "Pod", "spec": old["spec"],
               "metadata": {"name": p["name"], "namespace": p["namespace"], "labels": old["metadata"].get("labels", {})}}
        made = call("POST", f"/api/v1/namespaces/{p['namespace']}/pods", new)
        done.append(f"pod {p['namespace']}/{p['name']} uid {old['metadata']['uid'][:8]}->{made['metadata']['uid'][:8]}")
        break
    else:
        sys.exit("no pod to re-create")
    i = rnd.randrange(10)
    for plural, kind, name in (("configmaps", "ConfigMap", f"cm-{i}"), ("secrets", "Secret", f"secret-{i}")):
        call("DELETE", f"/api/v1/namespaces/default/{plural}/{name}")
        made = call("POST", f"/api/v1/namespaces/default/{plural}", obj(kind, "default", name, rnd.randrange(100)))
        done.append(f"{kind} default/{name}")
    print(", ".join(done))
PY
kube() {  # in $(…): a failure is written down, and fails the campaign at its end
  "$PY" "$dir/kube.py" "$server" "$1" "$RANDOM" 2>>"$dir/kube.log" || { echo "API call ($1) failed: $(tail -1 "$dir/kube.log")" >>"$dir/problems.log"; echo FAILED; }
}
: >"$dir/problems.log"
kube seed >/dev/null
[ -s "$dir/problems.log" ] && fail "$(cat "$dir/problems.log")"

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
sync_markers = true
[watch]
initial_list = "@INITIAL_LIST@"
idle_timeout = "3s"
retry_initial_backoff = "50ms"
retry_max_backoff = "1s"
[state]
interval = "3s"
@STATE@
[log]
summary_interval = "0s"
[server]
listen = "127.0.0.1:0"
# payload "full": every change moves the resourceVersion sent, so the final state can be
# compared exactly (fold --compare-resource-version; chaos_check's exact-state check).
[[resources]]
api_version = "v1"
kind = "Pod"
payload = "full"
page_size = @PAGE_SIZE@
[[resources]]
api_version = "v1"
kind = "ConfigMap"
payload = "full"
[[resources]]
api_version = "v1"
kind = "Secret"
payload = "full"
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
# The state store: a NATS KV bucket, or a compacted Kafka topic through the kafka sink's
# connection (tansu: the store's topic is created by kubesink; tansu freezes reach it too).
if [ "$state" = nats ]; then
  state_toml="backend = \"nats\"\n[state.nats]\nservers = [\"$nats_url\"]\nbucket = \"KUBESINK_CHAOS_STATE\""
else
  state_toml="backend = \"kafka\"\n[state.kafka]\ntopic = \"kubesink-chaos-state\""
fi
python3 - "$dir/kubesink.toml" "$state_toml" <<'PY'
import sys
p, block = sys.argv[1], sys.argv[2].replace("\\n", "\n")
text = open(p).read().replace("@STATE@", block)
open(p, "w").write(text)
PY
# Replica a makes paged lists (50 a page: an expired continue token has pages to cut);
# replica b streams its lists (sendInitialEvents) where the server serves them (`auto` on 1.32).
sed -e 's/@INITIAL_LIST@/list/' -e 's/@PAGE_SIZE@/50/' "$dir/kubesink.toml" >"$dir/kubesink-a.toml"
sed -e 's/@INITIAL_LIST@/auto/' -e 's/@PAGE_SIZE@/500/' "$dir/kubesink.toml" >"$dir/kubesink-b.toml"
cp "$dir/kubesink-b.toml" "$dir/kubesink.toml"
for w in a b; do
  "$BIN" --config "$dir/kubesink-$w.toml" check >"$dir/check.log" 2>&1 || { cat "$dir/check.log"; exit 2; }
done

declare -A pid log_from
start_replica() {
  log_from[$1]=$(( $(stat -c %s "$dir/replica-$1.log" 2>/dev/null || echo 0) + 1 ))
  POD_NAME="replica-$1" "$BIN" --config "$dir/kubesink-$1.toml" run >/dev/null 2>>"$dir/replica-$1.log" &
  pid[$1]=$!
}
# Whether the running incarnation of replica $1 leads: the Lease names it AND this incarnation
# logged "became the leader". The Lease alone is not enough: a replica restarted after it lost
# its lease finds its own name there until the other takes the Lease, and, if the API answers
# it too slowly to renew, it never leads (seed 41822: b read as the leader, frozen, woken, and
# rightly did not exit). The holder written just before the log line: asked again for 1 s.
leads() {
  local holder=$2
  [ "$holder" = "replica-$1" ] || return 1
  for _ in $(seq 10); do
    tail -c +"${log_from[$1]}" "$dir/replica-$1.log" | grep -q "became the leader" && return 0
    sleep 0.1
  done
  return 1
}
problem() { echo "  PROBLEM: $*" | tee -a "$dir/problems.log"; }
handovers() { cat "$dir"/replica-?.log 2>/dev/null | grep -c "became the leader" || true; }
# After the leader was killed, stopped or frozen: wait (up to 20 s) for a "became the leader"
# line beyond the $1 seen before; a hand-over that does not happen is a problem.
expect_handover() {
  expected_handovers=$((expected_handovers + 1))
  for _ in $(seq 200); do [ "$(handovers)" -gt "$1" ] && return 0; sleep 0.1; done
  problem "no hand-over within 20 s after: $2"
}
start_replica a
start_replica b
admin "churn?rate=40&seed=$seed"
for _ in $(seq 300); do [ "$(handovers)" -ge 1 ] && break; sleep 0.1; done
[ "$(handovers)" -ge 1 ] || fail "no replica became the leader in 30 s"
# The faults start once the leader watches: a fault that acts on open watches (a reset, a
# close, silence) drawn while its first lists are still in flight took no effect, and the
# effect check rightly failed the campaign (seed 57979: two resets at 0 s and 1 s, replica a
# still paging its lists).
for _ in $(seq 600); do
  cat "$dir"/replica-?.log 2>/dev/null | grep -q "initial sync complete" &&
    [ "$(stats | python3 -c 'import json,sys; print(json.load(sys.stdin).get("openWatches", 0))')" -ge 1 ] && break
  sleep 0.1
done

faults=0 expected_handovers=0 noop_effect="" recreated=0
declare -A scheduled=() fault_of=()  # effect counter name -> sim faults of that kind sent, and what they are
declare -A by_kind=()
deposed_woke=0 crashes=0 lease_losses=0
log_fault() { faults=$((faults + 1)); by_kind[$1]=$(( ${by_kind[$1]:-0} + 1 )); printf '  %5ss  %s\n' "$(( $(date +%s) - t0 ))" "$1${2:+ $2}" | tee -a "$dir/schedule.log"; }
# A simulator fault: $1 what, $2 the faultEffects counter that shows it took effect, $3… admin calls.
# With --plant missing-fault the first kind drawn is never sent (the effect check must notice).
sim_fault() {
  local what=$1 effect=$2; shift 2
  if [ "$plant" = missing-fault ] && { [ -z "$noop_effect" ] || [ "$noop_effect" = "$effect" ]; }; then
    noop_effect=$effect; log_fault "$what" "(PLANT missing-fault: not sent)"
  else
    # A fault that acts on open watches waits (up to 5 s) for one to be open: drawn right
    # after "API server unreachable" it found none and took no effect, which the effect check
    # rightly flagged (seed 77022: a reset at 55 s, the server refusing connections since 55 s).
    case $effect in
      resetWatches | closedWatches | silencedWatches)
        for _ in $(seq 50); do
          [ "$(stats | python3 -c 'import json,sys; print(json.load(sys.stdin).get("openWatches", 0))')" -ge 1 ] && break
          sleep 0.1
        done ;;
    esac
    log_fault "$what"; for c in "$@"; do admin "$c"; done
    api_fault_at=$(date +%s); [ "$effect" = delayedResponses ] && delay_on=1
  fi
  scheduled[$effect]=$(( ${scheduled[$effect]:-0} + 1 )); fault_of[$effect]=$what
}
# Replicas that exited without the schedule stopping them. Exit 3 with "lost leadership" while
# answers are slowed or within 6 s of a simulator fault is a leader that could not renew within
# renew_deadline (2 s) through those faults: the fault's effect, counted and restarted. Any
# other exit (a crash, or exit 3 that no fault explains) fails the campaign.
api_fault_at=0 delay_on=0 explained_lease_losses=0
reap() {
  for w in a b; do
    kill -0 "${pid[$w]}" 2>/dev/null && continue
    rc=0; wait "${pid[$w]}" 2>/dev/null || rc=$?
    if [ "$rc" -eq 3 ] && tail -3 "$dir/replica-$w.log" | grep -q "lost leadership" &&
       { [ "$delay_on" = 1 ] || [ $(( $(date +%s) - api_fault_at )) -le 6 ]; }; then
      explained_lease_losses=$((explained_lease_losses + 1))
      printf '  %5ss  %s\n' "$(( $(date +%s) - t0 ))" "(effect) replica $w lost its lease through the API faults (exit 3), restarted" | tee -a "$dir/schedule.log"
    elif [ "$rc" -eq 3 ]; then lease_losses=$((lease_losses + 1)); problem "replica $w lost its lease (exit 3) with no API fault to explain it"
    else crashes=$((crashes + 1)); problem "replica $w exited with code $rc unscheduled (a crash)"; fi
    [ "$rc" -eq 3 ] || tail -5 "$dir/replica-$w.log" | sed 's/^/      /'
    start_replica "$w"
  done
}
t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt "$seconds" ]; do
  reap
  r=${pid[a]}; who=a
  if [ $((RANDOM % 2)) -eq 1 ]; then r=${pid[b]}; who=b; fi
  read -r holder epoch < <(lease)
  leader=no; leads "$who" "$holder" && leader=yes
  case $((RANDOM % 19)) in
    0) sim_fault "close every watch" closedWatches close-watches ;;
    1) sim_fault "next 3 watches answer 410 (every watch closed first)" goneWatches "fail-watches?count=3" close-watches ;;
    2) sim_fault "reset every connection mid-stream" resetWatches reset-connections ;;
    3) ms=$(( (RANDOM % 3 + 1) * 400 )); sim_fault "API server unreachable for ${ms}ms" refusedConnections "unreachable?on=true&for_ms=$ms" ;;
    4) sim_fault "damage the next watch event" damagedWatchEvents "damage-watch-events?count=1&kind=truncated" ;;
    5) sim_fault "next 3 requests answer 500" failedRequests "fail-requests?count=3&status=500" ;;
    6) sim_fault "open watches go silent" silencedWatches silence-open-watches ;;
    7) sim_fault "answers slowed by 300ms for a while" delayedResponses "delay?ms=300" ;;
    8) if [ "$holder" = replica-a ]; then  # only replica a pages its lists
         sim_fault "the next continue token expires (then 410 relists of replica a's paged lists)" expiredContinues \
           "expire-continue?count=1" "fail-watches?count=3" close-watches
       else
         log_fault "re-create names with a new uid:" "$(kube recreate)"; recreated=$((recreated + 1))
       fi ;;
    9|10) h=$(handovers); log_fault "SIGKILL replica $who, restarted" "(leader: $leader)"; kill -KILL "$r" 2>/dev/null || true; wait "$r" 2>/dev/null || true
       sleep "0.$((RANDOM % 10))"; start_replica "$who"
       [ $leader = yes ] && expect_handover "$h" "SIGKILL of leader $who" ;;
    11) h=$(handovers); log_fault "SIGTERM replica $who, restarted" "(leader: $leader)"; kill -TERM "$r" 2>/dev/null || true
        rc=0; wait "$r" 2>/dev/null || rc=$?
        [ "$rc" -eq 0 ] || problem "SIGTERM of replica $who: exit $rc (not a clean shutdown)"
        start_replica "$who"
        [ $leader = yes ] && expect_handover "$h" "SIGTERM of leader $who" ;;
    12|13) h=$(handovers)
       log_fault "SIGSTOP replica $who for longer than the lease (4s), then SIGCONT" "(leader: $leader, epoch $epoch)"
       kill -STOP "$r"
       if [ $leader = yes ]; then
         expect_handover "$h" "freeze of leader $who"
         sleep 1   # the successor publishes; the frozen one still holds what it had in flight
         kill -CONT "$r"
         # The woken deposed leader must notice it lost the Lease and exit 3; restarted as a Deployment would.
         rc=none
         for _ in $(seq 150); do kill -0 "$r" 2>/dev/null || { rc=0; wait "$r" 2>/dev/null || rc=$?; break; }; sleep 0.1; done
         if [ "$rc" = 3 ]; then deposed_woke=$((deposed_woke + 1)); start_replica "$who"
         elif [ "$rc" = none ]; then problem "woken deposed leader $who did not exit in 15 s"; kill -KILL "$r"; wait "$r" 2>/dev/null || true; start_replica "$who"
         else problem "woken deposed leader $who exited with $rc, not 3"; start_replica "$who"; fi
       else
         sleep 6; kill -CONT "$r"
       fi ;;
    14) log_fault "nats-server frozen (SIGSTOP) for 2s"; kill -STOP "$nats_pid"; sleep 2; kill -CONT "$nats_pid" ;;
    15) log_fault "nats-server restarted"; kill -TERM "$nats_pid"; wait "$nats_pid" 2>/dev/null || true; sleep "0.$((RANDOM % 10))"; start_nats ;;
    16) log_fault "tansu frozen (SIGSTOP) for 2s"; kill -STOP "$tansu_pid"; sleep 2; kill -CONT "$tansu_pid" ;;
    17) log_fault "re-create names with a new uid:" "$(kube recreate)"; recreated=$((recreated + 1)) ;;
    18) log_fault "update a ConfigMap and a Secret:" "$(kube update)" ;;
  esac
  sleep "$((RANDOM % 3)).$((RANDOM % 10))"
  if [ $((RANDOM % 4)) -eq 0 ]; then admin "delay?ms=0"; [ "$delay_on" = 1 ] && { delay_on=0; api_fault_at=$(date +%s); }; fi
done
reap

echo "== faults stop ($faults injected); churn stops; waiting for the stream to agree with the cluster"
admin clear-faults
api_fault_at=$(date +%s) delay_on=0
admin "churn?rate=0"
# At least one re-creation, whatever the schedule drew.
[ "$recreated" -gt 0 ] || { log_fault "re-create names with a new uid:" "$(kube recreate)"; recreated=1; }
sleep 1
reap
fold() {
  "$BIN" --config "$dir/kubesink.toml" fold "$@" --against-cluster --compare-resource-version
}
# The plants, after the run, into what the oracles read.
plant_nats() {  # $1 lost-update | zombie
  "$PY" - "$nats_url" "$1" <<'PY' || fail "planting $1 failed"
import asyncio, json, sys
import nats
async def main(url, what):
    nc = await nats.connect(url); js = nc.jetstream()
    last = (await js.stream_info("CHAOS")).state.last_seq
    sub = await js.subscribe(">", stream="CHAOS", ordered_consumer=True)
    msgs, seq = [], 0
    while seq < last:
        m = await sub.next_msg(timeout=10); seq = m.metadata.sequence.stream
        msgs.append((seq, m.subject, json.loads(m.data)))
    top_epoch = max(d.get("leaderEpoch", 0) for _, _, d in msgs)
    by_key = {}
    for seq, subj, d in msgs:
        if d["op"] != "synced": by_key.setdefault(d["key"], []).append((seq, subj, d))
    for key, ms in by_key.items():
        ups = [x for x in ms if x[2]["op"] == "updated"]
        if ms[-1][2]["op"] == "deleted" or len(ups) < 2: continue
        seq, subj, d = ups[0]
        if what == "lost-update":   # a stale copy carrying the key's latest epoch: the final state goes back
            d["leaderEpoch"] = ms[-1][2].get("leaderEpoch", 0)
        else:                       # a deposed leader's late write, several hand-overs late
            if top_epoch < 2: sys.exit(f"zombie plant needs 2 hand-overs, the run had epochs up to {top_epoch}")
            d["leaderEpoch"] = min(d.get("leaderEpoch", 0), top_epoch - 2)
            if d["leaderEpoch"] >= ms[-1][2].get("leaderEpoch", 0): continue
        await js.publish(subj, json.dumps(d).encode())
        print(f"PLANT {what}: published to {subj} a copy of stream seq {seq} ({key}, rv {d['resourceVersion']}, leaderEpoch {d['leaderEpoch']}; "
              f"the key's last message has rv {ms[-1][2]['resourceVersion']}, leaderEpoch {ms[-1][2].get('leaderEpoch')})")
        break
    else:
        sys.exit("no key to plant into")
    await nc.close()
asyncio.run(main(sys.argv[1], sys.argv[2]))
PY
}
# Oracle 1 for each destination, until both agree (delivery may still be catching up).
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
case "$plant" in
  lost-update|zombie)
    plant_nats "$plant" | tee -a "$dir/plant.log"
    set +e; fold --nats "$nats_url" --stream CHAOS >"$dir/fold-nats.jsonl" 2>"$dir/fold-nats.log"; rc=$?; set -e
    [ $rc -eq 0 ] || agreed_nats="" ;;
esac
for d in nats kafka; do grep -h "DRIFT\|agree\|deposed" "$dir/fold-$d.log" | tail -2 | sed "s/^/  fold ($d): /" || true; done

# Oracles 2 and 3 read every message each destination holds.
drop=(); [ "$plant" = lost-update ] && drop=(--drop-update)
set +e
"$PY" scripts/chaos_check.py --server "$server" --expect-recreated nats "$nats_url" CHAOS >"$dir/order-nats.log" 2>&1
order_nats=$?
"$PY" scripts/chaos_check.py --server "$server" --expect-recreated "${drop[@]}" kafka "$kafka" chaos >"$dir/order-kafka.log" 2>&1
order_kafka=$?
set -e
sed 's/^/  /' "$dir/order-nats.log" "$dir/order-kafka.log"

# Non-vacuity: every simulator fault scheduled took effect; every leader stopped was replaced.
stats >"$dir/stats.json"
for k in "${!scheduled[@]}"; do printf '%s\t%s\t%s\n' "$k" "${scheduled[$k]}" "${fault_of[$k]}"; done >"$dir/scheduled.tsv"
"$PY" - "$dir/stats.json" "$dir/scheduled.tsv" >"$dir/effects.log" <<'PY' || true
import json, sys
st = json.load(open(sys.argv[1])); eff = st.get("faultEffects", {})
pods = st["requestCounts"]["byResource"].get("pods", {})
print(f"server: pod lists {pods.get('lists', 0)} (pages; initial lists and relists), pod watches {pods.get('watches', 0)}")
bad = 0
for line in open(sys.argv[2]):
    k, n, what = line.rstrip("\n").split("\t")
    print(f"  {k}: scheduled {n}, took effect {eff.get(k, 0)}")
    if eff.get(k, 0) == 0:
        print(f"  PROBLEM: fault \"{what}\" scheduled {n} times never took effect (faultEffects.{k} = 0)"); bad = 1
sys.exit(bad)
PY
sed 's/^/  /' "$dir/effects.log"
grep -h PROBLEM "$dir/effects.log" | sed 's/^ *PROBLEM: //' >>"$dir/problems.log" || true
got_handovers=$(( $(handovers) - 1 ))
echo "  hand-overs: $got_handovers seen (\"became the leader\" after the first), $expected_handovers expected from the leaders killed, stopped or frozen; woken deposed leaders that exited 3: $deposed_woke"
[ "$got_handovers" -ge "$expected_handovers" ] || echo "fewer hand-overs ($got_handovers) than leader kills and freezes ($expected_handovers)" >>"$dir/problems.log"
# The state store took part: a leader after a hand-over restores what its predecessor saved.
restores=$(cat "$dir"/replica-?.log | grep -c "saved state restored" || true)
echo "  saved state ($state) restored by a new leader: $restores watches"
[ "$got_handovers" -eq 0 ] || [ "$restores" -gt 0 ] || echo "no leader restored the saved state ($state) after $got_handovers hand-overs" >>"$dir/problems.log"
echo "  faults by kind:"; for k in "${!by_kind[@]}"; do echo "    ${by_kind[$k]}  $k"; done | sort -k2
echo "  names re-created with a new uid: $recreated times; crashes: $crashes; leases lost through API faults: $explained_lease_losses, unexplained: $lease_losses"

verdict() {  # $1 agreed, $2 fold file
  if [ -n "$1" ]; then echo agrees; else echo "DIFFERS ($(grep -c '"drift"' "$2" 2>/dev/null || true) drifts)"; fi
}
ok() { [ "$1" -eq 0 ] && echo ok || echo VIOLATED; }
nprob=$(wc -l <"$dir/problems.log")
echo "== chaos: seed $seed, state in $state, $faults faults in ${seconds}s${plant:+, plant $plant}; NATS fold: $(verdict "$agreed_nats" "$dir/fold-nats.jsonl"), order, uid and exact state: $(ok $order_nats); Kafka fold: $(verdict "$agreed_kafka" "$dir/fold-kafka.jsonl"), order, uid and exact state: $(ok $order_kafka); campaign problems: $nprob"
if [ -z "$agreed_nats" ] || [ -z "$agreed_kafka" ] || [ "$order_nats" -ne 0 ] || [ "$order_kafka" -ne 0 ] || [ "$nprob" -gt 0 ]; then
  [ "$nprob" -gt 0 ] && { echo "campaign problems:"; sed 's/^/  /' "$dir/problems.log"; }
  echo "schedule:"; cat "$dir/schedule.log"
  for d in nats kafka; do echo "drift ($d):"; head -20 "$dir/fold-$d.jsonl"; done
  # The evidence for each drifting key: its messages and its kind's sync markers as held.
  for d in nats kafka; do
    mapfile -t keys < <(grep -o '"key":"[^"]*"' "$dir/fold-$d.jsonl" 2>/dev/null | head -5 | cut -d'"' -f4)
    [ ${#keys[@]} -gt 0 ] || continue
    show=(); for k in "${keys[@]}"; do show+=(--show "$k"); done
    echo "messages of the drifting keys ($d):"
    if [ $d = nats ]; then where=("$nats_url" CHAOS); else where=("$kafka" chaos); fi
    "$PY" scripts/chaos_check.py --server "$server" "${show[@]}" $d "${where[@]}" 2>&1 | tail -80 || true
  done
  for w in a b; do echo "replica $w, last log lines:"; tail -15 "$dir/replica-$w.log"; done
  exit 1
fi
