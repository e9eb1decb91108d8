//! Prometheus metrics (`prometheus-client`), read at scrape time from the counters the
//! informers and sink workers keep anyway ([`InformerStats`], [`SinkStats`]), so the hot path
//! pays nothing for them. Names and units follow the Prometheus conventions
//! (<https://prometheus.io/docs/practices/naming/>): `kubesink_…_total` counters, `_seconds`,
//! `_bytes`. Every metric is listed with its meaning in `docs/operations.md`.
//!
//! Labels: `cluster`, `api_version`, `kind`, `scope` (`all`, or the namespace) per watch;
//! `sink` per sink; `cluster` per state store and per cluster's API requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use super::entries::{ClusterEntry, SinkEntry, StateEntry, WatchEntry, WatchList};
use crate::informer::{InformerStats, ListBudget, SinkFilterStats, Strategy};
use crate::leader::Leadership;
use crate::pipeline::{SinkStats, ERROR_KINDS};
use crate::state::StateStats;

type Labels = Vec<(&'static str, String)>;

/// The registry of one bridge: build info and the collector.
pub fn registry(
    watches: Arc<WatchList>,
    sinks: Arc<[SinkEntry]>,
    states: Arc<[StateEntry]>,
    clusters: Arc<[ClusterEntry]>,
    lists: Arc<ListBudget>,
    leadership: Option<Arc<Leadership>>,
) -> Registry {
    let mut r = Registry::with_prefix("kubesink");
    r.register(
        "build",
        "kubesink's version",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    r.register_collector(Box::new(BridgeCollector {
        watches,
        sinks,
        states,
        clusters,
        lists,
        leadership,
    }));
    r
}

struct BridgeCollector {
    watches: Arc<WatchList>,
    sinks: Arc<[SinkEntry]>,
    states: Arc<[StateEntry]>,
    clusters: Arc<[ClusterEntry]>,
    lists: Arc<ListBudget>,
    leadership: Option<Arc<Leadership>>,
}

impl BridgeCollector {
    /// The watches now (a group-form resource adds and removes them as kinds come and go).
    fn watches(&self) -> Arc<[WatchEntry]> {
        self.watches.get()
    }
}

impl std::fmt::Debug for BridgeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeCollector")
            .field("watches", &self.watches().len())
            .field("sinks", &self.sinks.len())
            .finish()
    }
}

/// A counter of [`InformerStats`], by name.
type Get = fn(&InformerStats) -> u64;

/// One state metric: name, help, unit and how to read it from [`StateStats`].
type StateMetric<T> = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&StateStats) -> T,
);

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// One metric family: name, help, unit, type, and its (labels, value) samples.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else {
        return Ok(());
    };
    let mut fam = encoder.encode_descriptor(name, help, unit, first.metric_type())?;
    for (labels, metric) in samples {
        metric.encode(fam.encode_family(&labels)?)?;
    }
    Ok(())
}

impl WatchEntry {
    fn labels(&self) -> Labels {
        vec![
            ("cluster", self.cluster.clone()),
            ("api_version", self.api_version.clone()),
            ("kind", self.kind.clone()),
            (
                "scope",
                self.namespace.clone().unwrap_or_else(|| "all".into()),
            ),
        ]
    }
}

impl SinkEntry {
    /// `sink`, and `cluster` with scale-out (a pipeline per held cluster).
    fn labels(&self) -> Labels {
        let mut labels = vec![("sink", self.handle.sink().name().to_owned())];
        if let Some(c) = &self.cluster {
            labels.push(("cluster", c.clone()));
        }
        labels
    }
}

fn with(mut labels: Labels, key: &'static str, value: &str) -> Labels {
    labels.push((key, value.to_owned()));
    labels
}

impl BridgeCollector {
    fn watch_counter(
        &self,
        e: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        get: impl Fn(&InformerStats) -> u64,
    ) -> Result<(), std::fmt::Error> {
        family(
            e,
            name,
            help,
            None,
            self.watches()
                .iter()
                .map(|w| (w.labels(), ConstCounter::new(get(&w.stats)))),
        )
    }

