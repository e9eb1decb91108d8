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

Needs PyYAML and jsonschema (installed with kubernetes-validate) and `dockerfile`.

The Pod Security Standards, v1.32 and later
(https://kubernetes.io/docs/concepts/security/pod-security-standards/): no real checker
(the Go library k8s.io/pod-security-admission) can be installed here from PyPI, npm or
crates.io, so `pss` implements each Baseline and Restricted control as that page lists them.
"""

import json
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


def cmd_pss(paths):
    checked, failed = 0, 0
    for path in paths:
        for doc in load_all(path):
            for name, meta, spec in pod_specs(doc):
                checked += 1
                v = restricted_violations(meta, spec)
                if v:
                    failed += 1
                    print(f"FAIL {path}: {name} breaks the restricted Pod Security Standard:")
                    for x in v:
                        print(f"  - {x}")
                else:
                    print(f"ok   {path}: {name} meets the restricted Pod Security Standard")
    if checked == 0:
        print("FAIL no Pod template found to check", file=sys.stderr)
        return 1
    return 1 if failed else 0


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
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
