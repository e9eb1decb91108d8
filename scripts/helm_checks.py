#!/usr/bin/env python3
"""Checks of the Helm chart (deploy/helm/kubesink) with Helm's own engine: the PyPI package
helm-python-sdk binds Helm v4's Go library (libhelm_c), so lint and render are Helm's, with no
helm binary. scripts/check-deploy.sh runs it and does the rest (Kubernetes schemas, Pod
Security, `kubesink check`, `kubesink rbac`) on what it writes.

  engine-self-test        the library is Helm: template functions with known output, Helm's
                          values coalescing, `required` and a lint finding
  render OUTDIR           lint (strict) and render the default values, each examples/*.yaml,
                          every option, the minimal set and flowControl enabled;
                          writes OUTDIR/helm-NAME.yaml (every manifest) and
                          OUTDIR/helm-NAME.toml (the rendered kubesink.toml) and
                          OUTDIR/helm-NAME.env (secretEnv's variables, placeholder values),
                          OUTDIR/helm-NAME.rbac-args (the release's `kubesink rbac` arguments),
                          OUTDIR/helm-NAME.args (the container's arguments, `run` made `check`);
                          prints the objects
  bad-values              each schema or template rule that matters rejects its bad value, with
                          the message a user would see
  real KUBECONFIG          against a real API server (tests/real_deploy.rs starts one): each set of
                          values `render` renders is installed (a namespace each), upgraded (a
                          changed value: revision 2) and uninstalled with Helm's engine; every
                          object must be accepted by the server's own validation (admission,
                          the flowcontrol API's rules) and exist after install and upgrade, and
                          none after uninstall
  package REPOSITORY TAG DIGEST OUTDIR
                          the chart as released: appVersion TAG, its default image
                          REPOSITORY:TAG@DIGEST (values.yaml's image.repository and image.digest
                          rewritten in a copy); writes OUTDIR/kubesink-VERSION.tgz, prints its
                          path (the release workflow pushes it to ghcr.io)
  oci REGISTRY REPOSITORY TAG DIGEST OUTDIR
                          `package`, then pushed to oci://REGISTRY/charts (plain HTTP: a local
                          registry, scripts/image.sh's) with Helm's registry client, resolved
                          and pulled back by tag and digest into OUTDIR/pulled; the pulled archive must be the
                          pushed one and render the pinned image; prints CHART_* lines
  publish CHART_TGZ REMOTE  the release workflow's push: CHART_TGZ to REMOTE (oci://ghcr.io/OWNER/charts)
                          with Helm's registry client, logged in as $HELM_REGISTRY_USERNAME
                          with $HELM_REGISTRY_PASSWORD; prints the chart's manifest digest
  install-pulled CHART_TGZ IMAGE_REF KUBECONFIG
                          the pulled chart installed into a real API server (tests/real_image.rs)
                          with its own values but the cluster's name: the Deployment's image is
                          IMAGE_REF and its app.kubernetes.io/version the image's tag; then
                          uninstalled
  compare-kustomize RENDERED KUSTOMIZED
                          the chart's default Deployment, Service, PDB and RBAC against
                          `kubectl kustomize deploy/base`: only the differences listed in
                          INTENDED (with why) may remain
"""
import copy
import json
import os
import sys
import tempfile

import helm_python as helm

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "helm", "kubesink")
RELEASE, NAMESPACE = "kubesink", "kubesink"