    fn sink_counter(
        &self,
        e: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        get: impl Fn(&SinkStats, &SinkEntry) -> u64,
    ) -> Result<(), std::fmt::Error> {
        family(
            e,
            name,
            help,
            None,
            self.sinks
                .iter()
                .map(|s| (s.labels(), ConstCounter::new(get(s.handle.stats(), s)))),
        )
    }

    fn encode_watches(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let events: [(&str, Get); 5] = [
            ("listed", |s| load(&s.listed)),
            ("added", |s| load(&s.added_events)),
            ("modified", |s| load(&s.modified_events)),
            ("deleted", |s| load(&s.deleted_events)),
            ("bookmark", |s| load(&s.bookmarks)),
        ];
        family(
            e,
            "watch_events",
            "Objects read from lists and watch events received, by type",
            None,
            self.watches().iter().flat_map(|w| {
                events.iter().map(|(t, get)| {
                    (
                        with(w.labels(), "type", t),
                        ConstCounter::new(get(&w.stats)),
                    )
                })
            }),
        )?;
        let ops: [(&str, Get); 3] = [
            ("added", |s| load(&s.emitted_added)),
            ("updated", |s| load(&s.emitted_updated)),
            ("deleted", |s| load(&s.emitted_deleted)),
        ];
        family(
            e,
            "messages",
            "Messages emitted into the pipeline, by op",
            None,
            self.watches().iter().flat_map(|w| {
                ops.iter()
                    .map(|(op, get)| (with(w.labels(), "op", op), ConstCounter::new(get(&w.stats))))
            }),
        )?;
        self.watch_counter(
            e,
            "suppressed",
            "Events that changed nothing in the emitted payload (no message)",
            |s| load(&s.suppressed),
        )?;
        self.watch_counter(
            e,
            "updates_ignored",
            "Updates not emitted whose payload differs from the one last sent in the resource's ignore_changes paths only",
            |s| load(&s.ignored),
        )?;
        self.watch_counter(
            e,
            "events_before_since",
            "Events mode: Events a first start found whose last occurrence is older than since (recorded, not sent)",
            |s| load(&s.events_before_since),
        )?;
        self.watch_counter(
            e,
            "events_deletes_unsent",
            "Events mode: deletions of Events (their TTL) not sent (send_deleted = false)",
            |s| load(&s.events_deletes_unsent),
        )?;
        self.watch_counter(
            e,
            "stale_events",
            "Watch events dropped because their resourceVersion is older than the one held for the key (a replayed event)",
            |s| load(&s.stale_events),
        )?;
        self.watch_counter(
            e,
            "inferred_deletes",
            "Deletes inferred after a relist or a uid change (finalStateUnknown)",
            |s| load(&s.inferred_deletes),
        )?;
        self.watch_counter(
            e,
            "left_selector_deletes",
            "Watch DELETEDs of objects still in the cluster: they stopped matching the resource's selector (reason leftSelector)",
            |s| load(&s.left_selector),
        )?;
        self.watch_counter(
            e,
            "shard_foreign_objects",
            "Objects outside the watch's shard that kubesink dropped itself: the API server ignored shardSelector (ShardedListAndWatch off), the client-side fallback",
            |s| load(&s.shard_foreign),
        )?;
        self.watch_counter(
            e,
            "filtered_out_objects",
            "Objects listed or watched that the resource's filter did not match (not followed)",
            |s| load(&s.filtered_out),
        )?;
        self.watch_counter(
            e,
            "left_filter_deletes",
            "Objects that stopped matching the resource's filter, sent as deleted with reason leftFilter",
            |s| load(&s.left_filter),
        )?;
        self.watch_counter(
            e,
            "filter_errors",
            "Evaluations of the resource's filter that failed (a missing field, a type mismatch) or gave no bool: each taken as no match",
            |s| load(&s.filter_errors),
        )?;
        self.watch_counter(
            e,
            "skipped_objects",
            "Objects skipped because they could not be decoded or shaped",
            |s| load(&s.skipped),
        )?;
        self.watch_counter(
            e,
            "lists",
            "Lists started: the initial sync, relists, and retried lists",
            |s| load(&s.lists),
        )?;
        self.watch_counter(e, "list_requests", "List page requests of the informer's lists (the one-name lookups of leftSelector deletes count only in kubesink_api_requests_total)", |s| {
            load(&s.list_requests)
        })?;
        self.watch_counter(
            e,
            "watch_requests",
            "Watch requests sent (each re-watch counts)",
            |s| load(&s.watch_requests),
        )?;
        self.watch_counter(
            e,
            "watch_gone",
            "410 Gone / Expired answers (resourceVersion or continue token too old)",
            |s| load(&s.gone),
        )?;
        self.watch_counter(
            e,
            "watch_idle_restarts",
            "Watches re-established after watch.idle_timeout without event or bookmark",
            |s| load(&s.idle_restarts),
        )?;
        self.watch_counter(
            e,
            "watch_early_ends",
            "Watches that ended empty long before their timeoutSeconds (backed off, or relisted when the server no longer holds their resourceVersion)",
            |s| load(&s.early_ends),
        )?;
        self.watch_counter(
            e,
            "watch_early_ends_gone",
            "Watches that ended empty from a resourceVersion the server no longer holds (a list at it answered 410 Gone): relisted, as after a 410",
            |s| load(&s.early_ends_gone),
        )?;
        self.watch_counter(
            e,
            "decode_errors",
            "Responses, events or list items that did not decode",
            |s| load(&s.decode_errors),
        )?;
        self.watch_counter(
            e,
            "discovery_errors",
            "Failed API discovery attempts of the watch's resource (retried in the background)",
            |s| load(&s.discovery_errors),
        )?;
        let classes: [(&str, Get); 6] = [
            ("forbidden", |s| load(&s.forbidden)),
            ("not_found", |s| load(&s.not_found)),
            ("throttled", |s| load(&s.throttled)),
            ("server", |s| load(&s.server_errors)),
            ("transport", |s| load(&s.transport_errors)),
            ("other", |s| load(&s.other_errors)),
        ];
        family(
            e,
            "api_errors",
            "Failed list and watch requests, by class (forbidden: 401/403, not_found: 404, throttled: 429, server: 5xx, transport: no connection, other: 400 and other refusals)",
            None,
            self.watches().iter().flat_map(|w| {
                classes
                    .iter()
                    .map(|(c, get)| (with(w.labels(), "class", c), ConstCounter::new(get(&w.stats))))
            }),
        )?;
        family(
            e,
            "watch_last_event_age",
            "Seconds since the last event or bookmark of the watch (-1 before the first)",
            Some(&Unit::Seconds),
            self.watches().iter().map(|w| {
                let age = w.stats.since_last_event().map_or(-1.0, |d| d.as_secs_f64());
                (w.labels(), ConstGauge::new(age))
            }),
        )?;
        family(
            e,
            "objects",
            "Objects known to the watch (its lightweight store)",
            None,
            self.watches()
                .iter()
                .map(|w| (w.labels(), ConstGauge::new(load(&w.stats.objects) as i64))),
        )?;
        family(
            e,
            "synced",
            "1 once the watch's initial sync completed",
            None,
            self.watches().iter().map(|w| {
                (
                    w.labels(),
                    ConstGauge::new(i64::from(w.stats.synced.load(Ordering::Relaxed))),
                )
            }),
        )?;
        family(
            e,
            "initial_sync_duration",
            "How long the initial list took (0 until it completed)",
            Some(&Unit::Seconds),
            self.watches().iter().map(|w| {
                let secs = load(&w.stats.initial_sync_ms) as f64 / 1000.0;
                (w.labels(), ConstGauge::new(secs))
            }),
        )?;
        family(
            e,
            "watch_initial_list",
            "How the watch reads its state (watch.initial_list): 1 for the strategy in use, stream (a streaming list, KEP-3157) or list (paged LISTs); none before its first list",
            None,
            self.watches().iter().flat_map(|w| {
                let now = w.stats.strategy();
                now.into_iter().flat_map(move |now| {
                    [Strategy::Stream, Strategy::List].map(|s| {
                        (
                            with(w.labels(), "strategy", s.as_str()),
                            ConstGauge::new(i64::from(s == now)),
                        )
                    })
                })
            }),
        )?;
        self.watch_counter(
            e,
            "watch_initial_streams",
            "Streaming lists started (watches with sendInitialEvents=true; counted in kubesink_watch_requests_total too)",
            |s| load(&s.initial_streams),
        )?;
        self.watch_counter(
            e,
            "watch_initial_list_fallbacks",
            "Falls back from streaming to paged lists (watch.initial_list = \"auto\": the server refused, ignored or never ended the streaming list)",
            |s| load(&s.initial_list_fallbacks),
        )?;
        family(
            e,
            "watch_failing",
            "Seconds the watch has been failing without a successful list or watch (0 when healthy)",
            Some(&Unit::Seconds),
            self.watches().iter().map(|w| {
                let secs = w.stats.failing_for().map_or(0.0, |(d, _)| d.as_secs_f64());
                (w.labels(), ConstGauge::new(secs))
            }),
        )
    }

