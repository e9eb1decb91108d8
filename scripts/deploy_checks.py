#!/usr/bin/env python3
"""Offline checks of kubesink's deploy kit, run by scripts/check-deploy.sh.

Subcommands:
  pss FILE...               every Pod template in the rendered manifests meets the "restricted"
                            Pod Security Standard (each control, below); exit 1 naming the
                            workload, container, control and field otherwise
  pss-self-test             the checker rejects a Pod breaking each control and accepts a good one
  rbac [--ignore-helm-labels] RENDERED EXPECTED...
                            the RBAC objects of each rendered overlay (or chart) equal
                            `kubesink rbac` output (pairs of files)
  compose SCHEMA FILE DOCKERFILE
                            the compose file validates against the Compose Specification JSON
                            schema, and what it names exists (build targets, mounted files,
                            depends_on services)
  dockerfile FILE           the Dockerfile parses (BuildKit's own parser, PyPI `dockerfile`), and
                            its runtime stages run as a numeric non-root user
  image-facts FACTS DOCKERFILE
                            the Dockerfile's runtime stages state the facts of deploy/image.env
                            (user and its passwd entry, workdir, binary path, entrypoint, cmd,
                            port, static OCI labels, features, Debian release), which
                            scripts/image.sh builds the image from without Docker
  flowcontrol FILE...       the API Priority and Fairness objects of each rendered manifest that
                            has any (deploy/components/flowcontrol, the chart's flowControl), on
                            what the OpenAPI schemas cannot say (each rule below); exit 1 if one
                            breaks a rule, or if no file has any
  flowcontrol-self-test     each of those rules rejects an object breaking it; the good set passes
  kubelet-env OUTDIR FILE...
                            for every kubesink container (args `run --config …`) of each rendered
                            manifest, the environment a kubelet would give it, written as
                            OUTDIR/NAME.env (NAME=VALUE lines), with OUTDIR/NAME.toml (the
                            mounted kubesink.toml) and OUTDIR/NAME.args; exit 1 if a Pod
                            template leaves enableServiceLinks on

Needs PyYAML and jsonschema (installed with kubernetes-validate) and `dockerfile`.

The Pod Security Standards, v1.32 and later
(https://kubernetes.io/docs/concepts/security/pod-security-standards/): no real checker
(the Go library k8s.io/pod-security-admission) can be installed here from PyPI, npm or
crates.io, so `pss` implements each Baseline and Restricted control as that page lists them.
"""

import json
import math
import re
import sys

import yaml

# --- Pod Security Standards ------------------------------------------------------------------

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}

def pod_specs(doc):
    """(workload name, pod metadata, pod spec) of a Pod or a Pod-template owner."""
    kind = doc.get("kind")
    name = f"{kind} {doc.get('metadata', {}).get('namespace', '')}/{doc.get('metadata', {}).get('name')}"
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return [(name, doc.get("metadata") or {}, spec)]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"):
        t = spec.get("template") or {}
        return [(name, t.get("metadata") or {}, t.get("spec") or {})]
    if kind == "CronJob":
        t = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}
        return [(name, t.get("metadata") or {}, t.get("spec") or {})]
    return []


