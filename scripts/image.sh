#!/usr/bin/env bash
# The release image and chart, built, published to a registry and fetched back without Docker
# (README, "Deploy"; scripts/test.sh runs it, and it runs alone too):
#   1. the release binary, `cargo build --release --locked -p kubesink` with the features
#      deploy/image.env names (the Dockerfile's too);
#   2. a minimal Debian root: the binary, exactly the shared libraries `ldd` names for it
#      (copied from this machine, which must be the Debian release deploy/image.env names),
#      the CA bundle, and a passwd/group entry for the non-root user; one layer tar with every
#      timestamp the commit's and every owner root, so the same binary gives the same digest;
#   3. an OCI image of that layer, assembled with go-containerregistry's crane (built once from
#      the Go module proxy into $TOOLS_CACHE_DIR/crane): user, workdir, entrypoint, cmd, port
#      and org.opencontainers.image.* labels from deploy/image.env, version from Cargo.toml,
#      revision and created from the commit;
#   4. pushed to a real registry on loopback (`crane registry serve`, a free port, in memory,
#      stopped at the end), pulled back by digest (an OCI layout) and the digests compared:
#      manifest, and the layer's diff_id against the tar built in 2; the pulled config checked
#      against deploy/image.env; the filesystem exported (crane export) into an unpacked root;
#   5. what is inside run as the image's user: `chroot --userspec=65532:65532 ROOT
#      /usr/local/bin/kubesink --version` and `kubesink check` of deploy/base's configuration
#      (chroot needs root; tests/real_image.rs runs `kubesink run` in that root against a real
#      kube-apiserver);
#   6. the Helm chart packaged with appVersion = the image's tag and the image pinned to the
#      pushed digest, pushed to the same registry as an OCI artifact and pulled back with Helm's
#      engine (scripts/helm_checks.py oci, PyPI helm-python-sdk from the deploy checks' venv);
#      tests/real_image.rs installs the pulled chart into a real API server.
# `--push REPOSITORY` (e.g. registry.example.com/kubesink): once every check passed, the image is
# copied there as REPOSITORY:VERSION, the same digest (crane copy, with your registry login:
# `crane auth login`); the chart is not pushed (the release workflow publishes it).
# Writes everything under $RELEASE_IMAGE_DIR (default ${CARGO_TARGET_DIR:-target}/image): root/
# (the unpacked image), chart/ (the pulled chart) and release.env (IMAGE_REF, IMAGE_DIGEST,
# IMAGE_SIZE, CHART_TGZ, CHART_DIGEST, ...); prints a summary, and that directory last.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_CACHE_DIR="${TOOLS_CACHE_DIR:-$HOME/.cache/kubesink}"
export TOOLS_CACHE_DIR
CRANE_VERSION=v0.22.1
TARGET="${CARGO_TARGET_DIR:-target}"
OUT="${RELEASE_IMAGE_DIR:-$TARGET/image}"
started=$(date +%s)
PUSH_TO=""
case "${1:-}" in
  --push) PUSH_TO="${2:?--push REPOSITORY}" ;;
  "") ;;
  *) echo "usage: scripts/image.sh [--push REPOSITORY]" >&2; exit 2 ;;
esac

# --- the facts (deploy/image.env: KEY=VALUE, the value the rest of the line) ------------------
while IFS= read -r line; do
  case "$line" in '' | '#'*) continue ;; esac
  key="${line%%=*}"
  [[ "$key" =~ ^IMAGE_[A-Z_]+$ ]] || { echo "error: deploy/image.env: bad line: $line" >&2; exit 1; }
  printf -v "$key" '%s' "${line#*=}"
done < deploy/image.env
# shellcheck disable=SC1091 # /etc/os-release is the machine's
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
if [ "$codename" != "$IMAGE_DEBIAN_RELEASE" ]; then
  echo "error: the image takes its shared libraries from this machine, which is '$codename'," >&2
  echo "       not Debian $IMAGE_DEBIAN_RELEASE (deploy/image.env); build with the Dockerfile there" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: running the image's binary as its user needs chroot, so root (or CAP_SYS_CHROOT)" >&2
  exit 1
