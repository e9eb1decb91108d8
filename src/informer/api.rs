//! What the informers of one cluster share about its API server: the client-side request
//! budget (a token bucket on list and watch requests), the request counts, and which
//! resources were found not to serve streaming lists.
//!
//! # The request budget
//!
//! A cold start against 1,500 namespaces × 4 resources opens 6,000 watches; sent at once, they
//! land on the API server together, where API Priority and Fairness
//! (<https://kubernetes.io/docs/concepts/cluster-administration/flow-control/>) queues them
//! and rejects the overflow with 429. client-go's answer is a token bucket per client
//! (`rest.Config.QPS`, default 5, and `Burst`, default 10: `flowcontrol.NewTokenBucketRateLimiter`);
//! kubesink has one per cluster, [`ClusterApi::admit`], from `watch.requests_per_second`
//! (default 50) and `watch.request_burst` (default 100), through `governor`'s GCRA, which is
//! a token bucket: `burst` requests at once, then one per `1 / rate` seconds. Every list page
//! and every watch (a streaming list included) takes a token; a `Retry-After` on 429 is
//! obeyed on top (`recovery.rs`). Watches last minutes (`timeoutSeconds` 290), so the steady
//! rate is small: ~21 requests/s for 6,000 watches.
//!
//! # Streaming-list support
//!
//! With `watch.initial_list = "auto"`, the first informer that finds a resource's server
//! without streaming lists records it here ([`ClusterApi::learn_no_streaming`]), with the
//! reason, and logs it; the cluster's other informers of that resource (one per namespace)
//! then list without trying, and without logging again.
//!
//! # The list shape `auto` starts with
//!
//! Before its first list, an informer with `auto` asks which shape is cheaper for the
//! server ([`auto_shape`]), from the server's version (`/version`, asked once per cluster
//! by [`ClusterApi::server_version`]). Measured on v1.37.2 with its watch cache
//! (BENCHMARKS.md, "Wire encoding and list shape", 20,000 Pods, three rounds): paged lists,
//! which it serves from its cache snapshot (`ListFromCacheSnapshot`, beta and on from 1.34),
//! cost the server less CPU than a streaming list, for whole Pods (1.10 s against 3.15 s)
//! and for protobuf metadata (1.08 s against 1.45 s; one earlier run of three had it the
//! other way), and about half with four clients syncing at once (1.74 s against 3.50 s for
//! protobuf metadata, 5.08 s against 10.38 s for whole Pods). Before 1.34 the pages after
//! the first come from etcd, so streaming is cheaper wherever the server streams.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::stats::Strategy;
use crate::config::WatchConfig;

/// How long a failed `/version` is believed before it is asked again.
const VERSION_RETRY: Duration = Duration::from_secs(60);

/// How long kubesink waits for `/version`.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kubernetes API server's release, `major.minor` from `/version` (`version.Info`; a
/// provider's `minor` such as `"31+"` reads as 31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion {
    /// `major`, 1 for every release so far.
    pub major: u32,
    /// `minor`.
    pub minor: u32,
}

