//! Starting the watches of every cluster, once this replica may watch (at once, or when it
//! became the leader): per cluster, restore the saved state (snapshot and journal), start its
//! keeper and journal writer, then resolve each resource (API discovery, retried) and run its
//! informers over the restored stores.
//!
//! Owns the order "state restored, then informers": a watch's decider starts from what was
//! saved up to now, and nothing is saved before it was restored (a follower never saves, so
//! it cannot overwrite its leader's state).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use kubesink_core::backoff::Backoff;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::planned::{Keepers, PlannedCluster, PlannedScope};
use super::routes::Route;
use crate::cluster::{self, ClusterError, Resolved};
use crate::config::{Cluster, StateConfig, WatchConfig};
use crate::informer::{
    owner_roles, ClusterApi, Decider, FailureKind, Informer, InformerStats, JournalRef, LightStore,
    ListBudget, OwnerContext, OwnerIndex, OwnerRole, TrackedStore, View, WatchPlan, OWNERS_WAIT,
};
use crate::leader::Leadership;
use crate::leader::{Elector, Fence, Lost};
use crate::observe::WatchList;
use crate::pipeline::Publisher;
use crate::plan::ResourcePlan;
use crate::plan::StatePlan;
use crate::state::{self, Journal, Keeper, Kept, StateStats, StateStore, WatchKey};

/// The state store's retry policy, for the journal writer and for reading the saved state at
/// start: quick at first (a blip of the state store), then every few seconds (sends, or the
/// watches, wait meanwhile).
const STATE_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// What starts the watches: per cluster, the state restore, then every resource's
/// resolution task.
pub(super) struct Watching {
    pub clusters: Vec<PlannedCluster>,
    /// `[state]` with what a backend takes from the rest of the plan: a group-form
    /// resource opens a store per kind (`groups.rs`).
    pub state_plan: StatePlan,
    /// The watches the observers see: a group-form resource adds its kinds' (`groups.rs`).
    pub watch_list: Arc<WatchList>,
    /// Names watches and saved state as a configuration of several clusters does.
    pub multi: bool,
    /// Starts following a group-form resource (`groups::spawn_follow`): the entry at the
    /// index of a planned cluster, through its client, counting into the entry's counters.
    pub follow_group: FollowGroup,
    pub sync_markers: bool,
    /// Which sinks each watch's views serve (`routes.rs`).
    pub routes: Arc<Vec<Route>>,
    pub watch: WatchConfig,
    /// The process's budget of lists in flight, shared by every cluster's informers.
    pub lists: Arc<ListBudget>,
    pub state: StateConfig,
    /// Closed when this replica may no longer lead: keepers stop saving.
    pub fence: Fence,
    pub publisher: Publisher,
    pub keepers: Keepers,
    pub stop_saving: CancellationToken,
    pub stop_journals: CancellationToken,
    pub cancel: CancellationToken,
    pub tasks: TaskTracker,
}

/// One watch ready to run: per route, its view's store, whether it holds saved state, and
/// its counters.
struct Scope {
    namespace: Option<String>,
    stats: Arc<InformerStats>,
    views: Vec<(Arc<TrackedStore>, bool, Arc<InformerStats>)>,
}

/// How a group-form resource is followed (`groups.rs`, which builds on this file).
pub(super) type FollowGroup =
    fn(&Arc<Watching>, &PlannedCluster, usize, Client, Arc<InformerStats>);

/// What one kind of a group-form resource runs under (`groups.rs`), so that it can be
/// started, moved to another version and dropped while the others run: its discovery
/// result, its own tokens and tasks, its keeper.
#[derive(Clone)]
pub(super) struct SlotRun {
    /// The kind as discovery found it (its watches start without asking again).
    pub resolved: Resolved,
    /// Stops its watches (a child of the bridge's).
    pub cancel: CancellationToken,
    /// Its kind left the cluster: each watch sends the deletes of what it holds, then stops.
    pub gone: CancellationToken,
    /// Stops its keeper's interval saves (a child of the bridge's).
    pub saving: CancellationToken,
    /// Stops its journal writer (a child of the bridge's).
    pub journals: CancellationToken,
    /// Its keeper, once its state was restored (also in the bridge's list).
    pub keepers: Keepers,
    /// Its start and its informers.
    pub tasks: TaskTracker,
}

/// One configured resource of one cluster and its watches.
struct Target {
    cluster: Cluster,
    client: Client,
    api: Arc<ClusterApi>,
    resource: ResourcePlan,
    scopes: Vec<Scope>,
    /// Which sinks each watch's views serve (`routes.rs`).
    routes: Arc<Vec<Route>>,
    /// With `enrich` in the cluster: its owner index and this resource's role.
    owners: Option<(Arc<OwnerIndex>, OwnerRole)>,
    /// For a kind of a group-form resource: what it runs under.
    slot: Option<SlotRun>,
}

