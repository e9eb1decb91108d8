//! Property-based fuzzing (proptest) of the watch-event and message paths and of the
//! destination templates, through the informer's internals (`kubesink::testing`, feature
//! `test-util`):
//!
//! - `watch_line`: any bytes (and mutations of the corpus) decode or fail with an error whose
//!   excerpt is bounded; never a panic; a real event cut short never decodes.
//! - `RawObject::parse` → `Shaper::shape` (full, metadata, fields, drop) → `encode` →
//!   `truncate`: no panic, every output is a JSON object, the fingerprint ignores only the
//!   resourceVersion, a truncated message is never larger (but for its `truncated` flag).
//! - Subjects and keys: two distinct objects never share a NATS subject under a template that
//!   names them (`{namespace}`, `{name}`), each token unescapes to the value; Kafka keys are
//!   distinct and topics use only Kafka's characters.
//!
//! Every file of `fuzz/corpus/<target>/` is replayed first. CI runs the default number of
//! cases (a few seconds); the long run (minutes per target) is
//! `PROPTEST_CASES=200000 cargo test --release --test fuzz -- --nocapture` (see
//! `fuzz/README.md`). A failing input proptest finds belongs in the corpus.

use std::path::Path;
use std::sync::Arc;

use kubesink::config::{PayloadMode, ResourceConfig};
use kubesink::testing::{watch_line, RawObject, Shaper};
use kubesink_core::message::{encode, truncate, Change, TruncateLevel};
use kubesink_core::{Op, Resource};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// The files of `fuzz/corpus/<target>/`.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus {}", dir.display());
    files
}

/// Decoding one line: never a panic; an error's excerpt stays short whatever the input.
fn check_watch_line(bytes: &[u8]) {
    if let Err(e) = watch_line(bytes) {
        assert!(
            e.excerpt.chars().count() <= 1200,
            "excerpt of {} chars",
            e.excerpt.chars().count()
        );
        assert!(!e.reason.is_empty());
    }
}

#[test]
fn watch_line_corpus() {
    for (name, bytes) in corpus("watch_line") {
        check_watch_line(&bytes);
        // A real event cut anywhere short of its end never decodes.
        if watch_line(&bytes).is_ok() {
            for cut in 0..bytes.len() {
                assert!(
                    watch_line(&bytes[..cut]).is_err(),
                    "{name} cut at {cut} decoded"
                );
            }
        }
    }
}

/// A corpus file with random bytes overwritten, inserted or cut.
fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let files = corpus(target);
    (
        0..files.len(),
        proptest::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 0..8),
    )
        .prop_map(move |(i, edits)| {
            let mut b = files[i].1.clone();
            for (at, byte, how) in edits {
                if b.is_empty() {
                    b.push(byte);
                    continue;
                }
                let at = at % b.len();
                match how {
                    0 => b[at] = byte,
                    1 => b.insert(at, byte),
                    _ => b.truncate(at),
                }
            }
            b
        })
}

/// Arbitrary JSON: strings with any characters, numbers at the edges, nesting.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A Kubernetes-like object with arbitrary names, labels, annotations and body.
fn object() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just("v1"),
            Just("apps/v1"),
            Just("example.com/v1alpha1"),
            Just("")
        ],
        prop_oneof![
            Just("Pod".to_owned()),
            Just("Secret".to_owned()),
            ".{0,6}".prop_map(String::from)
        ],
        ".{0,20}",
        proptest::option::of(".{0,12}"),
        any::<u64>(),
        proptest::collection::btree_map(".{0,10}", ".{0,10}", 0..4),
        proptest::collection::btree_map(".{0,10}", ".{0,40}", 0..4),
        proptest::collection::btree_map(".{0,8}", json_value(), 0..5),
    )
        .prop_map(|(api, kind, name, ns, rv, labels, annotations, body)| {
            let mut o = json!({"apiVersion": api, "kind": kind,
                    "metadata": {"name": name, "uid": format!("{rv:032x}"),
                                 "resourceVersion": rv.to_string(),
                                 "labels": labels, "annotations": annotations,
                                 "managedFields": [{"manager": "m"}]}});
            if let Some(ns) = ns {
                o["metadata"]["namespace"] = json!(ns);
            }
            for (k, v) in body {
                if !["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
                    o[k] = v;
                }
            }
            o
        })
}

/// JSON pointers: real ones, escaped tokens, array indices, nonsense.
fn pointer() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/spec".to_owned()),
        Just("/data".to_owned()),
        Just("/data/password".to_owned()),
        Just("/metadata/labels".to_owned()),
        Just("/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration".to_owned()),
        Just("/status/conditions/0".to_owned()),
        Just("/a~0b/~1".to_owned()),
        "(/[a-z0-9~]{0,6}){1,4}",
    ]
}

