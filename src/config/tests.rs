//! Configuration tests: layering, error reporting with key and source, and the reference
//! file `config/kubesink.toml` kept in step with the structs.

#![allow(clippy::result_large_err)] // figment::Jail fixes the closure type

use std::path::Path;

use figment::Jail;

use super::*;

/// The loader as `run` and `check` use it: expressions compiled (`crate::plan`).
fn load(file: Option<&Path>) -> Result<Config, ConfigErrors> {
    super::load(file, &crate::plan::Compiled)
}

fn errors_of(file: Option<&Path>) -> Vec<String> {
    match load(file) {
        Ok(c) => panic!("expected errors, got {c:?}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn env_overrides_file_and_file_overrides_defaults() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "k.toml",
            "[cluster]\nname = \"from-file\"\n[pipeline]\nmax_pending = 7\nlinger = \"5s\"\n",
        )?;
        jail.set_env("KUBESINK_PIPELINE__LINGER", "250ms");
        let c = load(Some(Path::new("k.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.cluster.name, "from-file");
        assert_eq!(c.pipeline.max_pending, 7);
        assert_eq!(
            c.pipeline.linger.get(),
            std::time::Duration::from_millis(250)
        );
        assert_eq!(c.pipeline.max_batch_events, 500, "default kept");
        assert_eq!(c.resources.len(), 4, "default resources");
        jail.set_env("KUBESINK_CLUSTER__NAME", "from-env");
        let c = load(Some(Path::new("k.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.cluster.name, "from-env");
        Ok(())
    });
}

/// The kubelet's service-link variables of the shipped Services (and of any Service named
/// `kubesink…`) are not configuration: read as such they would crash every Pod with
/// `metrics_service_host: unknown section`.
#[test]
fn kubelet_service_link_variables_are_not_configuration() {
    use super::env::tests::kubelet_service_env;
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
        let services = [
            kubelet_service_env("kubesink-metrics", "10.96.0.7", &[("metrics", 9090, "TCP")]),
            kubelet_service_env(
                "kubesink",
                "10.96.0.8",
                &[("", 9090, "TCP"), ("a-b", 81, "UDP")],
            ),
            kubelet_service_env("kubesink-nats", "fd00::12", &[("client", 4222, "TCP")]),
        ];
        for (name, value) in services.iter().flatten() {
            jail.set_env(name, value);
        }
        let c = load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.cluster.name, "prod");
        assert_eq!(super::service_link_variables().len(), 8 + 12 + 8);
        // A typo of a key in the same environment is still reported.
        jail.set_env("KUBESINK_PIPELINE_LINGER", "5s");
        let errs = errors_of(None);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("pipeline_linger: unknown section"),
            "{errs:?}"
        );
        Ok(())
    });
}

#[test]
fn bad_duration_from_env_names_key_and_variable() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
        jail.set_env("KUBESINK_PIPELINE__LINGER", "5 parsecs");
        let errs = errors_of(None);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("pipeline.linger: invalid duration \"5 parsecs\"")
                && errs[0].ends_with("(from env KUBESINK_PIPELINE__LINGER)"),
            "{}",
            errs[0]
        );
        Ok(())
    });
}

#[test]
fn bad_values_in_file_name_key_and_file() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "bad.toml",
            "[cluster]\nname = \"prod\"\nlabl = \"x\"\n[pipeline]\nmax_pending_bytes = \"lots\"\n",
        )?;
        let errs = errors_of(Some(Path::new("bad.toml")));
        let all = errs.join("\n");
        assert!(
            all.contains("pipeline.max_pending_bytes: invalid size \"lots\""),
            "{all}"
        );
        assert!(all.contains("cluster.labl: unknown key \"labl\""), "{all}");
        assert!(
            all.contains("(from file ") && all.contains("bad.toml)"),
            "{all}"
        );
        Ok(())
    });
}

/// A resource filter that does not compile is reported by `check` (and refused by
/// `run`) naming the key, the file, the expression and the position; a variable a resource
/// filter does not have is named too.
#[test]
fn a_bad_filter_names_its_key_its_file_and_the_position() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "f.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nfilter = \"object.status.phase ==\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Node\"\nfilter = \"op == 'added'\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Service\"\nfilter = 'ns == \"a\"'\n[[resources]]\napi_version = \"apps/v1\"\nkind = \"Deployment\"\npayload = \"metadata\"\nfilter = \"object.spec.replicas > 0\"\n",
        )?;
        let all = errors_of(Some(Path::new("f.toml"))).join("\n");
        assert!(
            all.contains("resources.0.filter: \"object.status.phase ==\": line 1, column "),
            "{all}"
        );
        assert!(
            all.contains("resources.1.filter: \"op == 'added'\": unknown variable \"op\""),
            "{all}"
        );
        assert!(!all.contains("resources.2"), "a good filter: {all}");
        assert!(
            all.contains("resources.3.filter: \"object.spec.replicas > 0\" reads object.spec but payload = \"metadata\""),
            "{all}"
        );
        assert!(all.contains("f.toml)"), "{all}");
        Ok(())
    });
}

#[test]
fn a_bad_sink_filter_names_its_sink_key_file_and_position() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "s.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"stdout\"\nname = \"a\"\nfilter = 'ns == \"payments\" &&'\n[[sinks]]\ntype = \"stdout\"\nname = \"b\"\nfilter = 'op == \"deleted\" || changed.exists(p, p.startsWith(\"spec\"))'\n[[sinks]]\ntype = \"stdout\"\nname = \"c\"\nfilter = 'opp == 1'\n",
        )?;
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("sinks.0.filter: \"ns == \\\"payments\\\" &&\": line 1, column "),
            "{all}"
        );
        assert!(
            !all.contains("sinks.1"),
            "op and changed are a sink filter's: {all}"
        );
        assert!(
            all.contains("sinks.2.filter: \"opp == 1\": unknown variable \"opp\"; a sink's filter has object, cluster, kind, ns, op, changed"),
            "{all}"
        );
        assert!(all.contains("s.toml)"), "{all}");
        Ok(())
    });
}

#[test]
fn several_bad_keys_in_one_section_and_env_are_all_reported() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "two.toml",
            "[cluster]\nname = \"p\"\nlabl = \"x\"\n[pipeline]\nlingr = \"1s\"\nmax_batch_bytes = \"huge\"\n[[resources]]\napi_version = \"v1\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\npayload = \"everything\"\n",
        )?;
        jail.set_env("KUBESINK_PIPELINE__LINGER", "5 parsecs");
        jail.set_env("KUBESINK_PIPELINE__MAX_PENDING", "many");
        let all = errors_of(Some(Path::new("two.toml"))).join("\n");
        for want in [
            "cluster.labl: unknown key",
            "pipeline.lingr: unknown key",
            "pipeline.max_batch_bytes: invalid size \"huge\"",
            "pipeline.linger: invalid duration \"5 parsecs\"",
            "(from env KUBESINK_PIPELINE__LINGER)",
            "pipeline.max_pending: ",
            "(from env KUBESINK_PIPELINE__MAX_PENDING)",
            "resources.1.payload: \"everything\" is not one of \"full\", \"metadata\" or \"fields\"",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        Ok(())
    });
}

#[test]
fn a_missing_cluster_name_says_it_is_not_set() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let all = errors_of(None).join("\n");
        assert!(
            all.contains("cluster.name: required") && all.contains("(from default: not set"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn every_problem_is_reported_at_once() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "many.toml",
            r#"
[cluster]
label = "bad label!"
[pipeline]
max_pending = 0
[[resources]]
api_version = "v1"
kind = "Pod"
payload = "fields"
[[resources]]
api_version = "a/b/c"
kind = "Foo"
drop = ["status"]
[[sinks]]
type = "stdout"
[[sinks]]
type = "stdout"
"#,
        )?;
        let errs = errors_of(Some(Path::new("many.toml")));
        let all = errs.join("\n");
        for want in [
            "cluster.name: required",
            "cluster.label: \"bad label!\"",
            "pipeline.max_pending: must be at least 1",
            "resources.0.fields: payload = \"fields\" needs",
            "resources.1.api_version: \"a/b/c\" is not an apiVersion",
            "resources.1.drop.0: \"status\" is not a JSON pointer",
            "sinks.1.name: sink name \"stdout\" is used twice",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert_eq!(errs.len(), 7, "{all}");
        Ok(())
    });
}

#[test]
fn change_paths_and_ignored_paths_are_checked_and_named_by_key() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "changes.toml",
            r#"