    fn encode_sinks(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let name = SinkEntry::labels;
        family(
            e,
            "sink_pending_messages",
            "Changes held for the sink: waiting plus in flight (bounded by pipeline.max_pending)",
            None,
            self.sinks
                .iter()
                .map(|s| (name(s), ConstGauge::new(s.handle.held() as i64))),
        )?;
        family(
            e,
            "sink_pending",
            "Bytes (keys + payloads) held for the sink (bounded by pipeline.max_pending_bytes)",
            Some(&Unit::Bytes),
            self.sinks
                .iter()
                .map(|s| (name(s), ConstGauge::new(s.handle.held_bytes() as i64))),
        )?;
        family(
            e,
            "sink_batches_in_flight",
            "Batches sent to the sink and not yet confirmed (at most the sink's batches_in_flight; 1 for sinks that confirm one batch at a time)",
            None,
            self.sinks
                .iter()
                .map(|s| (name(s), ConstGauge::new(s.handle.batches_in_flight() as i64))),
        )?;
        self.sink_counter(
            e,
            "sink_coalesced",
            "Changes not sent because of coalescing: replaced while waiting by a newer change of the same key and uid, or cancelled (an added and its delete, both waiting)",
            |_, s| s.handle.coalesced() as u64,
        )?;
        self.sink_counter(
            e,
            "sink_rate_held",
            "Event occurrences held back by their resource's reason_rate_limit (each once): they wait in the queue, later occurrences of the same Event folding into them",
            |_, s| s.handle.rate_held() as u64,
        )?;
        self.sink_counter(
            e,
            "sink_rate_folded",
            "Event occurrences folded into one held back by reason_rate_limit (its occurrences add them up; also counted in sink_coalesced)",
            |_, s| s.handle.rate_folded() as u64,
        )?;
        self.sink_counter(
            e,
            "sink_delivered_messages",
            "Messages the sink confirmed",
            |st, _| load(&st.delivered),
        )?;
        self.sink_counter(e, "sink_batches", "Batches the sink confirmed", |st, _| {
            load(&st.batches)
        })?;
        self.sink_counter(
            e,
            "sink_retried_messages",
            "Messages sent again after a failed send",
            |st, _| load(&st.retried),
        )?;
        family(
            e,
            "sink_journal_wait",
            "Time the sink's batches waited for the state journal to hold their new objects",
            Some(&Unit::Seconds),
            self.sinks.iter().map(|s| {
                let us = load(&s.handle.stats().write_ahead_wait_us);
                (name(s), ConstCounter::new(us as f64 / 1e6))
            }),
        )?;
        self.sink_counter(
            e,
            "sink_abandoned_messages",
            "Messages whose send was abandoned because the leadership fence closed during it (the next leader sends them)",
            |st, _| load(&st.abandoned),
        )?;
        self.sink_counter(
            e,
            "sink_client_rebuilds",
            "Times the sink replaced its client because the destination stopped accepting it while it answered (Kafka: a new producer after the brokers lost its producer id)",
            |_, s| s.handle.sink().client_rebuilds(),
        )?;
        self.sink_counter(
            e,
            "sink_rejected_messages",
            "Messages the destination refused for good (HTTP 4xx naming the message): logged at ERROR, not retried",
            |_, s| s.handle.sink().rejected(),
        )?;
        let views = |s: &SinkEntry, get: fn(&SinkFilterStats) -> u64| -> u64 {
            s.filter.as_deref().map_or(0, get)
        };
        self.sink_counter(
            e,
            "sink_filtered_out",
            "Objects (or, for a change filter, changes) that the sink's filter did not match, summed over its watches: not sent to this sink (0 without a filter)",
            move |_, s| views(s, |v| load(&v.filtered_out)),
        )?;
        self.sink_counter(
            e,
            "sink_left_filter_deletes",
            "Objects that stopped matching the sink's filter, sent to this sink as deleted with reason leftFilter",
            move |_, s| views(s, |v| load(&v.left_filter)),
        )?;
        self.sink_counter(
            e,
            "sink_filter_errors",
            "Evaluations of the sink's filter that failed (a missing field, a type mismatch) or gave no bool: each taken as no match",
            move |_, s| views(s, |v| load(&v.errors)),
        )?;
        self.sink_counter(
            e,
            "sink_truncated_messages",
            "Messages reduced by the oversize policy (metadata only, or no object)",
            |st, _| load(&st.truncated),
        )?;
        family(
            e,
            "sink_errors",
            "Failed sends, by kind (transient, partial, too_large, fatal); each is retried",
            None,
            self.sinks.iter().flat_map(|s| {
                ERROR_KINDS.iter().enumerate().map(move |(i, k)| {
                    (
                        with(name(s), "kind", k),
                        ConstCounter::new(load(&s.handle.stats().errors_by_kind[i])),
                    )
                })
            }),
        )?;
        family(
            e,
            "sink_ready",
            "1 while the sink's healthcheck passes and its sends succeed",
            None,
            self.sinks.iter().map(|s| {
                (
                    name(s),
                    ConstGauge::new(i64::from(s.handle.stats().ready())),
                )
            }),
        )?;
        family(
            e,
            "sink_batch_size",
            "Messages per confirmed batch",
            None,
            self.sinks
                .iter()
                .map(|s| (name(s), s.handle.stats().batch_size.clone())),
        )?;
        family(
            e,
            "sink_send_duration",
            "Duration of each send to the sink, failed ones included",
            Some(&Unit::Seconds),
            self.sinks
                .iter()
                .map(|s| (name(s), s.handle.stats().send_seconds.clone())),
        )
    }
}