def restricted_violations(meta, spec):
    """Every Baseline and Restricted control the Pod breaks, as 'control: field = value'."""
    out = []
    psc = spec.get("securityContext") or {}
    containers = [
        (f"{field}[{c.get('name')}]", c)
        for field in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(field) or []
    ]
    if not containers:
        out.append("no containers")

    # Baseline: HostProcess
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("HostProcess: spec.securityContext.windowsOptions.hostProcess = true")
    # Baseline: Host Namespaces
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(f):
            out.append(f"Host Namespaces: spec.{f} = true")
    # Baseline: HostPath Volumes; Restricted: Volume Types
    for v in spec.get("volumes") or []:
        types = [k for k in v if k != "name"]
        if "hostPath" in types:
            out.append(f"HostPath Volumes: spec.volumes[{v.get('name')}].hostPath")
        for t in types:
            if t not in RESTRICTED_VOLUME_TYPES:
                out.append(f"Volume Types: spec.volumes[{v.get('name')}] is {t}")
    # Baseline: Sysctls
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"Sysctls: spec.securityContext.sysctls {s.get('name')}")
    # Baseline: AppArmor (annotations and fields)
    for k, v in (meta.get("annotations") or {}).items():
        if k.startswith("container.apparmor.security.beta.kubernetes.io/"):
            if not (v == "runtime/default" or v.startswith("localhost/")):
                out.append(f"AppArmor: annotation {k} = {v}")
    def apparmor(sc, where):
        t = (sc.get("appArmorProfile") or {}).get("type")
        if t is not None and t not in ("RuntimeDefault", "Localhost"):
            out.append(f"AppArmor: {where}.appArmorProfile.type = {t}")
    def selinux(sc, where):
        o = sc.get("seLinuxOptions") or {}
        if o.get("type") is not None and o.get("type") not in SELINUX_TYPES:
            out.append(f"SELinux: {where}.seLinuxOptions.type = {o.get('type')}")
        for f in ("user", "role"):
            if o.get(f):
                out.append(f"SELinux: {where}.seLinuxOptions.{f} = {o.get(f)}")
    apparmor(psc, "spec.securityContext")
    selinux(psc, "spec.securityContext")

    # Restricted: Seccomp (pod level, or every container), Running as Non-root (likewise),
    # Running as Non-root user (anywhere).
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"Seccomp: spec.securityContext.seccompProfile.type = {pod_seccomp}")
    if psc.get("runAsUser") == 0:
        out.append("Running as Non-root user: spec.securityContext.runAsUser = 0")
    pod_non_root = psc.get("runAsNonRoot") is True

    for where, c in containers:
        sc = c.get("securityContext") or {}
        w = f"spec.{where}.securityContext"
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"HostProcess: {w}.windowsOptions.hostProcess = true")
        if sc.get("privileged"):
            out.append(f"Privileged Containers: {w}.privileged = true")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"Host Ports: spec.{where}.ports hostPort = {p.get('hostPort')}")
        apparmor(sc, w)
        selinux(sc, w)
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"/proc Mount Type: {w}.procMount = {sc.get('procMount')}")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation: {w}.allowPrivilegeEscalation must be false")
        c_non_root = sc.get("runAsNonRoot")
        if c_non_root is False:
            out.append(f"Running as Non-root: {w}.runAsNonRoot = false")
        elif c_non_root is not True and not pod_non_root:
            out.append(f"Running as Non-root: runAsNonRoot true neither on the Pod nor on {where}")
        if sc.get("runAsUser") == 0:
            out.append(f"Running as Non-root user: {w}.runAsUser = 0")
        c_seccomp = (sc.get("seccompProfile") or {}).get("type")
        if c_seccomp is not None and c_seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"Seccomp: {w}.seccompProfile.type = {c_seccomp}")
        elif c_seccomp is None and pod_seccomp is None:
            out.append(f"Seccomp: seccompProfile neither on the Pod nor on {where}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"Capabilities: {w}.capabilities.drop must include ALL")
        for cap in caps.get("add") or []:
            if cap != "NET_BIND_SERVICE":
                level = "Baseline" if cap not in BASELINE_CAPABILITIES else "Restricted"
                out.append(f"Capabilities ({level}): {w}.capabilities.add {cap}")
    return out


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def report(results, nothing):
    """Prints each checked unit's verdict and returns the exit code: `results` yields
    (violations, what it broke, what held) per unit; none at all fails with `nothing`."""
    checked, failed = 0, 0
    for violations, broke, held in results:
        checked += 1
        if violations:
            failed += 1
            print(f"FAIL {broke}:")
            for x in violations:
                print(f"  - {x}")
        else:
            print(f"ok   {held}")
    if checked == 0:
        print(f"FAIL {nothing}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def cmd_pss(paths):
    def results():
        for path in paths:
            for doc in load_all(path):
                for name, meta, spec in pod_specs(doc):
                    yield (restricted_violations(meta, spec),
                           f"{path}: {name} breaks the restricted Pod Security Standard",
                           f"{path}: {name} meets the restricted Pod Security Standard")
    return report(results(), "no Pod template found to check")


GOOD_POD = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{
        "name": "c",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }],
    "volumes": [{"name": "cfg", "configMap": {"name": "x"}}],
}


