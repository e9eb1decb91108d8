//! `kubesink fold`: what does downstream see? Reads a Kafka topic, a JetStream stream or a
//! JSON Lines file from the start, folds it as `docs/consumers.md` tells consumers to
//! ([`view`]), and prints the current view once caught up; optionally keeps following, or
//! compares the view with a live list from the API server ([`drift`]).
//!
//! Sources: [`file`] here; a broker's reader lives in its destination's crate, registered in
//! `src/sinks.rs` (`readers!`; `line_formats` for what a receiver writes down). A source sends
//! [`Event`]s (`kubesink_core::readback`) into a channel: records in order, and
//! [`Event::CaughtUp`] once when it reached what the broker held at start. It never writes
//! to the broker (no consumer group, no commit, no durable consumer).
//!
//! Exit codes (like `diff`): 0 done (and no drift), 1 `--against-cluster` found
//! differences, 2 an error (unreachable broker, no such topic or stream, a record that is not
//! a message: each named with where it is).

pub mod drift;
pub mod file;
pub mod view;

use std::io::Write;
use std::process::ExitCode;

use kubesink_core::readback::{Event, SourceError};
use tokio::sync::mpsc;
use view::View;

use crate::cli::{FoldArgs, FoldOutput};

/// Runs `kubesink fold` and returns the exit code (0, 1 for drift, 2 for errors).
pub async fn run(args: FoldArgs, config: Option<&std::path::Path>) -> ExitCode {
    match fold(args, config).await {
        Ok(code) => code,
        // The reader of stdout went away (`kubesink fold … | head`): not an error of fold's.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn fold(args: FoldArgs, config: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    // The configuration first: a drift check with a broken configuration fails before
    // reading a whole topic.
    let plan = if args.against_cluster {
        let loaded = crate::plan::load(config).map_err(|e| anyhow::anyhow!("{e}"))?;
        Some(crate::plan::resolve(&loaded)?)
    } else {
        None
    };
    let (tx, mut rx) = mpsc::channel::<Event>(1024);
    let follow = args.follow && !args.against_cluster;
    let (source, what) = spawn_source(&args, follow, tx)?;
    let mut view = View::new(args.objects);
    let stdout = std::io::stdout();
    let mut caught_up = false;
    while let Some(event) = rx.recv().await {
        match event {
            Event::Record(rec) => {
                let changes = view.apply(rec)?;
                if caught_up {
                    let mut out = stdout.lock();
                    for c in changes {
                        writeln!(out, "{}", c.to_json())?;
                    }
                    out.flush()?;
                }
            }
            Event::CaughtUp => {
                caught_up = true;
                let s = &view.stats;
                eprintln!(
                    "caught up with {what}: {} keys from {} records ({} applied, {} duplicates, \
                     {} deletes of keys not in the view, {} tombstones, {} sync markers sweeping \
                     {} keys, {} unknown ops skipped)",
                    view.len(),
                    s.records,
                    s.applied,
                    s.duplicates,
                    s.unknown_deletes,
                    s.tombstones,
                    s.markers,
                    s.swept,
                    s.unknown_ops
                );
                if s.stale_epochs > 0 {
                    eprintln!(
                        "{} message(s) of a deposed leader skipped: their leaderEpoch is below one \
                         already seen for their key (published before a hand-over, written after \
                         the successor's; see docs/consumers.md)",
                        s.stale_epochs
                    );
                }
                let skipped = view.skipped_sweeps();
                if skipped.replaced > 0 {
                    eprintln!(
                        "note: {} sync marker(s) closed a list some of whose messages the stream no \
                         longer holds: later changes of those objects replaced them (the stream keeps \
                         the last message per subject or key: max_msgs_per_subject = 1, or a compacted \
                         topic); not swept, and nothing is missing from the view but the deletes \
                         a sweep would have inferred from an earlier list (none on a stream that \
                         began with that list); see docs/consumers.md",
                        skipped.replaced
                    );
                }
                if skipped.missing > 0 {
                    eprintln!(
                        "warning: {} sync marker(s) closed a list of which fewer objects arrived than its \
                         count, and no later change explains the rest: not swept (on JetStream: a \
                         stateless restart within the stream's duplicate_window; see docs/consumers.md)",
                        skipped.missing
                    );
                }
                if let Some(plan) = &plan {
                    return drift_check(plan, &view, &args).await;
                }
                print_view(&view, args.output)?;
                if !follow {
                    break;
                }
            }
        }
    }
    // The source's own error (the channel closed because it stopped).
    match source.await {
        Ok(Ok(())) if caught_up => Ok(ExitCode::SUCCESS),
        Ok(Ok(())) => anyhow::bail!("{what} ended before catching up"),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => anyhow::bail!("the reader of {what} stopped: {e}"),
    }
}

type SourceTask = tokio::task::JoinHandle<Result<(), SourceError>>;

fn spawn_source(
    args: &FoldArgs,
    follow: bool,
    tx: mpsc::Sender<Event>,
) -> anyhow::Result<(SourceTask, String)> {
    if let Some(path) = &args.file {
        let path = path.clone();
        let what = if path.as_os_str() == "-" {
            "stdin".to_owned()
        } else {
            format!("file {}", path.display())
        };
        return Ok((
            tokio::spawn(async move { file::read(&path, follow, tx).await }),
            what,
        ));
    }
    match args.readers.open(args.timeout.into(), follow, tx) {
        Some(Ok((reading, what))) => return Ok((tokio::spawn(reading), what)),
        Some(Err(why)) => anyhow::bail!("{why}"),
        None => {}
    }
    anyhow::bail!("name a source: --file PATH (or - for stdin), or a destination's reader (kubesink fold --help lists this build's)")
}

fn print_view(view: &View, output: FoldOutput) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        FoldOutput::Json => {
            for e in view.entries() {
                writeln!(out, "{}", e.to_json())?;
            }
        }
        FoldOutput::Table => {
            let now = jiff::Timestamp::now();
            let mut rows = vec![[
                "CLUSTER",
                "KIND",
                "NAMESPACE",
                "NAME",
                "UID",
                "RV",
                "LAST-OP",
                "CHANGED",
                "AGE",
            ]
            .map(str::to_owned)];
            for e in view.entries() {
                let kind = if e.group.is_empty() {
                    e.kind.clone()
                } else {
                    format!("{}.{}", e.kind, e.group)
                };
                let age = e
                    .observed_at
                    .parse::<jiff::Timestamp>()
                    .map(|t| short_age(now.duration_since(t).as_secs()))
                    .unwrap_or_else(|_| "?".into());
                rows.push([
                    e.cluster.clone(),
                    kind,
                    e.namespace.clone(),
                    e.name.clone(),
                    e.uid.clone(),
                    e.resource_version.clone(),
                    e.op.clone(),
                    e.changed.as_ref().map_or_else(String::new, |c| c.join(",")),
                    age,
                ]);
            }
            let mut widths = [0usize; 9];
            for r in &rows {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.chars().count());
                }
            }
            for r in &rows {
                let line: Vec<String> = r
                    .iter()
                    .zip(widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                writeln!(out, "{}", line.join("  ").trim_end())?;
            }
        }
    }
    out.flush()
}