impl BridgeCollector {
    fn encode_states(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters: [StateMetric<u64>; 6] = [
            (
                "state_saves",
                "Snapshots of the informer state stored",
                None,
                |s| load(&s.saves),
            ),
            (
                "state_save_failures",
                "Saves of the informer state that failed (retried at the next interval)",
                None,
                |s| load(&s.save_failures),
            ),
            (
                "state_journal_records",
                "Records appended to the state journal: one per added about to be sent",
                None,
                |s| load(&s.journal_records),
            ),
            (
                "state_journal_written",
                "Bytes of journal frames stored",
                Some(Unit::Bytes),
                |s| load(&s.journal_bytes),
            ),
            (
                "state_journal_appends",
                "Journal store operations (file: one write and fdatasync; NATS: one PubAck per frame; Kafka: one acknowledged record per frame); records per append is the group commit",
                None,
                |s| load(&s.journal_frames),
            ),
            (
                "state_journal_errors",
                "Failed journal appends (each retried; sends wait meanwhile)",
                None,
                |s| load(&s.journal_errors),
            ),
        ];
        self.state_families(e, counters, ConstCounter::new)?;
        let gauges: [StateMetric<f64>; 10] = [
            (
                "state_restored_objects",
                "Objects restored from the saved state when this replica started watching",
                None,
                |s| load(&s.restored_objects) as f64,
            ),
            (
                "state_restored_unconfirmed_objects",
                "Of those, unconfirmed: re-sent, or deleted, by the first list",
                None,
                |s| load(&s.restored_unconfirmed) as f64,
            ),
            (
                "state_restore_ignored_watches",
                "Watches whose saved state could not be used (each listed and emitted everything; the log says why)",
                None,
                |s| load(&s.restore_ignored_watches) as f64,
            ),
            (
                "state_last_save_timestamp",
                "Unix time of the last stored snapshot (0: none yet)",
                Some(Unit::Seconds),
                |s| load(&s.last_save_ms) as f64 / 1000.0,
            ),
            (
                "state_snapshot",
                "Size of the last stored snapshot",
                Some(Unit::Bytes),
                |s| load(&s.bytes) as f64,
            ),
            (
                "state_objects",
                "Objects in the last stored snapshot",
                None,
                |s| load(&s.objects) as f64,
            ),
            (
                "state_unconfirmed_objects",
                "Of those, sent as added and not yet confirmed by every sink",
                None,
                |s| load(&s.unconfirmed) as f64,
            ),
            (
                "state_journal_pending_records",
                "Journal records appended and not yet stored: the sends that wait for them",
                None,
                |s| s.journal_pending() as f64,
            ),
            (
                "state_journal_failing",
                "Seconds the journal has been failing to store (0 when healthy)",
                Some(Unit::Seconds),
                |s| s.journal_failing_for().map_or(0.0, |d| d.as_secs_f64()),
            ),
            (
                "state_restore_waiting",
                "Seconds the saved state has been unreadable while the watches wait for it (0 when not waiting)",
                Some(Unit::Seconds),
                |s| s.restore_waiting_for().map_or(0.0, |d| d.as_secs_f64()),
            ),
        ];
        self.state_families(e, gauges, ConstGauge::new)
    }

