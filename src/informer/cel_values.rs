//! The object as a CEL filter sees it: CEL values built straight from the decoded
//! `metadata` and the raw JSON of the other top-level fields, borrowing their strings, and
//! only along the paths the expression can reach ([`Reach`]).
//!
//! Why: a filter runs on every event of its resource. Going through `serde_json::Value`
//! and the `cel` crate's `Value` cost a Pod's whole `status` three copies (parse, clone,
//! conversion) for an expression that reads `object.status.phase`; here a field the
//! expression cannot reach is skipped by the JSON parser (`IgnoredAny`) and a string is a
//! slice of the watch line. The values are the ones cel's own serde conversion makes
//! (`cel::ser`): a non-negative integer is a `uint`, a negative one an `int`, any other
//! number a `double`, `null` is `null`, an object a map with string keys.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::common::value::Val;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// A CEL value borrowing from the object for `'v`.
pub(super) type CelVal<'v> = Box<dyn Val + 'v>;

/// Which parts of a value an expression can reach: all of it, or only some of its fields
/// (each with what it reaches below). Found in the compiled expression: `object.a.b` and
/// `object["a"]["b"]` (and `has(object.a.b)`) reach `a.b` and all below it; any other use
/// of a value (iterated, passed to a function, indexed by a variable) reaches all of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reach {
    /// Every field, at any depth.
    All,
    /// Only these fields; a field absent here is never built.
    Fields(BTreeMap<String, Reach>),
}

/// Nothing yet (the start of a walk).
impl Default for Reach {
    fn default() -> Self {
        Reach::Fields(BTreeMap::new())
    }
}

/// What a field of a value reached whole reaches.
static ALL: Reach = Reach::All;

impl Reach {
    /// What field `name` reaches, `None` when the expression cannot reach it.
    pub(super) fn field(&self, name: &str) -> Option<&Reach> {
        match self {
            Reach::All => Some(&ALL),
            Reach::Fields(f) => f.get(name),
        }
    }

    /// Notes that the expression reaches `path` (and all below it).
    pub(super) fn add(&mut self, path: &[String]) {
        let Reach::Fields(fields) = self else { return };
        match path.split_first() {
            None => *self = Reach::All,
            Some((first, rest)) => fields.entry(first.clone()).or_default().add(rest),
        }
    }
}

/// `value` as a CEL value, pruned to `reach`.
pub(super) fn from_json<'v>(value: &'v Value, reach: &Reach) -> CelVal<'v> {
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => number(n),
        Value::String(s) => string(s),
        Value::Array(items) => Box::new(CelList::from(
            items
                .iter()
                .map(|i| from_json(i, reach))
                .collect::<Vec<_>>(),
        )),
        Value::Object(map) => from_json_map(map, reach),
    }
}

/// `s` as a CEL string, borrowed.
pub(super) fn string(s: &str) -> CelVal<'_> {
    Box::new(CelString::from(s))
}

/// `map` as a CEL map, pruned to `reach`.
pub(super) fn from_json_map<'v>(
    map: &'v serde_json::Map<String, Value>,
    reach: &Reach,
) -> CelVal<'v> {
    Box::new(CelMap::from(
        map.iter()
            .filter_map(|(k, v)| {
                reach
                    .field(k)
                    .map(|r| (CelMapKey::from(k.as_str()), from_json(v, r)))
            })
            .collect::<HashMap<_, _>>(),
    ))
}

fn number(n: &serde_json::Number) -> CelVal<'static> {
    match (n.as_u64(), n.as_i64()) {
        (Some(u), _) => Box::new(CelUInt::from(u)),
        (None, Some(i)) => Box::new(CelInt::from(i)),
        _ => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
    }
}

/// The raw JSON `text` as a CEL value, pruned to `reach`: the fields it cannot reach are
/// skipped unparsed; strings without escapes are slices of `text`.
///
/// # Errors
/// serde_json's, when `text` is not JSON.
pub(super) fn from_raw<'v>(text: &'v str, reach: &Reach) -> Result<CelVal<'v>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Pruned(reach).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Deserializes a JSON value into a CEL value, pruned to its [`Reach`].
struct Pruned<'r>(&'r Reach);

impl<'de> DeserializeSeed<'de> for Pruned<'_> {
    type Value = CelVal<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pruned<'_> {
    type Value = CelVal<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Box::new(CelBool::from(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Box::new(CelInt::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Box::new(CelUInt::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Box::new(CelDouble::from(v)))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(string(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Box::new(CelString::from(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Box::new(CelString::from(v)))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Box::new(CelNull))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Box::new(CelNull))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(Pruned(self.0))? {
            items.push(item);
        }
        Ok(Box::new(CelList::from(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = HashMap::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match self.0.field(&key) {
                Some(reach) => {
                    let value = map.next_value_seed(Pruned(reach))?;
                    fields.insert(CelMapKey::String(CelString::from(key)), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Box::new(CelMap::from(fields)))
    }
}

/// A map's key, borrowed from the text when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}
