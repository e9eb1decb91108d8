//! `kubesink-sim`: a Kubernetes API server simulator for kubesink's tests, benchmarks and demo.
//!
//! It serves discovery, list (with `limit`/`continue` pagination over consistent snapshots),
//! watch (bookmarks, `sendInitialEvents`, 410 for compacted versions), metadata-only answers,
//! selectors, create/replace/delete and CustomResourceDefinitions over plain HTTP, following
//! the API concepts (<https://kubernetes.io/docs/reference/using-api/api-concepts/>). A
//! [`Workload`] generator fills it with realistic objects and a seeded churn changes them;
//! [`Faults`] inject the misbehaviour of real servers and networks (status answers, silent,
//! empty and damaged watches, expired `continue` tokens, slow bodies, an unreachable
//! server) and take permissions away ([`Denial`]: 403 answers and `SelfSubjectAccessReview`s
//! that agree); [`RequestCounts`] count list and watch requests. Objects may be nested 10,000
//! levels deep or weigh megabytes, and [`Simulator::insert_raw`] stores objects that break
//! the conventions. This crate root owns the [`Simulator`] handle and must never contain
//! HTTP or storage logic itself.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use kubesink_sim::{SimConfig, Simulator, Workload};
//! let sim = Simulator::new(SimConfig::default());
//! sim.populate(&Workload { pods: 100, ..Workload::default() }).expect("populate");
//! let addr = sim.start("127.0.0.1:0".parse().expect("addr")).await?;
//! sim.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig.json"))?;
//! # let _ = addr; Ok(()) }
//! ```

#![warn(missing_docs)]

mod error;
mod faults;
mod json;
mod kubeconfig;
mod resources;
mod selector;
mod server;
mod stats;
mod store;
mod validation;
pub mod workload;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use error::{ApiError, EXPIRED_CONTINUE_MESSAGE};
pub use faults::{
    BreakKind, DamageKind, Denial, DenialParseError, FailureKind, FaultError, Faults,
    InitialEventsBreak, RequestMatch, WatchListSupport, INJECTABLE_STATUSES,
};
pub use resources::ResourceType;
pub use selector::{FieldSelector, LabelSelector, SelectorError};
pub use server::admin::{admin_help, AdminEndpoint, ADMIN_ENDPOINTS};
pub use server::SIM_USER;
pub use stats::{RequestCounts, VerbCounts};
pub use store::RawResourceVersion;
pub use workload::{Churn, ChurnHandle, ChurnStats, Workload};

use store::Store;

/// The release `/version` reports unless set otherwise ([`Simulator::set_server_version`]).
pub const DEFAULT_SERVER_VERSION: (u32, u32) = (1, 36);

/// How many requests the request log keeps (oldest dropped first).
pub const REQUEST_LOG_CAPACITY: usize = 10_000;

/// Simulator settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Interval between BOOKMARK events on watches with `allowWatchBookmarks=true`. Default 1 s.
    pub bookmark_interval: Duration,
    /// How many change events the log keeps (the "retained window"): watches and `Exact` lists
    /// / continue tokens older than the window get 410 Expired. Also bounds how far a live
    /// watcher may lag before its stream is closed. Default 10,000.
    pub retained_events: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            bookmark_interval: Duration::from_secs(1),
            retained_events: 10_000,
        }
    }
}

/// One request as received: method, path with query, `Accept` and `Impersonate-User`
/// headers and arrival time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method ("GET").
    pub method: String,
    /// Path and query as sent ("/api/v1/pods?limit=500").
    pub path_and_query: String,
    /// The `Accept` header, if any.
    pub accept: Option<String>,
    /// The `Impersonate-User` header, if any: the user a client acts as (`kubectl --as`).
    /// Recorded only; the simulator authorizes every user alike.
    pub impersonate_user: Option<String>,
    /// When the request arrived (before any injected delay), e.g. to check that a client
    /// waited out a `Retry-After`.
    pub at: Instant,
}

