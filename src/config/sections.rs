//! The small sections: `[leader_election]`, `[pipeline]`, `[watch]`, `[server]`, `[log]`,
//! each with the checks serde cannot express beside it.

use serde::{Deserialize, Serialize};

use super::problems::Problems;
use super::{ByteSize, ClusterEntry, HumanDuration};

/// `[leader_election]`: replicas elect a leader on a `coordination.k8s.io/v1` Lease, the way
/// client-go's `leaderelection` does (optimistic concurrency on the Lease's resourceVersion);
/// only the leader watches and emits (`src/leader.rs`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LeaderElectionConfig {
    /// Elect a leader. Default `false`: this process always leads.
    pub enabled: bool,
    /// The Lease's name. Default `kubesink`.
    pub lease_name: String,
    /// The Lease's namespace. Default: the Pod's own namespace in a cluster, else `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease. Default: `POD_NAME`, else the host name plus a
    /// random suffix drawn once per process (two replicas on one host never share one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The cluster whose API holds the Lease (a `[[clusters]]` name). Default: the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// How long a lease is valid after its last renewal; followers take over after it.
    /// Default 15s (client-go's).
    pub lease_duration: HumanDuration,
    /// The leader stops emitting when it could not renew for this long; shorter than
    /// `lease_duration`, so it stops before anyone else may start. Default 10s.
    pub renew_deadline: HumanDuration,
    /// How often to try to acquire or renew. Default 2s.
    pub retry_period: HumanDuration,
    /// Spread the clusters over the replicas instead of electing one leader for all
    /// (`docs/scale-out.md`): each replica renews a membership Lease
    /// (`{lease_name}-member-…`), every replica computes the same assignment of clusters to
    /// the live members, and each cluster is held on a Lease of its own
    /// (`{lease_name}-cluster-…`) with these timings. Needs `enabled = true` and `[state]` in
    /// NATS or Kafka (the next holder of a cluster resumes from its saved state). Default
    /// `false`.
    pub scale_out: bool,
    /// With `scale_out`: how long a replica must have been a member before clusters are
    /// assigned to it, so a replica that restarts again and again does not pull clusters
    /// back and forth. Default: 2 × `lease_duration`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_after: Option<HumanDuration>,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            enabled: false,
            lease_name: "kubesink".to_owned(),
            lease_namespace: None,
            identity: None,
            cluster: None,
            lease_duration: HumanDuration::from_secs(15),
            renew_deadline: HumanDuration::from_secs(10),
            retry_period: HumanDuration::from_secs(2),
            scale_out: false,
            join_after: None,
        }
    }
}

impl LeaderElectionConfig {
    /// Problems serde cannot see, as `(key, message)` with full dotted keys; `clusters` are the
    /// `[[clusters]]` entries (`leader_election.cluster` must name one).
    pub fn problems(&self, clusters: &[ClusterEntry]) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        if self.enabled {
            if self.renew_deadline >= self.lease_duration {
                problems.add("leader_election.renew_deadline", "must be shorter than leader_election.lease_duration (the leader must stop before its lease can expire)");
            }
            if self.retry_period >= self.renew_deadline || self.retry_period.0.is_zero() {
                problems.add(
                    "leader_election.retry_period",
                    "must be greater than zero and shorter than leader_election.renew_deadline",
                );
            } else if self.renew_deadline.0 + 2 * self.retry_period.0 >= self.lease_duration.0
                && self.renew_deadline < self.lease_duration
            {
                // The leader learns that it missed its renew deadline at the end of a renew
                // attempt: up to one retry_period of sleep plus one of request time after
                // the deadline. Only then does it stop and exit; until then it must still hold
                // the lease, or another replica could take over while it runs.
                problems.add(
                    "leader_election.lease_duration",
                    format!(
                        "must be longer than renew_deadline + 2 × retry_period ({} + 2 × {}): a leader that cannot renew stops up to two retry periods after its renew deadline, and must not outlive its lease",
                        humantime::format_duration(self.renew_deadline.0),
                        humantime::format_duration(self.retry_period.0)
                    ),
                );
            }
            if let Some(name) = &self.cluster {
                if !clusters.iter().any(|e| &e.name == name) {
                    problems.add(
                        "leader_election.cluster",
                        format!("{name:?} is not the name of a [[clusters]] entry"),
                    );
                }
            }
        }
        if self.join_after.is_some() && !self.scale_out {
            problems.add(
                "leader_election.join_after",
                "is a scale-out setting: set leader_election.scale_out = true, or remove it",
            );
        }
        if self.scale_out && !self.enabled {
            problems.add(
                "leader_election.scale_out",
                "needs leader_election.enabled = true (each cluster is held on a Lease of its own, with the leader election's timings)",
            );
        }
        problems.into_vec()
    }

    /// With `scale_out`: [`LeaderElectionConfig::join_after`], else 2 × `lease_duration`.
    pub fn join_after(&self) -> std::time::Duration {
        self.join_after.map_or(2 * self.lease_duration.0, |d| d.0)
    }
}

