//! Starting a bridge from its part of the plan, in order: the routes and the planned
//! watches, the pipeline over the sinks, the observers (sink probes, `/metrics` and
//! `/readyz`, summaries), then the watches (at once, or once this replica leads).
//! Each layer is handed only its part of the [`Plan`]; nothing here reads the raw
//! configuration.

use std::sync::Arc;

use kube::Client;
use kubesink_core::Sink;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::planned::{self, Keepers, Planned};
use super::routes;
use super::watching::Watching;
use super::{Bridge, Shared, StartError};
use crate::cluster::ClusterError;
use crate::informer::ListBudget;
use crate::leader::{Elector, Fence, Leadership};
use crate::observe::{self, Observer, SinkEntry, WatchList};
use crate::pipeline::Pipeline;
use crate::plan::{Plan, UnitPlan};

/// [`Bridge::start_built`] for `clusters`, units of `plan` (a scale-out member starts
/// one bridge per held unit).
pub(crate) async fn launch(
    plan: &Plan,
    clusters: Vec<UnitPlan>,
    clients: Vec<Result<Client, ClusterError>>,
    sinks: Vec<Arc<dyn Sink>>,
    elector: Option<Elector>,
    shared: Shared,
) -> Result<Bridge, StartError> {
    if clusters.len() != clients.len() {
        return Err(StartError::Clients {
            clusters: clusters.len(),
            clients: clients.len(),
        });
    }
    let multi = clusters.len() > 1 || shared.multi;
    let routes = Arc::new(routes::routes(&plan.sinks, &sinks));
    let Planned {
        clusters: planned,
        watches,
        states,
        apis,
        stats,
    } = planned::plan_units(plan, clusters, clients, &routes, multi);
    // One budget of lists in flight for the whole process, every cluster's informers.
    let lists = shared
        .lists
        .clone()
        .unwrap_or_else(|| Arc::new(ListBudget::new(plan.watch.max_concurrent_lists)));
    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    let fence = elector.as_ref().map_or_else(Fence::open, Elector::fence);
    let pipeline = Pipeline::start(&plan.pipeline, sinks, fence.clone());
    for h in pipeline.sinks() {
        tasks.spawn(observe::probe_sink(
            h.clone(),
            plan.server.sink_check_interval.get(),
            cancel.clone(),
        ));
    }
    let leadership = elector.as_ref().map(|_| Arc::new(Leadership::default()));
    // Per sink: its queue and counters, its filter's counts (the route that serves it
    // through a filter), and the cluster its queues belong to under scale-out.
    let sink_entries = pipeline
        .sinks()
        .iter()
        .enumerate()
        .map(|(i, h)| SinkEntry {
            handle: h.clone(),
            filter: routes
                .iter()
                .find(|r| r.sink.is_some() && r.sinks.contains(&i))
                .map(|r| r.counts.clone()),
            cluster: shared.sink_cluster.clone(),
        })
        .collect();
    let watch_list = WatchList::new(watches);
    let observed = Arc::new(Observer::new(
        watch_list.clone(),
        sink_entries,
        states,
        apis,
        lists.clone(),
        plan.server.watch_failure_timeout.get(),
        multi,
        leadership.clone(),
    ));
    let every = plan.log.summary_interval.get();
    if !every.is_zero() {
        tasks.spawn(observed.clone().log_summaries(every, cancel.clone()));
    }
    let server = observe::server::serve_configured(&plan.server, observed.clone(), cancel.clone())
        .await
        .inspect_err(|_| cancel.cancel())?;
    let (stop_saving, stop_journals) = (CancellationToken::new(), CancellationToken::new());
    let keepers = Keepers::default();
    let watching = Watching {
        clusters: planned,
        state_plan: plan.state.clone(),
        watch_list,
        multi,
        follow_group: super::groups::spawn_follow,
        sync_markers: plan.pipeline.sync_markers,
        routes: routes.clone(),
        watch: plan.watch.clone(),
        lists,
        state: plan.state.config.clone(),
        fence: fence.clone(),
        publisher: pipeline.publisher(),
        keepers: keepers.clone(),
        stop_saving: stop_saving.clone(),
        stop_journals: stop_journals.clone(),
        cancel: cancel.clone(),
        tasks: tasks.clone(),
    };
    let release = CancellationToken::new();
    let (lost, released) =
        watching.start_or_lead(elector.zip(leadership), &release, &cancel, &tasks);
    Ok(Bridge {
        pipeline,
        tasks,
        cancel,
        stats,
        observed,
        server,
        shutdown_timeout: plan.pipeline.shutdown_timeout.get(),
        lost,
        release,
        released,
        keepers,
        stop_saving,
        stop_journals,
    })
}