[cluster]
name = "p"
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
change_paths = ["spec.replicas", "spec..[", "spec.replicas"]
ignore_changes = ["status[?"]
[[resources]]
api_version = "v1"
kind = "Pod"
change_paths = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
ignore_changes = ["status"]
change_values = ["spec["]
change_value_max_bytes = 0
updates = false
[[resources]]
api_version = "v1"
kind = "Service"
change_paths = ["spec.ports[*].port", "metadata.labels['app.kubernetes.io/name']"]
ignore_changes = ["status", "metadata.annotations"]
change_values = ["spec.type", "spec.ports[*].port"]
change_value_max_bytes = "1KiB"
[[resources]]
api_version = "v1"
kind = "ConfigMap"
change_paths = ["a", "b", "c", "d", "e", "f", "g", "h"]
ignore_changes = ["status"]
"#,
        )?;
        let errs = errors_of(Some(Path::new("changes.toml")));
        let all = errs.join("\n");
        for want in [
            "resources.0.change_paths.1: \"spec..[\" is not a JSONPath (RFC 9535; parsed as \"$.spec..[\"",
            "resources.0.change_paths.2: \"spec.replicas\" is listed twice",
            "resources.0.ignore_changes.0: \"status[?\" is not a JSONPath",
            "resources.1.change_paths: 9 paths; at most 7",
            "resources.1.ignore_changes: only applies with updates = true",
            "resources.1.change_values.0: \"spec[\" is not a JSONPath",
            "resources.1.change_value_max_bytes: 0 bytes; 1 byte to 64 KiB",
            "resources.1.change_paths: only applies with updates = true",
            "resources.1.change_values: only applies with updates = true",
            "resources.3.change_paths: 8 paths; at most 7 (each keeps a 16-bit fingerprint per object; with ignore_changes one slot is theirs)",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert_eq!(errs.len(), 10, "the Service's paths are fine:\n{all}");
        Ok(())
    });
}

#[test]
fn enrich_gives_a_node_to_pods_with_their_spec_and_to_events_only() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "enrich.toml",
            r#"
[cluster]
name = "p"
[[resources]]
api_version = "v1"
kind = "Pod"
payload = "metadata"
enrich = ["owner", "node"]
[[resources]]
api_version = "apps/v1"
kind = "ReplicaSet"
enrich = ["node"]
[[resources]]
api_version = "events.k8s.io/v1"
kind = "Event"
mode = "events"
enrich = ["owner", "node"]
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
payload = "metadata"
enrich = ["owner"]
"#,
        )?;
        let errs = errors_of(Some(Path::new("enrich.toml")));
        let all = errs.join(
            "
",
        );
        for want in [
            "resources.0.enrich: \"node\" is read from the Pod's spec.nodeName, which payload = \"metadata\" does not read",
            "resources.1.enrich: \"node\" is a Pod's (spec.nodeName) or an Event's regarding Pod's, not apps/v1 ReplicaSet's",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert!(all.contains("enrich.toml"), "{all}");
        assert_eq!(
            errs.len(),
            2,
            "the Events and the Deployments are fine:\n{all}"
        );
        // A value enrich does not know, named with its key and file.
        jail.create_file(
            "unknown.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nenrich = [\"zone\"]\n",
        )?;
        let all = errors_of(Some(Path::new("unknown.toml"))).join("\n");
        assert!(
            all.contains("enrich")
                && all.contains("zone")
                && all.contains("owner")
                && all.contains("unknown.toml"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn events_mode_takes_events_and_none_of_the_options_that_shape_an_objects_state() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "events.toml",
            r#"
[cluster]
name = "p"
[[resources]]
api_version = "events.k8s.io/v1"
kind = "Event"
mode = "events"
since = "all"
reason_rate_limit = 0
[[resources]]
api_version = "v1"
kind = "Event"
mode = "events"
since = "10m"
send_deleted = true
reason_rate_limit = 20
filter = 'object.type == "Warning"'
[[resources]]
api_version = "v1"
kind = "Pod"
mode = "events"
payload = "metadata"
change_paths = ["spec"]
updates = false
[[resources]]
api_version = "apps/v1"
kind = "Deployment"
since = "5m"
send_deleted = true
reason_rate_limit = 10
"#,
        )?;
        let errs = errors_of(Some(Path::new("events.toml")));
        let all = errs.join("\n");
        for want in [
            "resources.2.mode: mode = \"events\" follows Kubernetes Events, not v1 Pod: use api_version = \"events.k8s.io/v1\" (or \"v1\") and kind = \"Event\"",
            "resources.2.payload: not used with mode = \"events\"",
            "resources.2.change_paths: not used with mode = \"events\"",
            "resources.2.updates: not used with mode = \"events\"",
            "resources.3.since: only applies with mode = \"events\"",
            "resources.3.send_deleted: only applies with mode = \"events\"",
            "resources.3.reason_rate_limit: only applies with mode = \"events\"",
            "resources.0.reason_rate_limit: must be at least 1",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert!(all.contains("events.toml"), "{all}");
        // And the objects' own rule: change_paths with updates = false.
        assert_eq!(errs.len(), 9, "the second Event entry is fine:\n{all}");
        jail.create_file(
            "since.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Event\"\nmode = \"events\"\nsince = \"yesterday\"\n",
        )?;
        let all = errors_of(Some(Path::new("since.toml"))).join("\n");
        assert!(
            all.contains("resources")
                && all.contains("since")
                && all.contains("\"all\" for every Event"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn unknown_sink_type_and_unknown_top_level_key_are_errors() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "s.toml",
            "[cluster]\nname = \"p\"\n[[sinks]]\ntype = \"carrier-pigeon\"\n",
        )?;
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(all.contains("carrier-pigeon"), "{all}");
        jail.create_file("t.toml", "[clustr]\nname = \"p\"\n")?;
        let all = errors_of(Some(Path::new("t.toml"))).join("\n");
        assert!(
            all.contains("clustr: unknown section \"clustr\" (did you mean \"cluster\"?)"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn state_settings_are_checked_with_key_and_source() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "s.toml",
            "[cluster]\nname = \"p\"\n[state]\nbackend = \"file\"\ninterval = \"0s\"\n",
        )?;
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.path: required with state.backend = \"file\"")
                && all.contains("state.interval: must be greater than zero (from file"),
            "{all}"
        );
        jail.set_env("KUBESINK_STATE__BACKEND", "nats");
        jail.set_env("KUBESINK_STATE__NATS__BUCKET", "no.dots");
        jail.set_env("KUBESINK_STATE__NATS__REPLICAS", "9");
        jail.set_env("KUBESINK_STATE__INTERVAL", "1m");
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.nats.bucket: \"no.dots\" is not a bucket name")
                && all.contains("(from env KUBESINK_STATE__NATS__BUCKET)")
                && all.contains("state.nats.replicas: must be between 1 and 5"),
            "{all}"
        );
        jail.set_env("KUBESINK_STATE__BACKEND", "disk");
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.backend: \"disk\" is not one of"),
            "{all}"
        );
        jail.set_env("KUBESINK_STATE__BACKEND", "file");
        // A path that cannot be the state file: a directory, or in a directory that is not.
        jail.set_env("KUBESINK_STATE__PATH", ".");
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.path: . is a directory")
                && all.contains("(from env KUBESINK_STATE__PATH)"),
            "{all}"
        );
        jail.set_env("KUBESINK_STATE__PATH", "no/such/dir/state");
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.path: the directory no/such/dir does not exist"),
            "{all}"
        );
        // (The [state.nats] settings above would be an error with the file backend.)
        jail.clear_env();
        jail.set_env("KUBESINK_STATE__BACKEND", "file");
        jail.set_env("KUBESINK_STATE__INTERVAL", "1m");
        jail.set_env("KUBESINK_STATE__PATH", "state");
        jail.set_env("KUBESINK_PIPELINE__SYNC_MARKERS", "true");
        let c = load(Some(Path::new("s.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.state.backend, StateBackend::File);
        assert_eq!(c.state.interval.get(), std::time::Duration::from_secs(60));
        assert!(c.pipeline.sync_markers);
        Ok(())
    });
}

#[test]
fn malformed_api_versions_are_rejected_naming_the_key_and_the_file() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        for bad in [
            "", "/v1", "v1/", "/", "//v1", "a/b/c", "apps//v1", " v1", "v1 ", "\tv1", "apps/ v1",
            "ap ps/v1", "V1", "Apps/v1", ".apps/v1", "apps./v1", "apps/v1/",
        ] {
            jail.create_file(
                "r.toml",
                &format!(
                    "[cluster]\nname = \"p\"\n[[resources]]\napi_version = {bad:?}\nkind = \"Secret\"\n"
                ),
            )?;
            let errs = errors_of(Some(Path::new("r.toml")));
            assert!(
                errs.iter()
                    .any(|e| e.starts_with("resources.0.api_version: ")
                        && e.contains("is not an apiVersion")
                        && e.ends_with("r.toml)")),
                "{bad:?}: {errs:?}"
            );
        }
        for good in [
            "v1",
            "apps/v1",
            "example.com/v1alpha1",
            "k8s-openapi-tests-custom-resource-definition.com/v1",
            "autoscaling/v2",
        ] {
            jail.create_file(
                "r.toml",
                &format!(
                    "[cluster]\nname = \"p\"\n[[resources]]\napi_version = {good:?}\nkind = \"Foo\"\n"
                ),
            )?;
            load(Some(Path::new("r.toml"))).map_err(|e| format!("{good:?}: {e}"))?;
        }
        Ok(())
    });
}

