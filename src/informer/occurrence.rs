//! Events mode (`[[resources]] mode = "events"`): a Kubernetes Event read as an
//! *occurrence* (docs/events.md). Owns the one place that knows both spellings of an Event:
//! the core `v1` Event and the `events.k8s.io/v1` Event are two views of the same stored
//! objects (the API server converts between them), with different field names for the same
//! facts (k8s.io/api `core/v1/types.go` and `events/v1/types.go`):
//!
//! | occurrence field | `events.k8s.io/v1` | core `v1` |
//! |---|---|---|
//! | `note` | `note` | `message` |
//! | `regarding` | `regarding` | `involvedObject` |
//! | `reportingController` | `reportingController`, else `deprecatedSource.component` | `reportingComponent`, else `source.component` |
//! | `reportingInstance` | `reportingInstance`, else `deprecatedSource.host` | `reportingInstance`, else `source.host` |
//! | `count` | `series.count`, else `deprecatedCount`, else 1 | `series.count`, else `count`, else 1 |
//! | `firstTime` | `eventTime`, else `deprecatedFirstTimestamp` | `eventTime`, else `firstTimestamp` |
//! | `lastTime` | `series.lastObservedTime`, else `deprecatedLastTimestamp`, else `firstTime` | `series.lastObservedTime`, else `lastTimestamp`, else `firstTime` |
//!
//! `reason`, `type`, `action` and `related` are spelled alike. `firstTime` and `lastTime`
//! fall back to `metadata.creationTimestamp` when the Event has neither.
//!
//! The count is what makes an Event a series: the recorders of client-go bump it (and the
//! last time) on the same object instead of creating a new one when the same thing happens
//! again (`tools/record` for core Events, `tools/events` for `events.k8s.io`). An Event
//! without a count happened once.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use kubesink_core::message::ObjectJson;

use super::object::RawObject;
use crate::config::{ResourceConfig, ResourceMode, Since};

/// How a watch in events mode sends Events (`[[resources]] mode = "events"`), resolved from
/// the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrences {
    /// Messages a second per Event `reason` to each destination (`reason_rate_limit`);
    /// `None`: no limit.
    pub reason_rate_limit: Option<std::num::NonZeroU32>,
    /// At a first start (no saved state), an Event the first list finds is sent when its
    /// last occurrence is at most this old; `None`: every one (`since = "all"`).
    pub since: Option<Duration>,
    /// Send a `deleted` when an Event leaves the cluster (`send_deleted`).
    pub send_deleted: bool,
}

impl Occurrences {
    /// The events mode of `res`; `None` for a resource of objects.
    pub fn of(res: &ResourceConfig) -> Option<Occurrences> {
        (res.mode == ResourceMode::Events).then(|| Occurrences {
            since: match res.since() {
                Since::All => None,
                Since::Within(d) => Some(d.get()),
            },
            send_deleted: res.send_deleted,
            reason_rate_limit: res.reason_rate_limit.and_then(std::num::NonZeroU32::new),
        })
    }

    /// Whether the first list of a first start sends `obj` (an Event it found), `now` being
    /// the time of the list: its last occurrence is recent enough, or unknown (an Event
    /// without any time is sent rather than lost).
    pub fn sends_at_start(&self, obj: &RawObject<'_>, now: SystemTime) -> bool {
        let Some(since) = self.since else {
            return true;
        };
        match read(obj).last {
            Some(last) => now.duration_since(last).map_or(true, |age| age < since),
            None => true,
        }
    }
}

/// The `reason` of a message's `event` (the object [`read`] made; its first field), `None`
/// when it has none.
pub fn reason_of(event: &ObjectJson) -> Option<String> {
    #[derive(Deserialize)]
    struct Reason<'a> {
        #[serde(default, borrow)]
        reason: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<Reason<'_>>(event.as_str())
        .ok()?
        .reason
        .map(Cow::into_owned)
}

/// One Event as an occurrence: the message's `event` and what the decider needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Occurrence {
    /// The message's `event` (JSON object text, fields as [`Wire`] orders them).
    pub object: ObjectJson,
    /// How many times the Event has happened so far (at least 1).
    pub count: u64,
    /// When it last happened (`lastTime` parsed; `None` when absent or not RFC 3339).
    pub last: Option<SystemTime>,
}

