//! The NATS protocol binding of CloudEvents (binary content mode, §3.1): the header names of
//! the attributes that `kubesink_core::message::cloudevents` defines for every sink, and the
//! binding's percent-encoding of header values.

use std::borrow::Cow;

use kubesink_core::message::cloudevents::{attributes, percent_encode_header};
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
/// attribute, values percent-encoded ([`percent_encode_header`], the HTTP binding's rule that the NATS binding takes over).
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
}
