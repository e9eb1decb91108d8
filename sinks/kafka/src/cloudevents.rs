//! The Kafka protocol binding of CloudEvents 1.0 (binary content mode, §3.2): the header
//! names of the attributes that `kubesink_core::message::cloudevents` defines for every sink.

use std::borrow::Cow;

use kubesink_core::message::cloudevents::attributes;
use kubesink_core::Message;

/// Binary content mode headers for Kafka (protocol binding §3.2.3): `ce_{attribute}` for
/// every attribute but `datacontenttype`, which is the record's `content-type` header (the
/// message's own headers already carry it).
pub fn kafka_headers(m: &Message) -> impl Iterator<Item = (&'static str, Cow<'_, str>)> {
    attributes(m)
        .into_iter()
        .zip(KAFKA_NAMES)
        .filter(|((name, _), _)| *name != "datacontenttype")
        .map(|((_, value), header)| (header, value))
}

/// The Kafka header name of each attribute of [`attributes`], in its order.
const KAFKA_NAMES: [&str; 8] = [
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_subject",
    "ce_time",
    "ce_datacontenttype",
    "ce_dataschema",
];

#[cfg(test)]
mod tests {
    use kubesink_core::message::fixtures::deployment_message;
    use kubesink_core::message::Op;

    use super::*;

    #[test]
    fn headers_follow_the_documented_mapping() {
        let m = deployment_message(Op::Updated);
        let kafka: Vec<(&str, String)> = kafka_headers(&m)
            .map(|(k, v)| (k, v.into_owned()))
            .collect();
        assert_eq!(kafka[0], ("ce_specversion", "1.0".to_owned()));
        assert_eq!(
            kafka[4],
            ("ce_subject", "prod/apps/Deployment/web/api".to_owned())
        );
        assert!(!kafka.iter().any(|(k, _)| *k == "ce_datacontenttype"));
    }
}
