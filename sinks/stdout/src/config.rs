//! `[[sinks]]` with `type = "stdout"`: its settings and `build()`.

use std::sync::Arc;

use async_trait::async_trait;
use kubesink_core::message::Format;
use kubesink_core::{Destination, Sink, SinkConfigError};
use serde::{Deserialize, Serialize};

use crate::StdoutSink;

/// `[[sinks]]` entry with `type = "stdout"`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdoutConfig {
    /// Name used in logs. Default `"stdout"`.
    #[serde(default = "default_name")]
    pub name: String,
    /// A CEL expression choosing what this sink gets (docs/configuration.md, "Sink filters
    /// and routes"). Naming only `object`, `cluster`, `kind` and `ns` it chooses the objects
    /// the sink holds: one that starts matching is sent to this sink as `added`, one that
    /// stops as `deleted` with `reason: "leftFilter"`, and the sink's acknowledged state is
    /// kept apart from the other sinks'. Naming `op` or `changed` it chooses changes: one
    /// it does not match is not sent to this sink. Compiled at start; `kubesink check`
    /// names a syntax error's line and column. Default: everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// How each line is written: `"json"` (the topology message v1) or
    /// `"cloudevents-structured"` (one CloudEvents JSON envelope per line, `data` = the
    /// message; see `docs/message-contract.md#cloudevents`). Binary mode has no headers to go
    /// in, so `"cloudevents"` is not accepted here. Default `"json"`.
    #[serde(default)]
    pub format: StdoutFormat,
}

/// The formats of the stdout sink (a line has no headers, so no CloudEvents binary mode).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum StdoutFormat {
    /// The topology message v1 per line.
    #[default]
    Json,
    /// A CloudEvents structured-mode envelope per line.
    #[serde(rename = "cloudevents-structured")]
    CloudEventsStructured,
}

/// `format`'s JSON Schema for stdout: one of its two spellings.
impl schemars::JsonSchema for StdoutFormat {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StdoutFormat".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "\"json\" (the topology message v1 per line) or \"cloudevents-structured\" (a CloudEvents envelope per line).",
            "enum": ["json", "cloudevents-structured"]
        })
    }
}

impl<'de> Deserialize<'de> for StdoutFormat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let allowed = [Format::Json, Format::CloudEventsStructured];
        Ok(
            match kubesink_core::message::cloudevents::parse_format(d, &allowed)? {
                Format::CloudEventsStructured => StdoutFormat::CloudEventsStructured,
                _ => StdoutFormat::Json,
            },
        )
    }
}

impl From<StdoutFormat> for Format {
    fn from(f: StdoutFormat) -> Self {
        match f {
            StdoutFormat::Json => Format::Json,
            StdoutFormat::CloudEventsStructured => Format::CloudEventsStructured,
        }
    }
}

fn default_name() -> String {
    "stdout".to_owned()
}

impl Default for StdoutConfig {
    fn default() -> Self {
        StdoutConfig {
            name: default_name(),
            filter: None,
            format: StdoutFormat::Json,
        }
    }
}

impl StdoutConfig {
    /// Builds the sink writing to the process's standard output.
    pub fn build(&self) -> StdoutSink {
        let mut sink = StdoutSink::new(self.name.clone(), Box::new(tokio::io::stdout()))
            .with_format(self.format.into());
        sink.process_stdout = true;
        sink
    }
}

#[async_trait]
impl Destination for StdoutConfig {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn filter(&self) -> Option<&str> {
        self.filter.as_deref()
    }

    fn reference_example() -> Self {
        StdoutConfig {
            filter: Some(r#"ns == "payments""#.into()),
            ..StdoutConfig::default()
        }
    }

    async fn build(&self, _index: usize) -> Result<Arc<dyn Sink>, SinkConfigError> {
        Ok(Arc::new(StdoutConfig::build(self)))
    }
}
