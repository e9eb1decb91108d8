//! Human units in configuration: durations (`250ms`, `5s`, `1m 30s`, via `humantime`) and
//! sizes (`64KiB`, `1MiB`, `1.5 GB`, via `bytesize`). A size is also accepted as a bare integer
//! (bytes, as Kafka's and NATS's own settings count them); a duration only as `0`: a number
//! without a unit is refused, as what it meant (seconds? milliseconds?) cannot be known.
//!
//! The one duration type and the one size type of the whole configuration: `[pipeline]`,
//! `[[sinks]]` of every kind and whatever comes next use these, so every duration key reads
//! and prints the same way.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written the human way in TOML or env (`"250ms"`, `"5s"`), or `0`; any other
/// bare number is refused (it has no unit). Serializes back as a human string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

/// A size in bytes written the human way (`"1MiB"`, `"64 KiB"`, `"2MB"`), or as an integer
/// number of bytes. Serializes back as a human string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl HumanDuration {
    /// The wrapped duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// A duration of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        HumanDuration(Duration::from_millis(ms))
    }

    /// A duration of `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        HumanDuration(Duration::from_secs(s))
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        HumanDuration(d)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl ByteSize {
    /// The size in bytes, saturated to `usize`.
    pub fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytesize::ByteSize::b(self.0).display().iec().to_string())
    }
}

/// A duration's JSON Schema: a string with a unit (humantime: `"250ms"`, `"5s"`, `"1h 30m"`),
/// or `0`.
impl schemars::JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration with a unit, such as \"250ms\", \"5s\" or \"1h 30m\"; a bare number must be 0.",
            "anyOf": [
                { "type": "string", "pattern": "^\\s*(0|([0-9]+\\s*[a-zA-Zµ]+\\s*)+)$" },
                { "const": 0 }
            ]
        })
    }
}

/// A size's JSON Schema: a number of bytes, or a string with an optional unit.
impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A size in bytes: a number, or a string with an optional unit, such as \"8MiB\", \"512KiB\" or \"1GB\".",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "minLength": 1 }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"250ms\" or \"5s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v.trim() == "0" {
                    return Ok(HumanDuration(Duration::ZERO));
                }
                humantime::parse_duration(v.trim())
                    .map(HumanDuration)
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))
            }
            // A bare number has no unit: `message_timeout = 30` meant as seconds would be
            // 30 ms, so it is refused rather than taken silently. Only 0 needs none.
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                match v {
                    0 => Ok(HumanDuration(Duration::ZERO)),
                    _ => Err(E::custom(format!(
                        "invalid duration {v}: a number needs a unit, such as \"{v}s\" or \"{v}ms\""
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "invalid duration {v}: must not be negative"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"1MiB\" or \"64KiB\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.trim()
                    .parse::<bytesize::ByteSize>()
                    .map(|b| ByteSize(b.as_u64()))
                    // bytesize's own text ("couldn't parse ... into a ByteSize, cannot parse
                    // float from empty string") names its parser, not the accepted forms.
                    .map_err(|_| {
                        E::custom(format!(
                            "invalid size {v:?}: expected a number of bytes with an optional unit, such as \"8MiB\", \"512KiB\", \"1GB\" or 1048576"
                        ))
                    })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_human_durations_and_sizes() {
        let d: HumanDuration = serde_json::from_str("\"250ms\"").unwrap();
        assert_eq!(d.0, Duration::from_millis(250));
        let d: HumanDuration = serde_json::from_str("0").unwrap();
        assert_eq!(d.0, Duration::ZERO);
        let e = serde_json::from_str::<HumanDuration>("30").unwrap_err();
        assert!(
            e.to_string().contains(
                "invalid duration 30: a number needs a unit, such as \"30s\" or \"30ms\""
            ),
            "{e}"
        );
        let s: ByteSize = serde_json::from_str("\"1MiB\"").unwrap();
        assert_eq!(s.0, 1024 * 1024);
        let s: ByteSize = serde_json::from_str("\"64 KiB\"").unwrap();
        assert_eq!(s.0, 64 * 1024);
        let z: HumanDuration = serde_json::from_str("\"0\"").unwrap();
        assert_eq!(z.0, Duration::ZERO);
        assert_eq!(HumanDuration::from_secs(90).to_string(), "1m 30s");
    }

    #[test]
    fn bad_units_name_the_value() {
        let e = serde_json::from_str::<HumanDuration>("\"5 parsecs\"").unwrap_err();
        assert!(
            e.to_string().contains("invalid duration \"5 parsecs\""),
            "{e}"
        );
        let e = serde_json::from_str::<ByteSize>("\"lots\"").unwrap_err();
        assert!(e.to_string().contains("invalid size \"lots\""), "{e}");
    }
}