/// A `series` (both APIs): the count and the time of its latest occurrence.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Series<'a> {
    #[serde(default)]
    count: Option<u64>,
    #[serde(default, borrow)]
    last_observed_time: Option<Cow<'a, str>>,
}

/// A `source` / `deprecatedSource` (core `EventSource`).
#[derive(Deserialize, Default)]
struct Source<'a> {
    #[serde(default, borrow)]
    component: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    host: Option<Cow<'a, str>>,
}

/// The message's `event`, in this field order; absent fields are left out.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Wire<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Cow<'a, str>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    type_: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    regarding: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    related: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reporting_controller: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reporting_instance: Option<Cow<'a, str>>,
    count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_time: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_time: Option<Cow<'a, str>>,
}

/// A string field, `None` when null, empty or not a string.
fn text<'a>(raw: &'a RawValue) -> Option<Cow<'a, str>> {
    serde_json::from_str::<Option<Cow<'a, str>>>(raw.get())
        .ok()
        .flatten()
        .filter(|s| !s.is_empty())
}

/// `s` unless it is empty.
fn nonempty(s: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    s.filter(|s| !s.is_empty())
}

/// An object field kept as the server sent it, `None` when null or not an object.
fn object(raw: &RawValue) -> Option<&RawValue> {
    raw.get().trim_start().starts_with('{').then_some(raw)
}

/// A positive count, `None` when null, zero or not a number.
fn count(raw: &RawValue) -> Option<u64> {
    serde_json::from_str::<Option<u64>>(raw.get())
        .ok()
        .flatten()
        .filter(|&n| n > 0)
}