# Every optional value set at once, so that each template branch is rendered and validated.
EVERY_OPTION = {
    "replicaCount": 3, "fullnameOverride": "topology",
    "image": {"repository": "registry.example.com/kubesink", "tag": "9.9.9", "pullPolicy": "Always",
              "digest": "sha256:" + "ab" * 32},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"create": True, "name": "topology-sa", "annotations": {"iam.example.com/role": "r"}},
    "config": {"server": {"listen": "0.0.0.0:9464"},
               "leader_election": {"enabled": True, "lease_name": "topology-lease"},
               # Built-in, irregular (Endpoints), custom and namespaced entries: the RBAC's
               # per-namespace Roles hold only what the ClusterRole does not grant.
               "resources": [
                   {"api_version": "v1", "kind": "Pod"},
                   {"api_version": "v1", "kind": "Node", "payload": "metadata"},
                   {"api_version": "v1", "kind": "Endpoints", "namespaces": ["shop", "payments"]},
                   {"api_version": "v1", "kind": "ConfigMap", "namespaces": ["shop"]},
                   {"api_version": "v1", "kind": "Pod", "namespaces": ["shop"]},
                   {"api_version": "argoproj.io/v1alpha1", "kind": "Rollout"},
                   {"api_version": "example.com/v1", "kind": "Policy", "namespaces": ["shop"]},
                   {"api_version": "networking.istio.io/v1", "kind": "VirtualService", "namespaces": ["shop"]}]},
    "secretEnv": [{"name": "NATS_TOKEN", "secretName": "nats", "key": "token"}],
    "secretMounts": [{"name": "ca", "secretName": "ca", "mountPath": "/etc/kubesink/ca",
                      "items": [{"key": "ca.crt", "path": "ca.pem"}]}],
    "extraEnv": [{"name": "KUBESINK_PIPELINE__LINGER", "value": "50ms"}],
    "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "logFormat": "human", "metrics": {"port": 9464},
    "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "10s", "labels": {"release": "p"}},
    "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                      "egress": [{"ports": [{"port": 443, "protocol": "TCP"}]}]},
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%"},
    "podAnnotations": {"a": "b"}, "podLabels": {"team": "platform"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "priorityClassName": "system-cluster-critical", "terminationGracePeriodSeconds": 90,
    # Every value changed; no leaderElectionPriorityLevel, so the Lease rule joins kubesink's
    # schema (the "flow-control" set below renders the Lease schema of the defaults).
    "flowControl": {"enabled": True, "nominalConcurrencyShares": 20, "lendablePercent": 25,
                    "borrowingLimitPercent": 50, "matchingPrecedence": 7000, "distinguisherMethod": "ByUser",
                    "queuing": {"queues": 128, "handSize": 8, "queueLengthLimit": 50},
                    "leaderElectionPriorityLevel": ""},
}


# The least the chart renders: one replica, no leader election, no RBAC, an existing account.
MINIMAL = {"replicaCount": 1, "config": {"leader_election": None}, "rbac": {"create": False},
           "serviceAccount": {"create": False, "name": "existing"}}


# API Priority and Fairness as the defaults have it once enabled: kubesink's level and schema,
# and the Lease schema to the API server's leader-election level.
FLOW_CONTROL = {"flowControl": {"enabled": True}}


def examples():
    """(name, values) for the default values, each example values file, every option, the
    minimal set and flowControl enabled."""
    out = [("default", {}), ("every-option", EVERY_OPTION), ("minimal", MINIMAL),
           ("flow-control", FLOW_CONTROL)]
    folder = os.path.join(CHART, "examples")
    for f in sorted(os.listdir(folder)):
        if f.endswith(".yaml"):
            with open(os.path.join(folder, f)) as fh:
                out.append((f[: -len(".yaml")], helm.values_from_yaml(fh.read())))
    return out


# The chart refuses its placeholder cluster name (CHANGE-ME) at render time: every check
# renders with this name unless its values set one (check-deploy.sh fills the shipped
# files' placeholders with the same words, so the default renders as deploy/base).
NAMED = {"config": {"cluster": {"name": "filled-in-by-check-deploy"}}}


def named(values):
    """`values` over NAMED (a deep merge: the values win, a null removes the name)."""
    def merge(base, over):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out
    return merge(NAMED, values)


def render(values):
    with helm.Chart.load(CHART) as chart:
        return chart.render(named(values), name=RELEASE, namespace=NAMESPACE, is_install=True)


def parse_stream(text):
    """The objects of a multi-document YAML stream, parsed by Helm's own YAML reader;
    documents holding only comments or nothing are skipped."""
    def has_content(part):
        return any(l.strip() not in ("", "---") and not l.lstrip().startswith("#")
                   for l in part.splitlines())
    return [helm.values_from_yaml(p) for p in text.split("\n---") if has_content(p)]


def documents(manifests):
    """The rendered objects, NOTES.txt left out."""
    return [d for path in sorted(manifests) if not path.endswith("NOTES.txt")
            for d in parse_stream(manifests[path])]