    /// One family per metric of `metrics`, a sample per cluster's state store.
    fn state_families<T, M: EncodeMetric, const N: usize>(
        &self,
        e: &mut DescriptorEncoder,
        metrics: [StateMetric<T>; N],
        make: fn(T) -> M,
    ) -> Result<(), std::fmt::Error> {
        for (metric, help, unit, get) in metrics {
            family(
                e,
                metric,
                help,
                unit.as_ref(),
                self.states
                    .iter()
                    .map(|s| (vec![("cluster", s.cluster.clone())], make(get(&s.stats)))),
            )?;
        }
        Ok(())
    }
}

impl BridgeCollector {
    /// Per cluster: API requests by verb, and the client-side rate limit's delays.
    fn encode_clusters(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let name = |c: &ClusterEntry| vec![("cluster", c.cluster.clone())];
        family(
            e,
            "api_requests",
            "List and watch requests sent to the cluster's API server, by verb (list: one per page; watch: streaming lists included)",
            None,
            self.clusters.iter().flat_map(|c| {
                [("list", &c.api.list_requests), ("watch", &c.api.watch_requests)]
                    .map(|(verb, n)| (with(name(c), "verb", verb), ConstCounter::new(load(n))))
            }),
        )?;
        family(
            e,
            "api_protobuf_responses",
            "List and watch responses the API server encoded in protobuf (metadata-only resources, watch.encoding = \"auto\"); the others in kubesink_api_requests_total were JSON",
            None,
            self.clusters
                .iter()
                .map(|c| (name(c), ConstCounter::new(load(&c.api.protobuf_responses)))),
        )?;
        family(
            e,
            "api_rate_limited_requests",
            "Requests that waited for the client-side rate limit (watch.requests_per_second, watch.request_burst)",
            None,
            self.clusters
                .iter()
                .map(|c| (name(c), ConstCounter::new(load(&c.api.delayed_requests)))),
        )?;
        family(
            e,
            "api_rate_limit_wait",
            "Time requests waited for the client-side rate limit, in all",
            Some(&Unit::Seconds),
            self.clusters
                .iter()
                .map(|c| (name(c), ConstCounter::new(c.api.delayed().as_secs_f64()))),
        )
    }
}

