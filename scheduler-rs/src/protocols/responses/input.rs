//! `instructions` and `input` (a string, or message, `function_call` and
//! `function_call_output` items) as chat messages.

use serde_json::{json, Map, Value};

use super::refusal::{refuse, Refusal};

/// `instructions` (a system message) and `input` as chat messages.
pub(super) fn messages(body: &Map<String, Value>) -> Result<Vec<Value>, Refusal> {
    let mut out = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(refuse("instructions", "must be a string")),
    }
    match body.get("input") {
        None | Some(Value::Null) => return Err(refuse("input", "missing required field `input`")),
        Some(Value::String(s)) => out.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                input_item(item, &format!("input[{i}]"), &mut out)?;
            }
        }
        Some(_) => {
            return Err(refuse(
                "input",
                "must be a string or a non-empty list of items",
            ))
        }
    }
    Ok(out)
}

/// One `input` item appended to the chat messages (a `function_call` joins the assistant
/// turn it follows, as chat keeps parallel calls in one message).
fn input_item(item: &Value, field: &str, out: &mut Vec<Value>) -> Result<(), Refusal> {
    let text = |key: &str| {
        item.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                refuse(
                    &format!("{field}.{key}"),
                    format!("`{key}` must be a string"),
                )
            })
    };
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") => {
            let role = text("role")?;
            if !["user", "system", "developer", "assistant"].contains(&role.as_str()) {
                return Err(refuse(
                    &format!("{field}.role"),
                    format!("unknown role `{role}`"),
                ));
            }
            let content = content_text(item.get("content"), &format!("{field}.content"))?;
            out.push(json!({"role": role, "content": content}));
        }
        Some("function_call") => {
            let call = json!({"id": text("call_id")?, "type": "function",
                              "function": {"name": text("name")?, "arguments": text("arguments")?}});
            let last = out.last_mut().filter(|m| m["role"] == "assistant");
            match last.and_then(|m| m.as_object_mut()) {
                Some(m) => match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => {
                        m.insert("tool_calls".into(), json!([call]));
                    }
                },
                None => {
                    out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}))
                }
            }
        }
        Some("function_call_output") => {
            let output = content_text(item.get("output"), &format!("{field}.output"))?;
            out.push(json!({"role": "tool", "tool_call_id": text("call_id")?, "content": output}));
        }
        Some(other) => {
            return Err(refuse(
                &format!("{field}.type"),
                format!(
                    "`{other}` items are not supported (message, function_call and \
                         function_call_output are)"
                ),
            ))
        }
    }
    Ok(())
}

/// A message's content: a string, or text parts (`input_text` / `output_text`).
fn content_text(v: Option<&Value>, field: &str) -> Result<String, Refusal> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(refuse(
                        field,
                        "only input_text and output_text parts are supported",
                    )),
                },
            )
            .collect(),
        _ => Err(refuse(field, "must be a string or a list of text parts")),
    }
}
