//! The environment layer's one exception: variables a kubelet writes, not a user.
//!
//! With `enableServiceLinks` on (the Pod default), the kubelet gives every container a set of
//! Docker-link variables for each Service in the Pod's namespace
//! (`pkg/kubelet/envvars/envvars.go`, `FromServices`): a Service named `kubesink-metrics` with
//! a port `metrics` 9090/TCP at 10.0.0.7 yields
//!
//! ```text
//! KUBESINK_METRICS_SERVICE_HOST=10.0.0.7
//! KUBESINK_METRICS_SERVICE_PORT=9090
//! KUBESINK_METRICS_SERVICE_PORT_METRICS=9090
//! KUBESINK_METRICS_PORT=tcp://10.0.0.7:9090
//! KUBESINK_METRICS_PORT_9090_TCP=tcp://10.0.0.7:9090
//! KUBESINK_METRICS_PORT_9090_TCP_PROTO=tcp
//! KUBESINK_METRICS_PORT_9090_TCP_PORT=9090
//! KUBESINK_METRICS_PORT_9090_TCP_ADDR=10.0.0.7
//! ```
//!
//! They carry kubesink's prefix whenever a Service's name starts with `kubesink`, and would
//! read as an unknown section (`metrics_service_host`): every Pod created after such a Service
//! would exit at start. The shipped manifests turn service links off, and this module makes
//! the loader skip them anyway, wherever they come from (an older manifest, a user's own
//! Deployment, a Service another team named `kubesink-…`).
//!
//! A variable is skipped only when both its name and its value have the kubelet's shape, and
//! its first segment (before `__`) is not a section: a configuration key always has a
//! section before `__`, so no key can be skipped, and a user's typo
//! (`KUBESINK_PIPELINE_LINGER=5s`) is still reported.

use std::net::IpAddr;
use std::sync::LazyLock;

use regex::Regex;

use super::SECTIONS;

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "KUBESINK_";

/// The names `FromServices` writes (`{SVC}` is the Service's name upper-cased, `-` → `_`;
/// `{PORT_NAME}` likewise; `{PROTO}` is TCP, UDP or SCTP), each with the shape of its value.
/// One name can have several readings (`{SVC}_PORT` of a Service `x-port-9090-tcp`, or
/// `{SVC}_PORT_9090_TCP_PORT` of `x`): a variable is a service link when one reading fits.
static SHAPES: LazyLock<Vec<(Regex, Value)>> = LazyLock::new(|| {
    [
        (r"^[A-Z0-9_]+_SERVICE_HOST$", Value::Ip),
        (r"^[A-Z0-9_]+_SERVICE_PORT(?:_[A-Z0-9_]+)?$", Value::Port),
        (r"^[A-Z0-9_]+_PORT$", Value::Url),
        (
            r"^[A-Z0-9_]+_PORT_(?P<num>[0-9]+)_(?P<proto>TCP|UDP|SCTP)$",
            Value::Url,
        ),
        (
            r"^[A-Z0-9_]+_PORT_(?P<num>[0-9]+)_(?P<proto>TCP|UDP|SCTP)_PROTO$",
            Value::Proto,
        ),
        (
            r"^[A-Z0-9_]+_PORT_(?P<num>[0-9]+)_(?P<proto>TCP|UDP|SCTP)_PORT$",
            Value::Num,
        ),
        (
            r"^[A-Z0-9_]+_PORT_(?P<num>[0-9]+)_(?P<proto>TCP|UDP|SCTP)_ADDR$",
            Value::Ip,
        ),
    ]
    .into_iter()
    // The patterns are constants: each compiles (the tests run every one).
    .filter_map(|(pattern, value)| Some((Regex::new(pattern).ok()?, value)))
    .collect()
});

/// What a service-link variable's value must look like.
#[derive(Clone, Copy)]
enum Value {
    /// The ClusterIP (`10.0.0.7`, `fd00::a`).
    Ip,
    /// A port number.
    Port,
    /// `tcp://10.0.0.7:9090`, `udp://[fd00::a]:53`; with `{PROTO}` and `{N}` in the name,
    /// that scheme and that port.
    Url,
    /// `{PROTO}` lower-cased.
    Proto,
    /// `{N}`.
    Num,
}