fn resource_config() -> impl Strategy<Value = ResourceConfig> {
    (
        prop_oneof![Just("Pod"), Just("Secret")],
        prop_oneof![
            Just(PayloadMode::Full),
            Just(PayloadMode::Metadata),
            Just(PayloadMode::Fields)
        ],
        proptest::collection::vec(pointer(), 1..4),
        proptest::collection::vec(pointer(), 0..3),
    )
        .prop_map(|(kind, mode, fields, drop)| {
            let mut r = ResourceConfig::new("v1", kind);
            r.payload = mode;
            if mode == PayloadMode::Fields {
                r.fields = fields;
            }
            r.drop = drop;
            r
        })
}

fn change(
    name: &str,
    ns: Option<&str>,
    object: Option<kubesink_core::message::ObjectJson>,
) -> Change {
    Change {
        resource_version: "7".into(),
        ..kubesink_core::message::fixtures::change(Op::Updated, ns, name, object)
    }
}

/// Parse → shape → encode → truncate: no panic; when the input is strict JSON, JSON out with
/// the cluster label, a deterministic fingerprint, and truncated forms that never grow.
///
/// Input that is not strict JSON but that serde_json's raw-value scan accepts (a lone UTF-16
/// surrogate escape such as `"\ud83d x"`: the scan checks the hex digits, not the pairing) is
/// copied through as it came: no panic, but the payload is as invalid as the input. The
/// Kubernetes API server never sends such escapes (Go's encoder writes U+FFFD); see
/// docs/robustness.md.
fn check_object_text(text: &str, res: &ResourceConfig) {
    let strict = serde_json::from_str::<Value>(text).is_ok();
    let Ok(raw) = RawObject::parse(text) else {
        return;
    };
    let shaper = Shaper::new(res, "kubesink.io/cluster", "fuzz");
    let Ok(shaped) = shaper.shape(&raw) else {
        return;
    };
    assert_eq!(
        shaper.shape(&raw).map(|s| s.fingerprint).ok(),
        Some(shaped.fingerprint),
        "deterministic"
    );
    if strict {
        let v: Value = serde_json::from_str(shaped.object.as_str()).expect("shaped object is JSON");
        assert!(v.is_object(), "{v}");
        assert_eq!(
            v["metadata"]["labels"]["kubesink.io/cluster"], "fuzz",
            "{v}"
        );
    }
    let resource = Arc::new(Resource::new("fuzz", "", "v1", &res.kind, "things", true));
    let name = raw
        .metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let ns = raw
        .metadata
        .get("namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let msg = encode(
        &resource,
        &change(&name, ns.as_deref(), Some(shaped.object)),
        "2026-11-30T00:00:00.000Z",
    )
    .expect("encodes");
    let truncated: Vec<_> = [TruncateLevel::MetadataOnly, TruncateLevel::NoObject]
        .into_iter()
        .filter_map(|level| truncate(&msg, level))
        .collect();
    if !strict {
        return;
    }
    let payload: Value = serde_json::from_slice(&msg.payload).expect("payload is JSON");
    assert_eq!(payload["name"], name.as_str());
    for t in truncated {
        let tv: Value = serde_json::from_slice(&t.payload).expect("truncated is JSON");
        assert_eq!(tv["truncated"], true);
        // Never larger but for the `"truncated":true` it adds.
        assert!(
            t.payload.len() <= msg.payload.len() + r#","truncated":true"#.len(),
            "{} > {}",
            t.payload.len(),
            msg.payload.len()
        );
        assert_eq!(t.key, msg.key);
    }
}

#[test]
fn object_corpus() {
    for (_, bytes) in corpus("object") {
        let text = String::from_utf8_lossy(&bytes);
        for mode in [
            PayloadMode::Full,
            PayloadMode::Metadata,
            PayloadMode::Fields,
        ] {
            let mut r = ResourceConfig::new("v1", "Secret");
            r.payload = mode;
            if mode == PayloadMode::Fields {
                r.fields = vec!["/data/password".into(), "/metadata/annotations".into()];
            }
            check_object_text(&text, &r);
        }
    }
}

