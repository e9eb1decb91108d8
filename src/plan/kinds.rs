//! The built-in kinds known offline (k8s-openapi's generally available ones): their group,
//! version, plural and scope, for the RBAC `kubesink rbac` writes (`crate::rbac`) and for the
//! warnings about a kind a built-in group version does not have (`check`, `rbac`); and the
//! nearest name to a misspelt one, which `check --online` gives for the served kinds too.

use crate::config::ResourceConfig;

/// A built-in kind: group, kind, plural and scope, from k8s-openapi.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Builtin {
    pub(crate) group: &'static str,
    pub(crate) api_version: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) namespaced: bool,
}

/// Whether a k8s-openapi resource scope is namespaced.
trait Scope {
    const NAMESPACED: bool;
}
impl Scope for k8s_openapi::NamespaceResourceScope {
    const NAMESPACED: bool = true;
}
impl Scope for k8s_openapi::ClusterResourceScope {
    const NAMESPACED: bool = false;
}

const fn entry<K: k8s_openapi::Resource>() -> Builtin
where
    K::Scope: Scope,
{
    Builtin {
        group: K::GROUP,
        api_version: K::API_VERSION,
        kind: K::KIND,
        plural: K::URL_PATH_SEGMENT,
        namespaced: <K::Scope as Scope>::NAMESPACED,
    }
}

/// The listable built-in kinds, one version each (RBAC does not name versions): those
/// generally available since Kubernetes 1.33 (k8s-openapi's earliest).
pub(crate) static BUILTINS: &[Builtin] = {
    use k8s_openapi::api::{
        admissionregistration, apps, autoscaling, batch, certificates, coordination, core,
        discovery, events, flowcontrol, networking, node, policy, rbac, scheduling, storage,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration;
    &[
        entry::<admissionregistration::v1::MutatingWebhookConfiguration>(),
        entry::<admissionregistration::v1::ValidatingAdmissionPolicy>(),
        entry::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(),
        entry::<admissionregistration::v1::ValidatingWebhookConfiguration>(),
        entry::<apiextensions::v1::CustomResourceDefinition>(),
        entry::<apiregistration::v1::APIService>(),
        entry::<apps::v1::ControllerRevision>(),
        entry::<apps::v1::DaemonSet>(),
        entry::<apps::v1::Deployment>(),
        entry::<apps::v1::ReplicaSet>(),
        entry::<apps::v1::StatefulSet>(),
        entry::<autoscaling::v2::HorizontalPodAutoscaler>(),
        entry::<batch::v1::CronJob>(),
        entry::<batch::v1::Job>(),
        entry::<certificates::v1::CertificateSigningRequest>(),
        entry::<coordination::v1::Lease>(),
        entry::<core::v1::ComponentStatus>(),
        entry::<core::v1::ConfigMap>(),
        entry::<core::v1::Endpoints>(),
        entry::<core::v1::Event>(),
        entry::<core::v1::LimitRange>(),
        entry::<core::v1::Namespace>(),
        entry::<core::v1::Node>(),
        entry::<core::v1::PersistentVolume>(),
        entry::<core::v1::PersistentVolumeClaim>(),
        entry::<core::v1::Pod>(),
        entry::<core::v1::PodTemplate>(),
        entry::<core::v1::ReplicationController>(),
        entry::<core::v1::ResourceQuota>(),
        entry::<core::v1::Secret>(),
        entry::<core::v1::Service>(),
        entry::<core::v1::ServiceAccount>(),
        entry::<discovery::v1::EndpointSlice>(),
        entry::<events::v1::Event>(),
        entry::<flowcontrol::v1::FlowSchema>(),
        entry::<flowcontrol::v1::PriorityLevelConfiguration>(),
        entry::<networking::v1::IPAddress>(),
        entry::<networking::v1::Ingress>(),
        entry::<networking::v1::IngressClass>(),
        entry::<networking::v1::NetworkPolicy>(),
        entry::<networking::v1::ServiceCIDR>(),
        entry::<node::v1::RuntimeClass>(),
        entry::<policy::v1::PodDisruptionBudget>(),
        entry::<rbac::v1::ClusterRole>(),
        entry::<rbac::v1::ClusterRoleBinding>(),
        entry::<rbac::v1::Role>(),
        entry::<rbac::v1::RoleBinding>(),
        entry::<scheduling::v1::PriorityClass>(),
        entry::<storage::v1::CSIDriver>(),
        entry::<storage::v1::CSINode>(),
        entry::<storage::v1::CSIStorageCapacity>(),
        entry::<storage::v1::StorageClass>(),
        entry::<storage::v1::VolumeAttachment>(),
    ]
};

/// What is wrong with `kind` in `api_version` when that is a built-in group version of
/// [`BUILTINS`] (its generally available kinds, known offline): a kind it does not have,
/// with its kinds and the nearest one (kinds are case-sensitive). `None` when the kind is
/// one of them, or the group version is not in the table (a CRD, a beta API): only the
/// server can tell those (`check --online`).
pub fn unknown_builtin_kind(api_version: &str, kind: &str) -> Option<String> {
    let kinds: Vec<&str> = BUILTINS
        .iter()
        .filter(|b| b.api_version == api_version)
        .map(|b| b.kind)
        .collect();
    if kinds.is_empty() || kinds.contains(&kind) {
        return None;
    }
    let near = nearest(kind, kinds.iter().copied())
        .map(|k| format!("; did you mean {k:?}?"))
        .unwrap_or_default();
    Some(format!(
        "{api_version} has no kind {kind:?} (its kinds: {}){near}",
        kinds.join(", ")
    ))
}

/// The built-in kind `kind` of `group`, if k8s-openapi knows it.
pub(crate) fn builtin(group: &str, kind: &str) -> Option<Builtin> {
    BUILTINS
        .iter()
        .find(|b| b.group == group && b.kind == kind)
        .copied()
}

/// A warning for each of `resources` (the entries under the key `{prefix}resources`) whose
/// kind a built-in group version does not have ([`unknown_builtin_kind`]): its watch would
/// fail with 404 Not Found, and RBAC would grant a resource that does not exist.
pub fn kind_warnings(resources: &[ResourceConfig], prefix: &str) -> Vec<String> {
    resources
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            unknown_builtin_kind(&r.api_version, &r.kind).map(|why| {
                format!(
                    "{prefix}resources.{i} ({} {}): {why}",
                    r.api_version, r.kind
                )
            })
        })
        .collect()
}

/// The candidate nearest to `wanted`: one equal but for case, else the one at the smallest
/// Damerau-Levenshtein distance (case ignored) when that is small for its length (about a
/// third of it: `Pdo` → `Pod`, `Deploymnet` → `Deployment`, never `Foo` → `Pod`). Ties go to
/// the first candidate.
pub(crate) fn nearest<'a>(
    wanted: &str,
    candidates: impl Iterator<Item = &'a str> + Clone,
) -> Option<&'a str> {
    let lower = wanted.to_lowercase();
    if let Some(same) = candidates.clone().find(|c| c.to_lowercase() == lower) {
        return Some(same);
    }
    let limit = wanted.chars().count().div_ceil(3).max(1);
    candidates
        .map(|c| (strsim::damerau_levenshtein(&lower, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}
