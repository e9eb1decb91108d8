//! The one registration list of destinations: every `[[sinks]]` type kubesink can build,
//! every state backend a destination's crate keeps (`state.backend`, `[state.NAME]`), and
//! every reader `kubesink fold` can read back with.
//!
//! A destination is a crate under `sinks/` (its crate holds the connection, the sink,
//! the reader `kubesink fold` uses, the state store where the broker has one, and its
//! CloudEvents binding) whose config struct implements [`kubesink_core::Destination`]. It is
//! registered by one line below (and its crate and cargo feature in `Cargo.toml`); the
//! [`SinkConfig`] enum and its dispatch are generated from that line, so no match arm or
//! feature list is repeated anywhere else. A destination whose broker keeps the informer
//! state registers its `[state.NAME]` section (a
//! [`StateBackendConfig`](kubesink_core::state::StateBackendConfig)) by one line of the
//! `state_config!` list below, which generates `StateBackend` and `StateConfig`. Vector's `#[typetag::serde] impl SinkConfig` is the
//! model; a serde enum tagged by `type` is kept instead of a trait object so that a config
//! error names the entry's type and key exactly as serde reports it, `Config` stays `Clone`,
//! `PartialEq` and `Serialize`, and the list is checked at compile time.

use std::sync::Arc;

use kubesink_core::{Destination, Sink, SinkConfigError};

use serde::{Deserialize, Serialize};