impl Watching {
    /// Starts the watches: at once, or, with leader election (`leading`: the elector and the
    /// leadership it records), once this replica leads. With leader election it returns the
    /// receiver of a lost leadership and the token cancelled once the leader task ended (its
    /// lease given up after `release`, or never held).
    pub fn start_or_lead(
        self,
        leading: Option<(Elector, Arc<Leadership>)>,
        release: &CancellationToken,
        cancel: &CancellationToken,
        tasks: &TaskTracker,
    ) -> (Option<oneshot::Receiver<Lost>>, Option<CancellationToken>) {
        let Some((elector, leadership)) = leading else {
            self.start();
            return (None, None);
        };
        let (tx, rx) = oneshot::channel();
        let released = CancellationToken::new();
        let ended = released.clone().drop_guard();
        let leading = lead(
            elector,
            leadership,
            self,
            tx,
            cancel.clone(),
            release.clone(),
        );
        tasks.spawn(async move {
            leading.await;
            drop(ended);
        });
        (Some(rx), Some(released))
    }

    /// Starts every cluster's task.
    pub fn start(self) {
        let shared = Arc::new(self);
        for i in 0..shared.clusters.len() {
            let w = shared.clone();
            shared.tasks.spawn(async move { w.start_cluster(i).await });
        }
    }

    /// Restores cluster `i`'s state (with `[state]`), starts its keeper and journal writer,
    /// then its resources' tasks.
    async fn start_cluster(self: Arc<Self>, i: usize) {
        let c = &self.clusters[i];
        let client = match &c.client {
            Ok(client) => client.clone(),
            Err(e) => match self.connect(c, e).await {
                Some(client) => client,
                None => return,
            },
        };
        self.start_planned(c, client, None).await;
    }

    /// Restores `c`'s state (with `[state]`), starts its keeper and journal writer, then its
    /// resources' tasks: a cluster's, or (`slot`) one kind of a group-form resource's, which
    /// runs under its own tokens.
    pub(super) async fn start_planned(
        self: &Arc<Self>,
        c: &PlannedCluster,
        client: Client,
        slot: Option<&SlotRun>,
    ) {
        let cancel = slot.map_or(&self.cancel, |s| &s.cancel);
        let keys: Vec<WatchKey> = c
            .resources
            .iter()
            .filter(|r| !r.resource.index_only)
            .flat_map(|r| r.scopes.iter())
            .flat_map(|s| s.views.iter().map(|(key, _)| key.clone()))
            .collect();
        let mut stores: Vec<(Arc<TrackedStore>, bool)> = match &c.state {
            None => keys
                .iter()
                .map(|_| (TrackedStore::new(LightStore::new(), false), false))
                .collect(),
            Some((store, stats)) => {
                let started = tokio::select! {
                    _ = cancel.cancelled() => return,
                    s = self.start_state(&c.spec.name, store, stats, &keys, slot) => s,
                };
                started
            }
        };
        stores.reverse(); // handed out in order by pop()
        let (roles, feeders) = owner_roles(
            &c.resources
                .iter()
                .map(|r| (&r.resource.config, r.scopes.len()))
                .collect::<Vec<_>>(),
        );
        let index = feeders.map(|n| Arc::new(OwnerIndex::new(n)));
        for (at, (r, role)) in c.resources.iter().zip(roles).enumerate() {
            if let Some(stats) = &r.group {
                (self.follow_group)(self, c, at, client.clone(), stats.clone());
                continue;
            }
            let scopes = r
                .scopes
                .iter()
                .map(
                    |PlannedScope {
                         namespace,
                         stats,
                         views,
                     }| {
                        let views = views
                            .iter()
                            .map(|(_, counts)| {
                                let fresh = || (TrackedStore::new(LightStore::new(), false), false);
                                let (store, restored) = match r.resource.index_only {
                                    true => fresh(),
                                    false => stores.pop().unwrap_or_else(fresh),
                                };
                                (store, restored, counts.clone())
                            })
                            .collect();
                        Scope {
                            namespace: namespace.clone(),
                            stats: stats.clone(),
                            views,
                        }
                    },
                )
                .collect();
            let target = Target {
                cluster: c.spec.clone(),
                client: client.clone(),
                api: c.api.clone(),
                resource: r.resource.clone(),
                scopes,
                routes: self.routes.clone(),
                owners: index.clone().filter(|_| slot.is_none()).map(|i| (i, role)),
                slot: slot.cloned(),
            };
            self.tasks.spawn(watch_resource(
                target,
                self.sync_markers,
                self.watch.clone(),
                self.lists.clone(),
                self.publisher.clone(),
                cancel.clone(),
                self.tasks.clone(),
            ));
        }
    }