# --- engine-self-test --------------------------------------------------------------------------
def cmd_engine_self_test():
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "probe")
        os.makedirs(os.path.join(chart, "templates"))
        with open(os.path.join(chart, "Chart.yaml"), "w") as f:
            f.write("apiVersion: v2\nname: probe\nversion: 1.2.3\n")
        with open(os.path.join(chart, "values.yaml"), "w") as f:
            f.write("a: {b: 1, c: [x]}\nport: 9090\n")
        with open(os.path.join(chart, "templates", "t.txt"), "w") as f:
            f.write('{{ "abc" | sha256sum }}|{{ "hello" | b64enc }}|{{ toToml (dict "k" "v") }}|'
                    '{{ .Values.a.b }}|{{ .Values.a.c | toJson }}|{{ .Chart.Version }}|'
                    '{{ .Release.Namespace }}|{{ kindOf .Values.port }}|{{ semverCompare ">=1.30" "1.31.0" }}')
        with open(os.path.join(chart, "templates", "req.txt"), "w") as f:
            f.write('{{ if .Values.need }}{{ required "need.x is required" .Values.need.x }}{{ end }}')
        with helm.Chart.load(chart) as c:
            got = c.render({"a": {"c": ["y"]}}, name="r", namespace="ns")["probe/templates/t.txt"]
            want = ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad|aGVsbG8=|"
                    'k = "v"\n|1|["y"]|1.2.3|ns|float64|true')
            if got != want:
                print(f"FAIL the engine rendered {got!r}, Helm renders {want!r}")
                return 1
            try:
                c.render({"need": {"y": 1}}, name="r", namespace="ns")
                print("FAIL `required` did not fail")
                return 1
            except helm.HelmRenderError as e:
                if "need.x is required" not in str(e):
                    print(f"FAIL `required` failed with {e}")
                    return 1
        report = helm.lint(chart, strict=True)
        if not any("icon is recommended" in m["error"] for m in report["messages"]):
            print(f"FAIL lint did not report Helm's 'icon is recommended': {report}")
            return 1
    print(f"ok   helm-python-sdk {helm.__version__} is Helm {helm.helm_sdk_version()}: "
          "sha256sum, b64enc, toToml, coalescing, float64 numbers, semverCompare, required, lint")
    return 0


# --- render ------------------------------------------------------------------------------------
def cmd_render(outdir):
    failures = 0
    for name, values in examples():
        report = helm.lint(CHART, named(values), strict=True, namespace=NAMESPACE)
        # Severity 1 is information ("icon is recommended"); 2 warnings and 3 errors fail.
        bad = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        if bad:
            print(f"FAIL helm lint --strict ({name}): {bad}")
            failures += 1
            continue
        try:
            manifests = render(values)
        except helm.HelmError as e:
            print(f"FAIL helm template ({name}): {e}")
            failures += 1
            continue
        docs = documents(manifests)
        with open(os.path.join(outdir, f"helm-{name}.yaml"), "w") as f:
            f.write("\n".join("---\n" + json.dumps(d) for d in docs) + "\n")
        config = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
        with open(os.path.join(outdir, f"helm-{name}.toml"), "w") as f:
            f.write(config[0]["data"]["kubesink.toml"])
        # The `kubesink rbac` arguments for this release (its names and namespace), when the
        # chart renders RBAC.
        deployment = [d for d in docs if d["kind"] == "Deployment"][0]
        with helm.Chart.load(CHART) as chart:
            merged = chart.merge_values(named(values))
        if merged["rbac"]["create"]:
            with open(os.path.join(outdir, f"helm-{name}.rbac-args"), "w") as f:
                f.write(f"--name {deployment['metadata']['name']} --namespace {NAMESPACE} "
                        f"--service-account {deployment['spec']['template']['spec']['serviceAccountName']}\n")
        elif any(d["kind"] in ("ClusterRole", "Role") for d in docs):
            print(f"FAIL ({name}) rbac.create is false, and RBAC objects are rendered")
            failures += 1
        # The container's arguments, for `kubesink check` (run becomes check, the mounted
        # configuration the rendered file).
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        if args[:1] != ["run"] or "--config" not in args:
            print(f"FAIL ({name}) the container's args are not `run --config …`: {args}")
            failures += 1
        else:
            args = ["check"] + args[1:]
            args[args.index("--config") + 1] = os.path.join(outdir, f"helm-{name}.toml")
            with open(os.path.join(outdir, f"helm-{name}.args"), "w") as f:
                f.write(" ".join(args) + "\n")
        # The variables secretEnv would set, with placeholders, for `kubesink check`.
        with open(os.path.join(outdir, f"helm-{name}.env"), "w") as f:
            f.write("".join(f"{e['name']}=placeholder-from-{e['secretName']}\n" for e in merged["secretEnv"]))
        kinds = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in docs)
        print(f"ok   helm lint --strict and helm template ({name}): {len(docs)} objects: {kinds}")
    # The chart's README has a row for every value (config's contents are kubesink's own).
    with helm.Chart.load(CHART) as chart:
        defaults = chart.values
    def leaves(value, prefix=""):
        if isinstance(value, dict) and value and prefix not in ("config", "resources", "service.annotations"):
            for k, v in value.items():
                yield from leaves(v, f"{prefix}.{k}" if prefix else k)
        else:
            yield prefix
    with open(os.path.join(CHART, "README.md")) as f:
        readme = f.read()
    missing = [k for k in leaves(defaults) if f"| `{k}` |" not in readme]
    if missing:
        print(f"FAIL deploy/helm/kubesink/README.md has no row for: {', '.join(missing)}")
        failures += 1
    else:
        print(f"ok   the chart's README documents every value ({len(list(leaves(defaults)))} rows)")
    # A changed configuration rolls the Pods: the checksum in the Pod template changes with it.
    def checksum(values):
        deployment = [d for d in documents(render(values)) if d["kind"] == "Deployment"][0]
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    if checksum({}) == checksum({"config": {"cluster": {"name": "another"}}}):
        print("FAIL a changed values.config leaves the Pod template's checksum/config as it was")
        failures += 1
    else:
        print("ok   a changed values.config changes the Pod template's checksum/config (the Deployment rolls)")
    return 1 if failures else 0