/// `[pipeline]`: the batching and backpressure stage (see `src/pipeline/mod.rs`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// While a key waits, a newer change replaces the older one (topology is state). `false`
    /// keeps every change. Default `true`.
    pub coalesce: bool,
    /// Changes held per sink (waiting plus in flight) before the informers stop reading their
    /// watch streams. With `coalesce = true` this is the number of distinct keys waiting.
    /// Default 10000.
    pub max_pending: usize,
    /// Bytes (keys + payloads) held per sink before the informers stop reading. Default 8MiB
    /// (~1,000 pods of 8 KB: enough to keep a sink busy, small next to the informer's state;
    /// see `BENCHMARKS.md`).
    pub max_pending_bytes: ByteSize,
    /// A batch closes at this many messages. Default 500.
    pub max_batch_events: usize,
    /// A batch closes at this many bytes (keys + payloads). Default 1MiB.
    pub max_batch_bytes: ByteSize,
    /// How long an idle sink (no batch in flight) waits for more changes after the oldest
    /// pending one before sending. A busy sink's next batch is everything that accumulated
    /// during its current send, without waiting, so batches grow with the load. Default 0s:
    /// an idle sink sends at once (lowest latency); a few milliseconds trade latency for
    /// fewer, fuller requests at low change rates.
    pub linger: HumanDuration,
    /// First retry delay after a sink error; doubles per failure (with jitter). Default 100ms.
    pub retry_initial_backoff: HumanDuration,
    /// Cap of every retry delay, jitter and a destination's retry-after hint included; a
    /// sink that reports its destination reachable again ends the wait at once. Default 30s.
    pub retry_max_backoff: HumanDuration,
    /// On SIGINT/SIGTERM, the deadline of the whole shutdown: stopping the watches,
    /// delivering what is pending and closing the sinks (four fifths of it at most), then the
    /// final state save, the lease release and the wait for the tasks. What does not fit is
    /// abandoned and named; `kubesink run` exits 1 naming how many changes were left
    /// undelivered, 5 when only later steps were abandoned (`docs/operations.md`). Keep it
    /// below the Pod's `terminationGracePeriodSeconds`. Default 10s.
    pub shutdown_timeout: HumanDuration,
    /// After each list (initial list or relist) of each watch, send a sync marker (`op:
    /// "synced"`, see `docs/message-contract.md`) to every destination of the resource, after
    /// all of the list's messages. Default `false`.
    pub sync_markers: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        use std::time::Duration;
        PipelineConfig {
            coalesce: true,
            max_pending: 10_000,
            max_pending_bytes: ByteSize(8 * 1024 * 1024),
            max_batch_events: 500,
            max_batch_bytes: ByteSize(1024 * 1024),
            linger: HumanDuration(Duration::ZERO),
            retry_initial_backoff: HumanDuration(Duration::from_millis(100)),
            retry_max_backoff: HumanDuration(Duration::from_secs(30)),
            shutdown_timeout: HumanDuration(Duration::from_secs(10)),
            sync_markers: false,
        }
    }
}

impl PipelineConfig {
    /// Problems serde cannot see, as `(key, message)` with full dotted keys.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        for (key, v) in [
            ("pipeline.max_pending", self.max_pending),
            ("pipeline.max_batch_events", self.max_batch_events),
            ("pipeline.max_pending_bytes", self.max_pending_bytes.bytes()),
            ("pipeline.max_batch_bytes", self.max_batch_bytes.bytes()),
        ] {
            if v == 0 {
                problems.add(key, "must be at least 1");
            }
        }
        if self.retry_initial_backoff.0.is_zero() {
            problems.add(
                "pipeline.retry_initial_backoff",
                "must be greater than zero",
            );
        }
        if self.retry_max_backoff < self.retry_initial_backoff {
            problems.add(
                "pipeline.retry_max_backoff",
                "must not be shorter than pipeline.retry_initial_backoff",
            );
        }
        problems.into_vec()
    }
}