    /// Builds cluster `c`'s client again and again (the `[watch]` backoff) until it can be,
    /// after it could not be at start (`first`): meanwhile each of its watches shows the
    /// error, so `/readyz` names them, and the other clusters run. `None` when cancelled.
    async fn connect(&self, c: &PlannedCluster, first: &ClusterError) -> Option<Client> {
        let span = tracing::info_span!("client", cluster = %c.spec.name);
        let retry = Backoff::new(
            self.watch.retry_initial_backoff.get(),
            self.watch.retry_max_backoff.get(),
        );
        let mut delays = retry.delays();
        let mut log = RetryLog::default();
        // At start the error was logged already (`cluster::usable`).
        log.loud();
        let mut error = first.to_string();
        loop {
            // Not reachable with these credentials is not a failure a restart cures: it
            // counts for readiness, not liveness (as a 401/403).
            for s in c.resources.iter().flat_map(|r| &r.scopes) {
                s.stats.errors.fetch_add(1, Ordering::Relaxed);
                s.stats.set_failure(
                    FailureKind::Forbidden,
                    format!("the cluster's client cannot be built: {error}"),
                );
            }
            let wait = delays.next().unwrap_or(retry.max);
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep(wait) => {}
            }
            let attempt = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                r = cluster::client(&c.spec) => r,
            };
            match attempt {
                Ok(client) => {
                    span.in_scope(|| {
                        tracing::info!("the cluster's client was built; starting its watches")
                    });
                    return Some(client);
                }
                Err(e) => {
                    error = e.to_string();
                    if log.loud() {
                        span.in_scope(|| tracing::warn!(error = %e, retry_in = ?wait, "the cluster's client still cannot be built; retrying (the other clusters are not held back)"));
                    } else {
                        span.in_scope(|| tracing::debug!(error = %e, "the cluster's client still cannot be built; retrying"));
                    }
                }
            }
        }
    }

    /// Restores one cluster's watches from `store`, starts its journal writer (with
    /// `state.write_ahead`) and keeper (under `slot`'s tokens for a kind of a group-form
    /// resource), and returns each watch's store and whether it holds saved state.
    async fn start_state(
        &self,
        cluster: &str,
        store: &Arc<dyn StateStore>,
        stats: &Arc<StateStats>,
        keys: &[WatchKey],
        slot: Option<&SlotRun>,
    ) -> Vec<(Arc<TrackedStore>, bool)> {
        let saved = if self.state.write_ahead {
            Ok(read_saved(cluster, store, stats).await)
        } else {
            state::read(&**store).await
        };
        let restored = state::restore(saved, store.describe(), cluster, keys);
        let (objects, unconfirmed) = restored.objects();
        stats.note_restore(
            objects,
            unconfirmed,
            restored.ignored,
            restored.summary.clone(),
        );
        let journal = Journal::new(cluster, keys, restored.next_generation, stats.clone());
        let mut out = Vec::with_capacity(keys.len());
        let mut kept = Vec::with_capacity(keys.len());
        for (watch, (saved, key)) in restored.stores.into_iter().zip(keys).enumerate() {
            let is_restored = saved.is_some();
            let (light, list_rv) = match saved {
                Some(s) => (s.store, s.list_resource_version),
                None => (LightStore::new(), String::new()),
            };
            let tracked = if self.state.write_ahead {
                TrackedStore::with_journal(
                    light,
                    JournalRef {
                        journal: journal.clone(),
                        watch: u32::try_from(watch).unwrap_or(u32::MAX),
                    },
                )
            } else {
                TrackedStore::new(light, true)
            };
            // The saved list's resourceVersion stays until this run completes a list (the
            // decider reads it: `since` after a crash before the first save).
            tracked.lock().list_resource_version = list_rv;
            kept.push(Kept {
                key: key.clone(),
                store: tracked.clone(),
            });
            out.push((tracked, is_restored));
        }
        if self.state.write_ahead {
            let retry = Backoff::new(STATE_RETRY.0, STATE_RETRY.1);
            let stop = slot.map_or(&self.stop_journals, |s| &s.journals);
            self.tasks
                .spawn(journal.clone().run(store.clone(), retry, stop.clone()));
        }
        let keeper = Keeper::new(
            store.clone(),
            cluster,
            kept,
            Some(journal),
            self.fence.clone(),
            stats.clone(),
        );
        self.keepers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(keeper.clone());
        if let Some(s) = slot {
            s.keepers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(keeper.clone());
        }
        let stop = slot.map_or(&self.stop_saving, |s| &s.saving);
        let task = keeper.spawn(self.state.interval.get(), stop.clone());
        self.tasks.spawn(async move {
            let _ = task.await;
        });
        out
    }
}