#[test]
fn a_state_location_without_a_backend_is_an_error_naming_the_backend_to_set() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let name = "[cluster]\nname = \"p\"\n";
        // (file contents, environment variable, key reported)
        let cases = [
            ("[state]\npath = \"state\"\n", None, "state.path: "),
            (
                "[state]\nbackend = \"none\"\npath = \"state\"\n",
                None,
                "state.path: ",
            ),
            ("", Some(("KUBESINK_STATE__PATH", "state")), "state.path: "),
            ("[state]\npath = \"\"\n", None, "state.path: "),
            (
                "[state.nats]\nbucket = \"KUBESINK_STATE\"\n",
                None,
                "state.nats.bucket: ",
            ),
            (
                "[state.nats.auth]\ntoken = \"t\"\n",
                None,
                "state.nats.auth.token: ",
            ),
            (
                "",
                Some(("KUBESINK_STATE__NATS__SERVERS", "[\"nats://n:4222\"]")),
                "state.nats.servers: ",
            ),
        ];
        for (toml, env, key) in cases {
            let nats = key.starts_with("state.nats");
            if nats && !cfg!(feature = "nats") {
                continue;
            }
            let fix = if nats {
                "state.backend = \"nats\""
            } else {
                "state.backend = \"file\""
            };
            jail.clear_env();
            jail.create_file("s.toml", &format!("{name}{toml}"))?;
            if let Some((k, v)) = env {
                jail.set_env(k, v);
            }
            let source = match env {
                Some((k, _)) => format!("(from env {k})"),
                None => "s.toml)".to_owned(),
            };
            let errs = errors_of(Some(Path::new("s.toml")));
            assert!(
                errs.iter()
                    .any(|e| e.starts_with(key) && e.contains(fix) && e.ends_with(&source)),
                "{toml:?} {env:?}: {errs:?}"
            );
        }
        // With the backend set, the same settings load.
        jail.clear_env();
        jail.create_file(
            "s.toml",
            &format!("{name}[state]\nbackend = \"file\"\npath = \"state\"\n"),
        )?;
        load(Some(Path::new("s.toml"))).map_err(|e| e.to_string())?;
        jail.set_env("KUBESINK_STATE__PATH", "state");
        jail.set_env("KUBESINK_STATE__BACKEND", "file");
        jail.create_file("s.toml", name)?;
        load(Some(Path::new("s.toml"))).map_err(|e| e.to_string())?;
        Ok(())
    });
}

/// `[state.kafka]`: its connection is a Kafka sink's (named, or the only one) or its own, in
/// every spelling (file, env); every way to get it wrong is named with its key and source, and
/// a `[state.kafka]` setting under another backend is an error.
#[cfg(feature = "kafka")]
#[test]
fn the_kafka_state_takes_a_sinks_connection_or_its_own_and_every_mistake_is_named() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let sink = |name: &str, servers: &str| {
            format!("[[sinks]]\ntype = \"kafka\"\nname = \"{name}\"\nbootstrap_servers = \"{servers}\"\n[sinks.security]\nprotocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\nsasl_password = \"s3cret-pw\"\n")
        };
        let head = "[cluster]\nname = \"p\"\n";
        let kafka = "[state]\nbackend = \"kafka\"\n";
        let stdout = "[[sinks]]\ntype = \"stdout\"\n";
        // (file, env, Ok(connection source and bootstrap.servers) | Err(key, words, source))
        type Want =
            Result<(&'static str, &'static str), (&'static str, &'static str, &'static str)>;
        type Case = (String, Option<(&'static str, &'static str)>, Want);
        let cases: Vec<Case> = vec![
            (format!("{head}{kafka}{}", sink("k", "a:9093")), None, Ok(("sink \"k\"", "a:9093"))),
            (
                format!("{head}{kafka}[state.kafka]\nsink = \"two\"\n{}{}", sink("one", "a:1"), sink("two", "b:2")),
                None,
                Ok(("sink \"two\"", "b:2")),
            ),
            (
                format!("{head}{kafka}{}{}", sink("one", "a:1"), sink("two", "b:2")),
                Some(("KUBESINK_STATE__KAFKA__SINK", "one")),
                Ok(("sink \"one\"", "a:1")),
            ),
            (
                format!("{head}{kafka}{stdout}"),
                Some(("KUBESINK_STATE__KAFKA__BOOTSTRAP_SERVERS", "own:9092")),
                Ok(("state.kafka.bootstrap_servers", "own:9092")),
            ),
            (
                format!("{head}{kafka}{stdout}"),
                None,
                Err(("state.kafka.bootstrap_servers", "no [[sinks]] entry of type \"kafka\"", "")),
            ),
            (
                format!("{head}{kafka}{}{}", sink("one", "a:1"), sink("two", "b:2")),
                None,
                Err(("state.kafka.sink", "required with several Kafka sinks", "")),
            ),
            (
                format!("{head}{kafka}[state.kafka]\nsink = \"nope\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.sink", "\"nope\" is not the name of a [[sinks]] entry of type \"kafka\" (Kafka sinks: \"k\")", "s.toml)")),
            ),
            (
                format!("{head}{kafka}[state.kafka]\nsink = \"k\"\nbootstrap_servers = \"x:1\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.bootstrap_servers", "together with state.kafka.sink", "s.toml)")),
            ),
            (
                format!("{head}{kafka}[state.kafka]\ntopic = \"kubesink.{{cluster}}\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.topic", "is a template", "s.toml)")),
            ),
            (
                format!("{head}{kafka}[state.kafka]\nchunk_bytes = \"10B\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.chunk_bytes", "at least 1KiB", "s.toml)")),
            ),
            (
                format!("{head}{kafka}{}", sink("k", "a:1")),
                Some(("KUBESINK_STATE__KAFKA__PARTITIONS", "0")),
                Err(("state.kafka.partitions", "at least 1", "(from env KUBESINK_STATE__KAFKA__PARTITIONS)")),
            ),
            (
                format!("{head}{kafka}[state.kafka]\ntopic = \"kubesink.p\"\n[[sinks]]\ntype = \"kafka\"\nname = \"k\"\nbootstrap_servers = \"a:1\"\ntopic = \"kubesink.{{cluster}}\"\n"),
                None,
                Err(("state.kafka.topic", "is also the topic of sink \"k\"", "s.toml)")),
            ),
            (
                format!("{head}{kafka}[state.kafka.librdkafka]\n\"no.such.prop\" = \"1\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.librdkafka.\"no.such.prop\"", "librdkafka has no such property", "s.toml)")),
            ),
            (
                format!("{head}{kafka}[state.kafka.librdkafka]\n\"bootstrap.servers\" = \"x:1\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.librdkafka.\"bootstrap.servers\"", "set state.kafka.bootstrap_servers", "s.toml)")),
            ),
            (
                format!("{head}{kafka}[state.nats]\nbucket = \"B\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.nats.bucket", "state.backend is \"kafka\", so it would be ignored", "s.toml)")),
            ),
            (
                format!("{head}[state.kafka]\nsink = \"k\"\n{}", sink("k", "a:1")),
                None,
                Err(("state.kafka.sink", "state.backend is \"none\"", "s.toml)")),
            ),
            (
                format!("{head}[state]\nbackend = \"file\"\npath = \"state\"\n{}", sink("k", "a:1")),
                Some(("KUBESINK_STATE__KAFKA__TOPIC", "t")),
                Err(("state.kafka.topic", "state.backend is \"file\"", "(from env KUBESINK_STATE__KAFKA__TOPIC)")),
            ),
        ];
        for (toml, env, want) in cases {
            jail.clear_env();
            jail.create_file("s.toml", &toml)?;
            if let Some((k, v)) = env {
                jail.set_env(k, v);
            }
            match want {
                Ok((source, servers)) => {
                    let c = load(Some(Path::new("s.toml"))).map_err(|e| format!("{toml}: {e}"))?;
                    let conn = c
                        .state
                        .kafka
                        .connection(kubesink_kafka::state::kafka_sinks(
                            &c.state_context(String::new()).sinks,
                        ))
                        .map_err(|e| format!("{e:?}"))?;
                    assert_eq!(conn.source, source, "{toml}");
                    assert_eq!(conn.properties.get("bootstrap.servers"), Some(servers));
                    if source.starts_with("sink") {
                        // The sink's security comes along; its producer tuning does not.
                        assert_eq!(conn.properties.get("sasl.password"), Some("s3cret-pw"));
                        assert_eq!(conn.properties.get("linger.ms"), None);
                        assert!(!format!("{:?}", conn.properties).contains("s3cret-pw"));
                    }
                }
                Err((key, words, source)) => {
                    let errs = errors_of(Some(Path::new("s.toml")));
                    assert!(
                        errs.iter().any(|e| e.starts_with(&format!("{key}: "))
                            && e.contains(words)
                            && e.ends_with(source)),
                        "{toml} {env:?}: {errs:?}"
                    );
                }
            }
        }
        Ok(())
    });
}

#[test]
fn a_named_config_file_that_is_missing_is_an_error() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let all = errors_of(Some(Path::new("/nonexistent/kubesink.toml"))).join("\n");
        assert!(
            all.contains("/nonexistent/kubesink.toml does not exist"),
            "{all}"
        );
        Ok(())
    });
}