impl BridgeCollector {
    /// The process's budget of lists in flight (`watch.max_concurrent_lists`), no labels.
    fn encode_lists(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let l = &self.lists;
        let gauges = [
            (
                "watch_lists_in_flight",
                "Lists (initial lists and relists, streaming or paged) being read now, across every cluster",
                load(&l.in_flight),
            ),
            (
                "watch_lists_in_flight_peak",
                "The most lists read at once since the start (at most watch.max_concurrent_lists when it is not 0)",
                load(&l.peak),
            ),
            (
                "watch_lists_waiting",
                "Lists waiting now for a slot of watch.max_concurrent_lists",
                load(&l.waiting),
            ),
            (
                "watch_max_concurrent_lists",
                "watch.max_concurrent_lists: lists the process reads at once (0: no limit)",
                l.limit() as u64,
            ),
        ];
        for (name, help, v) in gauges {
            family(
                e,
                name,
                help,
                None,
                [(
                    Labels::new(),
                    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)),
                )],
            )?;
        }
        family(
            e,
            "watch_list_slot_waits",
            "Lists that waited for a slot of watch.max_concurrent_lists",
            None,
            [(Labels::new(), ConstCounter::new(load(&l.waits)))],
        )?;
        family(
            e,
            "watch_list_slot_wait",
            "Time lists waited for a slot of watch.max_concurrent_lists, in all",
            Some(&Unit::Seconds),
            [(Labels::new(), ConstCounter::new(l.waited().as_secs_f64()))],
        )
    }
}