/// Whether the variable `name=value` is one the kubelet writes for a Service (module docs).
///
/// `name` is the whole variable name, prefix included.
#[must_use]
pub fn is_service_link(name: &str, value: &str) -> bool {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return false;
    };
    let first = rest.split("__").next().unwrap_or(rest).to_ascii_lowercase();
    if SECTIONS.contains(&first.as_str()) {
        return false;
    }
    let port = |v: &str| v.parse::<u16>().is_ok_and(|p| p > 0);
    let ip = |v: &str| v.parse::<IpAddr>().is_ok();
    SHAPES.iter().any(|(shape, kind)| {
        let Some(m) = shape.captures(name) else {
            return false;
        };
        let num = m.name("num").map(|n| n.as_str());
        let proto = m.name("proto").map(|p| p.as_str());
        match kind {
            Value::Ip => ip(value),
            Value::Port => port(value),
            Value::Proto => proto.is_some_and(|p| value.eq_ignore_ascii_case(p)),
            Value::Num => num == Some(value),
            Value::Url => {
                let Some((scheme, host_port)) = value.split_once("://") else {
                    return false;
                };
                let Some((host, p)) = host_port.rsplit_once(':') else {
                    return false;
                };
                let host = host.trim_start_matches('[').trim_end_matches(']');
                matches!(scheme, "tcp" | "udp" | "sctp")
                    && proto.is_none_or(|proto| proto.eq_ignore_ascii_case(scheme))
                    && num.is_none_or(|n| n == p)
                    && ip(host)
                    && port(p)
            }
        }
    })
}

/// The service-link variables of this process's environment (names, sorted), which the
/// loader skips; `kubesink check` notes them and `run` logs them at DEBUG.
#[must_use]
pub fn service_link_variables() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, v)| is_service_link(k, v))
        .map(|(k, _)| k)
        .collect();
    names.sort();
    names
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What the kubelet's `FromServices` writes for one Service (its code, transcribed).
    pub(crate) fn kubelet_service_env(
        service: &str,
        cluster_ip: &str,
        ports: &[(&str, u16, &str)],
    ) -> Vec<(String, String)> {
        let svc = service.replace('-', "_").to_ascii_uppercase();
        let host_port = |p: u16| {
            if cluster_ip.contains(':') {
                format!("[{cluster_ip}]:{p}")
            } else {
                format!("{cluster_ip}:{p}")
            }
        };
        let mut out = vec![
            (format!("{svc}_SERVICE_HOST"), cluster_ip.to_owned()),
            (format!("{svc}_SERVICE_PORT"), ports[0].1.to_string()),
        ];
        for (name, port, _) in ports {
            if !name.is_empty() {
                let n = name.replace('-', "_").to_ascii_uppercase();
                out.push((format!("{svc}_SERVICE_PORT_{n}"), port.to_string()));
            }
        }
        for (i, (_, port, proto)) in ports.iter().enumerate() {
            let lower = proto.to_ascii_lowercase();
            let url = format!("{lower}://{}", host_port(*port));
            if i == 0 {
                out.push((format!("{svc}_PORT"), url.clone()));
            }
            let pp = format!("{svc}_PORT_{port}_{}", proto.to_ascii_uppercase());
            out.push((pp.clone(), url));
            out.push((format!("{pp}_PROTO"), lower));
            out.push((format!("{pp}_PORT"), port.to_string()));
            out.push((format!("{pp}_ADDR"), cluster_ip.to_owned()));
        }
        out
    }

    #[test]
    fn every_variable_the_kubelet_writes_for_a_kubesink_service_is_a_service_link() {
        let services = [
            kubelet_service_env("kubesink-metrics", "10.96.0.7", &[("metrics", 9090, "TCP")]),
            kubesink_two_ports(),
            kubelet_service_env(
                "kubesink-dns",
                "fd00::a",
                &[("", 53, "UDP"), ("tcp", 53, "TCP")],
            ),
            kubelet_service_env("kubesink-sctp", "10.0.0.9", &[("x-y", 7, "SCTP")]),
        ];
        for (name, value) in services.iter().flatten() {
            assert!(is_service_link(name, value), "{name}={value}");
        }
    }

    fn kubesink_two_ports() -> Vec<(String, String)> {
        kubelet_service_env(
            "kubesink",
            "10.96.12.1",
            &[("http-metrics", 9090, "TCP"), ("grpc", 4317, "TCP")],
        )
    }

    #[test]
    fn every_shape_compiles() {
        assert_eq!(SHAPES.len(), 7);
    }

    #[test]
    fn configuration_keys_and_typos_are_not_service_links() {
        for (name, value) in [
            // Real keys: a section before `__`.
            ("KUBESINK_SERVER__PORT", "tcp://10.0.0.1:80"),
            ("KUBESINK_CLUSTER__NAME", "10.0.0.1"),
            ("KUBESINK_STATE__NATS__SERVICE_HOST", "10.0.0.1"),
            // Typos of keys: reported as unknown sections, not skipped.
            ("KUBESINK_PIPELINE_LINGER", "5s"),
            ("KUBESINK_SERVER_PORT", "9091"),
            ("KUBESINK_METRICS_SERVICE_HOST", "metrics.example"),
            ("KUBESINK_METRICS_SERVICE_PORT", "http"),
            ("KUBESINK_METRICS_PORT", "9090"),
            ("KUBESINK_METRICS_PORT_9090_TCP", "udp://10.0.0.1:9090"),
            ("KUBESINK_METRICS_PORT_9090_TCP_PORT", "9091"),
            ("KUBESINK_METRICS_PORT_9090_TCP_PROTO", "udp"),
            // Not ours.
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ] {
            assert!(!is_service_link(name, value), "{name}={value}");
        }
    }
}
