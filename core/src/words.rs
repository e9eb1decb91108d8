//! Words for error messages that every part shares: the nearest accepted spelling of a
//! mistyped name (configuration keys, sections, librdkafka properties, served kinds).

/// ` (did you mean "pipeline"?)` when one of `options` is near `found`: the same but for
/// case, one the start of the other (`streaming`, `stream`), or within a third of its length
/// in edits (Damerau-Levenshtein: a swapped pair is one edit). Empty otherwise.
pub fn did_you_mean(found: &str, options: &[&str]) -> String {
    let found = found.to_lowercase();
    let near = options
        .iter()
        .filter_map(|o| {
            let lower = o.to_lowercase();
            let d = strsim::damerau_levenshtein(&found, &lower);
            let prefix =
                lower.len() >= 3 && (found.starts_with(&lower) || lower.starts_with(&found));
            (d <= (lower.chars().count() / 3).max(1) || (prefix && found.len() >= 3))
                .then_some((d, o))
        })
        .min_by_key(|(d, _)| *d);
    match near {
        Some((_, o)) => format!(" (did you mean {o:?}?)"),
        None => String::new(),
    }
}