pub(crate) struct Inner {
    pub(crate) config: SimConfig,
    store: Mutex<Store>,
    pub(crate) faults: Faults,
    requests: Mutex<VecDeque<RecordedRequest>>,
    request_counts: Mutex<RequestCounts>,
    pub(crate) watch_events_sent: AtomicU64,
    pub(crate) open_watches: AtomicUsize,
    /// Streaming lists whose initial-events-end bookmark is not written yet.
    pub(crate) streaming_lists: AtomicUsize,
    /// The most of those at once since start or the last reset of the request counts.
    pub(crate) streaming_lists_peak: AtomicUsize,
    /// Streaming lists whose stream ended before their end bookmark was written.
    pub(crate) streaming_lists_cut: AtomicUsize,
    addr: Mutex<Option<SocketAddr>>,
    pub(crate) shutdown: CancellationToken,
    /// Churn started over the admin endpoint `/_sim/churn` (replaced by the next call).
    pub(crate) admin_churn: Mutex<Option<ChurnHandle>>,
    /// The release `/version` reports, `(major, minor)`.
    server_version: Mutex<(u32, u32)>,
}

impl Inner {
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The release `/version` reports, `(major, minor)`.
    pub(crate) fn server_version(&self) -> (u32, u32) {
        *self
            .server_version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn addr_string(&self) -> String {
        self.addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    pub(crate) fn record_request(&self, req: RecordedRequest) {
        let mut log = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() >= REQUEST_LOG_CAPACITY {
            log.pop_front();
        }
        log.push_back(req);
    }

    pub(crate) fn count_request(&self, path: &str, group: &str, plural: &str, verb: &str) {
        self.request_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .count(path, group, plural, verb);
    }
}

/// A simulated API server. Cheap to clone (an `Arc` inside); all clones share one state.
#[derive(Clone)]
pub struct Simulator {
    pub(crate) inner: Arc<Inner>,
}

fn kind_of(obj: &Value) -> Result<(String, String), ApiError> {
    let av = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    match (av, kind) {
        (Some(a), Some(k)) => Ok((a.to_owned(), k.to_owned())),
        _ => Err(ApiError::bad_request(
            "Object 'Kind' or 'apiVersion' is missing",
        )),
    }
}

impl Simulator {
    /// A simulator with the built-in resources and no objects. Does not listen yet.
    pub fn new(config: SimConfig) -> Self {
        let capacity = config.retained_events.clamp(64, 1 << 16);
        let store = Store::new(config.retained_events, capacity);
        Simulator {
            inner: Arc::new(Inner {
                config,
                store: Mutex::new(store),
                faults: Faults::default(),
                requests: Mutex::new(VecDeque::new()),
                request_counts: Mutex::new(RequestCounts::default()),
                watch_events_sent: AtomicU64::new(0),
                open_watches: AtomicUsize::new(0),
                streaming_lists: AtomicUsize::new(0),
                streaming_lists_peak: AtomicUsize::new(0),
                streaming_lists_cut: AtomicUsize::new(0),
                addr: Mutex::new(None),
                shutdown: CancellationToken::new(),
                admin_churn: Mutex::new(None),
                server_version: Mutex::new(DEFAULT_SERVER_VERSION),
            }),
        }
    }

    /// Binds `addr` (port 0 picks one) and serves HTTP in a background tokio task until
    /// [`Simulator::shutdown`]. Returns the bound address. Must be called inside a runtime.
    pub async fn start(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        *self.inner.addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(bound);
        let app = server::router(self.inner.clone());
        tokio::spawn(server::serve(listener, app, self.inner.clone()));
        tracing::info!(%bound, "kubesink-sim listening");
        Ok(bound)
    }

    /// Sets the release `/version` reports from now on, `major.minor` (default
    /// [`DEFAULT_SERVER_VERSION`]): clients that choose by version (kubesink's
    /// `watch.initial_list = "auto"`) see another server. What the simulator serves does not
    /// change (streaming lists follow [`Faults::set_watch_list`]).
    pub fn set_server_version(&self, major: u32, minor: u32) {
        *self
            .inner
            .server_version
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = (major, minor);
    }

    /// Stops the server: ends watch streams, stops accepting connections and closes the open
    /// ones once their current response is written.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// "http://127.0.0.1:PORT" once started.
    pub fn url(&self) -> Option<String> {
        self.inner
            .addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|a| format!("http://{a}"))
    }

    /// Writes a kubeconfig (JSON) for this server to `path`. Errors if not started yet
    /// (`NotConnected`) or on I/O failure.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        let url = self.url().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotConnected, "simulator not started")
        })?;
        let text = serde_json::to_vec_pretty(&kubeconfig::kubeconfig(&url))
            .map_err(std::io::Error::other)?;
        std::fs::write(path, text)
    }

    pub(crate) fn resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Arc<ResourceType>, ApiError> {
        self.inner
            .store()
            .registry
            .by_kind(api_version, kind)
            .ok_or_else(|| ApiError::UnknownResource {
                path: format!("{api_version}/{kind}"),
            })
    }

    /// Creates an object like POST (namespace from `metadata.namespace`, default "default").
    /// Returns the stored object. Errors as [`ApiError`]: 409 AlreadyExists, 422, 404 for an
    /// unknown kind.
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let (av, kind) = kind_of(&obj)?;
        let rt = self.resource(&av, &kind)?;
        let stored = self.inner.store().create(&rt, None, obj)?;
        Ok(stored.to_value()?)
    }

    /// Replaces an object like PUT; 409 Conflict on a stale `metadata.resourceVersion`.
    pub fn replace(&self, obj: Value) -> Result<Value, ApiError> {
        let (av, kind) = kind_of(&obj)?;
        let rt = self.resource(&av, &kind)?;
        let stored = self.inner.store().replace(&rt, None, None, obj)?;
        Ok(stored.to_value()?)
    }

    /// Deletes `kind` `name` (in `namespace` for namespaced kinds); returns the deleted object.
    /// 404 NotFound if absent.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let rt = self.resource(api_version, kind)?;
        let ns = if rt.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        let stored = self.inner.store().delete(&rt, ns, name)?;
        Ok(stored.to_value()?)
    }

    /// Current objects of a kind, sorted by namespace/name (empty for an unknown kind).
    /// Objects nested deeper than a few hundred levels come back as deep `Value`s, which
    /// `serde_json` drops recursively: read those over HTTP instead.
    pub fn objects(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let Ok(rt) = self.resource(api_version, kind) else {
            return Vec::new();
        };
        let store = self.inner.store();
        let sel = selector::Selectors::default();
        let key = rt.key();
        let page = store.page(&store::PageRequest {
            resource: &key,
            namespace: None,
            at_rv: store.resource_version(),
            after: None,
            limit: 0,
            selectors: &sel,
        });
        drop(store);
        page.items
            .iter()
            .filter_map(|o| o.to_value().ok())
            .collect()
    }

    /// The current global resourceVersion (0 before the first write).
    pub fn resource_version(&self) -> u64 {
        self.inner.store().resource_version()
    }

    /// Compacts the history as etcd does after a write elsewhere: the resourceVersion moves
    /// on by one without an event, and every watch or `continue` from an older version gets
    /// 410 Expired (open watches stay open; close them to make the clients resume). Returns
    /// the new resourceVersion.
    pub fn compact(&self) -> u64 {
        self.inner.store().compact()
    }

    /// Creates the objects of `workload` (see [`Workload`]).
    pub fn populate(&self, workload: &Workload) -> Result<(), ApiError> {
        workload::populate(self, workload)
    }

    /// Applies `steps` churn operations chosen by a generator seeded with `seed`;
    /// deterministic for the same store contents and seed.
    pub fn churn_steps(&self, steps: usize, seed: u64) -> Result<ChurnStats, ApiError> {
        workload::churn_steps(self, steps, seed)
    }

    /// Starts background churn at `churn.rate_per_sec`; stops when the handle is dropped.
    /// Must be called inside a tokio runtime.
    pub fn spawn_churn(&self, churn: Churn) -> ChurnHandle {
        workload::spawn_churn(self, churn)
    }

    /// Starts `churn` as the simulator's own churn, the one `POST /_sim/churn` replaces or
    /// stops (`rate=0`) and `/_sim/stats` counts (`churnApplied`); the churn started before
    /// is stopped. (A [`Simulator::spawn_churn`] handle is independent of it.)
    pub fn set_churn(&self, churn: Churn) {
        let mut slot = self
            .inner
            .admin_churn
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.take() {
            old.stop();
        }
        if churn.rate_per_sec > 0.0 {
            *slot = Some(workload::spawn_churn(self, churn));
        }
    }

    /// Like [`Simulator::spawn_churn`], but every added or updated pod carries the
    /// annotation `stamp` set to the write's wall-clock time in Unix microseconds (a decimal
    /// string), for measuring change-to-delivery latency (the benchmark suite,
    /// `benches/suite`). Deletes are not stamped.
    pub fn spawn_stamped_churn(&self, churn: Churn, stamp: &str) -> ChurnHandle {
        workload::spawn_stamped_churn(self, churn, Some(stamp.to_owned()))
    }

    /// The fault switches.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// The last [`REQUEST_LOG_CAPACITY`] requests, oldest first (admin `/_sim/` requests excluded).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Total watch events written to clients (all types, including BOOKMARK and ERROR).
    pub fn watch_events_sent(&self) -> u64 {
        self.inner.watch_events_sent.load(Ordering::Relaxed)
    }

    /// Watch streams currently open.
    pub fn open_watches(&self) -> usize {
        self.inner.open_watches.load(Ordering::Relaxed)
    }

    /// Streaming lists in flight: watches with `sendInitialEvents=true` whose
    /// initial-events-end bookmark is not written yet (the stream ending counts as their end).
    pub fn streaming_lists_in_flight(&self) -> usize {
        self.inner.streaming_lists.load(Ordering::SeqCst)
    }

    /// The most streaming lists in flight at once since start or the last
    /// [`Simulator::reset_request_counts`] (across every resource and client: a client's
    /// concurrency, when one client is served).
    pub fn streaming_lists_peak(&self) -> usize {
        self.inner.streaming_lists_peak.load(Ordering::SeqCst)
    }

    /// Streaming lists whose stream ended before their initial-events-end bookmark was written,
    /// since start: the client gave up waiting (a closed connection is seen only when hyper
    /// next polls it, so for a moment the list and the client's retry both count in
    /// [`Simulator::streaming_lists_in_flight`]), or a fault cut the stream.
    pub fn streaming_lists_cut(&self) -> usize {
        self.inner.streaming_lists_cut.load(Ordering::SeqCst)
    }

    /// List and watch requests per resource and per path since start or the last
    /// [`Simulator::reset_request_counts`], counted on arrival (also those a fault rejected).
    pub fn request_counts(&self) -> RequestCounts {
        self.inner
            .request_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sets every request count back to zero, and the peak of streaming lists in flight to
    /// those in flight now.
    pub fn reset_request_counts(&self) {
        self.inner.streaming_lists_peak.store(
            self.inner.streaming_lists.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
        *self
            .inner
            .request_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = RequestCounts::default();
    }

    /// Stores `obj` as an object of `api_version` `kind` WITHOUT validation or defaulting, to
    /// test clients against objects that break the API conventions: `metadata.name` or all
    /// of `metadata` may be missing, `kind`/`apiVersion` may be absent or wrong, and with
    /// [`RawResourceVersion::AsGiven`] `metadata.resourceVersion` keeps whatever the body
    /// says (e.g. the opaque "abc-17", or nothing). The object is keyed by
    /// `metadata.namespace` and `metadata.name` ("" when missing: one nameless object per
    /// namespace, a second replaces it) and appears in lists and as an ADDED (or MODIFIED)
    /// watch event like any write; the store's own resourceVersion counter still advances.
    /// Errors: 404 for an unknown kind, 400 if `obj` is not a JSON object.
    pub fn insert_raw(
        &self,
        api_version: &str,
        kind: &str,
        obj: Value,
        resource_version: RawResourceVersion,
    ) -> Result<(), ApiError> {
        let rt = self.resource(api_version, kind)?;
        self.inner.store().insert_raw(&rt, obj, resource_version)?;
        Ok(())
    }

    /// Makes a CRD's kind servable without an HTTP round trip (used by the workload).
    pub(crate) fn ensure_crd(&self, crd: Value) -> Result<(), ApiError> {
        match self.create(crd) {
            Ok(_) | Err(ApiError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