def cmd_pss_self_test():
    """Each control must fire on a Pod that breaks it, and only the good Pod passes."""
    import copy

    def broken(edit):
        p = copy.deepcopy(GOOD_POD)
        edit(p)
        return p

    def c0(p):
        return p["containers"][0]["securityContext"]

    cases = {
        "HostProcess": lambda p: c0(p).update(windowsOptions={"hostProcess": True}),
        "Host Namespaces": lambda p: p.update(hostPID=True),
        "Privileged Containers": lambda p: c0(p).update(privileged=True),
        "Capabilities (Baseline)": lambda p: c0(p)["capabilities"].update(add=["SYS_ADMIN"]),
        "Capabilities (Restricted)": lambda p: c0(p)["capabilities"].update(add=["CHOWN"]),
        "Capabilities": lambda p: c0(p)["capabilities"].update(drop=["NET_RAW"]),
        "HostPath Volumes": lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "Volume Types": lambda p: p["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
        "Host Ports": lambda p: p["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]),
        "AppArmor": lambda p: c0(p).update(appArmorProfile={"type": "Unconfined"}),
        "SELinux": lambda p: c0(p).update(seLinuxOptions={"type": "spc_t"}),
        "/proc Mount Type": lambda p: c0(p).update(procMount="Unmasked"),
        "Seccomp": lambda p: p["securityContext"].pop("seccompProfile"),
        "Sysctls": lambda p: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "Privilege Escalation": lambda p: c0(p).pop("allowPrivilegeEscalation"),
        "Running as Non-root": lambda p: p["securityContext"].pop("runAsNonRoot"),
        "Running as Non-root user": lambda p: c0(p).update(runAsUser=0),
    }
    bad = []
    if restricted_violations({}, GOOD_POD):
        bad.append(f"the good Pod fails: {restricted_violations({}, GOOD_POD)}")
    for control, edit in cases.items():
        v = restricted_violations({}, broken(edit))
        if not any(x.split(":")[0] == control for x in v):
            bad.append(f"{control}: not detected (got {v})")
    # An init container is checked like the others.
    p = broken(lambda p: p.update(initContainers=[{"name": "init"}]))
    if not any("initContainers[init]" in x for x in restricted_violations({}, p)):
        bad.append("an init container without a securityContext passes")
    for b in bad:
        print(f"FAIL pss self-test: {b}")
    if not bad:
        print(f"ok   pss self-test: each of {len(cases)} controls detected, the good Pod passes")
    return 1 if bad else 0


# --- RBAC ------------------------------------------------------------------------------------

RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


# Labels the Helm chart puts on every object (Helm's conventions) that `kubesink rbac` does not.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "app.kubernetes.io/component"}


def rbac_objects(path, ignore_helm_labels=False):
    objs = {}
    for d in load_all(path):
        if d.get("kind") in RBAC_KINDS:
            m = d.get("metadata") or {}
            if ignore_helm_labels:
                for k in HELM_LABELS:
                    (m.get("labels") or {}).pop(k, None)
            objs[(d["kind"], m.get("namespace", ""), m.get("name"))] = d
    return objs


def cmd_rbac(pairs, ignore_helm_labels=False):
    """Each (rendered, expected) pair: the same RBAC objects, field for field (with
    --ignore-helm-labels, but for the labels only the Helm chart sets)."""
    ok = True
    for rendered, expected in zip(pairs[::2], pairs[1::2]):
        ok = rbac_pair(rendered, expected, ignore_helm_labels) and ok
    return 0 if ok else 1


def rbac_pair(rendered, expected, ignore_helm_labels=False):
    got = rbac_objects(rendered, ignore_helm_labels)
    want = rbac_objects(expected)
    ok = True
    for key in sorted(set(got) | set(want)):
        label = "{} {}/{}".format(*key)
        if key not in got:
            print(f"FAIL {rendered}: {label} from `kubesink rbac` is missing")
            ok = False
        elif key not in want:
            print(f"FAIL {rendered}: {label} is not in `kubesink rbac` output (least privilege)")
            ok = False
        elif got[key] != want[key]:
            print(f"FAIL {rendered}: {label} differs from `kubesink rbac` output:")
            print("  rendered: " + json.dumps(got[key], sort_keys=True))
            print("  expected: " + json.dumps(want[key], sort_keys=True))
            ok = False
    if ok:
        print(f"ok   {rendered}: {len(got)} RBAC objects equal `kubesink rbac` output")
    return ok


# --- Dockerfile and compose ------------------------------------------------------------------

def dockerfile_stages(path):
    """{stage name: [instructions]} in order, parsed by BuildKit's parser."""
    import dockerfile

    stages, current = {}, None
    for c in dockerfile.parse_file(path):
        if c.cmd == "FROM":
            v = list(c.value)
            current = v[2] if len(v) >= 3 and v[1].upper() == "AS" else f"#{len(stages)}"
            stages[current] = []
        elif current is not None:
            stages[current].append(c)
    return stages


def cmd_dockerfile(path):
    stages = dockerfile_stages(path)
    problems = []
    names = list(stages)
    if not names or names[-1] != "kubesink":
        problems.append(f"the last (default) stage is {names[-1] if names else None}, not kubesink")
    for stage in ("kubesink", "kubesink-sim"):
        if stage not in stages:
            problems.append(f"no stage {stage}")
    # The runtime stages inherit USER from `runtime`; it must be numeric and not 0.
    users = [c.value[0] for c in stages.get("runtime", []) if c.cmd == "USER"]
    if not users or not re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]):
        problems.append(f"stage runtime: USER must be a numeric non-root uid, got {users}")
    for p in problems:
        print(f"FAIL {path}: {p}")
    if not problems:
        print(f"ok   {path}: parses; stages {', '.join(names)}; runtime user {users[-1]}")
    return 1 if problems else 0


def read_image_facts(path):
    """deploy/image.env as {KEY: VALUE}: KEY=VALUE lines, the value the rest of the line."""
    facts = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                facts[key] = value
    return facts