# --- bad-values --------------------------------------------------------------------------------
BAD_VALUES = [
    ("a wrong type", {"replicaCount": "2"}, "at '/replicaCount': got string, want integer"),
    ("an unknown top-level key", {"replicas": 2}, "additional properties 'replicas' not allowed"),
    ("an unknown key in a section", {"image": {"name": "x"}}, "additional properties 'name' not allowed"),
    ("replicas > 1 with leader election off", {"replicaCount": 3, "config": {"leader_election": {"enabled": False}}},
     "values.replicaCount is 3 but config.leader_election.enabled is not true: replicas without leader "
     "election would all watch and emit every change; set replicaCount: 1"),
    ("the placeholder cluster name", {"config": {"cluster": {"name": "CHANGE-ME"}}},
     "values.config.cluster.name is still the placeholder CHANGE-ME: set it to this cluster's name"),
    ("a bad pull policy", {"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
    ("an image digest that is not sha256:<64 hex>", {"image": {"digest": "latest"}}, "at '/image/digest'"),
    ("a secretEnv entry without its key", {"secretEnv": [{"name": "P", "secretName": "s"}]}, "missing property 'key'"),
    ("a relative secretMounts path", {"secretMounts": [{"name": "a", "secretName": "s", "mountPath": "etc"}]},
     "at '/secretMounts/0/mountPath'"),
    ("a resource without kind", {"config": {"resources": [{"api_version": "v1"}]}}, "missing property 'kind'"),
    ("no resources", {"config": {"resources": []}}, "at '/config/resources': minItems"),
    ("a credential in clear",
     {"config": {"sinks": [{"type": "nats", "auth": {"user": "u", "password": "hunter2"}}]}},
     "values.config.sinks[0].auth.password: a credential in clear"),
    # A number is no secret's type: the schema generated from kubesink's types refuses it first.
    ("a credential in clear as a number",
     {"config": {"sinks": [{"type": "nats", "auth": {"user": "u", "password": 123456}}]}},
     "at '/config/sinks/0/auth/password': got number, want string"),
    ("a typo inside config (the schema generated from kubesink's types)",
     {"config": {"pipeline": {"lingr": "5ms"}}}, "at '/config/pipeline': additional properties 'lingr' not allowed"),
    ("a value of kubesink's configuration it does not know",
     {"config": {"sinks": [{"type": "kafka", "bootstrap_servers": "k:9092", "compression": "brotli"}]}},
     "at '/config/sinks/0/compression'"),
    ("a log format kubesink does not know", {"logFormat": "text"}, "at '/logFormat'"),
    ("a credential in clear in the state store",
     {"config": {"state": {"backend": "nats", "nats": {"auth": {"token": "t0ken"}}}}},
     "values.config.state.nats.auth.token: a credential in clear"),
    ("namespaces on a cluster-scoped kind",
     {"config": {"resources": [{"api_version": "v1", "kind": "Node", "namespaces": ["a"]}]}},
     "values.config.resources[0].namespaces: v1 Node is cluster-scoped"),
    ("a listen address without a port", {"config": {"server": {"listen": "0.0.0.0"}}}, "at '/config/server/listen'"),
    ("a FlowSchema after service-accounts", {"flowControl": {"matchingPrecedence": 9000}},
     "at '/flowControl/matchingPrecedence': maximum"),
    ("a FlowSchema before the API server's own", {"flowControl": {"matchingPrecedence": 1000}},
     "at '/flowControl/matchingPrecedence': minimum"),
    ("a priority level without shares", {"flowControl": {"nominalConcurrencyShares": 0}},
     "at '/flowControl/nominalConcurrencyShares': minimum"),
    ("a lendable percent above 100", {"flowControl": {"lendablePercent": 101}}, "at '/flowControl/lendablePercent'"),
    ("a negative borrowing limit", {"flowControl": {"borrowingLimitPercent": -1}},
     "at '/flowControl/borrowingLimitPercent'"),
    ("a distinguisher the API server does not know", {"flowControl": {"distinguisherMethod": "ByPod"}},
     "at '/flowControl/distinguisherMethod'"),
    ("no queues", {"flowControl": {"queuing": {"queues": 0}}}, "at '/flowControl/queuing/queues': minimum"),
    ("a hand size beyond the entropy bound", {"flowControl": {"queuing": {"handSize": 9}}},
     "at '/flowControl/queuing/handSize': maximum"),
    ("a hand size above the queues", {"flowControl": {"enabled": True, "queuing": {"queues": 4, "handSize": 6}}},
     "values.flowControl.queuing.handSize (6) must not exceed queuing.queues (4)"),
    ("a Lease level that is no object name", {"flowControl": {"leaderElectionPriorityLevel": "Leader_Election"}},
     "at '/flowControl/leaderElectionPriorityLevel'"),
    ("an unknown key in flowControl", {"flowControl": {"precedence": 5000}},
     "additional properties 'precedence' not allowed"),
]


def cmd_bad_values():
    failures = 0
    for what, values, want in BAD_VALUES:
        try:
            render(values)
            print(f"FAIL {what} was accepted: {values}")
            failures += 1
        except helm.HelmError as e:
            msg = " ".join(str(e).split())
            if "hunter2" in msg or "t0ken" in msg:
                print(f"FAIL {what}: the message shows the credential: {msg}")
                failures += 1
            elif want in msg:
                print(f"ok   rejects {what}: {msg[msg.find(want) - 0:][:150]}")
            else:
                print(f"FAIL {what}: rejected, but the message lacks {want!r}: {msg}")
                failures += 1
    return 1 if failures else 0


# --- real --------------------------------------------------------------------------------------
# The prometheus-operator's ServiceMonitor kind, served without a schema: its objects are
# stored as given (a real cluster validates them with the operator's CRD; the chart's
# ServiceMonitor is checked against that schema nowhere else either).
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"plural": "servicemonitors", "singular": "servicemonitor",
                       "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def kubectl(kubeconfig, *args, stdin=None):
    import subprocess
    return subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], input=stdin,
                          capture_output=True, text=True)