/// Reads `obj`, an Event of either API, as an occurrence. Never fails: a field of an
/// unexpected type is left out (and a count that is not a positive number counts as 1).
pub fn read(obj: &RawObject<'_>) -> Occurrence {
    let mut w = Wire::default();
    let (mut series, mut source) = (Series::default(), Source::default());
    let (mut event_time, mut first, mut last, mut flat_count) = (None, None, None, None);
    for (k, v) in &obj.body {
        let v: &RawValue = v;
        match k.as_ref() {
            "reason" => w.reason = text(v),
            "type" => w.type_ = text(v),
            "note" | "message" => w.note = w.note.take().or(text(v)),
            "action" => w.action = text(v),
            "regarding" | "involvedObject" => w.regarding = object(v),
            "related" => w.related = object(v),
            "reportingController" | "reportingComponent" => w.reporting_controller = text(v),
            "reportingInstance" => w.reporting_instance = text(v),
            "series" => {
                series = serde_json::from_str::<Option<Series<'_>>>(v.get())
                    .ok()
                    .flatten()
                    .unwrap_or_default()
            }
            "source" | "deprecatedSource" => {
                source = serde_json::from_str::<Option<Source<'_>>>(v.get())
                    .ok()
                    .flatten()
                    .unwrap_or_default()
            }
            "count" | "deprecatedCount" => flat_count = count(v),
            "eventTime" => event_time = text(v),
            "firstTimestamp" | "deprecatedFirstTimestamp" => first = text(v),
            "lastTimestamp" | "deprecatedLastTimestamp" => last = text(v),
            _ => {}
        }
    }
    w.reporting_controller = w
        .reporting_controller
        .or_else(|| nonempty(source.component.clone()));
    w.reporting_instance = w
        .reporting_instance
        .or_else(|| nonempty(source.host.clone()));
    w.count = series.count.filter(|&n| n > 0).or(flat_count).unwrap_or(1);
    let created = obj
        .metadata
        .get("creationTimestamp")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(Cow::Borrowed);
    w.first_time = event_time.or(first).or_else(|| created.clone());
    w.last_time = nonempty(series.last_observed_time)
        .or(last)
        .or_else(|| w.first_time.clone());
    let last = w
        .last_time
        .as_deref()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    // Strings, integers and raw JSON the server sent: writing them cannot fail.
    let text = serde_json::to_string(&w).unwrap_or_else(|_| "{}".to_owned());
    Occurrence {
        object: ObjectJson::from_trusted(text),
        count: w.count,
        last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn occurrence(v: Value) -> (Value, u64, Option<SystemTime>) {
        let text = v.to_string();
        let obj = RawObject::parse(&text).unwrap();
        let o = read(&obj);
        (o.object.to_value(), o.count, o.last)
    }

    #[test]
    fn a_core_event_of_the_old_recorder_reads_as_the_same_occurrence_as_its_events_api_view() {
        // The same stored Event through both APIs (as kube-apiserver converts it).
        let core = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "default", "uid": "u", "resourceVersion": "7",
                         "creationTimestamp": "2026-12-07T10:00:00Z"},
            "involvedObject": {"kind": "Deployment", "namespace": "default", "name": "web", "uid": "d", "apiVersion": "apps/v1"},
            "reason": "ScalingReplicaSet", "message": "Scaled up replica set web-1 to 3",
            "source": {"component": "deployment-controller"},
            "firstTimestamp": "2026-12-07T10:00:00Z", "lastTimestamp": "2026-12-07T10:05:00Z",
            "count": 4, "type": "Normal", "eventTime": null, "reportingComponent": "", "reportingInstance": ""});
        let api = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "default", "uid": "u", "resourceVersion": "7",
                         "creationTimestamp": "2026-12-07T10:00:00Z"},
            "eventTime": null,
            "reportingController": "", "reportingInstance": "",
            "reason": "ScalingReplicaSet",
            "regarding": {"kind": "Deployment", "namespace": "default", "name": "web", "uid": "d", "apiVersion": "apps/v1"},
            "note": "Scaled up replica set web-1 to 3", "type": "Normal",
            "deprecatedSource": {"component": "deployment-controller"},
            "deprecatedFirstTimestamp": "2026-12-07T10:00:00Z",
            "deprecatedLastTimestamp": "2026-12-07T10:05:00Z", "deprecatedCount": 4});
        let (a, a_count, a_last) = occurrence(core);
        let (b, b_count, b_last) = occurrence(api);
        assert_eq!(a, b);
        assert_eq!((a_count, b_count), (4, 4));
        assert_eq!(a_last, b_last);
        assert_eq!(
            a,
            json!({"reason": "ScalingReplicaSet", "type": "Normal",
                "note": "Scaled up replica set web-1 to 3",
                "regarding": {"kind": "Deployment", "namespace": "default", "name": "web", "uid": "d", "apiVersion": "apps/v1"},
                "reportingController": "deployment-controller", "count": 4,
                "firstTime": "2026-12-07T10:00:00Z", "lastTime": "2026-12-07T10:05:00Z"})
        );
        assert_eq!(
            a_last,
            humantime::parse_rfc3339_weak("2026-12-07T10:05:00Z").ok()
        );
    }

    #[test]
    fn a_series_counts_and_dates_the_occurrence_and_a_single_event_counts_one() {
        let series = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "p.2", "namespace": "ns", "uid": "u", "resourceVersion": "9"},
            "eventTime": "2026-12-07T10:00:00.000001Z", "reportingController": "kubelet",
            "reportingInstance": "node-1", "action": "Pulling", "reason": "BackOff", "type": "Warning",
            "note": "Back-off pulling image", "series": {"count": 12, "lastObservedTime": "2026-12-07T11:00:00.500000Z"}});
        let (v, n, last) = occurrence(series);
        assert_eq!(n, 12);
        assert_eq!(v["count"], 12);
        assert_eq!(v["firstTime"], "2026-12-07T10:00:00.000001Z");
        assert_eq!(v["lastTime"], "2026-12-07T11:00:00.500000Z");
        assert_eq!(v["reportingInstance"], "node-1");
        assert!(last.is_some());
        let once = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "p.3", "namespace": "ns", "uid": "u", "resourceVersion": "10",
                         "creationTimestamp": "2026-12-07T09:00:00Z"},
            "reason": "Created", "count": "not a number", "series": null});
        let (v, n, _) = occurrence(once);
        assert_eq!(n, 1);
        assert_eq!(
            v,
            json!({"reason": "Created", "count": 1,
                "firstTime": "2026-12-07T09:00:00Z", "lastTime": "2026-12-07T09:00:00Z"})
        );
    }
}
