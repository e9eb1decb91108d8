//! Object builders from the templates in `sim/templates/` (real Kubernetes 1.36 objects from
//! the k8s-openapi recordings, plus hand-written Node/Service/ConfigMap in the same style).
//! Builders only shape JSON; they never touch the store. Server fields (uid,
//! resourceVersion, creationTimestamp) are removed so the store sets them.

use serde_json::{json, Value};

use super::WorkloadError;

/// The parsed templates.
pub struct Templates {
    pub pod: Value,
    pub deployment: Value,
    pub node: Value,
    pub service: Value,
    pub configmap: Value,
    pub foobar: Value,
    pub foobar_crd: Value,
}

fn parse(name: &'static str, text: &str) -> Result<Value, WorkloadError> {
    serde_json::from_str(text).map_err(|source| WorkloadError::Template { name, source })
}

impl Templates {
    /// Parses the embedded templates.
    pub fn load() -> Result<Self, WorkloadError> {
        Ok(Templates {
            pod: parse("pod.json", include_str!("../../templates/pod.json"))?,
            deployment: parse(
                "deployment.json",
                include_str!("../../templates/deployment.json"),
            )?,
            node: parse("node.json", include_str!("../../templates/node.json"))?,
            service: parse("service.json", include_str!("../../templates/service.json"))?,
            configmap: parse(
                "configmap.json",
                include_str!("../../templates/configmap.json"),
            )?,
            foobar: parse("foobar.json", include_str!("../../templates/foobar.json"))?,
            foobar_crd: parse(
                "foobar-crd.json",
                include_str!("../../templates/foobar-crd.json"),
            )?,
        })
    }
}

/// Clones `template` with server fields cleared and `name`/`namespace` set.
pub fn named(template: &Value, name: &str, namespace: Option<&str>) -> Value {
    let mut obj = template.clone();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
            meta.remove(k);
        }
        meta.insert("name".into(), json!(name));
        match namespace {
            Some(ns) => meta.insert("namespace".into(), json!(ns)),
            None => meta.remove("namespace"),
        };
    }
    obj
}

fn set(obj: &mut Value, pointer: &str, value: Value) {
    if let Some(slot) = obj.pointer_mut(pointer) {
        *slot = value;
    }
}

/// Where a generated pod belongs.
pub struct PodPlacement<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub app: &'a str,
    pub replicaset: &'a str,
    pub replicaset_uid: &'a str,
    pub template_hash: &'a str,
    pub node: &'a str,
    pub index: usize,
}

/// A pod from the coredns template, owned by `replicaset`, scheduled on `node`.
pub fn pod(t: &Templates, p: &PodPlacement<'_>) -> Value {
    let mut obj = named(&t.pod, p.name, Some(p.namespace));
    let ip = format!(
        "10.{}.{}.{}",
        244 + (p.index >> 16) % 10,
        (p.index >> 8) & 255,
        p.index & 255
    );
    set(
        &mut obj,
        "/metadata/generateName",
        json!(format!("{}-", p.replicaset)),
    );
    set(
        &mut obj,
        "/metadata/labels",
        json!({"app": p.app, "pod-template-hash": p.template_hash}),
    );
    set(
        &mut obj,
        "/metadata/ownerReferences/0/name",
        json!(p.replicaset),
    );
    set(
        &mut obj,
        "/metadata/ownerReferences/0/uid",
        json!(p.replicaset_uid),
    );
    set(&mut obj, "/spec/nodeName", json!(p.node));
    set(&mut obj, "/status/podIP", json!(ip));
    set(&mut obj, "/status/podIPs", json!([{"ip": ip}]));
    obj
}

/// A deployment named `name` selecting `app=name`.
pub fn deployment(t: &Templates, name: &str, namespace: &str, replicas: usize) -> Value {
    let mut obj = named(&t.deployment, name, Some(namespace));
    set(&mut obj, "/metadata/labels", json!({"app": name}));
    set(&mut obj, "/spec/selector/matchLabels", json!({"app": name}));
    set(
        &mut obj,
        "/spec/template/metadata/labels",
        json!({"app": name}),
    );
    set(&mut obj, "/spec/replicas", json!(replicas));
    obj
}

/// The ReplicaSet a deployment controller would create for `deployment`.
pub fn replicaset(deployment: &Value, name: &str, hash: &str, deployment_uid: &str) -> Value {
    let dep_name = deployment
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::Null);
    let namespace = deployment
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(Value::Null);
    let spec = deployment.get("spec").cloned().unwrap_or(Value::Null);
    let replicas = spec.get("replicas").cloned().unwrap_or(json!(1));
    let mut template = spec.get("template").cloned().unwrap_or(json!({}));
    set(
        &mut template,
        "/metadata/labels",
        json!({"app": dep_name, "pod-template-hash": hash}),
    );
    let managed = deployment
        .pointer("/metadata/managedFields")
        .cloned()
        .unwrap_or(json!([]));
    json!({
        "kind": "ReplicaSet",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": dep_name, "pod-template-hash": hash},
            "annotations": {"deployment.kubernetes.io/desired-replicas": replicas.to_string(), "deployment.kubernetes.io/max-replicas": replicas.to_string(), "deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": dep_name, "uid": deployment_uid, "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed,
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": dep_name, "pod-template-hash": hash}}, "template": template},
        "status": {"replicas": replicas, "fullyLabeledReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas, "observedGeneration": 1}
    })
}

/// A node named `name`.
pub fn node(t: &Templates, name: &str) -> Value {
    let mut obj = named(&t.node, name, None);
    set(
        &mut obj,
        "/metadata/labels/kubernetes.io~1hostname",
        json!(name),
    );
    set(&mut obj, "/status/addresses/1/address", json!(name));
    obj
}

/// A ClusterIP service selecting `app`.
pub fn service(t: &Templates, name: &str, namespace: &str, app: &str, index: usize) -> Value {
    let mut obj = named(&t.service, name, Some(namespace));
    let ip = format!("10.96.{}.{}", (index >> 8) & 255, index & 255);
    set(&mut obj, "/metadata/labels", json!({"app": app}));
    set(&mut obj, "/spec/selector", json!({"app": app}));
    set(&mut obj, "/spec/clusterIP", json!(ip));
    set(&mut obj, "/spec/clusterIPs", json!([ip]));
    obj
}

/// A namespace object.
pub fn namespace(name: &str) -> Value {
    json!({
        "kind": "Namespace", "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"}
    })
}