/// When a retried failure goes out at WARN: the first, then at most once a minute; the
/// retries between go to DEBUG. Shared by the start-up retries of this file (the state read,
/// API discovery).
#[derive(Default)]
struct RetryLog {
    last_warn: Option<Instant>,
}

impl RetryLog {
    /// How often a failure that keeps repeating goes out at WARN again.
    const EVERY: Duration = Duration::from_secs(60);

    /// Notes a failure; `true` when it goes out at WARN.
    fn loud(&mut self) -> bool {
        let loud = self.last_warn.is_none_or(|t| t.elapsed() >= Self::EVERY);
        if loud {
            self.last_warn = Some(Instant::now());
        }
        loud
    }

    /// Whether a failure was noted (so the success after it is worth a line).
    fn failed(&self) -> bool {
        self.last_warn.is_some()
    }
}

/// Reads cluster `cluster`'s saved state from `store`, again and again ([`STATE_RETRY`])
/// until it can be read: what an unreadable store holds is unknown, not absent, and a start
/// without it could never send the deletes of what vanished meanwhile (a leader taking over
/// while the NATS state server restarts would leave ghosts downstream). Meanwhile `/readyz`
/// and `kubesink_state_restore_waiting_seconds` say so, and nothing is watched, sent or
/// saved. The caller's cancellation ends the wait.
async fn read_saved(
    cluster: &str,
    store: &Arc<dyn StateStore>,
    stats: &Arc<StateStats>,
) -> state::Saved {
    let retry = Backoff::new(STATE_RETRY.0, STATE_RETRY.1);
    let mut delays = retry.delays();
    let mut log = RetryLog::default();
    loop {
        let e = match state::read(&**store).await {
            Ok(saved) => {
                if log.failed() {
                    tracing::info!(%cluster, store = store.describe(), "saved informer state read; starting the watches");
                }
                return saved;
            }
            Err(e) => e,
        };
        stats.note_restore_waiting(&e);
        let wait = delays.next().unwrap_or(retry.max);
        if log.loud() {
            tracing::warn!(%cluster, store = store.describe(), error = %e, retry_in = ?wait, "saved informer state cannot be read: the watches wait for it (starting without it would lose the deletes it lets the first list infer); retrying");
        } else {
            tracing::debug!(%cluster, error = %e, retry_in = ?wait, "saved informer state still cannot be read; retrying");
        }
        tokio::time::sleep(wait).await;
    }
}