def object_ref(doc, namespace):
    """`kind.group/name` of a rendered object for kubectl, and its namespace: its own, else the
    release's (kubectl ignores -n for cluster-scoped kinds)."""
    group = doc["apiVersion"].rsplit("/", 1)[0] if "/" in doc["apiVersion"] else ""
    ref = f"{doc['kind'].lower()}{'.' + group if group else ''}/{doc['metadata']['name']}"
    return ref, doc["metadata"].get("namespace") or namespace


def cmd_real(kubeconfig):
    failures = 0
    r = kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(SERVICE_MONITOR_CRD))
    if r.returncode != 0:
        print(f"FAIL the ServiceMonitor CRD: {r.stderr}")
        return 1
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com")
    # The namespaces EVERY_OPTION's namespaced resources name (their Roles go there).
    for ns in ("shop", "payments"):
        kubectl(kubeconfig, "create", "namespace", ns)
    for name, values in examples():
        values = copy.deepcopy(values)
        values.setdefault("config", {}).setdefault("cluster", {})["name"] = "real-helm"
        ns = f"helm-{name}"
        # The release's storage (its Secrets) in its own namespace, as `helm -n NS` does.
        with helm.Config(kubeconfig_path=kubeconfig, namespace=ns) as cfg:
            try:
                installed = cfg.install(CHART, RELEASE, values, namespace=ns, create_namespace=True, timeout=120)
                changed = copy.deepcopy(values)
                changed.setdefault("podAnnotations", {})["upgraded"] = "yes"
                upgraded = cfg.upgrade(CHART, RELEASE, changed, namespace=ns, timeout=120)
            except helm.HelmError as e:
                print(f"FAIL helm install/upgrade ({name}) into the real API server: {e}")
                failures += 1
                continue
            manifest = upgraded.get("manifest", "")
            docs = parse_stream(manifest)
            kinds = sorted({d["kind"] for d in docs})
            # Each object, where Helm put it (its own namespace, else the release's): kubectl
            # ignores -n for cluster-scoped kinds.
            missing = []
            for d in docs:
                ref, obj_ns = object_ref(d, ns)
                got = kubectl(kubeconfig, "get", ref, "-n", obj_ns, "-o", "name")
                if got.returncode != 0:
                    missing.append(f"{ref} in {obj_ns}: {got.stderr.strip()}")
            history = cfg.history(RELEASE)
            revisions = len(history) if isinstance(history, list) else len(history.get("releases", history))
            if missing or revisions != 2:
                print(f"FAIL ({name}) after install and upgrade ({revisions} revisions): {missing}")
                failures += 1
            else:
                print(f"ok   helm install and upgrade ({name}) accepted by the real API server: "
                      f"2 revisions, {len(docs)} objects ({', '.join(kinds)})")
            try:
                cfg.uninstall(RELEASE, timeout=120)
            except helm.HelmError as e:
                print(f"FAIL helm uninstall ({name}): {e}")
                failures += 1
                continue
            left = []
            for d in docs:
                ref, obj_ns = object_ref(d, ns)
                got = kubectl(kubeconfig, "get", ref, "-n", obj_ns, "-o", "name", "--ignore-not-found")
                if got.stdout.strip():
                    left.append(got.stdout.strip())
            if left:
                print(f"FAIL ({name}) objects left after helm uninstall: {left}")
                failures += 1
            else:
                print(f"ok   helm uninstall ({name}) removed every object")
    return 1 if failures else 0