impl Collector for BridgeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_watches(&mut encoder)?;
        self.encode_lists(&mut encoder)?;
        self.encode_clusters(&mut encoder)?;
        self.encode_sinks(&mut encoder)?;
        self.encode_states(&mut encoder)?;
        if let Some(l) = &self.leadership {
            family(
                &mut encoder,
                "leader",
                "1 while this replica holds the lease (leader election)",
                None,
                [(Labels::new(), ConstGauge::new(i64::from(l.is_leader())))],
            )?;
            family(
                &mut encoder,
                "leadership_changes",
                "Times this replica became or stopped being the leader",
                None,
                [(Labels::new(), ConstCounter::new(l.changes()))],
            )?;
            if let Some(ago) = l.holder_renewed_ago() {
                family(
                    &mut encoder,
                    "leader_lease_renewed",
                    "Seconds since the leader-election Lease's holder last renewed it, on this replica's clock (below about twice retry_period while the holder lives; at lease_duration a follower takes over)",
                    Some(&Unit::Seconds),
                    [(Labels::new(), ConstGauge::new(ago.as_secs_f64()))],
                )?;
            }
            family(
                &mut encoder,
                "lease_failing",
                "1 while the last attempts to read or write the leader-election Lease failed (this replica can neither lead nor stand by)",
                None,
                [(
                    Labels::new(),
                    ConstGauge::new(i64::from(l.lease_failing().is_some())),
                )],
            )?;
        }
        Ok(())
    }
}

/// Encodes `registry` in the Prometheus text format (version 0.0.4).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; a collector error would be a bug, reported inline.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, registry) {
        out.push_str(&format!("# encoding failed: {e}\n"));
    }
    out
}

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
