//! Every problem of one section or list entry in one pass. serde stops at the first bad field
//! of a struct, so a user who fixes that one would meet the next only on the next run. Here
//! the bad value is taken out and the rest tried again, until the rest deserializes, or all
//! that is still wrong is what was taken out (a required key now missing).
//!
//! Internally tagged enums (`[[sinks]]`, `type = "kafka"`) buffer their input, and serde's
//! errors from that buffer carry no key: the key is then found by taking each key out in
//! turn and seeing which one makes that error go.

use figment::error::Kind;
use figment::value::{Tag, Value};
use serde::de::DeserializeOwned;

/// One problem: the path below the probed value (`["payload"]`, `["tls", "ca_file"]`; empty
/// for the value itself), what is wrong, and the tag of the bad value (its source).
#[derive(Debug)]
pub(super) struct Found {
    pub path: Vec<String>,
    pub kind: Kind,
    pub tag: Tag,
}

/// Tries beyond the number of keys: each round takes at least one value out.
const MAX_ROUNDS: usize = 256;

/// Every problem of deserializing `value` as `T`, in the order serde meets them; empty when it
/// deserializes.
pub(super) fn all_errors<T: DeserializeOwned>(value: &Value) -> Vec<Found> {
    let mut value = value.clone();
    let mut taken: Vec<Vec<String>> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let Some((mut path, kind)) = first_error::<T>(&value) else {
            break;
        };
        if let Kind::MissingField(field) = &kind {
            // Reported at the end of a struct, once every key present in it parsed: the struct
            // itself is done. Taken out, its parent can go on to its later keys.
            path.push(field.to_string());
            if !taken.contains(&path) {
                let tag = parent_tag(&value, &path);
                out.push(Found {
                    path: path.clone(),
                    kind,
                    tag,
                });
            }
            path.pop();
            if path.is_empty() || take(&mut value, &path).is_none() {
                break;
            }
            taken.push(path);
            continue;
        }
        if let Kind::UnknownField(field, _) = &kind {
            if path.last() != Some(field) {
                path.push(field.clone());
            }
        }
        // The error's path names the bad value, unless a tagged enum lost the key on the way
        // and stopped at the table.
        let target = match lookup(&value, &path) {
            Some(Value::Dict(..)) => culprit::<T>(&value, &path, &kind).unwrap_or(path.clone()),
            _ => path.clone(),
        };
        match take(&mut value, &target) {
            Some(removed) => {
                out.push(Found {
                    path: target.clone(),
                    kind,
                    tag: removed.tag(),
                });
                taken.push(target);
            }
            None => {
                let tag = lookup(&value, &path).map_or(value.tag(), Value::tag);
                out.push(Found { path, kind, tag });
                break;
            }
        }
    }
    out
}

/// What is left of `value` once every bad value [`all_errors`] found is taken out,
/// deserialized as `T` (defaults in their place), with the paths taken out: so the checks
/// serde cannot express still run on the rest of an entry that did not parse. `None` when
/// the rest does not deserialize either (a required key was the bad one, or the `type`).
pub(super) fn remainder<T: DeserializeOwned>(value: &Value) -> Option<(T, Vec<Vec<String>>)> {
    let found = all_errors::<T>(value);
    let mut rest = value.clone();
    let mut taken = Vec::new();
    for f in found {
        take(&mut rest, &f.path);
        taken.push(f.path);
    }
    rest.deserialize::<T>().ok().map(|t| (t, taken))
}

/// The first error of deserializing `value` as `T`, with its path; `None` when it deserializes.
fn first_error<T: DeserializeOwned>(value: &Value) -> Option<(Vec<String>, Kind)> {
    let e = value.deserialize::<T>().err()?;
    let first = e.into_iter().next()?;
    Some((first.path, first.kind))
}

/// The key of the table at `path` whose removal makes `kind` go: the error's real place when
/// the path stops at that table. The tag key `type` is tried last, as taking it out changes
/// every error.
fn culprit<T: DeserializeOwned>(
    value: &Value,
    path: &[String],
    kind: &Kind,
) -> Option<Vec<String>> {
    // The secrets' mask refused as a value: several keys of one entry may hold it, each
    // giving the same error, so taking one out does not make the error go; the first place
    // holding the mask is the culprit (not `type`, and every other place is reported too).
    if let Kind::Message(message) = kind {
        if message.starts_with(&format!("{:?} is the mask", kubesink_core::MASK)) {
            if let Some(first) = holding_mask(value, path) {
                return Some(first);
            }
        }
        // A secret's `{ env = … }` / `{ file = … }` that cannot be read: the table naming
        // that variable or file (two such in one entry give the same kind of error; neither
        // is blamed on `type`).
        if message.starts_with("the secret's ") {
            if let Some(at) = naming_reference(value, path, message) {
                return Some(at);
            }
        }
    }
    culprit_in::<T>(value, path, kind, &(path.to_vec(), kind.to_string()))
}

/// The first `{ env = NAME }` / `{ file = PATH }` table below `table` whose NAME or PATH the
/// error `message` names.
fn naming_reference(value: &Value, table: &[String], message: &str) -> Option<Vec<String>> {
    fn walk(v: &Value, path: &mut Vec<String>, message: &str) -> Option<Vec<String>> {
        let Value::Dict(_, dict) = v else {
            return None;
        };
        let named = |key: &str, what: &str| {
            dict.get(key)
                .and_then(Value::as_str)
                .is_some_and(|at| message.contains(&format!("{what} {at}")))
        };
        if dict.len() == 1 && (named("env", "variable") || named("file", "file")) {
            return Some(path.clone());
        }
        dict.iter().find_map(|(k, child)| {
            path.push(k.clone());
            let found = walk(child, path, message);
            path.pop();
            found
        })
    }
    walk(lookup(value, table)?, &mut table.to_vec(), message)
}