def cmd_image_facts(facts_path, path):
    """The Dockerfile's runtime stages state deploy/image.env's facts (scripts/image.sh builds
    the image from that file without Docker): one runtime layout, two ways to build it."""
    import dockerfile

    facts = read_image_facts(facts_path)
    stages = dockerfile_stages(path)
    global_args = {}
    for c in dockerfile.parse_file(path):
        if c.cmd == "FROM":
            break
        if c.cmd == "ARG":
            key, _, value = c.value[0].partition("=")
            global_args[key] = value

    def unquote(v):
        return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v

    def last(stage, cmd):
        found = [c for c in stages.get(stage, []) if c.cmd == cmd]
        return found[-1] if found else None

    got = {}
    got["IMAGE_DEBIAN_RELEASE"] = global_args.get("DEBIAN_RELEASE")
    features = [c.value[0].partition("=")[2] for c in stages.get("builder", [])
                if c.cmd == "ARG" and c.value[0].startswith("KUBESINK_FEATURES=")]
    got["IMAGE_FEATURES"] = features[-1] if features else None
    user, workdir = last("runtime", "USER"), last("runtime", "WORKDIR")
    got["IMAGE_USER"] = user.value[0] if user else None
    got["IMAGE_WORKDIR"] = workdir.value[0] if workdir else None
    # The passwd/group entry: the name and the ids of IMAGE_USER.
    uid, _, gid = facts.get("IMAGE_USER", "").partition(":")
    runs = " ".join(c.value[0] for c in stages.get("runtime", []) if c.cmd == "RUN")
    names = re.findall(rf"useradd --uid {uid} --gid {gid} .* (\S+)$", runs)
    got["IMAGE_USER_NAME"] = names[0] if names and f"groupadd --gid {gid} {names[0]}" in runs else None
    # Debian's ca-certificates package writes its bundle there (update-ca-certificates).
    if re.search(r"apt-get install .*\bca-certificates\b", runs):
        got["IMAGE_CA_BUNDLE"] = "/etc/ssl/certs/ca-certificates.crt"
    copies = [c for c in stages.get("kubesink", []) if c.cmd == "COPY"]
    got["IMAGE_BINARY"] = copies[-1].value[-1] if copies else None
    expose, entrypoint, cmd = (last("kubesink", k) for k in ("EXPOSE", "ENTRYPOINT", "CMD"))
    got["IMAGE_PORT"] = " ".join(expose.value) if expose else None
    got["IMAGE_ENTRYPOINT"] = " ".join(entrypoint.value) if entrypoint and entrypoint.json else None
    got["IMAGE_CMD"] = " ".join(cmd.value) if cmd and cmd.json else None
    labels = {}
    for c in stages.get("kubesink", []):
        if c.cmd == "LABEL":
            labels.update(zip(c.value[0::2], (unquote(v) for v in c.value[1::2])))
    for key, label in (("IMAGE_TITLE", "title"), ("IMAGE_DESCRIPTION", "description"),
                       ("IMAGE_SOURCE", "source"), ("IMAGE_LICENSES", "licenses")):
        got[key] = labels.get(f"org.opencontainers.image.{label}")
    per_build = {"version": "${VERSION}", "revision": "${REVISION}", "created": "${CREATED}"}
    problems = [f"{key}: the Dockerfile says {got.get(key)!r}, {facts_path} says {facts.get(key)!r}"
                for key in sorted(set(facts) | set(got)) if got.get(key) != facts.get(key)]
    problems += [f"label org.opencontainers.image.{k}: {labels.get(f'org.opencontainers.image.{k}')!r}, not {v}"
                 for k, v in per_build.items() if labels.get(f"org.opencontainers.image.{k}") != v]
    for p in problems:
        print(f"FAIL {path}: {p}")
    if not problems:
        print(f"ok   {path} and {facts_path} state one runtime layout: user {got['IMAGE_USER']}, "
              f"{got['IMAGE_ENTRYPOINT']} {got['IMAGE_CMD']}, port {got['IMAGE_PORT']}, "
              f"{len(labels)} OCI labels, features {got['IMAGE_FEATURES']}")
    return 1 if problems else 0


def cmd_compose(schema_path, path, dockerfile_path):
    import os

    import jsonschema

    with open(schema_path) as f:
        schema = json.load(f)
    with open(path) as f:
        doc = yaml.safe_load(f)
    problems = [
        f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]
    services = doc.get("services") or {}
    stages = dockerfile_stages(dockerfile_path)
    base = os.path.dirname(os.path.abspath(path))
    for name, s in services.items():
        build = s.get("build")
        if isinstance(build, dict) and build.get("target") and build["target"] not in stages:
            problems.append(f"services.{name}.build.target {build['target']} is not a Dockerfile stage")
        deps = s.get("depends_on") or []
        for d in deps if isinstance(deps, list) else deps.keys():
            if d not in services:
                problems.append(f"services.{name}.depends_on {d}: no such service")
        for v in s.get("volumes") or []:
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src.startswith((".", "/")) and not os.path.exists(os.path.join(base, src)):
                problems.append(f"services.{name}.volumes {src}: does not exist")
    for p in problems:
        print(f"FAIL {path}: {p}")
    if not problems:
        print(f"ok   {path}: valid against the Compose Specification schema; {len(services)} services, targets and mounts exist")
    return 1 if problems else 0


# --- API Priority and Fairness ---------------------------------------------------------------
# https://kubernetes.io/docs/concepts/cluster-administration/flow-control/. kubernetes-validate
# checks the types; these are the rules it cannot: the API server's own validation that is not
# in the OpenAPI schemas (shuffle sharding's entropy, handSize <= queues), references between
# the objects and to the Deployment, and the kit's choices (docs/operations.md, "API Priority
# and Fairness").

FLOWCONTROL_API = "flowcontrol.apiserver.k8s.io/v1"
# The API server's own objects (mandatory and suggested): an object of ours by one of these
# names would fight the API server, which keeps them as it wants them.
BUILTIN_LEVELS = {"exempt", "catch-all", "system", "node-high", "leader-election",
                  "workload-high", "workload-low", "global-default"}
BUILTIN_SCHEMAS = {"exempt", "catch-all", "probes", "system-leader-election", "endpoint-controller",
                   "workload-leader-election", "system-node-high", "system-nodes",
                   "kube-controller-manager", "kube-scheduler", "kube-system-service-accounts",
                   "service-accounts", "global-default"}
# A schema of ours may send requests to a level rendered beside it, or to the API server's
# suggested leader-election level (kubesink's Lease).
REFERABLE_BUILTIN_LEVELS = {"leader-election"}
# After the API server's own schemas (1 to 900), before service-accounts (9000), which matches
# every service account and would take kubesink's requests first. The chart keeps kubesink's
# schema at 1001-8999, so its Lease schema, one below, is 1000 at the least.
PRECEDENCE_RANGE = (1000, 8999)
MAX_HASH_BITS = 60  # k8s.io/apiserver shufflesharding.MaxHashBits