fi
arch="$(dpkg --print-architecture)" # amd64, arm64: the OCI architecture names

# --- tools -------------------------------------------------------------------------------------
CRANE="$TOOLS_CACHE_DIR/crane/bin/crane"
if [ "$("$CRANE" version 2>/dev/null)" != "$CRANE_VERSION" ]; then
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  fi
  echo "== building crane $CRANE_VERSION (go-containerregistry) into $TOOLS_CACHE_DIR/crane" >&2
  GOBIN="$TOOLS_CACHE_DIR/crane/bin" go install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
fi
PY="${DEPLOY_CHECKS_PYTHON:-}"
[ -x "$PY" ] || PY="$(scripts/check-deploy.sh --tools | tail -1)"

# --- 1. the release binary ---------------------------------------------------------------------
echo "== cargo build --release -p kubesink --no-default-features --features $IMAGE_FEATURES" >&2
build_started=$(date +%s)
cargo build --release --locked -p kubesink --no-default-features --features "$IMAGE_FEATURES"
build_seconds=$(( $(date +%s) - build_started ))
BIN="$TARGET/release/kubesink"
pkgid="$(cargo pkgid -p kubesink)"
VERSION="${pkgid##*[#@]}"
REVISION="$(git rev-parse HEAD)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || REVISION="$REVISION-dirty"
SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)"
CREATED="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

