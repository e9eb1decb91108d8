//! Reading back what a Collector wrote: a line of the OTLP JSON encoding (the file exporter's
//! `format: json`, one `ExportLogsServiceRequest` a line) becomes the topology messages of
//! its log records, rebuilt from the `kubesink.*` attributes and the body's `object`
//! ([`crate::record`]). `kubesink fold --file` calls it for every line that has
//! `resourceLogs`; records kubesink did not write (no `kubesink.op`) are skipped.

use kubesink_core::readback::LineFormat;
use serde_json::{Map, Value};

use crate::record::FIELD_PREFIX;

/// The OTLP JSON encoding as a [`LineFormat`] of `kubesink fold --file`.
pub struct OtlpJson;

impl LineFormat for OtlpJson {
    fn name(&self) -> &'static str {
        "OTLP JSON"
    }

    fn item(&self) -> &'static str {
        "log record"
    }

    fn recognises(&self, line: &[u8]) -> bool {
        is_otlp_line(line)
    }

    fn messages(&self, line: &[u8]) -> Result<Vec<Value>, String> {
        messages(line)
    }
}

/// Whether `line` is an OTLP JSON logs request.
pub fn is_otlp_line(line: &[u8]) -> bool {
    line.starts_with(b"{\"resourceLogs\"")
}

/// The topology messages of one OTLP JSON line, in record order.
///
/// # Errors
/// The line is not JSON, or not an OTLP logs request, with what was expected.
pub fn messages(line: &[u8]) -> Result<Vec<Value>, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let resources = v["resourceLogs"]
        .as_array()
        .ok_or("resourceLogs is not an array")?;
    for rl in resources {
        for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
            for rec in sl["logRecords"].as_array().into_iter().flatten() {
                let mut msg = Map::new();
                for a in rec["attributes"].as_array().into_iter().flatten() {
                    if let Some(field) =
                        a["key"].as_str().and_then(|k| k.strip_prefix(FIELD_PREFIX))
                    {
                        msg.insert(field.to_owned(), json(&a["value"]));
                    }
                }
                if !msg.contains_key("op") {
                    continue;
                }
                let body = json(&rec["body"]);
                if let Some(object) = body.get("object") {
                    msg.insert("object".into(), object.clone());
                }
                out.push(Value::Object(msg));
            }
        }
    }
    Ok(out)
}

/// An `AnyValue` in the OTLP JSON encoding as plain JSON (`intValue` is a string or a number
/// there; `bytesValue` stays base64 text).
pub fn json(any: &Value) -> Value {
    let Some(obj) = any.as_object() else {
        return Value::Null;
    };
    if let Some(s) = obj.get("stringValue") {
        return s.clone();
    }
    if let Some(b) = obj.get("boolValue") {
        return b.clone();
    }
    if let Some(i) = obj.get("intValue") {
        return match i {
            Value::String(s) => s.parse::<i64>().map_or_else(|_| i.clone(), Value::from),
            other => other.clone(),
        };
    }
    if let Some(d) = obj.get("doubleValue") {
        return d.clone();
    }
    if let Some(b) = obj.get("bytesValue") {
        return b.clone();
    }
    if let Some(a) = obj.get("arrayValue") {
        return Value::Array(
            a["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(json)
                .collect(),
        );
    }
    if let Some(kv) = obj.get("kvlistValue") {
        return Value::Object(
            kv["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| Some((e["key"].as_str()?.to_owned(), json(&e["value"]))))
                .collect(),
        );
    }
    Value::Null
}