impl ServerVersion {
    /// Reads `version.Info`'s `major` and `minor`: their leading digits.
    pub fn parse(major: &str, minor: &str) -> Option<Self> {
        let digits = |s: &str| {
            let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            s[..end].parse::<u32>().ok()
        };
        Some(ServerVersion {
            major: digits(major)?,
            minor: digits(minor)?,
        })
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The list shape `watch.initial_list = "auto"` starts with on a server of `version`
/// (`None`: unknown), with why.
///
/// - unknown: a streaming list, with the fallback to paged lists when the server refuses it;
/// - before 1.32, and 1.33: paged lists (the `WatchList` gate is alpha and off before 1.32,
///   off again in 1.33: a streaming list would only be refused);
/// - 1.32: a streaming list (pages after the first are read from etcd);
/// - 1.34 and later: paged lists, whatever the encoding (measured: see the module's
///   documentation).
///
/// A streaming list the server refuses still falls back, whatever chose it.
pub fn auto_shape(version: Option<ServerVersion>) -> (Strategy, &'static str) {
    let Some(v) = version else {
        return (Strategy::Stream, "the server's version is unknown");
    };
    if v.major != 1 || v.minor >= 34 {
        (
            Strategy::List,
            "pages from the watch cache's snapshot cost the server less CPU than a streaming list",
        )
    } else if v.minor == 32 {
        (
            Strategy::Stream,
            "before 1.34 the pages after the first are read from etcd",
        )
    } else {
        (
            Strategy::List,
            "the WatchList feature gate is off by default in this release",
        )
    }
}

/// What is known of the server's version.
#[derive(Debug, Clone, Copy)]
enum VersionFact {
    Unasked,
    Known(ServerVersion),
    /// `/version` failed at this instant.
    Failed(Instant),
}

/// The kind of API request counted per cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// A list page (`GET` without `watch`).
    List,
    /// A watch (`?watch=true`), a streaming list included.
    Watch,
}

/// One cluster's API budget, counts and learned facts; shared by its informers.
#[derive(Debug)]
pub struct ClusterApi {
    limiter: Option<DefaultDirectRateLimiter>,
    /// List page requests sent.
    pub list_requests: AtomicU64,
    /// Watch requests sent (streaming lists included).
    pub watch_requests: AtomicU64,
    /// Requests that waited for a token.
    pub delayed_requests: AtomicU64,
    /// Time requests waited for a token in all, in nanoseconds.
    pub delayed_nanos: AtomicU64,
    /// Successful responses the server encoded in protobuf (metadata-only watches with
    /// `watch.encoding = "auto"`, `protobuf.rs`); the others were JSON.
    pub protobuf_responses: AtomicU64,
    /// Resources (by [`kubesink_core::Resource`]'s display) whose server does not stream
    /// lists, with the reason.
    no_streaming: Mutex<HashMap<String, String>>,
    /// The server's version, asked once (by the first informer that needs it; the others
    /// wait for its answer).
    version: tokio::sync::Mutex<VersionFact>,
}

impl ClusterApi {
    /// The budget of `[watch]`: `requests_per_second` (0: none) and `request_burst`.
    pub fn new(watch: &WatchConfig) -> Self {
        ClusterApi {
            limiter: quota(watch.requests_per_second, watch.request_burst).map(RateLimiter::direct),
            list_requests: AtomicU64::new(0),
            watch_requests: AtomicU64::new(0),
            delayed_requests: AtomicU64::new(0),
            delayed_nanos: AtomicU64::new(0),
            protobuf_responses: AtomicU64::new(0),
            no_streaming: Mutex::new(HashMap::new()),
            version: tokio::sync::Mutex::new(VersionFact::Unasked),
        }
    }

    /// The API server's version, from `/version` through `client`: asked once per cluster
    /// and kept; a failure (logged at DEBUG) is kept [`VERSION_RETRY`], then asked again.
    /// `None` while unknown.
    pub async fn server_version(&self, client: &kube::Client) -> Option<ServerVersion> {
        let mut fact = self.version.lock().await;
        match *fact {
            VersionFact::Known(v) => return Some(v),
            VersionFact::Failed(at) if at.elapsed() < VERSION_RETRY => return None,
            _ => {}
        }
        let asked = tokio::time::timeout(VERSION_TIMEOUT, client.apiserver_version()).await;
        let read = match asked {
            Ok(Ok(info)) => ServerVersion::parse(&info.major, &info.minor).ok_or_else(|| {
                format!(
                    "major {:?} and minor {:?} (gitVersion {:?}) are not numbers",
                    info.major, info.minor, info.git_version
                )
            }),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {VERSION_TIMEOUT:?}")),
        };
        match read {
            Ok(v) => {
                *fact = VersionFact::Known(v);
                tracing::debug!(version = %v, "the API server's version");
                Some(v)
            }
            Err(why) => {
                *fact = VersionFact::Failed(Instant::now());
                tracing::debug!(error = %why, "the API server's /version failed; watch.initial_list = \"auto\" streams until it is known");
                None
            }
        }
    }

    /// Waits for a token (at once while the bucket holds one), then counts the request.
    pub async fn admit(&self, verb: Verb) {
        self.wait_turn().await;
        self.count(verb);
    }

    /// Waits for a token, at once while the bucket holds one. What the request is for may
    /// have changed meanwhile (another watch learned something): check, then [`Self::count`]
    /// what is sent.
    pub async fn wait_turn(&self) {
        if let Some(limiter) = &self.limiter {
            if limiter.check().is_err() {
                let started = Instant::now();
                limiter.until_ready().await;
                self.delayed_requests.fetch_add(1, Ordering::Relaxed);
                let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.delayed_nanos.fetch_add(waited, Ordering::Relaxed);
            }
        }
    }