# --- 2. the root and its layer -----------------------------------------------------------------
rm -rf "$OUT" && mkdir -p "$OUT"
WORK="$(mktemp -d)"
registry_pid=""
cleanup() {
  [ -z "$registry_pid" ] || kill "$registry_pid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
build="$WORK/build-root"
mkdir -p "$build"
install -D -m 0755 "$BIN" "$build$IMAGE_BINARY"
# `ldd` lines: `libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x…)`, the loader as
# `/lib64/ld-linux-x86-64.so.2 (0x…)`, the vDSO without a path (the kernel's: skipped).
if ldd "$BIN" | grep -q 'not found'; then
  echo "error: ldd $BIN: $(ldd "$BIN" | grep 'not found')" >&2
  exit 1
fi
libs="$(ldd "$BIN" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)"
for lib in $libs; do
  # The file itself under the path ldd names (symlinks followed): /lib is /usr/lib's symlink
  # on this machine, a directory in the image; the loader finds it by that path either way.
  mkdir -p "$build$(dirname "$lib")"
  cp -L "$lib" "$build$lib"
  chmod 0755 "$build$lib"
done
install -D -m 0644 "$IMAGE_CA_BUNDLE" "$build$IMAGE_CA_BUNDLE"
uid="${IMAGE_USER%%:*}" gid="${IMAGE_USER##*:}"
printf '%s:x:%s:%s:%s:/nonexistent:/sbin/nologin\n' "$IMAGE_USER_NAME" "$uid" "$gid" "$IMAGE_USER_NAME" > "$build/etc/passwd"
printf '%s:x:%s:\n' "$IMAGE_USER_NAME" "$gid" > "$build/etc/group"
chmod 0644 "$build/etc/passwd" "$build/etc/group"
find "$build" -type d -exec chmod 0755 {} +
# Reproducible: sorted names, the commit's time on every entry, root's numeric ownership, no
# atime/ctime in the pax headers.
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --format=pax \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$build" -cf "$WORK/layer.tar" .
layer_diff_id="sha256:$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1)"

# --- 3, 4. the image in a registry on loopback, pulled back ------------------------------------
"$CRANE" registry serve --address 127.0.0.1:0 > "$WORK/registry.log" 2>&1 &
registry_pid=$!
port=""
for _ in $(seq 100); do
  port="$(sed -n 's/.*serving on port \([0-9][0-9]*\).*/\1/p' "$WORK/registry.log")"
  [ -n "$port" ] && break
  kill -0 "$registry_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { echo "error: crane registry serve did not start: $(cat "$WORK/registry.log")" >&2; exit 1; }
REGISTRY="127.0.0.1:$port"
REPO="$REGISTRY/kubesink"
"$CRANE" append --oci-empty-base --new_layer "$WORK/layer.tar" --new_tag "$REPO:unconfigured" >/dev/null 2>"$WORK/crane.log" \
  || { cat "$WORK/crane.log" >&2; exit 1; }
# The Debian image's PATH, which the Dockerfile's images inherit.
"$CRANE" mutate "$REPO:unconfigured" --tag "$REPO:$VERSION" --set-platform "linux/$arch" \
  --user "$IMAGE_USER" --workdir "$IMAGE_WORKDIR" --entrypoint "$IMAGE_ENTRYPOINT" --cmd "$IMAGE_CMD" \
  --exposed-ports "$IMAGE_PORT/tcp" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label "org.opencontainers.image.title=$IMAGE_TITLE" \
  --label "org.opencontainers.image.description=$IMAGE_DESCRIPTION" \
  --label "org.opencontainers.image.source=$IMAGE_SOURCE" \
  --label "org.opencontainers.image.licenses=$IMAGE_LICENSES" \
  --label "org.opencontainers.image.version=$VERSION" \
  --label "org.opencontainers.image.revision=$REVISION" \
  --label "org.opencontainers.image.created=$CREATED" >/dev/null 2>"$WORK/crane.log" \
  || { cat "$WORK/crane.log" >&2; exit 1; }
"$CRANE" delete "$REPO@$("$CRANE" digest "$REPO:unconfigured")" # only the release tag remains
DIGEST="$("$CRANE" digest "$REPO:$VERSION")"
echo "ok   pushed $REPO:$VERSION ($DIGEST)"

"$CRANE" pull --format=oci "$REPO@$DIGEST" "$WORK/pulled"
pulled="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$WORK/pulled/index.json")"
[ "$pulled" = "$DIGEST" ] || { echo "error: pulled manifest $pulled, pushed $DIGEST" >&2; exit 1; }
"$CRANE" config "$REPO@$DIGEST" > "$WORK/config.json"
"$CRANE" manifest "$REPO@$DIGEST" > "$WORK/manifest.json"
# The pulled configuration is what deploy/image.env says, and its one layer is the tar above.
python3 - "$WORK/config.json" deploy/image.env "$layer_diff_id" "$VERSION" "$REVISION" "$CREATED" "linux/$arch" <<'EOF'
import json, sys
config_path, facts_path, diff_id, version, revision, created, platform = sys.argv[1:]
config = json.load(open(config_path))
facts = {}
for line in open(facts_path):
    line = line.strip()
    if line and not line.startswith("#"):
        k, _, v = line.partition("=")
        facts[k] = v
c = config["config"]
want = {
    "User": facts["IMAGE_USER"], "WorkingDir": facts["IMAGE_WORKDIR"],
    "Entrypoint": [facts["IMAGE_ENTRYPOINT"]], "Cmd": [facts["IMAGE_CMD"]],
    "ExposedPorts": {f"{facts['IMAGE_PORT']}/tcp": {}},
    "Labels": {f"org.opencontainers.image.{k}": v for k, v in {
        "title": facts["IMAGE_TITLE"], "description": facts["IMAGE_DESCRIPTION"],
        "source": facts["IMAGE_SOURCE"], "licenses": facts["IMAGE_LICENSES"],
        "version": version, "revision": revision, "created": created}.items()},
}
problems = [f"{k}: {c.get(k)!r}, expected {v!r}" for k, v in want.items() if c.get(k) != v]
if config["rootfs"]["diff_ids"] != [diff_id]:
    problems.append(f"layers {config['rootfs']['diff_ids']}, expected the one built: {diff_id}")
if f"{config['os']}/{config['architecture']}" != platform:
    problems.append(f"platform {config['os']}/{config['architecture']}, expected {platform}")
