//! OpenAI Responses API requests (`POST /v1/responses`) as chat completion requests: the
//! endpoint is a translation layer onto the chat pipeline (api/responses.rs), so every chat
//! feature (sampling extensions, tiers, structured output, tools) means the same here.
//!
//! `input` (a string, or items: messages, `function_call`, `function_call_output`) and
//! `instructions` become `messages`; flat function `tools` and `tool_choice` the chat shapes;
//! `text.format` becomes `response_format`; `max_output_tokens` `max_tokens`. Responses are
//! not stored, so what needs storage (`previous_response_id`, `store: true`, item references)
//! is refused by name.

mod input;
mod refusal;
mod shapes;

use serde_json::{Map, Value};

use input::messages;
use refusal::{refuse, Refusal};
use shapes::{text_format, tool_choice, tools};

/// Responses fields that are only accepted at a neutral value (null, or one listed).
const NEUTRAL: &[(&str, &[&str])] = &[
    ("background", &["false"]),
    ("include", &["[]"]),
    ("truncation", &["\"disabled\""]),
    ("top_logprobs", &["0"]),
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
    "reasoning",
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
            "reasoning" => reasoning(value, &mut chat)?,
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

/// `reasoning`: its `effort` is the chat `reasoning_effort` (a chat template variable); a
/// summary is refused (none is written: the reasoning itself is the reasoning item's text).
fn reasoning(v: &Value, chat: &mut Map<String, Value>) -> Result<(), Refusal> {
    let Value::Object(o) = v else {
        return match v {
            Value::Null => Ok(()),
            _ => Err(refuse("reasoning", "reasoning must be an object")),
        };
    };
    for (key, value) in o {
        match key.as_str() {
            "effort" if !value.is_null() => {
                chat.insert("reasoning_effort".into(), value.clone());
            }
            "effort" | "summary" | "generate_summary" if value.is_null() => {}
            _ => {
                let name = format!("reasoning.{key}");
                return Err(refuse(&name, super::extensions::not_supported(&name)));
            }
        }
    }
    Ok(())
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

/// A chat-side field name as the Responses request calls it (for errors).
pub fn field_name(chat: &str) -> String {
    match chat {
        "response_format" => "text.format".into(),
        "max_tokens" => "max_output_tokens".into(),
        "reasoning_effort" => "reasoning.effort".into(),
        other => match other.strip_prefix("messages") {
            // NOTE: indices count chat messages (`instructions` is the first when sent).
            Some(rest) => format!("input{rest}"),
            None => other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
