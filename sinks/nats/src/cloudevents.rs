//! The NATS protocol binding of CloudEvents (binary content mode, §3.1): the header names of
//! the attributes that `kubesink_core::message::cloudevents` defines for every sink, and the
//! binding's percent-encoding of header values.

use std::borrow::Cow;
use std::fmt::Write as _;

use kubesink_core::message::cloudevents::attributes;
use kubesink_core::Message;

/// The NATS header name of each attribute of [`attributes`], in its order.
const NATS_NAMES: [&str; 8] = [
    "ce-specversion",
    "ce-id",
    "ce-source",
    "ce-type",
    "ce-subject",
    "ce-time",
    "ce-datacontenttype",
    "ce-dataschema",
];

/// Binary content mode headers for NATS (protocol binding §3.1.3): `ce-{attribute}` for every
/// attribute, values percent-encoded ([`percent_encode_header`]).
pub fn nats_headers(m: &Message) -> impl Iterator<Item = (&'static str, Cow<'_, str>)> {
    attributes(m)
        .into_iter()
        .zip(NATS_NAMES)
        .map(|((_, value), header)| {
            let encoded = match value {
                Cow::Borrowed(v) => percent_encode_header(v),
                Cow::Owned(v) => Cow::Owned(percent_encode_header(&v).into_owned()),
            };
            (header, encoded)
        })
}

/// The NATS binding's header value encoding (§3.1.3.2): space, `"`, `%` and every byte
/// outside printable ASCII become `%XY` (uppercase hex of each UTF-8 byte). Borrows `value`
/// when nothing needs encoding (the usual case).
pub fn percent_encode_header(value: &str) -> Cow<'_, str> {
    if value
        .bytes()
        .all(|b| matches!(b, b'!'..=b'~') && b != b'"' && b != b'%')
    {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for b in value.bytes() {
        match b {
            b' ' | b'"' | b'%' => {
                let _ = write!(out, "%{b:02X}");
            }
            b'!'..=b'~' => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use kubesink_core::message::fixtures::deployment_message;
    use kubesink_core::message::Op;

    use super::*;

    #[test]
    fn headers_follow_the_documented_mapping() {
        let m = deployment_message(Op::Updated);
        let nats: Vec<&str> = nats_headers(&m).map(|(k, _)| k).collect();
        assert_eq!(nats.len(), 8);
        assert_eq!((nats[1], nats[6]), ("ce-id", "ce-datacontenttype"));
    }

    #[test]
    fn nats_header_values_are_percent_encoded_as_the_binding_says() {
        assert_eq!(
            percent_encode_header("prod/core/Pod//%synced"),
            "prod/core/Pod//%25synced"
        );
        assert_eq!(
            percent_encode_header("Euro \u{20AC} \u{1F600}"),
            "Euro%20%E2%82%AC%20%F0%9F%98%80"
        );
        assert_eq!(percent_encode_header("a\"b"), "a%22b");
    }
}
