//! A configuration value that must never be printed: passwords, tokens, nkey seeds.
//!
//! In a configuration file a secret is written three ways:
//! - `password = "..."`: the value itself (fine on a laptop; in a cluster it puts the
//!   credential into a ConfigMap or the Helm release);
//! - `password = { env = "KAFKA_PASSWORD" }`: read from that environment variable when the
//!   configuration loads (a Kubernetes `secretKeyRef`: the chart's `secretEnv`);
//! - `password = { file = "/etc/kubesink/secrets/kafka/password" }`: read from that file when
//!   the configuration loads, one trailing newline removed (a mounted Secret's key: the
//!   chart's `secretMounts`).
//!
//! A reference that cannot be resolved (variable unset, file unreadable) or resolves to an
//! empty value is a configuration error naming the variable or file; the value is never
//! part of an error.
//!
//! Serialized (what `kubesink check` prints as the effective configuration), a reference is
//! written back as it was given, so the printed configuration loads again with the same
//! secrets; a value written inline is printed as `"***"`, and `"***"` is refused as a value
//! (it is the mask, never a credential: a printed configuration fed back names the key to
//! fill in instead of running with the password `***`).

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A secret string. `Debug` and `Display` print `"***"`, `Serialize` the reference it was
/// read through or `"***"` (module docs); only [`Secret::expose`] gives the value, at the one
/// place that hands it to a client library.
///
/// Deserializes from a string (the value), `{ env = "NAME" }` or `{ file = "PATH" }`; see the
/// module documentation.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret {
    value: String,
    origin: Origin,
}

/// Where a [`Secret`]'s value was read from.
#[derive(Clone, Default, PartialEq, Eq)]
enum Origin {
    /// Written in the configuration itself.
    #[default]
    Inline,
    /// `{ env = "NAME" }`.
    Env(String),
    /// `{ file = "PATH" }`.
    File(String),
}

/// The mask `Serialize` prints for an inline secret; refused as a value.
pub const MASK: &str = "***";

impl Secret {
    /// Wraps a value (as if written inline).
    pub fn new(value: impl Into<String>) -> Self {
        Secret {
            value: value.into(),
            origin: Origin::Inline,
        }
    }

    /// Whether the value was written into the configuration itself (not `{ env = … }` or
    /// `{ file = … }`): what [`Serialize`] prints as the mask.
    pub fn is_inline(&self) -> bool {
        self.origin == Origin::Inline
    }

    /// The secret value; call only where a client library needs it.
    pub fn expose(&self) -> &str {
        &self.value
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (key, at) = match &self.origin {
            Origin::Inline => return s.serialize_str(MASK),
            Origin::Env(name) => ("env", name),
            Origin::File(path) => ("file", path),
        };
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(key, at)?;
        map.end()
    }
}