# --- package, oci, install-pulled: the chart as released ---------------------------------------
def deployment_image(manifests):
    """The kubesink container's image in a rendered release."""
    for d in documents(manifests) if isinstance(manifests, dict) else parse_stream(manifests):
        if d.get("kind") == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["name"] == "kubesink":
                    return c["image"]
    return None


def cmd_package(repository, tag, digest, outdir):
    """The chart with appVersion = the image's tag and its default image pinned to the digest,
    packaged by Helm; returns the archive's path. Only values.yaml's two lines change, in a
    copy: the published chart's defaults are the release's image."""
    import shutil

    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "kubesink")
        shutil.copytree(CHART, chart)
        path = os.path.join(chart, "values.yaml")
        with open(path) as f:
            text = f.read()
        for old, new in (("\n  repository: ghcr.io/kubesink/kubesink\n", f"\n  repository: {repository}\n"),
                         ('\n  digest: ""\n', f'\n  digest: "{digest}"\n')):
            if text.count(old) != 1:
                raise SystemExit(f"FAIL values.yaml: expected one line {old.strip()!r} to pin")
            text = text.replace(old, new)
        with open(path, "w") as f:
            f.write(text)
        os.makedirs(outdir, exist_ok=True)
        archive = helm.package(chart, destination=outdir, app_version=tag)
    with helm.Chart.load(archive) as packaged:
        if packaged.metadata.get("appVersion") != tag:
            raise SystemExit(f"FAIL the packaged chart's appVersion is {packaged.metadata.get('appVersion')}, not {tag}")
        image = deployment_image(packaged.render(named({}), name=RELEASE, namespace=NAMESPACE, is_install=True))
    if image != f"{repository}:{tag}@{digest}":
        raise SystemExit(f"FAIL the packaged chart renders image {image}, not {repository}:{tag}@{digest}")
    return archive