/// `[watch]`: how each informer keeps its list and watch going (`src/informer/mod.rs`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// A watch that delivers neither an event nor a bookmark for this long is presumed dead
    /// (a middlebox that dropped the connection silently, a server that stopped sending) and
    /// re-established from its last resourceVersion. API servers send a bookmark about every
    /// minute on a healthy watch. A list page whose bytes stop arriving for this long is
    /// abandoned and the list tried again (a slow server is waited for). Default 3m.
    pub idle_timeout: HumanDuration,
    /// First delay after a failed list or watch (or a watch that ended empty at once);
    /// doubles per consecutive failure, with jitter inside the cap; reset only after a list
    /// completed or a watch delivered something. Also the bound of the random delay before a
    /// relist that needs no backoff (after 410 Gone), so that informers that lose their
    /// watches together do not relist together. Default 500ms.
    pub retry_initial_backoff: HumanDuration,
    /// Cap of that delay, `Retry-After` excepted (a server asking for longer is obeyed).
    /// Default 15s.
    pub retry_max_backoff: HumanDuration,
    /// How the initial state (and every relist) is read: a streaming list (KEP-3157), paged
    /// LISTs, or streaming where the server supports it. Default `auto`.
    pub initial_list: InitialList,
    /// The encoding asked of the API server for metadata-only resources (`payload =
    /// "metadata"`): `auto` asks for protobuf `PartialObjectMetadata` first (what client-go's
    /// metadata informer reads; far cheaper for the server to encode than JSON) and takes
    /// JSON where the server answers it instead; `json` asks for JSON only. Whole objects are
    /// always read as JSON. What is emitted is the same either way. Default `auto`.
    pub encoding: WireEncoding,
    /// Client-side limit on list and watch requests per cluster: a token bucket refilled at
    /// this rate (requests per second, fractions allowed), like client-go's `QPS`; `0` turns
    /// the limit off. Each cluster has its own bucket. Default 50.
    pub requests_per_second: f64,
    /// The bucket's size: how many requests may go at once before the rate applies, like
    /// client-go's `Burst`. Default 100.
    pub request_burst: u32,
    /// How many lists (initial lists and relists, streaming or paged) the whole process reads
    /// at once, across every cluster; the others wait for a slot, first come first served. A
    /// streaming list holds its slot until its initial-events-end bookmark, a paged list
    /// until its last page; the watch after it holds none. Bounds the memory of a cold start
    /// of many clusters (`[[clusters]]`) to that of this many lists. `0` turns the limit off
    /// (every list at once). Default 16.
    pub max_concurrent_lists: usize,
}

/// `watch.initial_list`: how an informer reads the state it starts from (initial sync and
/// every relist). See `docs/architecture.md` ("Streaming lists").
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum InitialList {
    /// The shape cheaper for the server, from its version (`/version`): on Kubernetes 1.34
    /// and later paged lists (served from the watch cache's snapshots), on 1.32 a streaming
    /// list, on 1.33 and before 1.32 paged lists, a streaming list while the version is
    /// unknown. A streaming list falls back, per
    /// cluster and resource, to paged lists when the server refuses it (an error status),
    /// ignores `sendInitialEvents`, or never ends the initial events with their bookmark.
    /// The fallback is logged once and kept until restart. See `docs/operations.md`
    /// ("Reading the initial state").
    #[default]
    Auto,
    /// Always a streaming list: a watch with `sendInitialEvents=true`,
    /// `resourceVersionMatch=NotOlderThan` and `resourceVersion` unset (a consistent read),
    /// whose initial state ends with the BOOKMARK annotated `k8s.io/initial-events-end`
    /// (KEP-3157, beta and on by default from Kubernetes 1.34; on in 1.32, off in 1.33). A
    /// server without it is a failure, retried with backoff: no LIST is ever sent.
    Stream,
    /// Always paged LISTs (`limit` and `continue`), then a watch from the list's
    /// resourceVersion: every API server serves them.
    List,
}

/// `watch.encoding`: how metadata-only resources cross the wire. See `docs/architecture.md`
/// ("Wire encoding").
#[derive(
    Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum WireEncoding {
    /// Protobuf for metadata-only resources where the server offers it, JSON otherwise.
    #[default]
    Auto,
    /// JSON always.
    Json,
}

impl std::fmt::Display for InitialList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InitialList::Auto => "auto",
            InitialList::Stream => "stream",
            InitialList::List => "list",
        })
    }
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            idle_timeout: HumanDuration::from_secs(180),
            retry_initial_backoff: HumanDuration::from_millis(500),
            retry_max_backoff: HumanDuration::from_secs(15),
            initial_list: InitialList::Auto,
            encoding: WireEncoding::Auto,
            requests_per_second: 50.0,
            request_burst: 100,
            max_concurrent_lists: DEFAULT_MAX_CONCURRENT_LISTS,
        }
    }
}