def _covers(outer, inner):
    """Does a list of names with "*" as everything hold every name of `inner`?"""
    outer, inner = set(outer or []), set(inner or [])
    return "*" in outer or ("*" not in inner and inner <= outer)


def _url_covers(outer, inner):
    """Non-resource URL patterns: "*", "/prefix/*" or exact."""
    def one(o, i):
        return o == "*" or o == i or (o.endswith("/*") and i.startswith(o[:-1]) and i != o)
    return all(any(one(o, i) for o in outer or []) for i in inner or [])


def _resource_rule_covers(a, b):
    return (_covers(a.get("verbs"), b.get("verbs")) and _covers(a.get("apiGroups"), b.get("apiGroups"))
            and _covers(a.get("resources"), b.get("resources"))
            and (a.get("clusterScope") or not b.get("clusterScope"))
            and _covers(a.get("namespaces"), b.get("namespaces")))


def _schema_covers(a, b):
    """Does FlowSchema a match every request FlowSchema b matches (rule by rule, so it may miss
    a cover by several rules together, never claim a false one)?"""
    def key(subject):
        return json.dumps(subject, sort_keys=True)
    for rb in b["spec"].get("rules") or []:
        subjects = {key(x) for x in rb.get("subjects") or []}
        covering = [ra for ra in a["spec"].get("rules") or []
                    if subjects <= {key(x) for x in ra.get("subjects") or []}]
        for r in rb.get("resourceRules") or []:
            if not any(_resource_rule_covers(c, r) for ra in covering for c in ra.get("resourceRules") or []):
                return False
        for r in rb.get("nonResourceRules") or []:
            if not any(_covers(c.get("verbs"), r.get("verbs")) and _url_covers(c.get("nonResourceURLs"), r.get("nonResourceURLs"))
                       for ra in covering for c in ra.get("nonResourceRules") or []):
                return False
    return True


