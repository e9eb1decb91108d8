//! The seam between the raw configuration and the languages some of its strings are written
//! in (CEL filters, JSONPath change paths). `config` compiles none of them: the layer that
//! runs them (`crate::plan`) implements [`Expressions`], and the loader asks it about each
//! entry beside the entry's own checks, so that a bad expression is reported like any other
//! problem: with its key and where its value came from, in the same run.

use super::{ResourceConfig, SinkConfig};

/// The checks of the expressions one configuration entry holds.
pub trait Expressions {
    /// Problems of the expressions of the `[[resources]]` entry at `key` (`resources.2`,
    /// `clusters.0.resources.1`), as `(full dotted key, message)`.
    fn resource(&self, r: &ResourceConfig, key: &str) -> Vec<(String, String)>;

    /// Problems of the expressions of one `[[sinks]]` entry, as `(key inside the entry,
    /// message)`.
    fn sink(&self, s: &SinkConfig) -> Vec<(String, String)>;
}
