//! Responses' flat function `tools`, `tool_choice` and `text.format` in chat's shapes.

use serde_json::{json, Value};

use crate::protocols::extensions;

use super::refusal::{refuse, Refusal};

/// Flat function tools (`{"type": "function", "name", "parameters", ...}`) in chat's shape.
pub(super) fn tools(v: &Value) -> Result<Value, Refusal> {
    let Some(list) = v.as_array() else {
        return Err(refuse("tools", "`tools` must be an array"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(refuse(
                "tools",
                format!("tools[{i}]: only `type: function` tools are supported"),
            ));
        }
        let mut function = t.as_object().cloned().unwrap_or_default();
        function.remove("type");
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice`: the same strings; a named function is `{"type": "function", "name"}`.
pub(super) fn tool_choice(v: &Value) -> Result<Value, Refusal> {
    match v {
        Value::String(_) => Ok(v.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(refuse(
                    "tool_choice",
                    "a named tool_choice is {\"type\": \"function\", \"name\": ...}",
                )),
            }
        }
        other => Err(refuse(
            "tool_choice",
            format!("must be none, auto, required or a function; got {other}"),
        )),
    }
}

/// `text.format` as chat's `response_format` (None for plain text).
pub(super) fn text_format(text: Option<&Value>) -> Result<Option<Value>, Refusal> {
    let Some(text) = text.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(obj) = text.as_object() else {
        return Err(refuse("text", "must be an object"));
    };
    if let Some(k) = obj.keys().find(|k| *k != "format" && *k != "verbosity") {
        return Err(refuse(
            &format!("text.{k}"),
            format!("Unrecognized request argument supplied: text.{k}"),
        ));
    }
    if obj
        .get("verbosity")
        .is_some_and(|v| !v.is_null() && v != "medium")
    {
        return Err(refuse(
            "text.verbosity",
            extensions::not_supported("text.verbosity"),
        ));
    }
    let Some(format) = obj.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut spec = format.as_object().cloned().unwrap_or_default();
            spec.remove("type");
            Ok(Some(json!({"type": "json_schema", "json_schema": spec})))
        }
        _ => Err(refuse(
            "text.format",
            "`type` must be text, json_object or json_schema",
        )),
    }
}