/// The first place below the table at `table` whose value is the secrets' mask.
fn holding_mask(value: &Value, table: &[String]) -> Option<Vec<String>> {
    fn walk(v: &Value, path: &mut Vec<String>) -> Option<Vec<String>> {
        match v {
            Value::String(_, s) if s == kubesink_core::MASK => Some(path.clone()),
            Value::Dict(_, dict) => dict.iter().find_map(|(k, child)| {
                path.push(k.clone());
                let found = walk(child, path);
                path.pop();
                found
            }),
            _ => None,
        }
    }
    walk(lookup(value, table)?, &mut table.to_vec())
}

/// [`culprit`] among the keys of the table at `table`: `error` is the error (path, text) that
/// the culprit's removal makes go. A culprit that is a table is narrowed to the key in it
/// whose removal alone does what removing the whole table does (`[sinks.security]`'s
/// `protocol`), or, when the error quotes a value or a key, to the one place in it holding
/// that value or key; a table wrong as a whole (a secret's `{ env = … }`) stays named as
/// it is.
fn culprit_in<T: DeserializeOwned>(
    value: &Value,
    table: &[String],
    kind: &Kind,
    error: &(Vec<String>, String),
) -> Option<Vec<String>> {
    let after = |p: &[String]| -> Option<Option<(Vec<String>, String)>> {
        let mut without = value.clone();
        take(&mut without, p)?;
        Some(first_error::<T>(&without).map(|(path, kind)| (path, kind.to_string())))
    };
    let found = keys_of(value, table)?.into_iter().find_map(|p| {
        let a = after(&p)?;
        (a.as_ref() != Some(error)).then_some(p)
    })?;
    if let Some(quoted) = quoted_in(value, &found, kind) {
        return Some(quoted);
    }
    let Some(target) = after(&found) else {
        return Some(found);
    };
    let mut narrowed = found;
    while let Some(inner) = keys_of(value, &narrowed).and_then(|keys| {
        keys.into_iter()
            .find(|p| after(p).as_ref() == Some(&target))
    }) {
        narrowed = inner;
    }
    Some(narrowed)
}

/// Whether a key (and its value) is what an error quotes.
type Hit = dyn Fn(&str, &Value) -> bool;

/// The one place below the table at `table` that holds what `kind` quotes: the key of an
/// unknown key, the leaf of an unknown value or a value of the wrong type. `None` when the
/// error quotes nothing, or the table has it in no place or in several.
fn quoted_in(value: &Value, table: &[String], kind: &Kind) -> Option<Vec<String>> {
    use figment::error::Actual;
    fn walk(v: &Value, path: &mut Vec<String>, hit: &Hit, out: &mut Vec<Vec<String>>) {
        if let Value::Dict(_, dict) = v {
            for (k, child) in dict {
                path.push(k.clone());
                if hit(k, child) {
                    out.push(path.clone());
                }
                walk(child, path, hit, out);
                path.pop();
            }
        }
    }
    let hit: Box<Hit> = match kind {
        Kind::UnknownField(field, _) => {
            let field = field.clone();
            Box::new(move |k, _| k == field)
        }
        Kind::UnknownVariant(found, _)
        | Kind::InvalidType(Actual::Str(found), _)
        | Kind::InvalidValue(Actual::Str(found), _) => {
            let found = found.clone();
            Box::new(move |_, v| v.as_str() == Some(found.as_str()))
        }
        Kind::InvalidType(Actual::Bool(b), _) | Kind::InvalidValue(Actual::Bool(b), _) => {
            let b = *b;
            Box::new(move |_, v| v.to_bool() == Some(b))
        }
        Kind::InvalidType(Actual::Unsigned(n), _) | Kind::InvalidValue(Actual::Unsigned(n), _) => {
            let n = *n;
            Box::new(move |_, v| v.to_u128() == Some(n))
        }
        Kind::InvalidType(Actual::Signed(n), _) | Kind::InvalidValue(Actual::Signed(n), _) => {
            let n = *n;
            Box::new(move |_, v| v.to_i128() == Some(n))
        }
        _ => return None,
    };
    let mut out = Vec::new();
    let mut path = table.to_vec();
    walk(lookup(value, table)?, &mut path, &*hit, &mut out);
    match out.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// The paths of the keys of the table at `table` (the tag key `type` last: taking it out
/// changes every error); `None` when it is not a table.
fn keys_of(value: &Value, table: &[String]) -> Option<Vec<Vec<String>>> {
    let Some(Value::Dict(_, dict)) = lookup(value, table) else {
        return None;
    };
    let mut keys: Vec<&String> = dict.keys().filter(|k| k.as_str() != "type").collect();
    keys.extend(dict.keys().filter(|k| k.as_str() == "type"));
    Some(
        keys.into_iter()
            .map(|k| {
                let mut p = table.to_vec();
                p.push(k.clone());
                p
            })
            .collect(),
    )
}

/// The value at `path` below `value` (dictionaries only, as figment's paths are).
fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, k| match v {
        Value::Dict(_, dict) => dict.get(k),
        _ => None,
    })
}

/// Takes the value at `path` out of `value`; `None` when there is none (or `path` is empty).
fn take(value: &mut Value, path: &[String]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut v = value;
    for k in parents {
        v = match v {
            Value::Dict(_, dict) => dict.get_mut(k)?,
            _ => return None,
        };
    }
    match v {
        Value::Dict(_, dict) => dict.remove(last),
        _ => None,
    }
}

/// The tag of the table that misses the last key of `path`.
fn parent_tag(value: &Value, path: &[String]) -> Tag {
    lookup(value, &path[..path.len().saturating_sub(1)]).map_or(value.tag(), Value::tag)
}
