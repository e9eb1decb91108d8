//! Routes: which sinks each watch's deciders serve, from the sinks' `filter`s.
//!
//! A sink without a `filter` gets every change of every watch; the sinks without one share
//! one decider per watch (the *shared view*), as before filters existed. A sink with a
//! `filter` gets a decider of its own per watch (its *view*): it follows the objects the
//! resource's filter and the sink's filter both match (or, for a change filter naming `op`
//! or `changed`, every object, and drops the changes the filter does not match), so it is
//! sent `added` when an object starts matching and `deleted` (`leftFilter`) when one stops,
//! its sync markers and inferred deletes cover what *it* holds, and its acknowledged state
//! (what the saved state and the journal record, see `informer/tracked.rs`) counts only its
//! own confirmations: a change another sink did not get cannot hold back, or run ahead of,
//! what this sink has.
//!
//! Why a decider per filtered sink, rather than one store holding a per-sink bit per key:
//! a view's store holds only the objects its filter matches (about 114 bytes each, `store.rs`), so a
//! narrow route costs little; the decider, the store, the saved state and the journal stay
//! exactly the code every other watch runs (restart, hand-over, 410 Gone, owed deletes), with
//! no second format to keep; and a per-key bit would have to be saved and read back per sink
//! anyway. The price is CPU: each view decides every event again (measured in the bench
//! suite's `filters` rows).
//!
//! In the saved state a view is the watch's identity with `#sink=NAME` appended. A view
//! without a saved state of its own starts from the shared view's (the sink got everything
//! until it had a filter), so adding a filter to a sink sends it `deleted` (`leftFilter`) for
//! what the filter leaves out and nothing else.

use std::sync::Arc;

use kubesink_core::Sink;

use crate::informer::{Filter, SinkFilterStats};
use crate::plan::{Plan, SinkPlan};

/// One view's sinks and filter.
#[derive(Debug)]
pub struct Route {
    /// The filtered sink's name; `None` for the shared view.
    pub sink: Option<String>,
    /// The indexes of its sinks in the pipeline.
    pub sinks: Vec<usize>,
    /// The sink's compiled filter; `None` for the shared view.
    pub filter: Option<Arc<Filter>>,
    /// What the sink's filter did, summed over its views (shown per sink).
    pub counts: Arc<SinkFilterStats>,
}

impl Route {
    /// The identity in the saved state of this route's view of the watch `identity`.
    pub fn identity(&self, identity: &str) -> String {
        match &self.sink {
            None => identity.to_owned(),
            Some(name) => format!("{identity}#sink={name}"),
        }
    }

    /// The identity a view without saved state of its own starts from: the shared view's.
    pub fn seed(&self, identity: &str) -> Option<String> {
        self.sink.as_ref().map(|_| identity.to_owned())
    }
}

/// The routes of `sinks` (the pipeline's, in order): the shared view of the sinks whose
/// planned entry (found by name in `planned`) has no filter, if any, then one route per
/// filtered sink. A sink not in the plan (an embedder's) has no filter.
pub fn routes(planned: &[SinkPlan], sinks: &[Arc<dyn Sink>]) -> Vec<Route> {
    let mut shared = Vec::new();
    let mut filtered = Vec::new();
    for (i, sink) in sinks.iter().enumerate() {
        let filter = planned
            .iter()
            .find(|p| p.name() == sink.name())
            .and_then(|p| p.filter.clone());
        let Some(filter) = filter else {
            shared.push(i);
            continue;
        };
        filtered.push(Route {
            sink: Some(sink.name().to_owned()),
            sinks: vec![i],
            filter: Some(filter),
            counts: Arc::default(),
        });
    }
    let mut out = Vec::with_capacity(filtered.len() + 1);
    if !shared.is_empty() || filtered.is_empty() {
        out.push(Route {
            sink: None,
            sinks: shared,
            filter: None,
            counts: Arc::default(),
        });
    }
    out.extend(filtered);
    out
}

/// The routes of `plan` in words, one line per resource and sink (per cluster when there
/// are several): what reaches the sink, and whether the sink keeps state of its own. What
/// `kubesink check` prints.
pub fn explain(plan: &Plan) -> Vec<String> {
    // Each sink once: where it goes and its compiled filter.
    let sinks: Vec<_> = plan
        .sinks
        .iter()
        .map(
            |SinkPlan {
                 config: sink,
                 filter,
             }| {
                let entry = serde_json::to_value(sink).unwrap_or_default();
                let text = |k: &str| entry.get(k).and_then(|v| v.as_str());
                let kind = text("type").unwrap_or_default();
                // Where it goes: the topic, subject, URL or endpoint (template) of the entry.
                let stream = entry
                    .pointer("/stream/name")
                    .and_then(|v| v.as_str())
                    .filter(|_| text("mode") == Some("jetstream"))
                    .map(|s| format!(", stream {s:?}"))
                    .unwrap_or_default();
                let target = ["topic", "subject", "url", "endpoint"]
                    .iter()
                    .find_map(|k| text(k).map(|t| format!(" ({k} {t:?}{stream})")))
                    .unwrap_or_default();
                let to = format!("{kind} {:?}{target}", sink.name());
                let filter = sink.filter().zip(filter.as_deref());
                (to, filter)
            },
        )
        .collect();
    let multi = plan.clusters.len() > 1;
    let mut out = Vec::new();
    for unit in &plan.clusters {
        let cluster = &unit.cluster;
        for res in &cluster.resources {
            let from = match multi {
                true => format!("{}: {}", cluster.name, res.display_name()),
                false => res.display_name(),
            };
            let objects = res.filter.as_deref().map(|f| format!("({f})"));
            for (to, filter) in &sinks {
                let when = match filter {
                    None => match &objects {
                        None => "every change".to_owned(),
                        Some(r) => format!("the objects matching {r}"),
                    },
                    Some((expr, f)) if f.on_changes() => {
                        let of = objects
                            .as_ref()
                            .map(|r| format!(" of the objects matching {r}"))
                            .unwrap_or_default();
                        format!("the changes matching ({expr}){of}; own state")
                    }
                    Some((expr, _)) => match &objects {
                        None => format!("the objects matching ({expr}); own state"),
                        Some(r) => format!("the objects matching {r} && ({expr}); own state"),
                    },
                };
                out.push(format!("{from} → {to}: {when}"));
            }
        }
    }
    out
}