    /// Counts a request sent.
    pub fn count(&self, verb: Verb) {
        match verb {
            Verb::List => &self.list_requests,
            Verb::Watch => &self.watch_requests,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a successful response encoded in protobuf.
    pub fn note_protobuf(&self) {
        self.protobuf_responses.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that `resource` is served without streaming lists, for `reason`; true for
    /// the first informer to learn it (it logs), false when another one did already.
    pub fn learn_no_streaming(&self, resource: &str, reason: &str) -> bool {
        let mut known = self
            .no_streaming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.contains_key(resource) {
            return false;
        }
        known.insert(resource.to_owned(), reason.to_owned());
        true
    }

    /// Why `resource` is known not to stream lists, if it is.
    pub fn no_streaming(&self, resource: &str) -> Option<String> {
        self.no_streaming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(resource)
            .cloned()
    }

    /// Time requests waited for a token in all.
    pub fn delayed(&self) -> Duration {
        Duration::from_nanos(self.delayed_nanos.load(Ordering::Relaxed))
    }
}

/// The token bucket of `rate` requests per second and `burst`; `None` when `rate` is 0 (or
/// not a usable number: the configuration check refuses those).
fn quota(rate: f64, burst: u32) -> Option<Quota> {
    if !rate.is_finite() || rate <= 0.0 {
        return None;
    }
    let period = Duration::try_from_secs_f64(1.0 / rate).ok()?;
    let quota = Quota::with_period(period.max(Duration::from_nanos(1)))?;
    Some(quota.allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rate: f64, burst: u32) -> WatchConfig {
        WatchConfig {
            requests_per_second: rate,
            request_burst: burst,
            ..WatchConfig::default()
        }
    }

    #[tokio::test]
    async fn the_burst_goes_at_once_and_the_rest_waits_for_tokens() {
        let api = ClusterApi::new(&config(20.0, 3));
        let started = Instant::now();
        for _ in 0..3 {
            api.admit(Verb::Watch).await;
        }
        assert_eq!(api.delayed_requests.load(Ordering::Relaxed), 0);
        for _ in 0..4 {
            api.admit(Verb::List).await;
        }
        // 4 requests past the burst at 20/s: at least 4 × 50 ms from the first, however fast
        // the machine (a slow one only takes longer, and waits less for tokens).
        assert!(
            started.elapsed() >= Duration::from_millis(195),
            "{:?}",
            started.elapsed()
        );
        assert!(api.delayed_requests.load(Ordering::Relaxed) <= 4);
        assert_eq!(api.list_requests.load(Ordering::Relaxed), 4);
        assert_eq!(api.watch_requests.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_rate_of_zero_is_no_limit() {
        let api = ClusterApi::new(&config(0.0, 0));
        for _ in 0..10_000 {
            api.admit(Verb::Watch).await;
        }
        assert_eq!(api.delayed_requests.load(Ordering::Relaxed), 0);
        assert!(quota(0.0, 5).is_none());
        assert!(quota(f64::NAN, 5).is_none());
        assert!(quota(crate::config::MIN_REQUESTS_PER_SECOND, 1).is_some());
        assert!(quota(1e12, 1).is_some());
    }

    #[test]
    fn a_version_reads_the_leading_digits_of_major_and_minor() {
        let v = |ma, mi| ServerVersion::parse(ma, mi);
        assert_eq!(
            v("1", "37"),
            Some(ServerVersion {
                major: 1,
                minor: 37
            })
        );
        assert_eq!(
            v("1", "31+"),
            Some(ServerVersion {
                major: 1,
                minor: 31
            })
        );
        assert_eq!(v("1", ""), None);
        assert_eq!(v("one", "37"), None);
        assert_eq!(ServerVersion { major: 1, minor: 9 }.to_string(), "1.9");
    }

    #[test]
    fn auto_pages_where_the_cache_serves_pages_and_streams_where_etcd_would() {
        let shape =
            |minor: Option<u32>| auto_shape(minor.map(|minor| ServerVersion { major: 1, minor })).0;
        assert_eq!(shape(None), Strategy::Stream);
        assert_eq!(shape(Some(32)), Strategy::Stream);
        for off in [26, 31, 33] {
            assert_eq!(shape(Some(off)), Strategy::List, "1.{off}");
        }
        for minor in [34, 36, 37, 40] {
            assert_eq!(shape(Some(minor)), Strategy::List, "1.{minor}");
        }
        let two = ServerVersion { major: 2, minor: 0 };
        assert_eq!(auto_shape(Some(two)).0, Strategy::List);
    }

    #[test]
    fn only_the_first_informer_to_learn_a_resource_without_streaming_logs_it() {
        let api = ClusterApi::new(&WatchConfig::default());
        assert!(api.learn_no_streaming("v1/Pod", "422 Invalid"));
        assert!(!api.learn_no_streaming("v1/Pod", "another reason"));
        assert_eq!(api.no_streaming("v1/Pod").as_deref(), Some("422 Invalid"));
        assert_eq!(api.no_streaming("apps/v1/Deployment"), None);
    }
}