/// A secret's JSON Schema: the value itself, or where to read it (`{ env = "NAME" }`,
/// `{ file = "PATH" }`).
impl schemars::JsonSchema for Secret {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A credential: best as { env = \"NAME\" } (an environment variable) or { file = \"PATH\" } (a file, one trailing newline dropped), so that the configuration holds none; a plain string is the value itself.",
            "anyOf": [
                { "type": "string", "minLength": 1 },
                {
                    "type": "object",
                    "properties": { "env": { "type": "string", "minLength": 1 } },
                    "required": ["env"],
                    "additionalProperties": false
                },
                {
                    "type": "object",
                    "properties": { "file": { "type": "string", "minLength": 1 } },
                    "required": ["file"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SecretVisitor)
    }
}

/// Where a secret's value comes from, for [`Secret`]'s deserializer.
enum Reference {
    Env(String),
    File(String),
}

impl Reference {
    /// Reads the value. Errors name the variable or file, never the value.
    fn resolve(&self) -> Result<Secret, String> {
        let source = match self {
            Reference::Env(name) => format!("environment variable {name}"),
            Reference::File(path) => format!("file {path}"),
        };
        let value = match self {
            Reference::Env(name) => std::env::var(name).map_err(|e| match e {
                std::env::VarError::NotPresent => format!("the secret's {source} is not set"),
                std::env::VarError::NotUnicode(_) => format!("the secret's {source} is not UTF-8"),
            })?,
            Reference::File(path) => {
                let mut v = std::fs::read_to_string(path)
                    .map_err(|e| format!("the secret's {source}: {e}"))?;
                // `echo secret > file` and `kubectl create secret --from-file` of such a
                // file leave one newline that is not part of the credential.
                if v.ends_with('\n') {
                    v.pop();
                    if v.ends_with('\r') {
                        v.pop();
                    }
                }
                v
            }
        };
        if value.is_empty() {
            return Err(format!("the secret's {source} is empty"));
        }
        let origin = match self {
            Reference::Env(name) => Origin::Env(name.clone()),
            Reference::File(path) => Origin::File(path.clone()),
        };
        Ok(Secret { value, origin })
    }
}

struct SecretVisitor;

impl<'de> Visitor<'de> for SecretVisitor {
    type Value = Secret;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a string, { env = "NAME" } or { file = "PATH" }"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Secret, E> {
        self.visit_string(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Secret, E> {
        if v == MASK {
            return Err(de::Error::custom(
                r#""***" is the mask `kubesink check` prints in place of a secret written into the configuration, not a value: write the secret, or better { env = "NAME" } or { file = "PATH" }"#,
            ));
        }
        Ok(Secret::new(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Secret, A::Error> {
        let mut reference = None;
        while let Some(key) = map.next_key::<String>()? {
            let value: String = map.next_value()?;
            let r = match key.as_str() {
                "env" => Reference::Env(value),
                "file" => Reference::File(value),
                other => return Err(de::Error::unknown_field(other, &["env", "file"])),
            };
            if reference.replace(r).is_some() {
                return Err(de::Error::custom(
                    "a secret takes one of `env` and `file`, not both",
                ));
            }
        }
        reference
            .ok_or_else(|| {
                de::Error::custom(r#"a secret table needs `env = "NAME"` or `file = "PATH"`"#)
            })?
            .resolve()
            .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_masked_in_debug_display_and_serialize() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "\"***\" ***");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"***\"");
        assert_eq!(s.expose(), "hunter2");
    }

    /// A reference prints as itself (`{ env = "KAFKA_PW" }`), never as `"***"`: a printed
    /// configuration fed back must not run with the password `***`.
    #[test]
    fn a_reference_serializes_as_itself_and_the_mask_is_refused_as_a_value() {
        std::env::set_var("KUBESINK_TEST_SECRET_ENV_ROUND_TRIP", "pw");
        let s = parse(r#"{"env":"KUBESINK_TEST_SECRET_ENV_ROUND_TRIP"}"#).unwrap();
        let printed = serde_json::to_string(&s).unwrap();
        assert_eq!(printed, r#"{"env":"KUBESINK_TEST_SECRET_ENV_ROUND_TRIP"}"#);
        assert_eq!(parse(&printed).unwrap().expose(), "pw");
        let path = std::env::temp_dir().join(format!("kubesink-secret-rt-{}", std::process::id()));
        std::fs::write(&path, "pw2\n").unwrap();
        let s = parse(&serde_json::json!({ "file": path }).to_string()).unwrap();
        let printed = serde_json::to_string(&s).unwrap();
        assert_eq!(parse(&printed).unwrap().expose(), "pw2");
        std::fs::remove_file(&path).unwrap();
        let err = parse(r#""***""#).unwrap_err();
        assert!(err.contains("is the mask `kubesink check` prints"), "{err}");
    }

    fn parse(json: &str) -> Result<Secret, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn secret_reads_its_environment_variable() {
        // A name no other test sets; set once, never removed (tests run in threads).
        std::env::set_var("KUBESINK_TEST_SECRET_ENV_1", "s3cret");
        let s = parse(r#"{"env":"KUBESINK_TEST_SECRET_ENV_1"}"#).unwrap();
        assert_eq!(s.expose(), "s3cret");
        let err = parse(r#"{"env":"KUBESINK_TEST_SECRET_UNSET_VARIABLE"}"#).unwrap_err();
        assert!(
            err.contains("KUBESINK_TEST_SECRET_UNSET_VARIABLE is not set"),
            "{err}"
        );
        std::env::set_var("KUBESINK_TEST_SECRET_ENV_EMPTY", "");
        let err = parse(r#"{"env":"KUBESINK_TEST_SECRET_ENV_EMPTY"}"#).unwrap_err();
        assert!(
            err.contains("KUBESINK_TEST_SECRET_ENV_EMPTY is empty"),
            "{err}"
        );
    }

    #[test]
    fn secret_reads_its_file_without_the_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("kubesink-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (content, expected) in [
            ("pw", "pw"),
            ("pw\n", "pw"),
            ("pw\r\n", "pw"),
            ("a\nb\n", "a\nb"),
        ] {
            let path = dir.join("password");
            std::fs::write(&path, content).unwrap();
            let json = serde_json::json!({ "file": path }).to_string();
            assert_eq!(parse(&json).unwrap().expose(), expected, "{content:?}");
        }
        let missing = dir.join("missing");
        let err = parse(&serde_json::json!({ "file": missing }).to_string()).unwrap_err();
        assert!(
            err.contains(&format!("the secret's file {}", missing.display())),
            "{err}"
        );
        std::fs::write(dir.join("empty"), "\n").unwrap();
        let err = parse(&serde_json::json!({ "file": dir.join("empty") }).to_string()).unwrap_err();
        assert!(err.contains("is empty"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secret_table_takes_exactly_one_known_key() {
        for bad in [
            r#"{}"#,
            r#"{"env":"A","file":"/b"}"#,
            r#"{"vault":"x"}"#,
            "3",
        ] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
        let err = parse(r#"{"vault":"x"}"#).unwrap_err();
        assert!(err.contains("unknown field `vault`"), "{err}");
    }
}
