//! The `kubesink` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the informer's parse → shape → encode path allocates and
/// frees many small JSON nodes per object, and glibc's malloc/free took ~30% of the CPU in a
/// profile of `cargo bench --bench throughput` (see docs/architecture.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc options (`enum mi_option_e` in mimalloc v3's `include/mimalloc.h`; the
/// `libmimalloc-sys` crate exports `mi_option_set` but not these two names).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc give memory back to the OS as soon as it is free. By default it commits
/// arenas eagerly on Linux and purges freed pages after a 1 s delay; measured, the pages and
/// messages of the initial list stayed resident after it (after listing 20,000 pods: RSS 62–93 MiB steady, peak
/// 93–111 MiB; with these options 23 MiB steady, peak 33 MiB; the initial list then costs
/// ~30% more CPU, still well above the parse floor: see BENCHMARKS.md).
///
/// Runs from `.init_array`, before `main` and before the first allocation: the first arena
/// is created, and committed or not, by that allocation, so setting the options in `main`
/// is too late for it (measured: 36–41 MiB steady instead of 23). The environment variables
/// `MIMALLOC_PURGE_DELAY` and `MIMALLOC_ARENA_EAGER_COMMIT` still take precedence (read with
/// `getenv`, which does not allocate).
extern "C" fn tune_allocator() {
    for (option, value, env) in [
        (MI_OPTION_PURGE_DELAY, 0, c"MIMALLOC_PURGE_DELAY"),
        (
            MI_OPTION_ARENA_EAGER_COMMIT,
            0,
            c"MIMALLOC_ARENA_EAGER_COMMIT",
        ),
    ] {
        // SAFETY: `getenv` reads the environment (no other thread exists yet), with a
        // NUL-terminated name; `mi_option_set` stores an integer in mimalloc's option table,
        // and both are valid options of this mimalloc version that take any integer.
        unsafe {
            if libc::getenv(env.as_ptr()).is_null() {
                libmimalloc_sys::mi_option_set(option, value);
            }
        }
    }
}

#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

use clap::Parser;
use kubesink::cli::{init_logging, CheckArgs, Cli, Command, LogFormat, RbacArgs};
use kubesink::config;