def flowcontrol_violations(docs):
    """Every rule the FlowSchemas and PriorityLevelConfigurations of one rendered manifest
    break, as 'rule: object: what'."""
    out = []
    levels = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "PriorityLevelConfiguration"}
    schemas = [d for d in docs if d.get("kind") == "FlowSchema"]
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    for d in list(levels.values()) + schemas:
        label = f"{d['kind']} {d['metadata']['name']}"
        if d.get("apiVersion") != FLOWCONTROL_API:
            out.append(f"API version: {label} is {d.get('apiVersion')}, the kit targets {FLOWCONTROL_API}")
        if d["metadata"]["name"] in (BUILTIN_LEVELS if d["kind"] == "PriorityLevelConfiguration" else BUILTIN_SCHEMAS):
            out.append(f"Built-in name: {label} is one of the API server's own objects")

    for name, d in levels.items():
        label = f"PriorityLevelConfiguration {name}"
        spec = d.get("spec") or {}
        lim = spec.get("limited") or {}
        if spec.get("type") != "Limited":
            out.append(f"Limited: {label} spec.type is {spec.get('type')}")
        if (lim.get("nominalConcurrencyShares") or 0) < 1:
            out.append(f"Shares: {label} nominalConcurrencyShares {lim.get('nominalConcurrencyShares')} < 1 leaves it only borrowed seats")
        if not 0 <= (lim.get("lendablePercent") or 0) <= 100:
            out.append(f"Lendable: {label} lendablePercent {lim.get('lendablePercent')} is not 0-100")
        if lim.get("borrowingLimitPercent") is not None and lim["borrowingLimitPercent"] < 0:
            out.append(f"Borrowing: {label} borrowingLimitPercent {lim['borrowingLimitPercent']} < 0")
        resp = lim.get("limitResponse") or {}
        if resp.get("type") != "Queue":
            out.append(f"Queue: {label} limitResponse.type is {resp.get('type')}: kubesink's requests must wait, not be rejected")
        q = resp.get("queuing") or {}
        queues, hand, length = q.get("queues") or 0, q.get("handSize") or 0, q.get("queueLengthLimit") or 0
        if queues < 1 or hand < 1 or length < 1:
            out.append(f"Queue sizes: {label} queues {queues}, handSize {hand}, queueLengthLimit {length} must be positive")
        elif hand > queues:
            out.append(f"Hand size: {label} handSize {hand} > queues {queues}")
        elif math.ceil(math.log2(queues) * hand) > MAX_HASH_BITS:
            out.append(f"Entropy: {label} handSize {hand} x log2(queues {queues}) > {MAX_HASH_BITS} bits (the API server rejects it)")
        if not any((s["spec"].get("priorityLevelConfiguration") or {}).get("name") == name for s in schemas):
            out.append(f"Unused level: {label} takes a share of the API server's concurrency, and no FlowSchema sends requests to it")

    accounts = set()
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        accounts.add((pod.get("serviceAccountName") or "default", dep["metadata"].get("namespace", "default")))
    for s in schemas:
        label = f"FlowSchema {s['metadata']['name']}"
        spec = s.get("spec") or {}
        level = (spec.get("priorityLevelConfiguration") or {}).get("name")
        if level not in levels and level not in REFERABLE_BUILTIN_LEVELS:
            out.append(f"Level: {label} refers to the priority level {level}, which is neither rendered nor the API server's {'/'.join(sorted(REFERABLE_BUILTIN_LEVELS))}")
        p = spec.get("matchingPrecedence")
        if not isinstance(p, int) or not PRECEDENCE_RANGE[0] <= p <= PRECEDENCE_RANGE[1]:
            out.append(f"Precedence: {label} matchingPrecedence {p} is outside {PRECEDENCE_RANGE[0]}-{PRECEDENCE_RANGE[1]} "
                       "(after the API server's own schemas, before service-accounts at 9000)")
        if (spec.get("distinguisherMethod") or {}).get("type") not in ("ByUser", "ByNamespace"):
            out.append(f"Distinguisher: {label} distinguisherMethod {spec.get('distinguisherMethod')} is neither ByUser nor ByNamespace")
        if not spec.get("rules"):
            out.append(f"Subject: {label} has no rules")
        for r in spec.get("rules") or []:
            for subj in r.get("subjects") or [{}]:
                sa = subj.get("serviceAccount") or {}
                who = (sa.get("name"), sa.get("namespace"))
                if subj.get("kind") != "ServiceAccount" or who not in accounts:
                    out.append(f"Subject: {label} subject {json.dumps(subj, sort_keys=True)} is not the Deployment's service account "
                               + (", ".join(f"{ns}/{name}" for name, ns in sorted(accounts)) or "(no Deployment rendered)"))
    # kubesink's LIST and WATCH, everywhere, reach a level rendered here.
    reads = {"verbs": ["list", "watch"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    if schemas and not any((s["spec"].get("priorityLevelConfiguration") or {}).get("name") in levels
                           and any(_resource_rule_covers(c, reads) for r in s["spec"].get("rules") or [] for c in r.get("resourceRules") or [])
                           for s in schemas):
        out.append("Reads: no FlowSchema sends LIST and WATCH of every resource, namespaced and cluster-wide, to a level rendered here")
    # A schema that an earlier one covers entirely is never matched (equal precedence: the
    # lexicographically smaller name first, as the API server orders them).
    order = sorted(schemas, key=lambda s: (s["spec"].get("matchingPrecedence") or 0, s["metadata"]["name"]))
    for i, later in enumerate(order):
        for earlier in order[:i]:
            if _schema_covers(earlier, later):
                out.append(f"Shadowed: FlowSchema {later['metadata']['name']} is never matched: "
                           f"{earlier['metadata']['name']} (precedence {earlier['spec'].get('matchingPrecedence')}) matches all its requests first")
                break
    return out


def cmd_flowcontrol(paths):
    def results():
        for path in paths:
            docs = load_all(path)
            fc = [d for d in docs if d.get("kind") in ("FlowSchema", "PriorityLevelConfiguration")]
            if fc:
                names = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in fc)
                yield (flowcontrol_violations(docs),
                       f"{path}: the API Priority and Fairness objects break",
                       f"{path}: {names}: references, subject, precedence and queues hold")
    return report(results(), "no FlowSchema or PriorityLevelConfiguration found to check")


def good_flowcontrol():
    """A level, kubesink's schema, its Lease schema and the Deployment they name."""
    sa = [{"kind": "ServiceAccount", "serviceAccount": {"name": "sink", "namespace": "ops"}}]
    return [
        {"apiVersion": FLOWCONTROL_API, "kind": "PriorityLevelConfiguration", "metadata": {"name": "sink"},
         "spec": {"type": "Limited", "limited": {
             "nominalConcurrencyShares": 15, "lendablePercent": 50, "borrowingLimitPercent": 100,
             "limitResponse": {"type": "Queue", "queuing": {"queues": 64, "handSize": 8, "queueLengthLimit": 100}}}}},
        {"apiVersion": FLOWCONTROL_API, "kind": "FlowSchema", "metadata": {"name": "sink"},
         "spec": {"priorityLevelConfiguration": {"name": "sink"}, "matchingPrecedence": 8000,
                  "distinguisherMethod": {"type": "ByNamespace"},
                  "rules": [{"subjects": sa, "resourceRules": [
                      {"verbs": ["get", "list", "watch"], "apiGroups": ["*"], "resources": ["*"],
                       "clusterScope": True, "namespaces": ["*"]}],
                      "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/apis", "/apis/*"]}]}]}},
        {"apiVersion": FLOWCONTROL_API, "kind": "FlowSchema", "metadata": {"name": "sink-leader-election"},
         "spec": {"priorityLevelConfiguration": {"name": "leader-election"}, "matchingPrecedence": 7999,
                  "distinguisherMethod": {"type": "ByUser"},
                  "rules": [{"subjects": sa, "resourceRules": [
                      {"verbs": ["get", "create", "update"], "apiGroups": ["coordination.k8s.io"],
                       "resources": ["leases"], "namespaces": ["*"]}]}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sink", "namespace": "ops"},
         "spec": {"template": {"spec": {"serviceAccountName": "sink", "containers": [{"name": "c"}]}}}},
    ]


def cmd_flowcontrol_self_test():
    """Each rule must fire on a set that breaks it, and only the good set passes."""
    import copy

    def plc(d):
        return d[0]["spec"]["limited"]

    def fs(d):
        return d[1]["spec"]

    def queuing(d):
        return plc(d)["limitResponse"]["queuing"]

    cases = {
        "API version": lambda d: d[1].update(apiVersion="flowcontrol.apiserver.k8s.io/v1beta3"),
        "Built-in name": lambda d: d[0]["metadata"].update(name="workload-low"),
        "Limited": lambda d: d[0]["spec"].update(type="Exempt"),
        "Shares": lambda d: plc(d).update(nominalConcurrencyShares=0),
        "Lendable": lambda d: plc(d).update(lendablePercent=120),
        "Borrowing": lambda d: plc(d).update(borrowingLimitPercent=-1),
        "Queue": lambda d: plc(d).update(limitResponse={"type": "Reject"}),
        "Queue sizes": lambda d: queuing(d).update(queueLengthLimit=0),
        "Hand size": lambda d: queuing(d).update(queues=4),
        "Entropy": lambda d: queuing(d).update(queues=1024, handSize=7),
        "Unused level": lambda d: fs(d).update(priorityLevelConfiguration={"name": "leader-election"}),
        "Level": lambda d: d[2]["spec"].update(priorityLevelConfiguration={"name": "sink-lease"}),
        "Precedence": lambda d: fs(d).update(matchingPrecedence=9000),
        "Distinguisher": lambda d: fs(d).update(distinguisherMethod={"type": "ByPod"}),
        "Subject": lambda d: fs(d)["rules"][0].update(subjects=[
            {"kind": "ServiceAccount", "serviceAccount": {"name": "sink", "namespace": "default"}}]),
        "Reads": lambda d: fs(d)["rules"][0]["resourceRules"][0].update(clusterScope=False),
        # The Lease schema after kubesink's, which matches its GETs first.
        "Shadowed": lambda d: (d[2]["spec"].update(matchingPrecedence=8001),
                               d[2]["spec"]["rules"][0]["resourceRules"][0].update(verbs=["get"])),
    }
    bad = []
    if flowcontrol_violations(good_flowcontrol()):
        bad.append(f"the good set fails: {flowcontrol_violations(good_flowcontrol())}")
    for rule, edit in cases.items():
        d = copy.deepcopy(good_flowcontrol())
        edit(d)
        v = flowcontrol_violations(d)
        if not any(x.split(":")[0] == rule for x in v):
            bad.append(f"{rule}: not detected (got {v})")
    for b in bad:
        print(f"FAIL flowcontrol self-test: {b}")
    if not bad:
        print(f"ok   flowcontrol self-test: each of {len(cases)} rules detected, the good set passes")
    return 1 if bad else 0


# --- kubelet-env -------------------------------------------------------------------------------
# What the kubelet puts in a container's environment (pkg/kubelet/kubelet_pods.go,
# makeEnvironmentVariables): the Docker-link variables of every Service in the Pod's namespace
# (pkg/kubelet/envvars/envvars.go, FromServices) plus the `kubernetes` Service's from `default`,
# then envFrom, then env (later wins). Service links are written here as if enableServiceLinks
# were on, whatever the manifest says: the shipped manifests turn them off (checked), and
# kubesink must start with them anyway (a user's own Deployment, an older manifest).

def _env_name(s):
    return s.replace("-", "_").upper()


def service_link_env(name, cluster_ip, ports):
    """FromServices for one Service: ports are (name, port, protocol)."""
    svc = _env_name(name)
    host = f"[{cluster_ip}]" if ":" in cluster_ip else cluster_ip
    out = [(f"{svc}_SERVICE_HOST", cluster_ip), (f"{svc}_SERVICE_PORT", str(ports[0][1]))]
    out += [(f"{svc}_SERVICE_PORT_{_env_name(n)}", str(p)) for n, p, _ in ports if n]
    for i, (_, port, proto) in enumerate(ports):
        url = f"{proto.lower()}://{host}:{port}"
        if i == 0:
            out.append((f"{svc}_PORT", url))
        pp = f"{svc}_PORT_{port}_{proto.upper()}"
        out += [(pp, url), (f"{pp}_PROTO", proto.lower()), (f"{pp}_PORT", str(port)), (f"{pp}_ADDR", cluster_ip)]
    return out


def _field_ref(path, pod_name, namespace, meta, spec):
    simple = {
        "metadata.name": pod_name, "metadata.namespace": namespace,
        "metadata.uid": "3f1f5e3c-1f7a-4c1b-9f55-4a8d1f7e2b10", "spec.nodeName": "node-a",
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.hostIP": "192.0.2.10", "status.hostIPs": "192.0.2.10",
        "status.podIP": "10.244.1.23", "status.podIPs": "10.244.1.23",
    }
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ValueError(f"fieldRef {path} is not one a kubelet resolves")


def kubelet_env(docs, workload, meta, spec, container):
    """(NAME, VALUE) pairs, in the kubelet's order, later ones overriding earlier ones."""
    namespace = workload["metadata"].get("namespace", "default")
    pod_name = f"{workload['metadata']['name']}-7c9d8f6b5d-x2k4q"
    env = dict(service_link_env("kubernetes", "10.96.0.1", [("https", 443, "TCP")]))
    services = [d for d in docs if d.get("kind") == "Service"
                and d["metadata"].get("namespace", "default") == namespace]
    # Another team's Service named like kubesink's prefix, with two named ports and UDP.
    services.append({"metadata": {"name": "kubesink"}, "spec": {"ports": [
        {"name": "http-metrics", "port": 9090}, {"name": "dns", "port": 53, "protocol": "UDP"}]}})
    for i, svc in enumerate(services):
        ip = svc["spec"].get("clusterIP") or f"10.96.{7 + i}.{20 + i}"
        if ip == "None" or not svc["spec"].get("ports"):
            continue
        ports = [(p.get("name", ""), p["port"], p.get("protocol", "TCP")) for p in svc["spec"]["ports"]]
        env.update(service_link_env(svc["metadata"]["name"], ip, ports))
    by_name = {(d.get("kind"), d["metadata"]["name"]): d for d in docs if d.get("metadata")}
    for src in container.get("envFrom", []):
        prefix = src.get("prefix", "")
        if "configMapRef" in src:
            cm = by_name.get(("ConfigMap", src["configMapRef"]["name"]), {})
            env.update({prefix + k: v for k, v in (cm.get("data") or {}).items()})
        # A Secret's keys are not in the rendered set: none can be named here.
    for e in container.get("env", []):
        if "value" in e or "valueFrom" not in e:
            env[e["name"]] = e.get("value", "")
            continue
        ref = e["valueFrom"]
        if "fieldRef" in ref:
            env[e["name"]] = _field_ref(ref["fieldRef"]["fieldPath"], pod_name, namespace, meta, spec)
        elif "secretKeyRef" in ref:
            env[e["name"]] = f"placeholder-from-secret-{ref['secretKeyRef']['name']}"
        elif "configMapKeyRef" in ref:
            cm = by_name.get(("ConfigMap", ref["configMapKeyRef"]["name"]), {})
            env[e["name"]] = (cm.get("data") or {}).get(ref["configMapKeyRef"]["key"], "")
        elif "resourceFieldRef" in ref:
            env[e["name"]] = "268435456"
    return env


def cmd_kubelet_env(outdir, paths):
    import os
    failures, written = 0, 0
    for path in paths:
        docs = [d for d in load_all(path) if d]
        stem = os.path.splitext(os.path.basename(path))[0]
        for doc in docs:
            for workload, meta, spec in pod_specs(doc):
                if spec.get("enableServiceLinks", True) is not False:
                    print(f"FAIL {path}: {workload}: enableServiceLinks is not false")
                    failures += 1
                for c in spec.get("containers", []):
                    args = c.get("args") or []
                    if args[:1] != ["run"] or "--config" not in args:
                        continue
                    config_path = args[args.index("--config") + 1]
                    toml = None
                    for mount in c.get("volumeMounts", []):
                        if not config_path.startswith(mount["mountPath"].rstrip("/") + "/"):
                            continue
                        vol = next(v for v in spec.get("volumes", []) if v["name"] == mount["name"])
                        key = os.path.relpath(config_path, mount["mountPath"])
                        if "configMap" in vol:
                            cm = next((d for d in docs if d.get("kind") == "ConfigMap"
                                       and d["metadata"]["name"] == vol["configMap"]["name"]), None)
                            if cm is not None:
                                toml = (cm.get("data") or {}).get(key)
                        elif "secret" in vol:
                            # A Secret of the rendered set (kustomize's secretGenerator).
                            import base64
                            sec = next((d for d in docs if d.get("kind") == "Secret"
                                        and d["metadata"]["name"] == vol["secret"]["secretName"]), None)
                            if sec is not None and key in (sec.get("data") or {}):
                                toml = base64.b64decode(sec["data"][key]).decode()
                            elif sec is not None:
                                toml = (sec.get("stringData") or {}).get(key)
                    if toml is None:
                        print(f"FAIL {path}: {workload}/{c['name']}: {config_path} comes from no rendered ConfigMap or Secret")
                        failures += 1
                        continue
                    name = f"{stem}-{doc['metadata']['name']}-{c['name']}"
                    env = kubelet_env(docs, doc, meta, spec, c)
                    with open(os.path.join(outdir, f"{name}.env"), "w") as f:
                        f.write("".join(f"{k}={v}\n" for k, v in env.items()))
                    with open(os.path.join(outdir, f"{name}.toml"), "w") as f:
                        f.write(toml)
                    with open(os.path.join(outdir, f"{name}.args"), "w") as f:
                        f.write("\n".join(args[1:]) + "\n")
                    written += 1
                    links = sum(1 for k in env if k.startswith("KUBESINK_") and "__" not in k)
                    print(f"ok   {path}: {workload}/{c['name']}: {len(env)} variables ({links} KUBESINK_ service links)")
    if not written:
        print("FAIL no kubesink container found in " + " ".join(paths))
        failures += 1
    return 1 if failures else 0


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "pss" and args:
        return cmd_pss(args)
    if cmd == "pss-self-test" and not args:
        return cmd_pss_self_test()
    if cmd == "rbac" and args[:1] == ["--ignore-helm-labels"] and len(args) % 2 == 1:
        return cmd_rbac(args[1:], ignore_helm_labels=True)
    if cmd == "rbac" and args and len(args) % 2 == 0:
        return cmd_rbac(args)
    if cmd == "compose" and len(args) == 3:
        return cmd_compose(*args)
    if cmd == "dockerfile" and len(args) == 1:
        return cmd_dockerfile(*args)
    if cmd == "image-facts" and len(args) == 2:
        return cmd_image_facts(*args)
    if cmd == "flowcontrol" and args:
        return cmd_flowcontrol(args)
    if cmd == "kubelet-env" and len(args) >= 2:
        return cmd_kubelet_env(args[0], args[1:])
    if cmd == "flowcontrol-self-test" and not args:
        return cmd_flowcontrol_self_test()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