/// Resolves one configured resource (retrying with backoff), then runs its informers.
async fn watch_resource(
    t: Target,
    sync_markers: bool,
    watch: WatchConfig,
    lists: Arc<ListBudget>,
    publisher: Publisher,
    cancel: CancellationToken,
    tasks: TaskTracker,
) {
    let span = tracing::info_span!("discovery", cluster = %t.cluster.name, resource = %t.resource.config.display_name());
    // The `[watch]` backoff, as for a failing list or watch.
    let retry = Backoff::new(
        watch.retry_initial_backoff.get(),
        watch.retry_max_backoff.get(),
    );
    let mut delays = retry.delays();
    let mut log = RetryLog::default();
    let known = t.slot.as_ref().map(|s| s.resolved.clone());
    let resolved = loop {
        if let Some(known) = known {
            break known;
        }
        let attempt = tokio::select! {
            _ = cancel.cancelled() => return,
            r = cluster::resolve(&t.client, &t.cluster.name, &t.resource.config) => r,
        };
        let e = match attempt {
            Ok(r) => break r,
            Err(e) => e,
        };
        let kind = if e.is_not_found() {
            FailureKind::NotFound
        } else if e.is_transient() {
            FailureKind::Unreachable
        } else {
            FailureKind::Broken
        };
        for s in &t.scopes {
            s.stats.errors.fetch_add(1, Ordering::Relaxed);
            s.stats.discovery_errors.fetch_add(1, Ordering::Relaxed);
            s.stats.set_failure(kind, e.to_string());
        }
        if matches!(e, ClusterError::ClusterScoped { .. }) {
            span.in_scope(
                || tracing::error!(error = %e, "configuration error; this resource is not watched"),
            );
            return;
        }
        let wait = delays.next().unwrap_or(retry.max);
        if log.loud() {
            span.in_scope(|| tracing::warn!(error = %e, retry_in = ?wait, "API discovery failed; retrying (the other resources are not held back)"));
        } else {
            span.in_scope(
                || tracing::debug!(error = %e, retry_in = ?wait, "API discovery failed; retrying"),
            );
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    };
    if log.failed() {
        span.in_scope(|| tracing::info!("API discovery succeeded; starting its watches"));
    }
    let filter = t.resource.filter.clone();
    let mut plans = WatchPlan::expand(
        &t.resource.config,
        t.resource.changes.clone(),
        resolved.resource,
        resolved.api_resource,
        &t.cluster.label,
    );
    for p in &mut plans {
        p.shard = t.cluster.shard;
    }
    for (plan, scope) in plans.into_iter().zip(t.scopes) {
        scope.stats.clear_failure();
        let reported = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let index_only = t.resource.index_only;
        let views = t
            .routes
            .iter()
            .zip(scope.views)
            .map(|(route, (store, restored, counts))| {
                let mut decider = Decider::with_store(
                    plan.resource.clone(),
                    plan.scope(),
                    plan.shaper.clone(),
                    plan.updates,
                    store,
                    restored,
                    counts,
                );
                if sync_markers && !index_only {
                    decider = decider.with_sync_markers(scope.namespace.clone());
                }
                decider = decider.with_filter(filter.clone());
                if let Some(o) = plan.occurrences {
                    decider = decider.with_occurrences(o);
                }
                if let Some(f) = route.filter.as_ref().filter(|_| !index_only) {
                    decider = decider.with_sink_filter(f.clone(), route.counts.clone());
                }
                if let Some((index, role)) = &t.owners {
                    decider = decider.with_context(OwnerContext {
                        index: index.clone(),
                        role: role.clone(),
                        reported: reported.clone(),
                    });
                }
                let sinks: &[usize] = match index_only {
                    true => &[],
                    false => &route.sinks,
                };
                View::new(decider, publisher.only(sinks))
            })
            .collect();
        let informer = Informer::new(
            plan,
            t.client.clone(),
            &watch,
            views,
            scope.stats,
            t.api.clone(),
            lists.clone(),
        );
        let waits = t.owners.clone().filter(|(_, role)| role.waits);
        let cancel = cancel.clone();
        let gone = t.slot.as_ref().map(|s| s.gone.clone());
        let run = async move {
            if let Some((index, _)) = waits {
                owners_ready(&index, &cancel).await;
            }
            informer.run_or_retire(cancel, gone).await
        };
        match &t.slot {
            Some(s) => tasks.spawn(s.tasks.track_future(run)),
            None => tasks.spawn(run),
        };
    }
}

/// Waits (at most [`OWNERS_WAIT`]) for the first lists of the kinds that fill the owner
/// index, so that the first messages of a resource with `enrich` carry whole chains.
async fn owners_ready(index: &OwnerIndex, cancel: &CancellationToken) {
    tracing::debug!("waiting for the first lists of the kinds that fill the owner index");
    tokio::select! {
        _ = cancel.cancelled() => {}
        ready = index.ready(OWNERS_WAIT) => match ready {
            true => tracing::debug!(objects = index.objects(), "owner index filled"),
            false => tracing::warn!(waited = ?OWNERS_WAIT, objects = index.objects(), "the kinds that fill the owner index did not all complete their first list: listing anyway, messages carry the owners known so far (ownersComplete: false)"),
        },
    }
}

/// Leader election: campaign, watch once leading, report the loss; give the lease up at
/// shutdown once `release` fires (after the pipeline drained).
pub(super) async fn lead(
    mut elector: Elector,
    leadership: Arc<Leadership>,
    watching: Watching,
    lost: oneshot::Sender<Lost>,
    cancel: CancellationToken,
    release: CancellationToken,
) {
    elector.report_to(leadership.clone());
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = elector.acquire() => {}
    }
    leadership.set_leader(true);
    watching.start();
    tokio::select! {
        _ = release.cancelled() => {
            elector.release().await;
            leadership.set_leader(false);
        }
        why = elector.hold() => {
            leadership.set_leader(false);
            let _ = lost.send(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_failure_is_loud_first_then_once_a_minute() {
        let mut log = RetryLog::default();
        assert!(!log.failed());
        assert!(log.loud(), "the first failure goes out at WARN");
        assert!(!log.loud(), "a retry within the minute goes to DEBUG");
        assert!(log.failed());
        log.last_warn = Instant::now().checked_sub(RetryLog::EVERY);
        assert!(log.loud(), "a minute later: WARN again");
        assert!(!log.loud());
    }
}
