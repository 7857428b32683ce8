//! A chat reply that may hold tool calls: read out of the model's text (a forced call is the
//! whole text as JSON; otherwise Hermes `<tool_call>` blocks) into OpenAI `tool_calls`.

use serde_json::{json, Value};

use crate::protocols::tool_calls::{forced_call, hermes_calls, ToolCall};
use crate::protocols::tools::Tools;

/// How a reply's text is read for calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    /// The grammar forced one call: the text is `{"name": ..., "arguments": ...}`.
    Forced,
    /// The model chose: Hermes-style `<tool_call>{...}</tool_call>` blocks, if any.
    Hermes,
}

impl CallFormat {
    /// For a request's tools: None when no calls are read (`tool_choice: none`, no tools).
    pub fn of(tools: Option<&Tools>) -> Option<Self> {
        use crate::protocols::tools::ToolChoice;
        match tools.map(|t| &t.choice) {
            None | Some(ToolChoice::None) => None,
            Some(ToolChoice::Auto) => Some(CallFormat::Hermes),
            Some(_) => Some(CallFormat::Forced),
        }
    }

    /// (content, calls) of a finished reply's text.
    fn read(self, text: &str) -> (String, Vec<ToolCall>) {
        match self {
            CallFormat::Forced => match forced_call(text) {
                Some(call) => (String::new(), vec![call]),
                // NOTE: cut short (max_tokens): the partial JSON is returned as content.
                None => (text.to_string(), Vec::new()),
            },
            CallFormat::Hermes => hermes_calls(text),
        }
    }
}

/// The assistant message and finish reason of a finished reply: with calls, `tool_calls`
/// (ids `call_<request id>_<index>`), content null when no text remains, and finish reason
/// `tool_calls`.
pub fn message(
    format: Option<CallFormat>,
    request_id: &str,
    text: String,
    finish: &'static str,
) -> (Value, &'static str) {
    let Some(format) = format else {
        return (json!({"role": "assistant", "content": text}), finish);
    };
    let (content, calls) = format.read(&text);
    if calls.is_empty() {
        return (json!({"role": "assistant", "content": content}), finish);
    }
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| c.to_json(&format!("call_{request_id}_{i}")))
        .collect();
    let content = (!content.is_empty()).then_some(content);
    (
        json!({"role": "assistant", "content": content, "tool_calls": calls}),
        "tool_calls",
    )
}

/// The stream's closing deltas for a reply whose text was held back (tool calls are read
/// from the whole text): the content, the calls (with their `index`), and the finish reason.
pub fn final_deltas(
    format: CallFormat,
    request_id: &str,
    text: String,
    finish: &'static str,
) -> (Vec<Value>, &'static str) {
    let (msg, finish) = message(Some(format), request_id, text, finish);
    let mut deltas = Vec::new();
    if let Some(c) = msg["content"].as_str().filter(|c| !c.is_empty()) {
        deltas.push(json!({"content": c}));
    }
    if let Some(calls) = msg["tool_calls"].as_array() {
        let indexed: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut c = c.clone();
                c["index"] = json!(i);
                c
            })
            .collect();
        deltas.push(json!({"tool_calls": indexed}));
    }
    (deltas, finish)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_and_hermes_replies_become_tool_calls() {
        let text = r#"{"name": "now", "arguments": {"tz": "UTC"}}"#.to_string();
        let (msg, finish) = message(Some(CallFormat::Forced), "r1", text, "stop");
        assert_eq!(finish, "tool_calls");
        assert_eq!(msg["content"], Value::Null);
        assert_eq!(msg["tool_calls"][0]["id"], "call_r1_0");
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "now");
        assert_eq!(
            msg["tool_calls"][0]["function"]["arguments"],
            r#"{"tz":"UTC"}"#
        );
        let cut = r#"{"name": "now", "argu"#.to_string();
        let (msg, finish) = message(Some(CallFormat::Forced), "r1", cut.clone(), "length");
        assert_eq!(
            (msg["content"].as_str(), finish),
            (Some(cut.as_str()), "length")
        );
        let text = "ok <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>".to_string();
        let (deltas, finish) = final_deltas(CallFormat::Hermes, "r2", text, "stop");
        assert_eq!(finish, "tool_calls");
        assert_eq!(deltas[0], json!({"content": "ok"}));
        assert_eq!(deltas[1]["tool_calls"][0]["index"], 0);
        assert_eq!(deltas[1]["tool_calls"][0]["function"]["name"], "a");
        let (msg, finish) = message(None, "r3", "hi".into(), "stop");
        assert_eq!((msg["content"].as_str(), finish), (Some("hi"), "stop"));
    }
}