/// Every leaf key of the configuration, from a value with every optional field set.
fn all_keys() -> Vec<String> {
    let mut res = ResourceConfig::new("v1", "Pod");
    res.namespaces = vec!["default".into()];
    res.label_selector = Some("a=b".into());
    res.field_selector = Some("metadata.name=x".into());
    res.fields = vec!["/spec".into()];
    res.drop = vec!["/status".into()];
    res.plural = Some("pods".into());
    res.mode = super::ResourceMode::Events;
    res.since = Some(super::Since::DEFAULT);
    res.send_deleted = true;
    let mut c = Config {
        resources: vec![res],
        ..Default::default()
    };
    c.cluster.kubeconfig = Some("/k".into());
    c.cluster.context = Some("ctx".into());
    c.clusters = vec![super::ClusterEntry {
        name: "a".into(),
        kubeconfig: Some("/k".into()),
        context: Some("ctx".into()),
        resources: None,
        shards: 1,
    }];
    c.leader_election.lease_namespace = Some("ns".into());
    c.leader_election.identity = Some("me".into());
    c.leader_election.cluster = Some("a".into());
    c.state.path = Some("/state".into());
    #[cfg(feature = "nats")]
    {
        let n = &mut c.state.nats;
        n.object = Some("o".into());
        n.auth.user = Some("u".into());
        n.auth.password = Some(kubesink_core::Secret::new("p"));
        n.auth.token = Some(kubesink_core::Secret::new("t"));
        n.auth.nkey_seed = Some(kubesink_core::Secret::new("s"));
        n.auth.credentials_file = Some("/c".into());
        n.tls.ca_file = Some("/ca".into());
        n.tls.cert_file = Some("/cert".into());
        n.tls.key_file = Some("/key".into());
    }
    let v = serde_json::to_value(&c).unwrap();
    let mut keys = Vec::new();
    fn walk(prefix: &str, v: &serde_json::Value, keys: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    walk(&format!("{prefix}.{k}"), x, keys)
                }
            }
            serde_json::Value::Array(a) if a.first().is_some_and(|x| x.is_object()) => {
                walk(prefix, &a[0], keys)
            }
            _ => keys.push(prefix.trim_start_matches('.').to_owned()),
        }
    }
    walk("", &v, &mut keys);
    // Every option of every sink type, from a fully populated entry of each registered one.
    for example in SinkConfig::reference_examples() {
        walk("sinks", &serde_json::to_value(&example).unwrap(), &mut keys);
    }
    keys
}

#[test]
fn a_bad_sink_format_names_the_entry_key_and_source() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "f.toml",
            "[cluster]\nname = \"p\"\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"b:9092\"\nformat = \"xml\"\n[[sinks]]\ntype = \"stdout\"\nformat = \"cloudevents\"\n",
        )?;
        let errs = errors_of(Some(Path::new("f.toml")));
        let all = errs.join("\n");
        for want in [
            "sinks.0.format: unknown value \"xml\"; expected \"json\" or \"cloudevents\" or \"cloudevents-structured\" (from file ",
            "sinks.1.format: unknown value \"cloudevents\"; expected \"json\" or \"cloudevents-structured\" (from file ",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        jail.set_env("KUBESINK_CLUSTER__NAME", "p");
        jail.create_file(
            "ok.toml",
            "[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"b:9092\"\nformat = \"cloudevents\"\n[[sinks]]\ntype = \"nats\"\nformat = \"cloudevents-structured\"\n[[sinks]]\ntype = \"stdout\"\nformat = \"cloudevents-structured\"\n",
        )?;
        let c = load(Some(Path::new("ok.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.sinks.len(), 3);
        Ok(())
    });
}

#[test]
fn reference_file_parses_and_documents_every_option() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/kubesink.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    Jail::expect_with(|jail| {
        jail.clear_env();
        let c = load(Some(&path)).map_err(|e| e.to_string())?;
        assert_eq!(
            c.pipeline,
            PipelineConfig::default(),
            "the file shows the defaults"
        );
        Ok(())
    });
    // Each option appears as `key =` (set or commented out) in the file.
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.trim_start_matches(['#', ' ']).to_owned())
        .collect();
    for key in all_keys() {
        let leaf = key.rsplit('.').next().unwrap();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{leaf} =")) || l.starts_with(&format!("{leaf}="))),
            "config/kubesink.toml does not document {key}"
        );
    }
}

// ---- fuzzing (proptest): no panic, every error names key and source, the source named is
// ---- what was actually set. Corpus: fuzz/corpus/config_toml/. ----

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    const SECTIONS: &[&str] = &[
        "[cluster]",
        "[pipeline]",
        "[watch]",
        "[server]",
        "[log]",
        "[[resources]]",
        "[[sinks]]",
        "[sinks.auth]",
        "[sinks.stream]",
        "[sinks.security]",
        "[sinks.librdkafka]",
        "[clustr]",
        "[pipeline.inner]",
    ];
    const KEYS: &[&str] = &[
        "name",
        "label",
        "kubeconfig",
        "linger",
        "max_pending",
        "max_pending_bytes",
        "retry_max_backoff",
        "shutdown_timeout",
        "idle_timeout",
        "listen",
        "enabled",
        "summary_interval",
        "api_version",
        "kind",
        "namespaces",
        "payload",
        "fields",
        "drop",
        "type",
        "servers",
        "bootstrap_servers",
        "topic",
        "subject",
        "token",
        "mode",
        "\"acks\"",
        "\"sasl.password\"",
        "lingr",
        "",
    ];
    const VALUES: &[&str] = &[
        "\"prod\"",
        "\"\"",
        "\"5 parsecs\"",
        "\"250ms\"",
        "\"64MiB\"",
        "\"lots\"",
        "7",
        "-1",
        "0",
        "18446744073709551616",
        "1.5",
        "true",
        "[]",
        "[\"a\", 1]",
        "{ a = 1 }",
        "\"v1\"",
        "\"Pod\"",
        "\"nats\"",
        "\"kafka\"",
        "\"stdout\"",
        "\"fields\"",
        "[\"/spec\", \"status\"]",
        "\"nats://u:p@h:1\"",
        "\"\\u0000\"",
        "\"ü\"",
        "1979-05-27T07:32:00Z",
    ];

    fn document() -> impl Strategy<Value = String> {
        let line = prop_oneof![
            3 => (0..SECTIONS.len()).prop_map(|i| SECTIONS[i].to_owned()),
            8 => (0..KEYS.len(), 0..VALUES.len())
                .prop_map(|(k, v)| format!("{} = {}", KEYS[k], VALUES[v])),
            1 => "[ -~]{0,20}",
        ];
        proptest::collection::vec(line, 0..24).prop_map(|l| l.join("\n"))
    }

    /// Every error names a key (but a whole-file syntax error) and one of the sources
    /// `file <path>`, `env <NAME>` (a variable that is set), `default…`, `--config…`.
    fn check_errors(errs: &ConfigErrors, set: &[String]) -> Result<(), TestCaseError> {
        prop_assert!(!errs.0.is_empty());
        for e in &errs.0 {
            prop_assert!(!e.message.is_empty(), "{e}");
            let src = &e.source;
            if let Some(var) = src.strip_prefix("env ") {
                prop_assert!(
                    set.iter().any(|s| s == var),
                    "{e}: names {var}, set: {set:?}"
                );
                prop_assert!(!e.key.is_empty(), "{e}");
            } else {
                prop_assert!(
                    src.starts_with("file ")
                        || src.starts_with("default")
                        || src.starts_with("--config"),
                    "{e}"
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn toml_files_never_panic_and_errors_name_key_and_file(doc in document()) {
            Jail::expect_with(|jail| {
                jail.clear_env();
                jail.create_file("k.toml", &doc)?;
                if let Err(errs) = load(Some(Path::new("k.toml"))) {
                    check_errors(&errs, &[]).map_err(|e| e.to_string())?;
                }
                Ok(())
            });
        }

        #[test]
        fn arbitrary_bytes_as_a_config_file_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            Jail::expect_with(|jail| {
                jail.clear_env();
                std::fs::write(jail.directory().join("k.toml"), &bytes).map_err(|e| e.to_string())?;
                if let Err(errs) = load(Some(Path::new("k.toml"))) {
                    check_errors(&errs, &[]).map_err(|e| e.to_string())?;
                }
                Ok(())
            });
        }

        #[test]
        fn env_errors_name_the_variable_actually_set(
            vars in proptest::collection::vec(
                (
                    prop_oneof![Just("KUBESINK_"), Just("kubesink_"), Just("Kubesink_")],
                    prop_oneof![
                        Just("CLUSTER__NAME"), Just("PIPELINE__LINGER"), Just("pipeline__max_pending"),
                        Just("PIPELINE"), Just("WATCH__IDLE_TIMEOUT"), Just("SERVER__LISTEN"),
                        Just("LOG__SUMMARY_INTERVAL"), Just("CLUSTER"), Just("PIPELINE__LINGR"),
                        Just("Server__Enabled"), Just("RESOURCES"),
                    ],
                    0..VALUES.len(),
                ),
                1..4,
            )
        ) {
            Jail::expect_with(|jail| {
                jail.clear_env();
                let mut set = Vec::new();
                for (prefix, path, v) in &vars {
                    let name = format!("{prefix}{path}");
                    jail.set_env(&name, VALUES[*v].trim_matches('"'));
                    set.push(name);
                }
                if let Err(errs) = load(None) {
                    check_errors(&errs, &set).map_err(|e| e.to_string())?;
                }
                Ok(())
            });
        }
    }

    #[test]
    fn the_corpus_loads_without_panic() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/config_toml");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            Jail::expect_with(|jail| {
                jail.clear_env();
                if let Err(errs) = load(Some(&path)) {
                    check_errors(&errs, &[]).map_err(|e| format!("{}: {e}", path.display()))?;
                }
                Ok(())
            });
        }
    }
}

