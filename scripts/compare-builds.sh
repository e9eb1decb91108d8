#!/usr/bin/env bash
# Two kubesink builds, one simulated cluster, the same configuration: do they say the same?
# For refactors that must change no message, metric or log line.
#
#   scripts/compare-builds.sh OLD_KUBESINK NEW_KUBESINK [SECONDS]
#
# e.g. `git worktree add /tmp/old HEAD~5 && (cd /tmp/old && cargo build --bin kubesink)`, then
# `scripts/compare-builds.sh /tmp/old/target/debug/kubesink target/debug/kubesink`.
#
# Both run at once against one kubesink-sim (so both see the same objects, uids and
# resourceVersions; churn runs between their initial syncs and the end), with five resources
# in every payload mode, sync markers, a JSON and a CloudEvents sink, a file state store and
# the HTTP server. Then it compares:
# - the messages: per key and sink, the same sequence, byte for byte once `observedAt`/`time`
#   are masked (the order across keys depends on task scheduling);
# - the `kubesink check` output for every configuration under fuzz/corpus/config_toml and
#   config/ (problems, their order and wording, the resolved configuration);
# - the log lines, as a sorted multiset with durations masked;
# - /metrics (every series name and HELP/TYPE line), /readyz and /healthz (keys and shapes).
# Exit 0 when all agree; otherwise the differences are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$(realpath "$1"); NEW=$(realpath "$2"); SECONDS_RUN=${3:-20}
SIM=${SIM:-target/debug/kubesink-sim}
[ -x "$SIM" ] || cargo build -q -p kubesink-sim
WORK=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fail=0

echo "== kubesink check, every corpus configuration"
for f in fuzz/corpus/config_toml/*.toml config/*.toml; do
  a=$(cd "$WORK" && "$OLD" check --config "$OLDPWD/$f" 2>&1; echo "exit $?")
  b=$(cd "$WORK" && "$NEW" check --config "$OLDPWD/$f" 2>&1; echo "exit $?")
  if [ "$a" != "$b" ]; then echo "DIFFERS: $f"; diff <(echo "$a") <(echo "$b") | head -20; fail=1; fi
done

echo "== one simulator, both builds, ${SECONDS_RUN}s"
sim_port=$(free_port)
"$SIM" --listen "127.0.0.1:$sim_port" --kubeconfig "$WORK/kc" --pods 600 --deployments 30 --nodes 6 \
  --services 12 --configmaps 40 --namespaces 3 --churn 0 --seed 3 > "$WORK/sim.log" 2>&1 &
for _ in $(seq 100); do [ -s "$WORK/kc" ] && break; sleep 0.1; done
for b in old new; do
  port=$(free_port); echo "$port" > "$WORK/port.$b"
  cat > "$WORK/cfg.$b.toml" <<TOML
[cluster]
name = "cmp"
kubeconfig = "$WORK/kc"
[pipeline]
sync_markers = true
[server]
listen = "127.0.0.1:$port"
[state]
backend = "file"
path = "$WORK/state.$b"
[[resources]]
api_version = "v1"
kind = "Pod"
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
payload = "metadata"
[[resources]]
api_version = "v1"
kind = "Node"
payload = "fields"
fields = ["/metadata/name", "/status/conditions"]
[[resources]]
api_version = "v1"
kind = "Service"
[[resources]]
api_version = "v1"
kind = "ConfigMap"
namespaces = ["ns-1", "ns-2"]
[[sinks]]
type = "stdout"
[[sinks]]
type = "stdout"
name = "ce"
format = "cloudevents-structured"
TOML
  bin=$OLD; [ $b = new ] && bin=$NEW
  "$bin" run --config "$WORK/cfg.$b.toml" > "$WORK/out.$b" 2> "$WORK/err.$b" &
  echo $! > "$WORK/pid.$b"
done
# Churn starts once both have synced (so both list the same resourceVersion), and stops before
# they do, so that both deliver every change before the comparison.
for b in old new; do
  for _ in $(seq 300); do
    curl -sf "127.0.0.1:$(cat "$WORK/port.$b")/readyz" > /dev/null && break; sleep 0.1
  done
done
curl -sf -X POST "127.0.0.1:$sim_port/_sim/churn?rate=15&seed=3" > /dev/null
sleep "$SECONDS_RUN"
curl -sf -X POST "127.0.0.1:$sim_port/_sim/churn?rate=0" > /dev/null
sleep 2
for b in old new; do
  port=$(cat "$WORK/port.$b")
  curl -sf "127.0.0.1:$port/metrics" > "$WORK/metrics.$b" || true
  curl -s "127.0.0.1:$port/readyz" > "$WORK/readyz.$b" || true
  curl -s "127.0.0.1:$port/healthz" > "$WORK/healthz.$b" || true
done
kill -INT "$(cat "$WORK/pid.old")" "$(cat "$WORK/pid.new")"
wait "$(cat "$WORK/pid.old")" "$(cat "$WORK/pid.new")" || true

python3 - "$WORK" <<'PY' || fail=1
import json, re, sys
from collections import defaultdict
w = sys.argv[1]
def streams(b):
    per = defaultdict(list)
    for line in open(f"{w}/out.{b}"):
        d = json.loads(line)
        sink = "ce" if "specversion" in d else "json"
        key = (d.get("data", d).get("key"), sink)
        per[key].append(re.sub(r'"(observedAt|time)":"[^"]*"', '"T":""', line))
    return per
old, new = streams("old"), streams("new")
n = sum(len(v) for v in new.values())
if old != new:
    bad = [k for k in set(old) | set(new) if old.get(k) != new.get(k)]
    print(f"DIFFERS: messages of {len(bad)} of {len(set(old) | set(new))} key streams, e.g. {bad[:3]}")
    sys.exit(1)
print(f"messages: {n} in {len(new)} key streams, the same bytes per stream")
def shape(x):
    if isinstance(x, dict): return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list): return [shape(x[0])] if x else []
    return type(x).__name__
for ep in ("readyz", "healthz"):
    a, b = (shape(json.load(open(f"{w}/{ep}.{s}"))) for s in ("old", "new"))
    if a != b:
        print(f"DIFFERS: /{ep} shape"); sys.exit(1)
def series(b):
    return sorted({re.split(r"[ {]", l)[0] for l in open(f"{w}/metrics.{b}") if not l.startswith("#")} |
                  {l.strip() for l in open(f"{w}/metrics.{b}") if l.startswith("# HELP") or l.startswith("# TYPE")})
a, b = series("old"), series("new")
if a != b:
    print("DIFFERS: /metrics", sorted(set(a) ^ set(b))[:10]); sys.exit(1)
print(f"/metrics: the same {len(b)} names and HELP/TYPE lines; /readyz and /healthz: the same shape")
def logs(b):
    out = []
    for l in open(f"{w}/err.{b}"):
        l = re.sub(r"^\S+\s+", "", l.rstrip())
        l = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", l)
        l = re.sub(r"\d+(\.\d+)?(ns|µs|us|ms|s|m)\b", "", l).replace(f"state.{b}", "state")
        out.append(l)
    return sorted(out)
if logs("old") != logs("new"):
    import difflib
    print("DIFFERS: log lines"); print("\n".join(list(difflib.unified_diff(logs("old"), logs("new"), lineterm=""))[:20])); sys.exit(1)
print(f"logs: the same {len(logs('new'))} lines (durations masked)")
PY
[ $fail = 0 ] && echo "== the two builds agree"
exit $fail
