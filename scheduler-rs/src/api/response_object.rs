//! The Responses API response object and its output items, built from a chat reply (shared by
//! the non-streamed answer and the event stream).

use serde_json::{json, Map, Value};

use super::output::TextStream;
use super::reading::Reading;
use super::tool_reply::CallFormat;
use crate::protocols::responses::ECHOED;

/// What every response object of one request repeats: ids, time, model and the request's
/// echoed fields.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `resp_<router request id>`.
    pub id: String,
    pub created_at: u64,
    pub model: String,
    echoed: Map<String, Value>,
}

impl ResponseMeta {
    pub fn new(request: &Map<String, Value>, router_id: u64, created_at: u64, model: &str) -> Self {
        let mut echoed = Map::new();
        for key in ECHOED {
            echoed.insert(
                (*key).to_string(),
                request.get(*key).cloned().unwrap_or(Value::Null),
            );
        }
        // NOTE: OpenAI's defaults when the field was not sent (the rest report null).
        let defaults = [
            ("metadata", json!({})),
            ("parallel_tool_calls", json!(true)),
            ("reasoning", json!({"effort": null, "summary": null})),
            ("text", json!({"format": {"type": "text"}})),
            ("tool_choice", json!("auto")),
            ("tools", json!([])),
        ];
        for (key, value) in defaults {
            if echoed[key].is_null() {
                echoed.insert(key.to_string(), value);
            }
        }
        ResponseMeta {
            id: format!("resp_{router_id}"),
            created_at,
            model: model.to_string(),
            echoed,
        }
    }

    /// The response object: `status` is in_progress, completed or incomplete; `usage` null
    /// until the end.
    pub fn object(&self, status: &str, output: &[Value], usage: Value) -> Value {
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        let mut obj = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": null, "incomplete_details": incomplete,
            "model": self.model, "output": output, "usage": usage,
            "previous_response_id": null, "store": false, "background": false,
            "truncation": "disabled",
        });
        let fields = obj.as_object_mut().expect("an object literal");
        fields.extend(self.echoed.clone());
        obj
    }

    /// The message item's id.
    pub fn message_id(&self) -> String {
        format!("msg_{}", &self.id["resp_".len()..])
    }

    /// The reasoning item's id.
    pub fn reasoning_id(&self) -> String {
        format!("rs_{}", &self.id["resp_".len()..])
    }
}

/// The status a finish reason gives (a reply cut by `max_output_tokens` is incomplete).
pub fn status(finish: &str) -> &'static str {
    if finish == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// A message item holding `text` (content empty while in progress).
pub fn message_item(meta: &ResponseMeta, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(output_text).into_iter().collect();
    json!({"type": "message", "id": meta.message_id(), "status": status, "role": "assistant",
           "content": content})
}

/// An `output_text` content part.
pub fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A `reasoning_text` content part.
pub fn reasoning_text(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

/// A reasoning item holding `text` (content empty while in progress).
pub fn reasoning_item(meta: &ResponseMeta, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(reasoning_text).into_iter().collect();
    json!({"type": "reasoning", "id": meta.reasoning_id(), "summary": [], "content": content,
           "encrypted_content": null, "status": status})
}

/// A reasoning item's status: completed once content followed it, else the reply's.
pub fn reasoning_status(content: &str, finish: &str) -> &'static str {
    if content.is_empty() {
        status(finish)
    } else {
        "completed"
    }
}

/// The output items of a finished reply: its reasoning item (when a reasoning parser read
/// some), then `content_items` of the rest.
pub fn output_items(
    meta: &ResponseMeta,
    reading: &Reading,
    text: &str,
    finish: &str,
) -> Vec<Value> {
    let split = reading.split(text);
    let mut items = Vec::new();
    if !split.reasoning.is_empty() {
        let status = reasoning_status(&split.content, finish);
        items.push(reasoning_item(meta, Some(&split.reasoning), status));
    }
    items.extend(content_items(meta, reading.calls, split.content, finish));
    items
}

/// The content's output items: a message with its text (unless only calls were made), then
/// one `function_call` item per call (`call_id` `call_resp_<id>_<i>`).
pub fn content_items(
    meta: &ResponseMeta,
    calls: Option<CallFormat>,
    text: String,
    finish: &str,
) -> Vec<Value> {
    let (content, calls) = match calls {
        Some(format) => format.read(&text),
        None => (text, Vec::new()),
    };
    let status = status(finish);
    let mut items = Vec::with_capacity(calls.len() + 1);
    if !content.is_empty() || calls.is_empty() {
        items.push(message_item(meta, Some(&content), status));
    }
    for (i, c) in calls.iter().enumerate() {
        items.push(
            json!({"type": "function_call", "id": format!("fc_{}_{i}", meta.id),
                          "call_id": format!("call_{}_{i}", meta.id), "name": c.name,
                          "arguments": c.arguments, "status": "completed"}),
        );
    }
    items
}

/// The Responses `usage` of a request (from the chat usage: cached prompt tokens included
/// when the router reports them).
pub fn usage(all: &[TextStream]) -> Value {
    let chat = super::output::usage(all);
    let cached = chat
        .pointer("/prompt_tokens_details/cached_tokens")
        .cloned()
        .unwrap_or(json!(0));
    json!({
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat["total_tokens"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        let req = json!({"input": "x", "instructions": "Be brief.", "temperature": 0.5});
        ResponseMeta::new(req.as_object().unwrap(), 7, 100, "tiny")
    }

    #[test]
    fn the_object_echoes_the_request_and_reports_a_cut_reply_incomplete() {
        let m = meta();
        let items = output_items(&m, &Reading::default(), "hi", "length");
        let obj = m.object(status("length"), &items, json!(null));
        assert_eq!(
            (obj["id"].as_str(), obj["status"].as_str()),
            (Some("resp_7"), Some("incomplete"))
        );
        assert_eq!(obj["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(
            (obj["instructions"].as_str(), &obj["temperature"]),
            (Some("Be brief."), &json!(0.5))
        );
        assert_eq!(
            (&obj["tools"], &obj["tool_choice"]),
            (&json!([]), &json!("auto"))
        );
        assert_eq!(obj["output"][0]["id"], "msg_7");
        assert_eq!(obj["reasoning"], json!({"effort": null, "summary": null}));
        assert_eq!(obj["output"][0]["content"][0]["text"], "hi");
        assert_eq!(status("stop"), "completed");
    }

    #[test]
    fn calls_become_function_call_items_after_the_text() {
        let text =
            "Checking.<tool_call>{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}</tool_call>";
        let items = content_items(&meta(), Some(CallFormat::HERMES), text.into(), "stop");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["content"][0]["text"], "Checking.");
        assert_eq!(
            (
                items[1]["type"].as_str(),
                items[1]["name"].as_str(),
                items[1]["call_id"].as_str()
            ),
            (Some("function_call"), Some("now"), Some("call_resp_7_0"))
        );
        assert_eq!(items[1]["arguments"], r#"{"tz":"UTC"}"#);
        let forced = r#"{"name": "now", "arguments": {}}"#;
        let items = content_items(&meta(), Some(CallFormat::FORCED), forced.into(), "stop");
        assert_eq!(
            (items.len(), items[0]["type"].as_str()),
            (1, Some("function_call"))
        );
    }
}