#[test]
fn scale_out_needs_leader_election_and_a_state_every_replica_reads() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let base = "[[sinks]]\ntype = \"stdout\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[clusters]]\nname = \"a\"\n[[clusters]]\nname = \"b\"\n";
        jail.create_file(
            "off.toml",
            &format!("{base}[leader_election]\nscale_out = true\n"),
        )?;
        let errs = errors_of(Some(Path::new("off.toml")));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("leader_election.scale_out:")
                    && e.contains("leader_election.enabled = true")),
            "{errs:?}"
        );
        jail.create_file(
            "file.toml",
            &format!("{base}[leader_election]\nenabled = true\nscale_out = true\n[state]\nbackend = \"file\"\npath = \"/tmp/ks.state\"\n"),
        )?;
        let errs = errors_of(Some(Path::new("file.toml")));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("leader_election.scale_out:")
                    && e.contains("\"nats\" or \"kafka\"")),
            "{errs:?}"
        );
        jail.create_file(
            "none.toml",
            &format!("{base}[leader_election]\nenabled = true\nscale_out = true\n"),
        )?;
        assert!(
            errors_of(Some(Path::new("none.toml")))
                .iter()
                .any(|e| e.starts_with("leader_election.scale_out:")),
            "no [state] is refused too"
        );
        jail.create_file(
            "stray.toml",
            &format!("{base}[leader_election]\nenabled = true\njoin_after = \"45s\"\n"),
        )?;
        assert!(
            errors_of(Some(Path::new("stray.toml")))
                .iter()
                .any(|e| e.starts_with("leader_election.join_after:")
                    && e.contains("scale_out = true")),
            "join_after without scale_out is refused"
        );
        jail.create_file(
            "ok.toml",
            &format!("{base}[leader_election]\nenabled = true\nscale_out = true\njoin_after = \"45s\"\n[state]\nbackend = \"nats\"\n"),
        )?;
        let c = load(Some(Path::new("ok.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(
            c.leader_election.join_after(),
            std::time::Duration::from_secs(45)
        );
        assert_eq!(
            LeaderElectionConfig::default().join_after(),
            std::time::Duration::from_secs(30),
            "2 × lease_duration by default"
        );
        assert!(
            !crate::plan::warnings(&c)
                .iter()
                .any(|w| w.contains("scale_out with one cluster")),
            "two clusters: no warning"
        );
        jail.create_file(
            "one.toml",
            "[[sinks]]\ntype = \"stdout\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[cluster]\nname = \"a\"\n[leader_election]\nenabled = true\nscale_out = true\n[state]\nbackend = \"nats\"\n",
        )?;
        let one = load(Some(Path::new("one.toml"))).map_err(|e| e.to_string())?;
        assert!(
            crate::plan::warnings(&one)
                .iter()
                .any(|w| w.starts_with("leader_election.scale_out with one cluster")),
            "{:?}",
            crate::plan::warnings(&one)
        );
        Ok(())
    });
}

#[test]
fn shards_split_one_cluster_into_units_of_scale_out_and_need_it() {
    figment::Jail::expect_with(|jail| {
        let base =
            "[[sinks]]\ntype = \"stdout\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n";
        let scale_out =
            "[leader_election]\nenabled = true\nscale_out = true\n[state]\nbackend = \"nats\"\n";
        jail.create_file(
            "sharded.toml",
            &format!("{base}[cluster]\nname = \"huge\"\nshards = 4\n{scale_out}"),
        )?;
        let c = load(Some(Path::new("sharded.toml"))).map_err(|e| e.to_string())?;
        let units: Vec<String> = c.units().iter().map(|u| u.unit()).collect();
        assert_eq!(
            units,
            [
                "huge#shard-0-of-4",
                "huge#shard-1-of-4",
                "huge#shard-2-of-4",
                "huge#shard-3-of-4"
            ]
        );
        assert!(
            c.units().iter().all(|u| u.name == "huge"),
            "messages carry the cluster's name"
        );
        assert_eq!(
            c.clusters().len(),
            1,
            "still one cluster to connect to, fold and check"
        );
        assert!(
            !crate::plan::warnings(&c)
                .iter()
                .any(|w| w.contains("scale_out with one cluster")),
            "four shards are four units: no warning"
        );
        // Without scale-out the shards would only multiply one process's watches.
        jail.create_file(
            "alone.toml",
            &format!("{base}[[clusters]]\nname = \"a\"\n[[clusters]]\nname = \"b\"\nshards = 2\n"),
        )?;
        let e = load(Some(Path::new("alone.toml"))).expect_err("refused");
        assert!(
            e.to_string().contains("clusters.1.shards")
                && e.to_string().contains("scale_out = true"),
            "{e}"
        );
        for bad in ["0", "257"] {
            jail.create_file(
                "range.toml",
                &format!("{base}[cluster]\nname = \"huge\"\nshards = {bad}\n{scale_out}"),
            )?;
            let e = load(Some(Path::new("range.toml"))).expect_err("refused");
            assert!(
                e.to_string().contains("cluster.shards") && e.to_string().contains("1 to 256"),
                "{bad}: {e}"
            );
        }
        // A sync marker stands for a whole list; a shard's is a part.
        jail.create_file(
            "markers.toml",
            &format!("{base}[cluster]\nname = \"huge\"\nshards = 2\n{scale_out}[pipeline]\nsync_markers = true\n"),
        )?;
        let e = load(Some(Path::new("markers.toml"))).expect_err("refused");
        assert!(
            e.to_string()
                .contains("pipeline.sync_markers: cannot be used with cluster.shards = 2"),
            "{e}"
        );
        // Every problem in one run, each naming where its own value came from.
        jail.set_env("KUBESINK_PIPELINE__SYNC_MARKERS", "true");
        jail.create_file(
            "both.toml",
            &format!("{base}[cluster]\nname = \"huge\"\nshards = 2\n"),
        )?;
        let e = load(Some(Path::new("both.toml")))
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("cluster.shards: 2 shards need") && e.contains("(from file both.toml)"),
            "{e}"
        );
        assert!(
            e.contains("pipeline.sync_markers: cannot be used")
                && e.contains("KUBESINK_PIPELINE__SYNC_MARKERS"),
            "{e}"
        );
        jail.set_env("KUBESINK_PIPELINE__SYNC_MARKERS", "false");
        // A mixed fleet: whole clusters and the shards of one, each a unit.
        jail.create_file(
            "mixed.toml",
            &format!("{base}[[clusters]]\nname = \"a\"\n[[clusters]]\nname = \"b\"\nshards = 2\n{scale_out}"),
        )?;
        let c = load(Some(Path::new("mixed.toml"))).map_err(|e| e.to_string())?;
        let units: Vec<String> = c.units().iter().map(|u| u.unit()).collect();
        assert_eq!(units, ["a", "b#shard-0-of-2", "b#shard-1-of-2"]);
        Ok(())
    });
}

#[test]
fn lease_timings_that_let_the_leader_outlive_its_lease_are_rejected() {
    // 15 s / 14 s / 13 s pass every other rule, yet a leader that cannot renew notices up to
    // two retry periods after its renew deadline: rejected.
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "k.toml",
            "[cluster]\nname = \"prod\"\n[leader_election]\nenabled = true\nlease_duration = \"15s\"\nrenew_deadline = \"14s\"\nretry_period = \"13s\"\n",
        )?;
        let errs = errors_of(Some(Path::new("k.toml")));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("leader_election.lease_duration:")
                    && e.contains("renew_deadline + 2 × retry_period")
                    && e.contains("k.toml")),
            "{errs:?}"
        );
        jail.create_file(
            "ok.toml",
            "[cluster]\nname = \"prod\"\n[leader_election]\nenabled = true\nlease_duration = \"15s\"\nrenew_deadline = \"10s\"\nretry_period = \"2s\"\n",
        )?;
        load(Some(Path::new("ok.toml"))).map_err(|e| e.to_string())?;
        Ok(())
    });
}

#[test]
fn secrets_come_from_environment_variables_and_files_in_every_secret_key() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("kafka-password", "from-file\n")?;
        jail.create_file("nkey", "SUAFROMFILE")?;
        jail.set_env("KAFKA_KEY_PASSWORD", "key-from-env");
        jail.set_env("NATS_PASSWORD", "nats-from-env");
        jail.set_env("STATE_TOKEN", "state-from-env");
        jail.create_file(
            "k.toml",
            r#"
[cluster]
name = "p"
[state]
backend = "nats"
[state.nats]
servers = ["nats://n:4222"]
[state.nats.auth]
token = { env = "STATE_TOKEN" }
[[sinks]]
type = "kafka"
bootstrap_servers = "b:9092"
[sinks.security]
protocol = "sasl_ssl"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "u"
sasl_password = { file = "kafka-password" }
ssl_key_password = { env = "KAFKA_KEY_PASSWORD" }
[[sinks]]
type = "nats"
name = "n1"
[sinks.auth]
user = "u"
password = { env = "NATS_PASSWORD" }
[[sinks]]
type = "nats"
name = "n2"
[sinks.auth]
nkey_seed = { file = "nkey" }
"#,
        )?;
        let c = load(Some(Path::new("k.toml"))).map_err(|e| e.to_string())?;
        let SinkConfig::Kafka(k) = &c.sinks[0] else {
            panic!("{:?}", c.sinks[0])
        };
        let expose = |s: &Option<kubesink_core::Secret>| s.as_ref().map(|s| s.expose().to_owned());
        assert_eq!(
            expose(&k.security.sasl_password).as_deref(),
            Some("from-file")
        );
        assert_eq!(
            expose(&k.security.ssl_key_password).as_deref(),
            Some("key-from-env")
        );
        let SinkConfig::Nats(n1) = &c.sinks[1] else {
            panic!("{:?}", c.sinks[1])
        };
        assert_eq!(expose(&n1.auth.password).as_deref(), Some("nats-from-env"));
        let SinkConfig::Nats(n2) = &c.sinks[2] else {
            panic!("{:?}", c.sinks[2])
        };
        assert_eq!(expose(&n2.auth.nkey_seed).as_deref(), Some("SUAFROMFILE"));
        assert_eq!(
            expose(&c.state.nats.auth.token).as_deref(),
            Some("state-from-env")
        );

        // Unresolvable: named with the entry and the file, never the value.
        jail.set_env("NATS_PASSWORD", "");
        std::fs::remove_file("nkey").map_err(|e| e.to_string())?;
        let errs = errors_of(Some(Path::new("k.toml"))).join("\n");
        for want in [
            "sinks.1.auth.password: the secret's environment variable NATS_PASSWORD is empty (from file ",
            "sinks.2.auth.nkey_seed: the secret's file nkey: ",
        ] {
            assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
        }
        assert!(
            !errs.contains("from-file") && !errs.contains("key-from-env"),
            "{errs}"
        );
        Ok(())
    });
}