/// `kubectl`-style age: `42s`, `5m`, `3h`, `12d`.
fn short_age(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

async fn drift_check(
    plan: &crate::plan::Plan,
    view: &View,
    args: &FoldArgs,
) -> anyhow::Result<ExitCode> {
    let report = drift::compare(
        plan,
        view,
        args.compare_resource_version,
        args.sink.as_deref(),
    )
    .await?;
    let mut out = std::io::stdout().lock();
    for d in &report.drifts {
        writeln!(out, "{}", d.to_json())?;
    }
    out.flush()?;
    let count = |k: &str| report.drifts.iter().filter(|d| d.kind == k).count();
    eprintln!(
        "{}: {} missing from the view, {} ghosts in the view, {} uid mismatches{} \
         ({} live objects, {} folded keys, {} keys outside the configured resources not compared)",
        if report.drifts.is_empty() {
            "in agreement with the cluster"
        } else {
            "DRIFT"
        },
        count("missing"),
        count("ghost"),
        count("uid"),
        if args.compare_resource_version {
            format!(", {} stale resourceVersions", count("stale"))
        } else {
            String::new()
        },
        report.live,
        view.len(),
        report.not_compared,
    );
    // A route's destination holds only what its sink's filter matches: without `--sink`
    // every missing object of the others would be reported.
    let routes: Vec<&str> = plan
        .sinks
        .iter()
        .filter(|s| s.filter.is_some())
        .map(|s| s.name())
        .collect();
    if args.sink.is_none() && count("missing") > 0 && !routes.is_empty() {
        eprintln!(
            "hint: sink(s) {} of the configuration have a filter; if this destination is fed by one of them, compare with --sink NAME (only what its filter matches is expected there)",
            routes.join(", ")
        );
    }
    if args.repair {
        let repaired = drift::repair(plan, view, &report, args.sink.as_deref()).await?;
        eprintln!(
            "repaired: {} `deleted` messages (finalStateUnknown) published for the ghosts through {}",
            repaired.deletes,
            if repaired.sinks.is_empty() {
                "no sink (nothing to publish)".to_owned()
            } else {
                format!("sink(s) {}", repaired.sinks.join(", "))
            }
        );
        // What the repair does not do: `missing`, `uid` and `stale` keys are the next
        // kubesink start's (a full list re-sends them).
        let left = report.drifts.iter().filter(|d| d.kind != "ghost").count();
        return Ok(if left == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    Ok(if report.drifts.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
