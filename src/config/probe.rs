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
    let Some(Value::Dict(_, dict)) = lookup(value, path) else {
        return None;
    };
    let mut keys: Vec<&String> = dict.keys().filter(|k| k.as_str() != "type").collect();
    keys.extend(dict.keys().filter(|k| k.as_str() == "type"));
    let before = (path.to_vec(), kind.to_string());
    keys.into_iter().find_map(|k| {
        let mut p = path.to_vec();
        p.push(k.clone());
        let mut without = value.clone();
        take(&mut without, &p)?;
        let after = first_error::<T>(&without).map(|(path, kind)| (path, kind.to_string()));
        (after.as_ref() != Some(&before)).then_some(p)
    })
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
