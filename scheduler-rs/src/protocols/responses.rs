//! OpenAI Responses API requests (`POST /v1/responses`) as chat completion requests: the
//! endpoint is a translation layer onto the chat pipeline (api/responses.rs), so every chat
//! feature (sampling extensions, tiers, structured output, tools) means the same here.
//!
//! `input` (a string, or items: messages, `function_call`, `function_call_output`) and
//! `instructions` become `messages`; flat function `tools` and `tool_choice` the chat shapes;
//! `text.format` becomes `response_format`; `max_output_tokens` `max_tokens`. Responses are
//! not stored, so what needs storage (`previous_response_id`, `store: true`, item references)
//! is refused by name.

use serde_json::{json, Map, Value};

type Refusal = (String, String);

fn refuse(field: &str, why: impl Into<String>) -> Refusal {
    (field.to_string(), why.into())
}

/// Responses fields that are only accepted at a neutral value (null, or one listed).
const NEUTRAL: &[(&str, &[&str])] = &[
    ("background", &["false"]),
    ("include", &["[]"]),
    ("truncation", &["\"disabled\""]),
    ("top_logprobs", &["0"]),
    ("reasoning", &["{}"]),
    ("conversation", &[]),
    ("prompt", &[]),
    ("max_tool_calls", &[]),
    ("store", &["false"]),
    ("previous_response_id", &[]),
];

/// Chat fields with a Responses counterpart (or none): refused here as unrecognized, as
/// OpenAI's Responses endpoint does, instead of meaning something silently.
const CHAT_ONLY: &[&str] = &[
    "messages",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "logprobs",
    "functions",
    "function_call",
];

/// The request's fields a response object reports back (`instructions`, `tools`, ...).
pub const ECHOED: &[&str] = &[
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "user",
];

/// The chat request body for a Responses request body; the field (Responses' name) and why
/// for a 400 otherwise. Fields not handled here pass through unchanged (the chat endpoint's
/// extensions such as `seed` or `top_k`, and its refusal of unknown fields).
pub fn to_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, Refusal> {
    let mut chat = Map::new();
    for (key, value) in body {
        let why = if CHAT_ONLY.contains(&key.as_str()) {
            Some(format!("Unrecognized request argument supplied: {key}"))
        } else if let Some((_, ok)) = NEUTRAL.iter().find(|(n, _)| n == key) {
            let text = value.to_string();
            let neutral = value.is_null() || ok.contains(&text.as_str());
            (!neutral).then(|| match key.as_str() {
                "store" | "previous_response_id" | "conversation" => format!(
                    "`{key}` needs stored responses; this server does not store them \
                     (send the whole conversation in `input`, and `store: false`)"
                ),
                _ => super::extensions::not_supported(key),
            })
        } else {
            None
        };
        if let Some(why) = why {
            return Err(refuse(key, why));
        }
        match key.as_str() {
            "input" | "instructions" | "text" | "tools" | "tool_choice" => {}
            _ if NEUTRAL.iter().any(|(n, _)| n == key) => {}
            "max_output_tokens" => {
                chat.insert("max_tokens".into(), value.clone());
            }
            // NOTE: the metadata is only reported back (OpenAI's: at most 16 string pairs).
            "metadata" => {}
            "stream_options" => stream_options(value)?,
            _ => {
                chat.insert(key.clone(), value.clone());
            }
        }
    }
    chat.insert("messages".into(), Value::Array(messages(body)?));
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), self::tools(tools)?);
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(format) = text_format(body.get("text"))? {
        chat.insert("response_format".into(), format);
    }
    Ok(chat)
}

/// Only `include_obfuscation` (a padding Nitsum never adds) is accepted.
fn stream_options(v: &Value) -> Result<(), Refusal> {
    match v {
        Value::Null => Ok(()),
        Value::Object(o) if o.keys().all(|k| k == "include_obfuscation") => Ok(()),
        _ => Err(refuse(
            "stream_options",
            "only `include_obfuscation` is accepted (usage is always in response.completed)",
        )),
    }
}

/// `instructions` (a system message) and `input` as chat messages.
fn messages(body: &Map<String, Value>) -> Result<Vec<Value>, Refusal> {
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

/// Flat function tools (`{"type": "function", "name", "parameters", ...}`) in chat's shape.
fn tools(v: &Value) -> Result<Value, Refusal> {
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
fn tool_choice(v: &Value) -> Result<Value, Refusal> {
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
fn text_format(text: Option<&Value>) -> Result<Option<Value>, Refusal> {
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
            super::extensions::not_supported("text.verbosity"),
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

/// A chat-side field name as the Responses request calls it (for errors).
pub fn field_name(chat: &str) -> String {
    match chat {
        "response_format" => "text.format".into(),
        "max_tokens" => "max_output_tokens".into(),
        other => match other.strip_prefix("messages") {
            // NOTE: indices count chat messages (`instructions` is the first when sent).
            Some(rest) => format!("input{rest}"),
            None => other.to_string(),
        },
    }
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