#[test]
fn the_list_budget_comes_from_file_or_env_zero_turns_it_off_and_bad_values_are_named() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
        let c = load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.watch.max_concurrent_lists, DEFAULT_MAX_CONCURRENT_LISTS);
        assert_eq!(DEFAULT_MAX_CONCURRENT_LISTS, 16);
        jail.create_file("w.toml", "[watch]\nmax_concurrent_lists = 4\n")?;
        let c = load(Some(Path::new("w.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.watch.max_concurrent_lists, 4);
        // The environment overrides the file; 0 is "no limit", accepted.
        jail.set_env("KUBESINK_WATCH__MAX_CONCURRENT_LISTS", "0");
        let c = load(Some(Path::new("w.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.watch.max_concurrent_lists, 0);
        jail.set_env("KUBESINK_WATCH__MAX_CONCURRENT_LISTS", "-1");
        let all = errors_of(None).join("\n");
        assert!(
            all.contains("watch.max_concurrent_lists")
                && all.contains("(from env KUBESINK_WATCH__MAX_CONCURRENT_LISTS)"),
            "{all}"
        );
        jail.set_env("KUBESINK_WATCH__MAX_CONCURRENT_LISTS", "some");
        let all = errors_of(None).join("\n");
        assert!(all.contains("watch.max_concurrent_lists"), "{all}");
        jail.clear_env();
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
        jail.create_file("big.toml", "[watch]\nmax_concurrent_lists = 2000000\n")?;
        let all = errors_of(Some(Path::new("big.toml"))).join("\n");
        assert!(
            all.contains("watch.max_concurrent_lists: must be 0 (no limit) or at most 1000000 lists at once; got 2000000"),
            "{all}"
        );
        jail.create_file(
            "many.toml",
            &format!("[watch]\nmax_concurrent_lists = {MAX_CONCURRENT_LISTS}\n"),
        )?;
        let c = load(Some(Path::new("many.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.watch.max_concurrent_lists, MAX_CONCURRENT_LISTS);
        Ok(())
    });
}

#[test]
fn the_initial_list_strategy_and_the_request_budget_come_from_file_or_env_and_are_checked() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
        let c = load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.watch.initial_list, InitialList::Auto);
        assert_eq!(
            (c.watch.requests_per_second, c.watch.request_burst),
            (50.0, 100)
        );
        // Every accepted spelling: each variant, integers and fractions, from file and env.
        for (variant, want) in [
            ("auto", InitialList::Auto),
            ("stream", InitialList::Stream),
            ("list", InitialList::List),
        ] {
            jail.clear_env();
            jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
            jail.create_file(
                "w.toml",
                &format!("[watch]\ninitial_list = \"{variant}\"\nrequests_per_second = 2.5\nrequest_burst = 3\n"),
            )?;
            let c = load(Some(Path::new("w.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.watch.initial_list, want);
            assert_eq!(
                (c.watch.requests_per_second, c.watch.request_burst),
                (2.5, 3)
            );
            jail.set_env("KUBESINK_WATCH__INITIAL_LIST", variant);
            jail.set_env("KUBESINK_WATCH__REQUESTS_PER_SECOND", "7");
            let c = load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.watch.initial_list, want);
            assert_eq!(c.watch.requests_per_second, 7.0);
        }
        jail.set_env("KUBESINK_WATCH__REQUESTS_PER_SECOND", "0");
        jail.set_env("KUBESINK_WATCH__REQUEST_BURST", "0");
        let c = load(None).map_err(|e| e.to_string())?;
        assert_eq!(
            c.watch.requests_per_second, 0.0,
            "0 turns the limit off, any burst"
        );

        // Each bad value is named with its key and source. (A section that does not
        // deserialize is not checked further, so one case at a time.)
        jail.set_env("KUBESINK_WATCH__INITIAL_LIST", "streaming");
        let all = errors_of(None).join("\n");
        assert!(
            all.contains("watch.initial_list: \"streaming\" is not one of \"auto\", \"stream\" or \"list\" (did you mean \"stream\"?)")
                && all.contains("(from env KUBESINK_WATCH__INITIAL_LIST)"),
            "{all}"
        );
        jail.set_env("KUBESINK_WATCH__INITIAL_LIST", "list");
        jail.set_env("KUBESINK_WATCH__REQUESTS_PER_SECOND", "-1");
        let all = errors_of(None).join("\n");
        assert!(
            all.contains("watch.requests_per_second: must be a number of requests per second, 0 (no limit) or more; got -1"),
            "{all}"
        );
        jail.clear_env();
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod");
        jail.create_file(
            "bad.toml",
            "[watch]\nrequests_per_second = 0.0001\nrequest_burst = 0\n",
        )?;
        let all = errors_of(Some(Path::new("bad.toml"))).join("\n");
        for want in [
            "watch.requests_per_second: must be 0 (no limit) or at least",
            "watch.request_burst: must be at least 1 while watch.requests_per_second limits the rate",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        jail.create_file("nan.toml", "[watch]\nrequests_per_second = nan\n")?;
        let all = errors_of(Some(Path::new("nan.toml"))).join("\n");
        assert!(
            all.contains("watch.requests_per_second: must be a number"),
            "{all}"
        );
        jail.create_file("words.toml", "[watch]\nrequests_per_second = \"fast\"\n")?;
        let all = errors_of(Some(Path::new("words.toml"))).join("\n");
        assert!(
            all.contains("watch.requests_per_second") && all.contains("words.toml"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn one_run_reports_every_problem_of_one_entry_every_env_misspelling_and_the_checks() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        // One [[resources]] entry with three problems (serde stops at the first), a sink whose
        // tagged enum loses the key in its errors, a bad value in [pipeline], and a lease
        // timing that a check across keys refuses (it runs on the sections that parsed).
        jail.create_file(
            "three.toml",
            "[leader_election]\nenabled = true\nrenew_deadline = \"20s\"\n[pipeline]\nmax_pending = \"many\"\nmax_pending_bytes = \"lots\"\n\
             [[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\nnamespaces = \"default\"\npayload = \"ful\"\nlabel_selectr = \"app=x\"\n\
             [[sinks]]\ntype = \"nats\"\nservers = \"nats://x\"\nsubjct = \"a\"\n",
        )?;
        jail.set_env("KUBESINK_CLUSTER__NAEM", "prod");
        jail.set_env("KUBESINK_PIPELNE__LINGER", "1s");
        jail.set_env("KUBESINK_WATHC__IDLE_TIMEOUT", "1s");
        let errs = errors_of(Some(Path::new("three.toml")));
        let all = errs.join("\n");
        for want in [
            "pipelne: unknown section \"pipelne\" (did you mean \"pipeline\"?)",
            "(from env KUBESINK_PIPELNE__LINGER)",
            "wathc: unknown section \"wathc\" (did you mean \"watch\"?)",
            "cluster.naem: unknown key \"naem\" (did you mean \"name\"?)",
            "(from env KUBESINK_CLUSTER__NAEM)",
            "pipeline.max_pending: expected a whole number (0 or more), found the string \"many\"",
            "pipeline.max_pending_bytes: invalid size \"lots\": expected a number of bytes",
            "resources.0.namespaces: expected a list, such as [\"a\", \"b\"], found the string \"default\"",
            "resources.0.payload: \"ful\" is not one of \"full\", \"metadata\" or \"fields\" (did you mean \"full\"?)",
            "resources.0.label_selectr: unknown key \"label_selectr\" (did you mean \"label_selector\"?)",
            "sinks.0.servers: expected a list",
            "sinks.0.subjct: unknown key \"subjct\" (did you mean \"subject\"?)",
            "leader_election.renew_deadline: must be shorter",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        // [cluster] did not parse, so its check (a missing name) is left out: fixing "naem"
        // is the fix.
        assert!(!all.contains("cluster.name"), "{all}");
        assert_eq!(errs.len(), 11, "{all}");
        // Rust's words stay out of it.
        for rust in ["usize", "`", "sequence", "ByteSize", "float"] {
            assert!(!all.contains(rust), "{rust:?} in:\n{all}");
        }
        Ok(())
    });
}

#[test]
fn a_check_that_reads_a_section_that_did_not_parse_is_left_out() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        // [[clusters]] does not parse: [cluster] without a name would otherwise be reported
        // as missing, and leader_election.cluster as naming no entry.
        jail.create_file(
            "c.toml",
            "[leader_election]\nenabled = true\ncluster = \"a\"\n[[clusters]]\nname = \"a\"\nkubeconfg = \"/k\"\n",
        )?;
        let all = errors_of(Some(Path::new("c.toml"))).join("\n");
        assert!(all.contains("clusters.0.kubeconfg: unknown key"), "{all}");
        assert!(!all.contains("cluster.name"), "{all}");
        assert!(!all.contains("leader_election.cluster"), "{all}");
        Ok(())
    });
}

#[test]
fn the_section_list_is_the_configs_fields() {
    // serde names every field of Config when it meets an unknown one.
    let probe = figment::Figment::from(figment::providers::Serialized::default(
        "no_such_section",
        1,
    ));
    match probe.extract::<Config>() {
        Err(e) => match e.kind {
            figment::error::Kind::UnknownField(_, fields) => {
                assert_eq!(fields, super::SECTIONS)
            }
            other => panic!("{other:?}"),
        },
        Ok(c) => panic!("{c:?}"),
    }
}

#[test]
fn the_shipped_placeholder_is_refused_wherever_it_is_left_naming_each_key() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "p.toml",
            "[cluster]\nname = \"CHANGE-ME\"\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"b:9092\"\n[sinks.security]\nprotocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\nsasl_password = \"change-me \"\n",
        )?;
        let errs = errors_of(Some(Path::new("p.toml")));
        let all = errs.join("\n");
        assert!(
            all.contains("cluster.name: is still the placeholder \"CHANGE-ME\" of the shipped configuration: set it to the cluster's name")
                && all.contains("sinks.0.security.sasl_password: is still the placeholder \"CHANGE-ME\"")
                && all.contains("{ env = \"NAME\" }")
                && all.contains("(from file "),
            "{all}"
        );
        assert_eq!(errs.len(), 2, "{all}");
        // The environment sets the name over the file's placeholder, as the deploy files say.
        jail.set_env("KUBESINK_CLUSTER__NAME", "prod-eu-1");
        let errs = errors_of(Some(Path::new("p.toml")));
        assert_eq!(errs.len(), 1, "{errs:?}");
        jail.set_env("KUBESINK_CLUSTER__NAME", "CHANGE-ME");
        let all = errors_of(Some(Path::new("p.toml"))).join("\n");
        assert!(
            all.contains("cluster.name: is still the placeholder")
                && all.contains("(from env KUBESINK_CLUSTER__NAME)"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn a_toml_syntax_error_is_reported_once() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("syn.toml", "[cluster]\nname = \"x\n")?;
        let errs = errors_of(Some(Path::new("syn.toml")));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("TOML parse error at line 2"), "{errs:?}");
        Ok(())
    });
}

#[test]
fn problems_inside_a_sinks_nested_table_name_their_own_key_and_durations_need_a_unit() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "k.toml",
            "[cluster]\nname = \"p\"\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"b:9092\"\nacks = -1\nmessage_timeout = 30\n[sinks.security]\nprotocol = \"SASL_SSL\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\nsasl_password = { env = \"KUBESINK_TEST_UNSET_SECRET\" }\n",
        )?;
        let errs = errors_of(Some(Path::new("k.toml")));
        let all = errs.join("\n");
        for want in [
            "sinks.0.message_timeout: invalid duration 30: a number needs a unit, such as \"30s\" or \"30ms\"",
            "sinks.0.security.protocol: \"SASL_SSL\" is not one of",
            "(did you mean \"sasl_ssl\"?)",
            "sinks.0.security.sasl_password: the secret's environment variable KUBESINK_TEST_UNSET_SECRET is not set",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        // acks = -1 is librdkafka's "all".
        assert_eq!(errs.len(), 3, "{all}");
        Ok(())
    });
}