for p in problems:
    print(f"FAIL the pulled image's configuration: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
echo "ok   pulled $REPO@$DIGEST back: same manifest digest, its layer the one built, its configuration deploy/image.env's"
mkdir -p "$OUT/root"
"$CRANE" export "$REPO@$DIGEST" - | tar -x -C "$OUT/root"
size="$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["config"]["size"] + sum(l["size"] for l in m["layers"]))' "$WORK/manifest.json")"
unpacked="$(du -sb "$OUT/root" | cut -f1)"

# --- 5. run what is inside, as the image's user ------------------------------------------------
as_image_user=("$(command -v chroot)" --userspec="$IMAGE_USER" "$OUT/root")
version_line="$(env -i "${as_image_user[@]}" "$IMAGE_BINARY" --version)"
[ "$version_line" = "kubesink $VERSION" ] || { echo "error: kubesink --version in the image: $version_line" >&2; exit 1; }
echo "ok   chroot --userspec=$IMAGE_USER: $version_line"
sed 's/CHANGE-ME/image-check/g' deploy/base/kubesink.toml > "$OUT/root/kubesink-check.toml"
if env -i "${as_image_user[@]}" "$IMAGE_BINARY" check --config /kubesink-check.toml > "$WORK/check.out" 2>&1; then
  echo "ok   chroot --userspec=$IMAGE_USER: kubesink check --config (deploy/base/kubesink.toml) passes"
else
  echo "error: kubesink check in the image: $(cat "$WORK/check.out")" >&2
  exit 1
fi
rm -f "$OUT/root/kubesink-check.toml"

# --- 6. the chart, pinned to the image, through the same registry ------------------------------
"$PY" scripts/helm_checks.py oci "$REGISTRY" "$REPO" "$VERSION" "$DIGEST" "$OUT/chart" > "$WORK/chart.out" \
  || { cat "$WORK/chart.out" >&2; exit 1; }
grep -v '^CHART_' "$WORK/chart.out"
chart_version="$(sed -n 's/^CHART_VERSION=//p' "$WORK/chart.out")"
# What Helm pushed is a chart by the OCI conventions Helm defines: its media types.
"$CRANE" manifest "$REGISTRY/charts/kubesink:$chart_version" | python3 -c '
import json, sys
m = json.load(sys.stdin)
want = ("application/vnd.cncf.helm.config.v1+json", ["application/vnd.cncf.helm.chart.content.v1.tar+gzip"])
got = (m["config"]["mediaType"], [l["mediaType"] for l in m["layers"]])
if got != want:
    sys.exit(f"error: the chart artifact has media types {got}, not Helm'"'"'s {want}")
print(f"ok   the chart artifact has Helm'"'"'s media types: config {got[0]}, content {got[1][0]}")
'

if [ -n "$PUSH_TO" ]; then
  "$CRANE" copy "$REPO@$DIGEST" "$PUSH_TO:$VERSION"
  pushed_digest="$("$CRANE" digest "$PUSH_TO:$VERSION")"
  [ "$pushed_digest" = "$DIGEST" ] || { echo "error: $PUSH_TO:$VERSION is $pushed_digest, not $DIGEST" >&2; exit 1; }
  echo "ok   copied to $PUSH_TO:$VERSION@$DIGEST"
fi

{
  echo "IMAGE_REF=$REPO:$VERSION@$DIGEST"
  echo "IMAGE_DIGEST=$DIGEST"
  echo "IMAGE_VERSION=$VERSION"
  echo "IMAGE_SIZE=$size"
  echo "IMAGE_UNPACKED_SIZE=$unpacked"
  echo "IMAGE_ROOT=$(cd "$OUT/root" && pwd)"
  grep '^CHART_' "$WORK/chart.out"
} > "$OUT/release.env"
echo "image $REPO:$VERSION@$DIGEST: $size bytes compressed (config and layer), $unpacked unpacked; $(echo "$libs" | wc -w) shared libraries from ldd"
echo "release build $build_seconds s; image, registry round trip and chart $(( $(date +%s) - started - build_seconds )) s"
cd "$OUT" && pwd