/// Declares the destinations: one line each, `Variant(ConfigType) if "cargo feature";`. The
/// variant's lowercase name is its `type` in `[[sinks]]`.
macro_rules! sinks {
    ($( $(#[$doc:meta])* $variant:ident($config:ty) if $feature:literal; )*) => {
        /// One `[[sinks]]` entry. The `type` key selects the destination; the other keys are
        /// the destination's own (see each variant's struct).
        #[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
        #[serde(tag = "type", rename_all = "lowercase")]
        #[allow(clippy::large_enum_variant)] // built once at start-up; size does not matter
        pub enum SinkConfig {
            $( $(#[$doc])* #[cfg(feature = $feature)] $variant($config), )*
            /// A build without any destination feature (`--no-default-features`) has no sink
            /// type; this uninhabited variant keeps the enum and its match well-formed there.
            #[cfg(not(any($(feature = $feature),*)))]
            #[serde(skip)]
            #[doc(hidden)]
            NoSinkFeature(std::convert::Infallible),
        }

        impl SinkConfig {
            /// One fully populated entry per registered destination
            /// ([`Destination::reference_example`]).
            pub fn reference_examples() -> Vec<SinkConfig> {
                vec![$( #[cfg(feature = $feature)] SinkConfig::$variant(<$config as Destination>::reference_example()), )*]
            }

            /// The entry as its destination's [`Destination`].
            pub fn destination(&self) -> &(dyn Destination + Send + Sync) {
                match self {
                    $( #[cfg(feature = $feature)] SinkConfig::$variant(c) => c, )*
                    #[cfg(not(any($(feature = $feature),*)))]
                    SinkConfig::NoSinkFeature(never) => match *never {},
                }
            }
        }
    };
}

sinks! {
    /// `type = "stdout"`: JSON Lines on standard output (`sinks/stdout`).
    Stdout(kubesink_stdout::StdoutConfig) if "stdout";
    /// `type = "nats"`: NATS core or JetStream (`sinks/nats`).
    Nats(kubesink_nats::NatsConfig) if "nats";
    /// `type = "kafka"`: Kafka through librdkafka (`sinks/kafka`).
    Kafka(kubesink_kafka::KafkaConfig) if "kafka";
    /// `type = "http"`: CloudEvents or JSON Lines over HTTP POST (`sinks/http`).
    Http(kubesink_http::HttpConfig) if "http";
    /// `type = "otlp"`: OpenTelemetry log records over OTLP/HTTP (`sinks/otlp`).
    Otlp(kubesink_otlp::OtlpConfig) if "otlp";
}

impl SinkConfig {
    /// The sink's configured name.
    pub fn name(&self) -> &str {
        self.destination().name()
    }

    /// Checks settings that serde cannot (returns every problem found). `index` is the
    /// entry's position in `sinks`, used in messages. Its `filter` is checked where filters
    /// are compiled (`crate::plan`).
    pub fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        self.destination().validate(index)
    }

    /// The entry's `filter` ([`Destination::filter`]).
    pub fn filter(&self) -> Option<&str> {
        self.destination().filter()
    }

    /// Settings that work but weaken security (TLS verification off, credentials without
    /// TLS), one sentence each naming the entry and key; `kubesink check` prints them and
    /// `kubesink run` logs them at start.
    pub fn warnings(&self, index: usize) -> Vec<String> {
        self.destination().warnings(index)
    }

    /// The files the sink reads when built, as `(key inside the entry, path)`
    /// ([`Destination::files`]).
    pub fn files(&self) -> Vec<(String, std::path::PathBuf)> {
        self.destination().files()
    }

    /// Builds the sink (connecting where the destination needs it).
    ///
    /// # Errors
    /// A [`SinkConfigError`] naming the entry and key when the settings cannot work.
    pub async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        self.destination().build(index).await
    }
}

/// Generates [`StateBackend`] and [`StateConfig`] from the registered state backends: one
/// line each, `/// variant doc  Variant { /// field doc  name: SectionType } if "cargo
/// feature";`, the section type implementing `StateBackendConfig` and `name` its
/// `state.backend` value and its key under `[state]` (the variant's name in lowercase).
/// Invoked once, by the registration list (`src/sinks.rs`).
macro_rules! state_config {
    ($(
        $(#[$vdoc:meta])* $variant:ident {
            $(#[$fdoc:meta])* $field:ident: $config:ty
        } if $feature:literal;
    )*) => {
        /// Where the state is kept.
        #[derive(
            Clone, Copy, Debug, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq, schemars::JsonSchema,
        )]
        #[serde(rename_all = "lowercase")]
        pub enum StateBackend {
            /// No state: every start lists and emits every object as `initial` (and cannot report
            /// the deletes that happened while kubesink was down).
            #[default]
            None,
            /// A local file (`state.path`), written atomically. Follows a restart on the same
            /// volume, not a hand-over to a replica on another node.
            File,
            $( $(#[$vdoc])* #[cfg(feature = $feature)] $variant, )*
        }

        impl StateBackend {
            /// Its name as written in `state.backend` (`"none"`, `"file"`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    StateBackend::None => "none",
                    StateBackend::File => "file",
                    $( #[cfg(feature = $feature)] StateBackend::$variant => stringify!($field), )*
                }
            }

            /// The names of the registered backends a destination's crate keeps (every
            /// backend but `none` and `file`), in registration order.
            pub fn registered() -> &'static [&'static str] {
                &[$( #[cfg(feature = $feature)] stringify!($field), )*]
            }
        }

        /// `[state]`: the acknowledged informer state, saved so that a restart sends only the
        /// differences (and the deletes that happened meanwhile) instead of every object again.
        #[derive(Clone, Debug, serde::Deserialize, serde::Serialize, PartialEq, Eq, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct StateConfig {
            #[doc = concat!("Where the state is kept: `none` (default), `file`", $(", `", stringify!($field), "`",)* ".")]
            #[serde(default)]
            pub backend: StateBackend,
            /// With `backend = "file"` (required there): the state file. Written as a temporary file
            /// in the same directory, fsynced, then renamed over it; the directory must exist and be
            /// writable. Set without a backend it is an error (set `backend = "file"`). Default: none.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub path: Option<std::path::PathBuf>,
            /// How often the state is saved while running (it is also saved at shutdown, after the
            /// pipeline drained). A crash re-sends at most what changed since the last save.
            /// Default `30s`.
            #[serde(default = "state_default_interval")]
            pub interval: kubesink_core::units::HumanDuration,
            /// Record every new object in the state's journal before its `added` may be sent
            /// (`docs/restarts.md`), so that after a crash the restart can send the `deleted` of
            /// objects first sent after the last save and deleted while kubesink was down. Sends wait
            /// for the journal (one append per batch, usually done before the batch is ready); while
            /// the state store cannot be written, they stop; while it cannot be read at start or at a
            /// take-over, the watches wait for it. `false` keeps the sinks flowing then (and starts
            /// without the state it cannot read, with a full initial list), at the price of possible
            /// ghosts downstream after a crash. Default `true`.
            #[serde(default = "state_yes")]
            pub write_ahead: bool,
            $( $(#[$fdoc])* #[cfg(feature = $feature)] #[serde(default)] pub $field: $config, )*
        }

        impl Default for StateConfig {
            fn default() -> Self {
                StateConfig {
                    backend: StateBackend::None,
                    path: None,
                    interval: state_default_interval(),
                    write_ahead: true,
                    $( #[cfg(feature = $feature)] $field: <$config>::default(), )*
                }
            }
        }

        impl StateConfig {
            /// Every registered backend's section, as `(name, section)` in registration
            /// order, whichever backend is selected.
            pub fn sections(&self) -> Vec<(&'static str, &dyn kubesink_core::state::StateBackendConfig)> {
                vec![$( #[cfg(feature = $feature)] (stringify!($field), &self.$field as &dyn kubesink_core::state::StateBackendConfig), )*]
            }

            /// The selected backend's section (`None` for `none` and `file`).
            pub fn selected(&self) -> Option<&dyn kubesink_core::state::StateBackendConfig> {
                match self.backend {
                    StateBackend::None | StateBackend::File => None,
                    $( #[cfg(feature = $feature)] StateBackend::$variant => Some(&self.$field), )*
                }
            }
        }

        fn state_default_interval() -> kubesink_core::units::HumanDuration {
            kubesink_core::units::HumanDuration::from_secs(30)
        }

        fn state_yes() -> bool {
            true
        }
    };
}

// The state backends a destination's crate keeps, one line each (`state_config!`,
// `src/config/state.rs`, generates `StateBackend` and `StateConfig` from them).
state_config! {
    /// A NATS JetStream object store (`[state.nats]`): whichever replica runs finds it.
    /// (Cargo feature `nats`.)
    Nats {
        /// With `backend = "nats"`: the NATS connection and the object store. Any of its
        /// settings without a backend is an error (set `backend = "nats"`).
        nats: kubesink_nats::state::StateNatsConfig
    } if "nats";
    /// A compacted Kafka topic (`[state.kafka]`): whichever replica runs finds it.
    /// (Cargo feature `kafka`.)
    Kafka {
        /// With `backend = "kafka"`: the compacted topic and its connection (a Kafka sink's, or
        /// its own). Any of its settings without that backend is an error.
        kafka: kubesink_kafka::state::StateKafkaConfig
    } if "kafka";
}

/// Builds the sinks of `entries` (the `[[sinks]]` entries, in order; each connecting where its
/// destination needs it).
///
/// # Errors
/// The first sink that cannot be built, naming its entry.
pub async fn build_all<'a>(
    entries: impl IntoIterator<Item = &'a SinkConfig>,
) -> Result<Vec<Arc<dyn Sink>>, SinkConfigError> {
    let mut built = Vec::new();
    for (i, s) in entries.into_iter().enumerate() {
        built.push(s.build(i).await?);
    }
    Ok(built)
}

/// Declares the destinations' readers: one line each, `field(OptionsType) if "cargo
/// feature";`, the options a `clap::Args` of the destination's crate implementing
/// [`kubesink_core::readback::ReadOptions`].
macro_rules! readers {
    ($( $(#[$doc:meta])* $field:ident($options:ty) if $feature:literal; )*) => {
        /// The options of every registered reader, flattened into `kubesink fold`'s (each
        /// reader's source option is in the `source` group: exactly one source is named).
        #[derive(Debug, Clone, Default, clap::Args)]
        #[group(skip)]
        pub struct ReaderArgs {
            $( $(#[$doc])* #[cfg(feature = $feature)] #[command(flatten)] pub $field: $options, )*
        }

        impl ReaderArgs {
            /// The reading of the source named, or `None` when no reader's options name one.
            ///
            /// # Errors
            /// `Some(Err(..))` as [`ReadOptions::open`](kubesink_core::readback::ReadOptions::open).
            #[allow(unused_variables)] // a build without any reader
            pub fn open(
                &self,
                timeout: std::time::Duration,
                follow: bool,
                tx: tokio::sync::mpsc::Sender<kubesink_core::readback::Event>,
            ) -> Option<Result<(kubesink_core::readback::Reading, String), String>> {
                $(
                    #[cfg(feature = $feature)]
                    if let Some(r) = kubesink_core::readback::ReadOptions::open(&self.$field, timeout, follow, tx.clone()) {
                        return Some(r);
                    }
                )*
                None
            }
        }
    };
}

readers! {
    /// `--kafka BOOTSTRAP --topic T`: a Kafka topic from its first offsets (`sinks/kafka`).
    kafka(kubesink_kafka::reader::ReadArgs) if "kafka";
    /// `--nats URL --stream S`: a JetStream stream from its first sequence (`sinks/nats`).
    nats(kubesink_nats::reader::ReadArgs) if "nats";
}

/// The registered [`LineFormat`](kubesink_core::readback::LineFormat)s: the forms in which a
/// destination's receiver writes messages down, which `kubesink fold --file` unpacks (one
/// line each, `if "cargo feature"`).
pub fn line_formats() -> &'static [&'static dyn kubesink_core::readback::LineFormat] {
    &[
        #[cfg(feature = "otlp")]
        &kubesink_otlp::reader::OtlpJson,
    ]
}
