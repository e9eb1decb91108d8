//! The workload generator: a [`Workload`] spec (counts per kind) becomes realistic objects
//! built from real templates (pods ~9 KB with managedFields, ownerReferences and status),
//! spread over namespaces, with Deployment → ReplicaSet → Pod ownership and pods scheduled on
//! generated nodes. Names are deterministic under `seed`. The churn submodule changes them.
//! This module writes only through the store's normal create path.

mod churn;
mod templates;

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

pub(crate) use churn::{churn_steps, spawn_churn, spawn_stamped_churn};
pub use churn::{Churn, ChurnHandle, ChurnStats};

use crate::error::ApiError;
use crate::Simulator;
use templates::{PodPlacement, Templates};

/// Errors of the workload generator (turned into [`ApiError::Internal`]).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// An embedded template is not valid JSON.
    #[error("template {name}: {source}")]
    Template {
        /// Template file name.
        name: &'static str,
        /// The parse error.
        source: serde_json::Error,
    },
}

impl From<WorkloadError> for ApiError {
    fn from(e: WorkloadError) -> Self {
        ApiError::Internal {
            message: e.to_string(),
        }
    }
}

/// What to generate. Counts are totals across namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Namespaces to spread namespaced objects over: "default", then "ns-1", "ns-2", …
    /// (created as Namespace objects). Default 1.
    pub namespaces: usize,
    /// Pods, named `web-<d>-<hash>-<suffix>`, owned by the ReplicaSet of deployment `d`
    /// (round-robin), `spec.nodeName` round-robin over the nodes.
    pub pods: usize,
    /// Deployments `web-<d>`, each with one ReplicaSet `web-<d>-<hash>`.
    pub deployments: usize,
    /// Nodes `node-<i>` (cluster-scoped).
    pub nodes: usize,
    /// Services `svc-<i>` selecting `app=web-<i mod deployments>`.
    pub services: usize,
    /// ConfigMaps `config-<i>`.
    pub configmaps: usize,
    /// FooBar custom objects `fb-<i>`; the FooBar CRD (group
    /// `k8s-openapi-tests-custom-resource-definition.com`) is registered when > 0.
    pub foobars: usize,
    /// Seed for generated name hashes and suffixes.
    pub seed: u64,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            namespaces: 1,
            pods: 0,
            deployments: 0,
            nodes: 0,
            services: 0,
            configmaps: 0,
            foobars: 0,
            seed: 0,
        }
    }
}

/// The alphabet Kubernetes uses for generated name suffixes (no vowels).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

pub(crate) fn random_suffix(rng: &mut ChaCha8Rng, len: usize) -> String {
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The name of namespace `i`.
pub fn namespace_name(i: usize) -> String {
    if i == 0 {
        "default".to_owned()
    } else {
        format!("ns-{i}")
    }
}

fn create(sim: &Simulator, obj: Value) -> Result<Value, ApiError> {
    sim.create(obj)
}

/// Creates a cheap object through the store without parsing it back; returns its uid.
fn create_fast(
    sim: &Simulator,
    api_version: &str,
    kind: &str,
    obj: Value,
) -> Result<String, ApiError> {
    let rt = sim.resource(api_version, kind)?;
    Ok(sim.inner.store().create(&rt, None, obj)?.uid.clone())
}

fn uid_of(v: &Value) -> String {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Creates everything `w` describes. Errors: 409 if a generated name already exists.
pub(crate) fn populate(sim: &Simulator, w: &Workload) -> Result<(), ApiError> {
    let t = Templates::load()?;
    let mut rng = ChaCha8Rng::seed_from_u64(w.seed);
    let namespaces = w.namespaces.max(1);
    for i in 0..namespaces {
        match create(sim, templates::namespace(&namespace_name(i))) {
            Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let ns_of = |i: usize| namespace_name(i % namespaces);
    for i in 0..w.nodes {
        create_fast(sim, "v1", "Node", templates::node(&t, &format!("node-{i}")))?;
    }
    // One owner group per deployment (at least one, so pods always have an owner chain).
    let groups = w.deployments.max(1);
    let mut owners = Vec::with_capacity(groups);
    for d in 0..groups {
        let name = format!("web-{d}");
        let hash = random_suffix(&mut rng, 10);
        let rs_name = format!("{name}-{hash}");
        let mut rs_uid = uuid::Uuid::new_v4().to_string();
        if d < w.deployments {
            let replicas = w.pods / groups + usize::from(d < w.pods % groups);
            let dep = templates::deployment(&t, &name, &ns_of(d), replicas);
            let created = create(sim, dep.clone())?;
            let rs = templates::replicaset(&dep, &rs_name, &hash, &uid_of(&created));
            rs_uid = create_fast(sim, "apps/v1", "ReplicaSet", rs)?;
        }
        owners.push((name, hash, rs_name, rs_uid, ns_of(d)));
    }
    let mut names = HashSet::new();
    for j in 0..w.pods {
        let (app, hash, rs_name, rs_uid, ns) = &owners[j % groups];
        let name = loop {
            let candidate = format!("{rs_name}-{}", random_suffix(&mut rng, 5));
            if names.insert(candidate.clone()) {
                break candidate;
            }
        };
        let node = if w.nodes == 0 {
            "node-0".to_owned()
        } else {
            format!("node-{}", j % w.nodes)
        };
        let placement = PodPlacement {
            name: &name,
            namespace: ns,
            app,
            replicaset: rs_name,
            replicaset_uid: rs_uid,
            template_hash: hash,
            node: &node,
            index: j,
        };
        create_fast(sim, "v1", "Pod", templates::pod(&t, &placement))?;
    }
    for i in 0..w.services {
        let app = format!("web-{}", i % groups);
        create_fast(
            sim,
            "v1",
            "Service",
            templates::service(&t, &format!("svc-{i}"), &ns_of(i), &app, i),
        )?;
    }
    for i in 0..w.configmaps {
        create_fast(
            sim,
            "v1",
            "ConfigMap",
            templates::named(&t.configmap, &format!("config-{i}"), Some(&ns_of(i))),
        )?;
    }
    if w.foobars > 0 {
        sim.ensure_crd(t.foobar_crd.clone())?;
        for i in 0..w.foobars {
            let obj = templates::named(&t.foobar, &format!("fb-{i}"), Some(&ns_of(i)));
            create_fast(sim, FOOBAR_API_VERSION, "FooBar", obj)?;
        }
    }
    Ok(())
}

/// apiVersion of the FooBar custom resource.
pub const FOOBAR_API_VERSION: &str = "k8s-openapi-tests-custom-resource-definition.com/v1";

/// The FooBar CustomResourceDefinition from the recordings (as POSTed there).
pub fn foobar_crd() -> Result<Value, ApiError> {
    Ok(Templates::load()?.foobar_crd)
}