#[test]
fn a_state_backends_name_is_its_spelling_in_the_configuration() {
    let mut all = vec![StateBackend::None, StateBackend::File];
    #[cfg(feature = "nats")]
    all.push(StateBackend::Nats);
    #[cfg(feature = "kafka")]
    all.push(StateBackend::Kafka);
    for b in all {
        assert_eq!(serde_json::to_value(b).unwrap(), b.name(), "{b:?}");
    }
}

/// A section whose checks read the sinks (Kafka's connection) is left unjudged when the sinks
/// did not parse, its settings under another backend too; one that reads nothing is judged.
#[cfg(all(feature = "nats", feature = "kafka"))]
#[test]
fn a_state_section_reading_the_sinks_is_not_judged_when_they_did_not_parse() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "s.toml",
            "[state.kafka]\ntopic = \"t\"\n[state.nats]\nbucket = \"B\"\n[[sinks]]\ntype = \"stdout\"\nname = 5\n",
        )?;
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.nats.bucket: is a [state.nats] setting"),
            "{all}"
        );
        assert!(!all.contains("state.kafka"), "{all}");
        jail.create_file(
            "s.toml",
            "[state.kafka]\ntopic = \"t\"\n[[sinks]]\ntype = \"stdout\"\nname = \"s\"\n",
        )?;
        let all = errors_of(Some(Path::new("s.toml"))).join("\n");
        assert!(
            all.contains("state.kafka.topic: is a [state.kafka] setting"),
            "{all}"
        );
        Ok(())
    });
}

#[test]
fn a_registered_state_section_is_named_as_its_backend_and_its_key() {
    let c = super::StateConfig::default();
    let names: Vec<&str> = c.sections().iter().map(|(name, _)| *name).collect();
    assert_eq!(names, StateBackend::registered());
    for (name, section) in c.sections() {
        assert_eq!(section.name(), name);
    }
}

#[test]
fn a_bad_value_in_a_sink_entry_does_not_hide_the_entrys_other_problems() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        // One type mistake (acks) and three mistakes only the sink's own checks see (no
        // bootstrap_servers, a bad topic template, mutual TLS half set): one run names all.
        jail.create_file(
            "f.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Pod\"\n[[sinks]]\ntype = \"kafka\"\nacks = \"two\"\ntopic = \"a b\"\n[sinks.security]\nssl_certificate_location = \"/c\"\n[[sinks]]\ntype = \"nats\"\nmax_in_flight = \"many\"\nsubject = \"\"\n",
        )?;
        let errs = errors_of(Some(Path::new("f.toml")));
        let all = errs.join("\n");
        for want in [
            "sinks.0.acks: ",
            "sinks.0.bootstrap_servers: required",
            "sinks.0.topic: ",
            "sinks.0.security.ssl_key_location: ",
            "sinks.1.max_in_flight: ",
            "sinks.1.subject: ",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert!(
            !all.contains("sinks.1.max_in_flight: must be at least 1"),
            "the taken-out value is not reported again by its default: {all}"
        );
        Ok(())
    });
}

/// `config/kubesink.schema.json` and the `config` definitions of the Helm chart's
/// `values.schema.json` are what [`Config::json_schema`] generates. With
/// `KUBESINK_WRITE_SCHEMA=1` the test writes them instead (then review the diff).
#[test]
fn the_shipped_json_schemas_are_generated_from_the_config_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let write = std::env::var_os("KUBESINK_WRITE_SCHEMA").is_some();
    let generated = Config::json_schema();
    let text = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap() + "\n";

    // The file for editors: the schema as generated.
    let shipped = root.join("config/kubesink.schema.json");
    if write {
        std::fs::write(&shipped, text(&generated)).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&shipped).unwrap_or_default(),
        text(&generated),
        "config/kubesink.schema.json is not what the config types generate: run \
         KUBESINK_WRITE_SCHEMA=1 cargo test -p kubesink --lib the_shipped_json_schemas"
    );

    // The chart: `config` is checked against definitions.Config (the generated root) and
    // the definitions it refers to, beside the chart's own rules.
    let chart = root.join("deploy/helm/kubesink/values.schema.json");
    let mut values: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&chart).unwrap()).unwrap();
    let mut config = generated.clone();
    let defs = config
        .as_object_mut()
        .and_then(|o| o.remove("definitions"))
        .unwrap_or_default();
    for key in ["$schema", "title"] {
        config.as_object_mut().unwrap().remove(key);
    }
    let mut want = values["definitions"].clone();
    let chart_own = ["stringMap", "objectList", "name"];
    want.as_object_mut()
        .unwrap()
        .retain(|k, _| chart_own.contains(&k.as_str()));
    for (k, v) in defs.as_object().unwrap() {
        assert!(
            !chart_own.contains(&k.as_str()),
            "{k} is a chart definition too"
        );
        want[k] = v.clone();
    }
    want["Config"] = config;
    if write {
        values["definitions"] = want.clone();
        std::fs::write(&chart, text(&values)).unwrap();
    }
    assert_eq!(
        values["definitions"], want,
        "deploy/helm/kubesink/values.schema.json's definitions are not what the config types \
         generate: run KUBESINK_WRITE_SCHEMA=1 cargo test -p kubesink --lib the_shipped_json_schemas"
    );
    assert_eq!(
        values["properties"]["config"]["allOf"][0],
        serde_json::json!({"$ref": "#/definitions/Config"}),
        "the chart checks config against the generated schema"
    );
}