impl WatchConfig {
    /// Problems serde cannot see, as `(key, message)` with full dotted keys.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        if self.idle_timeout.0 < std::time::Duration::from_secs(1) {
            problems.add("watch.idle_timeout", "must be at least 1s");
        }
        if self.retry_initial_backoff.0.is_zero() {
            problems.add("watch.retry_initial_backoff", "must be greater than zero");
        }
        if self.retry_max_backoff < self.retry_initial_backoff {
            problems.add(
                "watch.retry_max_backoff",
                "must not be shorter than watch.retry_initial_backoff",
            );
        }
        let rate = self.requests_per_second;
        if !rate.is_finite() || rate < 0.0 {
            problems.add(
                "watch.requests_per_second",
                format!(
                    "must be a number of requests per second, 0 (no limit) or more; got {rate}"
                ),
            );
        } else if rate > 0.0 && rate < MIN_REQUESTS_PER_SECOND {
            problems.add(
                "watch.requests_per_second",
                format!("must be 0 (no limit) or at least {MIN_REQUESTS_PER_SECOND} (one request an hour); got {rate}"),
            );
        }
        if self.request_burst == 0 && rate > 0.0 {
            problems.add(
                "watch.request_burst",
                "must be at least 1 while watch.requests_per_second limits the rate",
            );
        }
        if self.max_concurrent_lists > MAX_CONCURRENT_LISTS {
            problems.add(
                "watch.max_concurrent_lists",
                format!(
                    "must be 0 (no limit) or at most {MAX_CONCURRENT_LISTS} lists at once; got {}",
                    self.max_concurrent_lists
                ),
            );
        }
        problems.into_vec()
    }
}

/// The default `watch.max_concurrent_lists`: enough lists at once to keep two cores busy
/// decoding (more are not decoded faster), few enough that a fleet's cold start holds little
/// (`BENCHMARKS.md`, "Many clusters in one process").
pub const DEFAULT_MAX_CONCURRENT_LISTS: usize = 16;

/// The largest `watch.max_concurrent_lists`: far above any number of watches one process
/// holds (each is a connection), and within what a semaphore can count.
pub const MAX_CONCURRENT_LISTS: usize = 1_000_000;

/// The lowest non-zero `watch.requests_per_second`: one request an hour. Slower would starve
/// the watches (each ends every few minutes) and the bucket's period would not fit its clock.
pub const MIN_REQUESTS_PER_SECOND: f64 = 1.0 / 3600.0;

/// `[server]`: the HTTP server with `/metrics`, `/healthz` and `/readyz`
/// (`docs/operations.md`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Serve at all. Default `true`.
    pub enabled: bool,
    /// Address and port to listen on. Default `0.0.0.0:9090`.
    pub listen: String,
    /// `/healthz` fails when a watch could not be re-established for this long (connection
    /// failures, dead or undecodable watches, server errors; not 401/403/404, which a restart
    /// cannot cure). Default 5m.
    pub watch_failure_timeout: HumanDuration,
    /// How often each sink's healthcheck runs once it passed (readiness). Default 10s.
    pub sink_check_interval: HumanDuration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            enabled: true,
            listen: "0.0.0.0:9090".to_owned(),
            watch_failure_timeout: HumanDuration::from_secs(300),
            sink_check_interval: HumanDuration::from_secs(10),
        }
    }
}

impl ServerConfig {
    /// Problems serde cannot see, as `(key, message)` with full dotted keys.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        if self.enabled {
            if let Err(e) = self.listen.parse::<std::net::SocketAddr>() {
                problems.add(
                    "server.listen",
                    format!(
                        "{:?} is not an address:port ({e}), e.g. \"0.0.0.0:9090\"",
                        self.listen
                    ),
                );
            }
        }
        if self.sink_check_interval.0.is_zero() {
            problems.add("server.sink_check_interval", "must be greater than zero");
        }
        problems.into_vec()
    }
}

/// `[log]`: logging beyond `--log-format` and `--log-level`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Interval of the one-line summary at info level (objects, events/s, messages/s,
    /// pending and delivered/s per sink); `0s` turns it off. Default 60s.
    pub summary_interval: HumanDuration,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            summary_interval: HumanDuration::from_secs(60),
        }
    }
}