fn main() -> ExitCode {
    #[cfg(not(target_os = "linux"))]
    tune_allocator();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let code = rt.block_on(async_main());
            // Work the shutdown deadline abandoned (a save blocked in a write) must not hold
            // the exit: dropping the runtime would wait for its blocking threads.
            rt.shutdown_background();
            code
        }
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn async_main() -> ExitCode {
    let cli = Cli::parse();
    // `fold` prints a view on stdout and its summary on stderr: clients' connection chatter
    // (info) would drown the summary, so it logs warnings only unless asked otherwise.
    let quiet = matches!(cli.command, Some(Command::Fold(_))) && cli.log_level == "info";
    init_logging(cli.log_format, if quiet { "warn" } else { &cli.log_level });
    let command = cli.command.unwrap_or(Command::Run);
    let json_logs = matches!(cli.log_format, LogFormat::Json);
    let result = match command {
        Command::Check(args) => return check(cli.config.as_deref(), &args).await,
        Command::Rbac(args) => return rbac(cli.config.as_deref(), &args),
        Command::Fold(args) => return kubesink::fold::run(args, cli.config.as_deref()).await,
        #[cfg(feature = "sim")]
        Command::Demo(args) => kubesink::demo::run(args).await,
        Command::Run => match kubesink::plan::load(cli.config.as_deref()) {
            Ok(c) => kubesink::run::run(c).await,
            Err(e) => {
                eprint!("{e}");
                return ExitCode::FAILURE;
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Said once on stderr: as a JSON log line for a log collector, else as a line
            // for a person (the human log format would repeat it with a timestamp).
            match json_logs {
                true => tracing::error!("{e:#}"),
                false => eprintln!("error: {e:#}"),
            }
            // A shutdown that was not clean says how (docs/operations.md, exit codes).
            match e.downcast_ref::<kubesink::bridge::Unclean>() {
                Some(unclean) => ExitCode::from(u8::try_from(unclean.0.exit_code()).unwrap_or(1)),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// `kubesink check`: prints the effective configuration (secrets masked) or every problem;
/// with `--online`, once the configuration is valid, one line per configured resource of
/// each cluster instead of the configuration.
async fn check(file: Option<&std::path::Path>, args: &CheckArgs) -> ExitCode {
    match kubesink::plan::load_with_partial(file) {
        Err((errors, partial)) => {
            eprint!("{errors}");
            // What did parse is still checked: its warnings, and with --strict its missing
            // files as errors, come in the same run as the errors.
            if let Some(partial) = partial {
                // A configuration that does not resolve has its problems said already.
                let watches = kubesink::plan::resolve(&partial).ok().map(|p| p.watches());
                if strict_errors(&partial, watches, args.strict) == 0 {
                    warn(&partial, watches);
                }
            }
            ExitCode::FAILURE
        }
        Ok(c) => check_valid(c, args).await,
    }
}

/// `kubesink check` of a configuration that loaded: resolved into the plan `run` starts
/// from, then reported.
async fn check_valid(c: config::Config, args: &CheckArgs) -> ExitCode {
    let plan = match kubesink::plan::resolve(&c) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let watches = Some(plan.watches());
    // A kubeconfig that is here but that `run` cannot use is reported like a missing one: a
    // warning, an error with --strict (a file that is not a kubeconfig, or a context it
    // lacks, must not pass `check --strict` and then stop `run`).
    let unusable = unusable_kubeconfigs(&c).await;
    for u in &unusable {
        match args.strict {
            true => eprintln!("error (--strict): {u}"),
            false => eprintln!("warning: {u}"),
        }
    }
    if strict_errors(&c, watches, args.strict) > 0 || (args.strict && !unusable.is_empty()) {
        return ExitCode::FAILURE;
    }
    if args.online {
        match warn(&c, watches) {
            0 => eprintln!("configuration OK; asking the clusters"),
            n => eprintln!("configuration OK, with {n} warning(s); asking the clusters"),
        }
        let options = kubesink::online::Options {
            timeout: args.timeout.into(),
            impersonate: args.as_user.clone(),
        };
        let report = kubesink::online::run(&plan, &options).await;
        for line in &report.lines {
            println!("{line}");
        }
        eprintln!("{}", report.summary());
        return if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    match c.to_effective_toml() {
        Ok(text) => {
            println!("# effective configuration (secrets masked)\n{text}");
            println!("# routes: what reaches each sink (\"own state\": a sink with a filter keeps its acknowledged state apart)");
            for line in kubesink::bridge::explain_routes(&plan) {
                println!("#   {line}");
            }
            println!("# resources: what each entry follows (`check --online` asks the clusters what they serve now)");
            for line in kubesink::plan::explain_resources(&c) {
                println!("#   {line}");
            }
            if plan.scale_out {
                let units: Vec<String> = plan.units.iter().map(|u| u.unit()).collect();
                println!(
                    "# scale-out: {} unit(s) spread over the group's replicas, each on a Lease of its own: {}",
                    units.len(),
                    units.join(", ")
                );
            }
            match warn(&c, watches) {
                0 => eprintln!("configuration OK"),
                n => eprintln!("configuration OK, with {n} warning(s)"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("configuration is valid but could not be printed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The kubeconfigs of `c` that are here but that `run` cannot use, each as one sentence:
/// its clients are built as `run` builds them (reading the file, resolving the context,
/// loading certificates; no request is made). A missing file is left to
/// [`config::missing_files`].
async fn unusable_kubeconfigs(c: &config::Config) -> Vec<String> {
    let mut out = Vec::new();
    for cluster in c.clusters() {
        if !cluster.kubeconfig.as_ref().is_some_and(|p| p.is_file()) {
            continue;
        }
        if let Err(e) = kubesink::cluster::client(&cluster).await {
            out.push(format!(
                "{e} (`kubesink run` cannot use it for cluster {:?})",
                cluster.name
            ));
        }
    }
    out
}

/// With `--strict`, prints each missing file of `c` and each kind a built-in group version
/// does not have as an error, then the other warnings; returns how many errors it printed
/// (none, and nothing printed, without `--strict`).
fn strict_errors(c: &config::Config, watches: Option<u64>, strict: bool) -> usize {
    if !strict {
        return 0;
    }
    let missing = config::missing_files(c);
    for m in &missing {
        eprintln!("error (--strict): {}", m.error());
    }
    let kinds = kubesink::plan::kind_warnings(c);
    for k in &kinds {
        eprintln!("error (--strict): {k}");
    }
    let errors = missing.len() + kinds.len();
    if errors > 0 {
        let mut reported: Vec<String> = missing.iter().map(config::MissingFile::warning).collect();
        reported.extend(kinds);
        warn_except(c, watches, &reported);
    }
    errors
}

/// Prints what works but is risky in `c` on stderr (the open-files limit for its `watches`,
/// `None` when it did not resolve, then the configuration's warnings); returns how many
/// configuration warnings there were.
fn warn(c: &config::Config, watches: Option<u64>) -> usize {
    warn_except(c, watches, &[])
}

/// [`warn`], leaving out the warnings in `reported` (already printed as errors).
fn warn_except(c: &config::Config, watches: Option<u64>, reported: &[String]) -> usize {
    // `run` raises the soft limit to the hard one: that is the one that counts.
    if let (Ok(limit), Some(watches)) = (kubesink::limits::open_files(), watches) {
        if let Some(warning) = kubesink::limits::fd_budget(watches, limit.hard) {
            eprintln!("warning: {warning}");
        }
    }
    let warnings: Vec<String> = kubesink::plan::warnings(c)
        .into_iter()
        .filter(|w| !reported.contains(w))
        .collect();
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    warnings.len()
}

/// `kubesink rbac`: prints the RBAC YAML on stdout, or the problem on stderr (exit 1).
fn rbac(file: Option<&std::path::Path>, args: &RbacArgs) -> ExitCode {
    match kubesink::rbac::generate(file, &args.name, &args.service_account, &args.namespace) {
        Ok(generated) => {
            for w in &generated.warnings {
                eprintln!("warning: {w}");
            }
            print!("{}", generated.yaml);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprint!("{e}");
            if !e.to_string().ends_with('\n') {
                eprintln!();
            }
            ExitCode::FAILURE
        }
    }
}