def sha256_file(path):
    import hashlib

    with open(path, "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()


def cmd_oci(registry, repository, tag, digest, outdir):
    from helm_python import registry as oci

    archive = cmd_package(repository, tag, digest, os.path.join(outdir, "pushed"))
    with helm.Chart.load(archive) as packaged:
        version = packaged.version
    remote = f"oci://{registry}/charts"
    with oci.RegistryClient(plain_http=True) as client:
        client.push(archive, remote, plain_http=True)
        ref = f"{remote}/kubesink:{version}"
        resolved = client.resolve(ref)
        tags = client.tags(f"{remote}/kubesink")
        pulled_dir = os.path.join(outdir, "pulled")
        os.makedirs(pulled_dir, exist_ok=True)
        # Pinned as a user pins it: tag and digest; Helm refuses a chart of another digest.
        client.pull(f"{ref}@{resolved['digest']}", destination=pulled_dir, plain_http=True)
    written = [f for f in os.listdir(pulled_dir) if f.endswith(".tgz")]
    pulled = os.path.join(pulled_dir, written[0]) if len(written) == 1 else ""
    problems = []
    if not pulled:
        problems.append(f"helm pull of {ref}@{resolved['digest']} wrote {written}, not one chart")
    elif sha256_file(pulled) != sha256_file(archive):
        problems.append(f"the pulled archive {sha256_file(pulled)} is not the pushed one {sha256_file(archive)}")
    if tags != [version]:
        problems.append(f"the registry's tags of the chart: {tags}, expected [{version!r}]")
    if resolved.get("media_type") not in ("application/vnd.oci.image.manifest.v1+json", None):
        problems.append(f"the chart's manifest media type: {resolved.get('media_type')}")
    if not problems:
        with helm.Chart.load(pulled) as chart:
            image = deployment_image(chart.render(named({}), name=RELEASE, namespace=NAMESPACE, is_install=True))
        if image != f"{repository}:{tag}@{digest}":
            problems.append(f"the pulled chart renders image {image}")
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        return 1
    print(f"ok   chart kubesink {version} (appVersion {tag}, image pinned to {digest}) pushed to "
          f"{remote} with Helm's registry client, pulled back by tag@digest: the same archive "
          f"({sha256_file(pulled)}), manifest {resolved['digest']}")
    print(f"CHART_REF={ref}@{resolved['digest']}")
    print(f"CHART_DIGEST={resolved['digest']}")
    print(f"CHART_VERSION={version}")
    print(f"CHART_TGZ={os.path.abspath(pulled)}")
    return 0


def cmd_publish(archive, remote):
    from helm_python import registry as oci

    host = remote.removeprefix("oci://").split("/", 1)[0]
    with helm.Chart.load(archive) as chart:
        ref = f"{remote}/{chart.name}:{chart.version}"
    with oci.RegistryClient() as client:
        client.login(host, os.environ["HELM_REGISTRY_USERNAME"], os.environ["HELM_REGISTRY_PASSWORD"])
        client.push(archive, remote)
        print(client.resolve(ref)["digest"])
    return 0


def cmd_install_pulled(archive, image_ref, kubeconfig):
    ns = "release-chart"
    tag = image_ref.rsplit("@", 1)[0].rsplit(":", 1)[1]
    values = {"config": {"cluster": {"name": "real-release"}}}
    with helm.Config(kubeconfig_path=kubeconfig, namespace=ns) as cfg:
        try:
            release = cfg.install(archive, RELEASE, values, namespace=ns, create_namespace=True, timeout=120)
        except helm.HelmError as e:
            print(f"FAIL helm install of the pulled chart into the real API server: {e}")
            return 1
        docs = parse_stream(release.get("manifest", ""))
        got = kubectl(kubeconfig, "-n", ns, "get", "deployment", "-l", "app.kubernetes.io/name=kubesink",
                      "-o", "json")
        live = json.loads(got.stdout)["items"] if got.returncode == 0 else []
        problems = []
        if len(live) != 1:
            problems.append(f"Deployments on the server: {len(live)} ({got.stderr.strip()})")
        else:
            containers = live[0]["spec"]["template"]["spec"]["containers"]
            image = next((c["image"] for c in containers if c["name"] == "kubesink"), None)
            version = live[0]["metadata"]["labels"].get("app.kubernetes.io/version")
            if image != image_ref:
                problems.append(f"the Deployment's image on the server is {image}, not {image_ref}")
            if version != tag:
                problems.append(f"its app.kubernetes.io/version is {version}, not the image's tag {tag}")
        try:
            cfg.uninstall(RELEASE, timeout=120)
        except helm.HelmError as e:
            problems.append(f"helm uninstall: {e}")
    for p in problems:
        print(f"FAIL the pulled chart: {p}")
    if problems:
        return 1
    print(f"ok   the pulled chart installed into the real API server ({len(docs)} objects): the "
          f"Deployment runs {image_ref}, version {tag}; uninstalled")
    return 0


# --- compare-kustomize -------------------------------------------------------------------------
# (kind, path) -> why the chart differs from deploy/base there. Labels that only Helm has
# (helm.sh/chart, app.kubernetes.io/instance, version, managed-by) are dropped before comparing.
INTENDED = {
    ("Deployment", "spec.template.metadata.annotations.checksum/config"):
        "the chart rolls the Pods on a configuration change by a checksum; kustomize by the ConfigMap name's hash",
    ("Deployment", "spec.template.spec.volumes[0].configMap.name"):
        "kustomize appends a content hash to the ConfigMap name",
    ("*", "metadata.labels.app.kubernetes.io/component"):
        "the chart puts its common labels, component included, on every object; deploy/base on the Deployment's only",
}
HELM_ONLY_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by"}


def flatten(value, prefix=""):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def normalized(doc):
    d = copy.deepcopy(doc)
    def strip(m):
        for k in HELM_ONLY_LABELS:
            (m or {}).pop(k, None)
    strip(d.get("metadata", {}).get("labels"))
    for path in (("spec", "selector", "matchLabels"), ("spec", "selector"),
                 ("spec", "template", "metadata", "labels")):
        node = d
        for p in path:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            strip(node)
    aff = d.get("spec", {}).get("template", {}).get("spec", {}).get("affinity", {})
    for term in aff.get("podAntiAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", []):
        strip(term["podAffinityTerm"]["labelSelector"]["matchLabels"])
    return d


def load_stream(path):
    with open(path) as f:
        return parse_stream(f.read())


def cmd_compare_kustomize(rendered, kustomized):
    ours = {(d["kind"], d["metadata"]["name"]): d for d in load_stream(rendered)}
    theirs = {(d["kind"], d["metadata"]["name"]): d for d in load_stream(kustomized)}
    failures, listed = 0, []
    for key in sorted(theirs):
        kind, name = key
        if kind in ("Namespace", "ConfigMap"):
            continue  # Helm does not own the release namespace; the ConfigMap's data is config
        if key not in ours:
            print(f"FAIL {kind} {name} of deploy/base is not rendered by the chart")
            failures += 1
            continue
        a, b = flatten(normalized(ours[key])), flatten(normalized(theirs[key]))
        for path in sorted(set(a) | set(b)):
            if a.get(path) == b.get(path):
                continue
            why = INTENDED.get((kind, path)) or INTENDED.get(("*", path))
            if why is None:
                print(f"FAIL {kind} {name} {path}: chart {a.get(path)!r}, deploy/base {b.get(path)!r}")
                failures += 1
            else:
                line = f"     {kind if (kind, path) in INTENDED else '*'} {path}: {why}"
                if line not in listed:
                    listed.append(line)
    extra = sorted(k for k in set(ours) - set(theirs) if k[0] != "ConfigMap")
    print(f"{'ok  ' if not failures else 'FAIL'} the chart's default objects and deploy/base agree "
          f"but for {len(listed)} intended difference(s); objects only the chart has: "
          + (", ".join(f"{k} {n}" for k, n in extra) or "none"))
    for line in listed:
        print(line)
    return 1 if failures else 0


def main(argv):
    if argv[:1] == ["engine-self-test"] and len(argv) == 1:
        return cmd_engine_self_test()
    if argv[:1] == ["render"] and len(argv) == 2:
        return cmd_render(argv[1])
    if argv[:1] == ["bad-values"] and len(argv) == 1:
        return cmd_bad_values()
    if argv[:1] == ["real"] and len(argv) == 2:
        return cmd_real(argv[1])
    if argv[:1] == ["package"] and len(argv) == 5:
        print(cmd_package(*argv[1:]))
        return 0
    if argv[:1] == ["oci"] and len(argv) == 6:
        return cmd_oci(*argv[1:])
    if argv[:1] == ["publish"] and len(argv) == 3:
        return cmd_publish(*argv[1:])
    if argv[:1] == ["install-pulled"] and len(argv) == 4:
        return cmd_install_pulled(*argv[1:])
    if argv[:1] == ["compare-kustomize"] and len(argv) == 3:
        return cmd_compare_kustomize(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