#[test]
fn the_json_schema_accepts_the_reference_config_and_names_a_typo() {
    let schema = Config::json_schema();
    let validator = jsonschema::validator_for(&schema).expect("a valid schema");
    let reference: serde_json::Value = toml::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/kubesink.toml"))
            .unwrap(),
    )
    .unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&reference)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let typo: serde_json::Value = toml::from_str(
        "[cluster]\nname = \"a\"\n[pipeline]\nlinger = \"5ms\"\nlingr = \"5ms\"\n[[sinks]]\ntype = \"kafka\"\nbootstrap_servers = \"k:9092\"\nacks = \"two\"\n",
    )
    .unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&typo)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    let all = errors.join("\n");
    assert!(all.contains("/pipeline") && all.contains("lingr"), "{all}");
    assert!(all.contains("/sinks/0"), "{all}");
}

/// The secrets' mask `"***"` in two places of one sink entry: each named at its own key (not
/// once, blamed on `sinks.0.type`), and an unset `{ env }` reference beside it is not hidden;
/// a dotted librdkafka property quoted as in TOML.
#[cfg(feature = "kafka")]
#[test]
fn the_secrets_mask_is_named_at_every_key_that_holds_it() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "masked.toml",
            r#"
[cluster]
name = "a"
[[resources]]
api_version = "v1"
kind = "Pod"
[[sinks]]
type = "kafka"
bootstrap_servers = "127.0.0.1:1"
[sinks.security]
protocol = "sasl_ssl"
sasl_mechanism = "PLAIN"
sasl_username = "u"
sasl_password = "***"
[sinks.librdkafka]
"ssl.keystore.password" = "***"
"client.id" = { env = "TESTS_UNSET_VARIABLE_FOR_THE_MASK" }
"#,
        )?;
        let errs = errors_of(Some(Path::new("masked.toml")));
        let all = errs.join("\n");
        assert_eq!(errs.len(), 3, "{all}");
        for want in [
            "sinks.0.security.sasl_password: \"***\" is the mask",
            "sinks.0.librdkafka.\"ssl.keystore.password\": \"***\" is the mask",
            "sinks.0.librdkafka.\"client.id\": the secret's environment variable TESTS_UNSET_VARIABLE_FOR_THE_MASK is not set",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        Ok(())
    });
}

/// Two `{ env = … }` secrets of one sink entry that cannot be read: each named at its own
/// key, never one error blamed on `sinks.0.type`.
#[cfg(feature = "kafka")]
#[test]
fn every_unreadable_secret_reference_is_named_at_its_key() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "refs.toml",
            r#"
[cluster]
name = "a"
[[resources]]
api_version = "v1"
kind = "Pod"
[[sinks]]
type = "kafka"
bootstrap_servers = "127.0.0.1:1"
[sinks.security]
protocol = "sasl_ssl"
sasl_mechanism = "PLAIN"
sasl_username = "u"
sasl_password = { env = "TESTS_UNSET_SASL_PASSWORD" }
ssl_key_password = { env = "TESTS_UNSET_KEY_PASSWORD" }
"#,
        )?;
        let errs = errors_of(Some(Path::new("refs.toml")));
        let all = errs.join("\n");
        assert_eq!(errs.len(), 2, "{all}");
        for want in [
            "sinks.0.security.sasl_password: the secret's environment variable TESTS_UNSET_SASL_PASSWORD is not set",
            "sinks.0.security.ssl_key_password: the secret's environment variable TESTS_UNSET_KEY_PASSWORD is not set",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        Ok(())
    });
}
#[test]
fn enrich_without_the_kinds_it_reads_is_a_warning_naming_them() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let base = r#"
[cluster]
name = "p"
[[sinks]]
type = "stdout"
filter = 'namespaceLabels.team == "a"'
[[resources]]
api_version = "v1"
kind = "Pod"
payload = "metadata"
enrich = ["owner"]
[[resources]]
api_version = "events.k8s.io/v1"
kind = "Event"
mode = "events"
enrich = ["owner", "node"]
[[resources]]
api_version = "v1"
kind = "Service"
enrich = ["namespace"]
namespace_labels = ["team"]
[[resources]]
api_version = "v1"
kind = "ConfigMap"
filter = 'owners.exists(o, o.kind == "Deployment")'
"#;
        jail.create_file("gaps.toml", base)?;
        let c = load(Some(Path::new("gaps.toml"))).map_err(|e| e.to_string())?;
        let w = crate::plan::warnings(&c).join("\n");
        // The owner index watches the workload controllers itself: no warning for them.
        assert!(!w.contains("ReplicaSet"), "{w}");
        for want in [
            "resources.1.enrich (events.k8s.io/v1 Event): \"node\" is the regarding Pod's spec.nodeName, which v1 Pod with payload = \"metadata\" does not read: no Event will carry a node; set resources.0.payload = \"fields\"",
            "resources.3.filter reads owners, but its resource has no enrich = [\"owner\"]: owners is [] for every object",
        ] {
            assert!(w.contains(want), "missing {want:?} in:\n{w}");
        }
        assert!(
            !w.contains("sinks.0.filter"),
            "a resource has enrich = [\"namespace\"]: {w}"
        );
        // Events alone: the Pods' hint says they need their spec for node.
        jail.create_file(
            "alone.toml",
            "[cluster]\nname = \"p\"\n[[sinks]]\ntype = \"stdout\"\nfilter = 'node == \"n\"'\n[[resources]]\napi_version = \"v1\"\nkind = \"Event\"\nmode = \"events\"\nenrich = [\"owner\"]\n",
        )?;
        let c = load(Some(Path::new("alone.toml"))).map_err(|e| e.to_string())?;
        let w = crate::plan::warnings(&c).join("\n");
        assert!(
            w.contains("v1 Pod not followed")
                && w.contains("sinks.0.filter (sink \"stdout\") reads node, but no resource has enrich = [\"node\"]"),
            "{w}"
        );
        jail.create_file(
            "whole.toml",
            &format!("{base}[[resources]]\napi_version = \"apps/v1\"\nkind = \"ReplicaSet\"\n[[resources]]\napi_version = \"apps/v1\"\nkind = \"Deployment\"\n[[resources]]\napi_version = \"v1\"\nkind = \"Namespace\"\n")
                .replace("payload = \"metadata\"\nenrich", "enrich")
                .replace("kind = \"ConfigMap\"\n", "kind = \"ConfigMap\"\nenrich = [\"owner\"]\n"),
        )?;
        let c = load(Some(Path::new("whole.toml"))).map_err(|e| e.to_string())?;
        let w = crate::plan::warnings(&c);
        assert!(!w.iter().any(|w| w.contains("enrich")), "{w:?}");
        // A cluster's own resources are checked among themselves, named by their key.
        jail.create_file(
            "clusters.toml",
            "[[sinks]]\ntype = \"stdout\"\n[[resources]]\napi_version = \"apps/v1\"\nkind = \"ReplicaSet\"\n[[clusters]]\nname = \"a\"\n[[clusters]]\nname = \"b\"\n[[clusters.resources]]\napi_version = \"v1\"\nkind = \"Event\"\nmode = \"events\"\nenrich = [\"owner\"]\n",
        )?;
        let c = load(Some(Path::new("clusters.toml"))).map_err(|e| e.to_string())?;
        let w = crate::plan::warnings(&c).join("\n");
        assert!(
            w.contains("clusters.1.resources.0.enrich (v1 Event): v1 Pod not followed"),
            "{w}"
        );
        Ok(())
    });
}

/// The group form (`group`, `kinds`, `exclude`): accepted alone, refused beside
/// `api_version` and `kind` or with what belongs to one kind, each problem under its key;
/// an entry with neither form says both.
#[test]
fn the_group_form_names_its_problems_by_key() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "ok.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\ngroup = \"example.com\"\n[[resources]]\nkinds = [\"*\"]\nnamespaces = [\"a\"]\nexclude = [\"secrets\", \"*.coordination.k8s.io\"]\n[[resources]]\ngroup = \"core\"\nkinds = [\"ConfigMap\"]\n[[sinks]]\ntype = \"stdout\"\n",
        )?;
        let c = load(Some(Path::new("ok.toml"))).expect("the group form loads");
        let s = c.resources[1]
            .selector()
            .expect("kinds = [\"*\"] is the group form");
        assert_eq!((s.group, s.kinds, s.namespaced_only), (None, None, true));
        assert_eq!(
            c.resources[2].selector().and_then(|s| s.group),
            Some(String::new())
        );
        jail.create_file(
            "bad.toml",
            "[cluster]\nname = \"p\"\n[[resources]]\ngroup = \"Example.com\"\nkind = \"Widget\"\nkinds = [\"wid-get\"]\nexclude = [\"a b\"]\nenrich = [\"owner\"]\nmode = \"events\"\n[[resources]]\nnamespaces = [\"a\"]\n[[resources]]\napi_version = \"v1\"\n[[sinks]]\ntype = \"stdout\"\n",
        )?;
        let all = errors_of(Some(Path::new("bad.toml"))).join("\n");
        for want in [
            "resources.0.group: \"Example.com\" is not an API group",
            "resources.0.kind: not with group or kinds",
            "resources.0.kinds.0: \"wid-get\" is not a Kind",
            "resources.0.exclude.0: \"a b\" is not a resource",
            "resources.0.enrich: enrich is per kind",
            "resources.0.mode: mode = \"events\" follows the Event kind",
            "resources.1: api_version and kind are required",
            "resources.2.kind: required, and not set",
        ] {
            assert!(all.contains(want), "{want}\n{all}");
        }
        Ok(())
    });
}
