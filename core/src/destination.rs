//! What a destination's `[[sinks]]` entry can do, whatever the broker: the contract between
//! the bridge's one registration list (`src/sinks.rs`) and a destination's crate.
//!
//! A destination implements [`Destination`] on its config struct (Vector's `SinkConfig` is
//! the model); the registration list turns the entries into one serde enum tagged by `type`,
//! so a config error still names the entry, its type and its key.

use std::sync::Arc;

use async_trait::async_trait;

use crate::Sink;

/// One destination type's `[[sinks]]` entry, deserialized (`type = "..."` selects it).
#[async_trait]
pub trait Destination {
    /// The entry's `name` (unique among the sinks; metrics and logs use it).
    fn name(&self) -> &str;

    /// The entry's `filter`: a CEL expression choosing what the sink gets, compiled and
    /// applied by the bridge (`None`: everything).
    fn filter(&self) -> Option<&str> {
        None
    }

    /// An entry with every option set (optional ones included, secrets as placeholders): the
    /// reference-file test walks its keys to check that `config/kubesink.toml` documents
    /// every option of every registered destination.
    fn reference_example() -> Self
    where
        Self: Sized;

    /// The entry as [`Any`](std::any::Any) (implemented as `self`), so that another part of
    /// its destination's crate handed every sink as `&dyn Destination` (its state backend,
    /// [`StateContext`](crate::state::StateContext)) finds its own entries by downcasting.
    fn as_any(&self) -> &dyn std::any::Any;

    /// Checks settings that serde cannot, returning every problem found. `index` is the
    /// entry's position in `sinks`, used in messages.
    fn validate(&self, index: usize) -> Vec<SinkConfigError> {
        let _ = index;
        Vec::new()
    }

    /// Settings that work but weaken security (TLS verification off, credentials without
    /// TLS), one sentence each naming the entry and key; `kubesink check` prints them and
    /// `kubesink run` logs them at start.
    fn warnings(&self, index: usize) -> Vec<String> {
        let _ = index;
        Vec::new()
    }

    /// The files the sink reads when it is built (credentials, certificates) as `(key,
    /// path)`, the key inside the entry (`auth.credentials_file`): `kubesink run` refuses to
    /// start when one cannot be read, so `kubesink check` names each that is not there (a
    /// warning, as the file is often mounted only where kubesink runs; an error with
    /// `--strict`).
    fn files(&self) -> Vec<(String, std::path::PathBuf)> {
        Vec::new()
    }

    /// Builds the sink (connecting where the destination needs it).
    ///
    /// # Errors
    /// A [`SinkConfigError`] naming the entry and key when the settings cannot work.
    async fn build(&self, index: usize) -> Result<Arc<dyn Sink>, SinkConfigError>;
}

/// Why a sink could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SinkConfigError {
    /// A setting is invalid; `key` is the dotted config key inside the `[[sinks]]` entry.
    #[error("sinks[{index}] ({name}): {key}: {message}")]
    Invalid {
        /// Position of the entry in `sinks`.
        index: usize,
        /// The sink's name.
        name: String,
        /// The key inside the entry.
        key: String,
        /// What is wrong.
        message: String,
    },
}