proptest! {
    #[test]
    fn watch_line_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        check_watch_line(&bytes);
    }

    #[test]
    fn watch_line_never_panics_on_mutated_events(bytes in mutated("watch_line")) {
        check_watch_line(&bytes);
    }

    #[test]
    fn objects_shape_and_encode_into_json(o in object(), res in resource_config()) {
        check_object_text(&o.to_string(), &res);
    }

    #[test]
    fn arbitrary_and_mutated_object_text_never_panics(
        text in ".{0,200}",
        bytes in mutated("object"),
        res in resource_config(),
    ) {
        check_object_text(&text, &res);
        check_object_text(&String::from_utf8_lossy(&bytes), &res);
    }

    #[test]
    fn the_fingerprint_ignores_the_resource_version_only(o in object(), rv in any::<u64>()) {
        let res = ResourceConfig::new("v1", "Pod");
        let shaper = Shaper::new(&res, "l", "c");
        let text = o.to_string();
        let mut other = o.clone();
        other["metadata"]["resourceVersion"] = json!(rv.to_string());
        let a = shaper.shape(&RawObject::parse(&text).unwrap()).unwrap();
        let b = shaper.shape(&RawObject::parse(&other.to_string()).unwrap()).unwrap();
        prop_assert_eq!(a.fingerprint, b.fingerprint);
        let mut changed = o.clone();
        changed["metadata"]["labels"]["fuzz-changed"] = json!("yes");
        let c = shaper.shape(&RawObject::parse(&changed.to_string()).unwrap()).unwrap();
        prop_assert_ne!(a.fingerprint, c.fingerprint);
    }

    /// Kafka keys (the message key) of distinct objects differ. Kubernetes names and
    /// namespaces never contain '/' (API conventions: path segment names).
    #[test]
    fn message_keys_of_distinct_objects_differ(
        a in ("[^/]{0,12}", proptest::option::of("[^/]{1,8}")),
        b in ("[^/]{0,12}", proptest::option::of("[^/]{1,8}")),
    ) {
        let r = Resource::new("c", "apps", "v1", "Deployment", "deployments", true);
        prop_assume!(a != b);
        prop_assert_ne!(r.key(a.1.as_deref(), &a.0), r.key(b.1.as_deref(), &b.0));
    }
}

#[cfg(feature = "nats")]
mod nats_subjects {
    use kubesink_core::MessageMeta;
    use kubesink_nats::{subject_template, unescape_token, DEFAULT_SUBJECT};

    use super::*;

    fn meta(ns: Option<&str>, name: &str) -> MessageMeta {
        let things = Resource::new("c.1", "example.com", "v1", "Thing", "things", true);
        kubesink_core::message::fixtures::meta(Arc::new(things), ns, name)
    }

    proptest! {
        /// Under the default template (which names the object), distinct objects get
        /// distinct subjects, every token is a legal NATS token, and each unescapes back.
        #[test]
        fn distinct_objects_get_distinct_reversible_subjects(
            a in (proptest::option::of(".{0,10}"), ".{0,16}"),
            b in (proptest::option::of(".{0,10}"), ".{0,16}"),
        ) {
            let t = subject_template(DEFAULT_SUBJECT).unwrap();
            let (sa, sb) = (t.render(&meta(a.0.as_deref(), &a.1)), t.render(&meta(b.0.as_deref(), &b.1)));
            for s in [&sa, &sb] {
                for token in s.split('.') {
                    prop_assert!(!token.is_empty(), "{}", s);
                    prop_assert!(!token.contains(|c: char| c.is_whitespace() || c == '*' || c == '>'), "{}", s);
                }
            }
            let tokens: Vec<&str> = sa.split('.').collect();
            let name = unescape_token(tokens[5]);
            prop_assert_eq!(name.as_deref(), Some(a.1.as_str()));
            // `_` stands for "no namespace", so None and Some("") share it by design; a
            // namespace is never empty in Kubernetes.
            let norm = |x: &(Option<String>, String)| (x.0.clone().filter(|n| !n.is_empty()), x.1.clone());
            if norm(&a) != norm(&b) {
                prop_assert_ne!(&sa, &sb);
            }
        }

        /// A template without `{name}` says objects share subjects: they do.
        #[test]
        fn a_template_without_the_name_shares_subjects(a in ".{0,16}", b in ".{0,16}") {
            let t = subject_template("k.{cluster}.{kind}.{namespace}").unwrap();
            prop_assert_eq!(t.render(&meta(Some("ns"), &a)), t.render(&meta(Some("ns"), &b)));
        }
    }
}

#[cfg(feature = "kafka")]
mod kafka_topics {
    use kubesink_kafka::topic_template;

    use super::*;

    proptest! {
        /// Rendered topics use only Kafka's topic characters, whatever the values.
        #[test]
        fn topics_use_only_legal_characters(cluster in ".{1,12}", ns in proptest::option::of(".{0,12}"), kind in ".{1,8}") {
            let t = topic_template("k8s.{cluster}.{group}.{kind}.{namespace}").unwrap();
            let resource = Arc::new(Resource::new(&cluster, "g.example", "v1", &kind, "k", true));
            let m = kubesink_core::message::fixtures::meta(resource, ns.as_deref(), "n");
            let topic = t.render(&m);
            prop_assert!(topic.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{}", topic);
        }
    }
}
