//! JSON without a nesting limit: objects nested 10,000 levels deep must be accepted, stored
//! and served without overflowing the stack. `serde_json` stops at 128 levels by default and
//! `serde_json::Value` parses, serializes, compares, clones and drops recursively, so deep
//! documents are parsed with the limit disabled on a growing stack (`serde_stacker`) and
//! every other operation on a deep `Value` runs inside [`with_stack_for`], which moves to a
//! big enough stack segment first (`stacker`). Shallow documents (almost all) take the
//! ordinary path at no extra cost. This module never decides what to do with a document.

use serde::Deserialize;
use serde_json::Value;

/// Nesting depth up to which JSON is handled on the caller's stack.
pub const SHALLOW_DEPTH: usize = 64;

/// Stack kept free below a deep operation, on top of the per-level need (bytes).
const BASE_STACK: usize = 512 * 1024;

/// Stack one nesting level may take in the deepest recursion over a `Value` (drop, clone,
/// serialize, compare) in an unoptimized build, with margin (bytes).
const STACK_PER_LEVEL: usize = 4 * 1024;

/// The deepest nesting of objects and arrays in JSON text `bytes` (0 for a scalar). A
/// byte scan that skips strings; it does not validate.
pub fn depth_of_bytes(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The deepest nesting of objects and arrays in `v` (0 for a scalar), without recursion.
pub fn depth_of_value(v: &Value) -> usize {
    let mut max = 0;
    let mut todo: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, d)) = todo.pop() {
        match v {
            Value::Object(m) => {
                max = max.max(d + 1);
                todo.extend(m.values().map(|c| (c, d + 1)));
            }
            Value::Array(a) => {
                max = max.max(d + 1);
                todo.extend(a.iter().map(|c| (c, d + 1)));
            }
            _ => {}
        }
    }
    max
}

/// Parses one JSON document of nesting `depth` (from [`depth_of_bytes`]) with no depth
/// limit. A deep result must be used and dropped inside [`with_stack_for`].
/// Errors: the text is not one JSON document.
pub fn parse_with_depth(bytes: &[u8], depth: usize) -> Result<Value, serde_json::Error> {
    if depth <= SHALLOW_DEPTH {
        return serde_json::from_slice(bytes);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    de.disable_recursion_limit();
    let value = Value::deserialize(serde_stacker::Deserializer::new(&mut de))?;
    de.end()?;
    Ok(value)
}

/// [`parse_with_depth`] after measuring the depth.
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    parse_with_depth(bytes, depth_of_bytes(bytes))
}

/// Runs `f`, which works on JSON values nested up to `depth` levels, on a stack big enough
/// for it: the current one when shallow or when enough of it is left, else a new segment.
pub fn with_stack_for<R>(depth: usize, f: impl FnOnce() -> R) -> R {
    if depth <= SHALLOW_DEPTH {
        return f();
    }
    let need = BASE_STACK + depth.saturating_mul(STACK_PER_LEVEL);
    stacker::maybe_grow(need, need + BASE_STACK, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        let mut s = String::with_capacity(depth * 8 + 16);
        for _ in 0..depth {
            s.push_str("{\"a\":");
        }
        s.push_str("\"}{[\"");
        for _ in 0..depth {
            s.push('}');
        }
        s
    }

    #[test]
    fn depth_counts_nesting_and_ignores_brackets_in_strings() {
        assert_eq!(depth_of_bytes(b"1"), 0);
        assert_eq!(depth_of_bytes(br#"{"a":[1,{"b":"]]}}"}]}"#), 3);
        assert_eq!(depth_of_bytes(nested(50).as_bytes()), 50);
        let v: Value = serde_json::from_str(r#"{"a":[1,{"b":"x"}]}"#).unwrap_or_default();
        assert_eq!(depth_of_value(&v), 3);
    }

    #[test]
    fn ten_thousand_levels_parse_serialize_and_drop_on_a_small_stack() {
        let text = nested(10_000);
        let outcome = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                with_stack_for(depth_of_bytes(text.as_bytes()), || {
                    let v = parse(text.as_bytes()).map_err(|e| e.to_string())?;
                    let again = serde_json::to_string(&v).map_err(|e| e.to_string())?;
                    let same = again == text && v.clone() == v;
                    Ok::<_, String>((depth_of_value(&v), same))
                })
            })
            .map_err(|e| e.to_string())
            .and_then(|h| h.join().map_err(|_| "thread panicked".to_owned()));
        assert_eq!(outcome, Ok(Ok((10_000, true))));
    }
}
