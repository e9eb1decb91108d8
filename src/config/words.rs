//! What a deserialization error says, in the terms of the file the user wrote (keys, strings,
//! whole numbers, lists, tables) rather than Rust's (`usize`, `a sequence`, backticks), with
//! the nearest accepted spelling when a key or value is misspelt.

use figment::error::{Actual, Kind};

/// One problem's text, without a key or a source (the loader adds both).
pub(super) fn describe(kind: &Kind) -> String {
    match kind {
        Kind::UnknownField(field, expected) => format!(
            "unknown key {field:?}{}; the keys here are: {}",
            did_you_mean(field, expected),
            expected.join(", ")
        ),
        Kind::UnknownVariant(found, expected) => format!(
            "{found:?} is not one of {}{}",
            quoted(expected),
            did_you_mean(found, expected)
        ),
        Kind::InvalidType(actual, expected) => {
            format!(
                "expected {}, found {}",
                expected_words(expected),
                actual_words(actual)
            )
        }
        Kind::InvalidValue(actual, expected) => format!(
            "{} is not accepted here: expected {}",
            actual_words(actual),
            expected_words(expected)
        ),
        Kind::InvalidLength(len, expected) => format!(
            "has {len} item{}, expected {}",
            if *len == 1 { "" } else { "s" },
            expected_words(expected)
        ),
        Kind::MissingField(_) => "required, and not set".to_owned(),
        Kind::DuplicateField(field) => format!("key {field:?} is set twice"),
        Kind::ISizeOutOfRange(v) => format!("{v} is out of range"),
        Kind::USizeOutOfRange(v) => format!("{v} is out of range"),
        Kind::Unsupported(actual) => format!("{} is not supported here", actual_words(actual)),
        Kind::UnsupportedKey(actual, expected) => format!(
            "a key must be {}, found {}",
            expected_words(expected),
            actual_words(actual)
        ),
        Kind::Message(m) => m.clone(),
    }
}

/// `"full", "metadata" or "fields"`.
fn quoted(options: &[&str]) -> String {
    let q: Vec<String> = options.iter().map(|o| format!("{o:?}")).collect();
    match q.split_last() {
        None => "nothing".to_owned(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

pub(super) use kubesink_core::words::did_you_mean;

/// What serde expected, as the file spells it.
fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number (0 or more)".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" | "bool" => "true or false".into(),
        "a sequence" => "a list, such as [\"a\", \"b\"]".into(),
        "a map" => "a table (key = value pairs)".into(),
        "a string" | "a borrowed string" | "string" | "string or map" => {
            "a string in quotes".into()
        }
        "a character" | "char" => "a single character in quotes".into(),
        other if other.starts_with("struct ") => "a table (key = value pairs)".into(),
        other if other.starts_with("internally tagged enum ") => {
            "a table with a \"type\" key".into()
        }
        other if other.starts_with("enum ") => "one of the names listed for this key".into(),
        other => other.to_owned(),
    }
}

/// What was found, as the file spells it.
fn actual_words(actual: &Actual) -> String {
    match actual {
        Actual::Bool(v) => v.to_string(),
        Actual::Unsigned(v) => format!("the number {v}"),
        Actual::Signed(v) => format!("the number {v}"),
        Actual::Float(v) => format!("the number {v}"),
        Actual::Char(c) => format!("{:?}", c.to_string()),
        Actual::Str(s) => format!("the string {s:?}"),
        Actual::Seq => "a list".into(),
        Actual::Map => "a table".into(),
        Actual::Unit | Actual::Option => "nothing".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speaks_the_files_terms() {
        let k = Kind::InvalidType(Actual::Str("many".into()), "usize".into());
        assert_eq!(
            describe(&k),
            "expected a whole number (0 or more), found the string \"many\""
        );
        let k = Kind::InvalidType(Actual::Str("default".into()), "a sequence".into());
        assert_eq!(
            describe(&k),
            "expected a list, such as [\"a\", \"b\"], found the string \"default\""
        );
        let k = Kind::UnknownVariant("ful".into(), &["full", "metadata", "fields"]);
        let text = describe(&k);
        assert_eq!(
            text,
            "\"ful\" is not one of \"full\", \"metadata\" or \"fields\" (did you mean \"full\"?)"
        );
        assert!(!text.contains('`'), "{text}");
    }

    #[test]
    fn suggests_only_near_spellings() {
        let sections: &[&str] = &["cluster", "pipeline", "watch", "sinks", "state"];
        let lists: &[&str] = &["auto", "stream", "list"];
        for (found, options, want) in [
            ("pipelne", sections, Some("pipeline")),
            ("Pipeline", sections, Some("pipeline")),
            ("sink", sections, Some("sinks")),
            ("zzz", sections, None),
            ("naem", &["name", "label"][..], Some("name")),
            ("streaming", lists, Some("stream")),
        ] {
            let said = want.map_or(String::new(), |w| format!(" (did you mean {w:?}?)"));
            assert_eq!(did_you_mean(found, options), said, "{found}");
        }
    }
}
