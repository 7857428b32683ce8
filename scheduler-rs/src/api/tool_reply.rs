//! A chat reply that may hold tool calls: read out of the model's text (a forced reply is the
//! whole text as JSON calls; otherwise the `--tool-call-parser` format) into OpenAI
//! `tool_calls`.

use serde_json::{json, Value};

use crate::config::OutputParsers;
use crate::errors::ApiError;
use crate::parsers::tool_calls::ToolParser;
use crate::protocols::tool_calls::{forced_calls, ToolCall};
use crate::protocols::tools::{ToolChoice, Tools};

/// How a reply's text is read for calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFormat {
    /// The grammar forced the calls: the text is `{"name": ..., "arguments": ...}` or an
    /// array of those. Otherwise the model chose: calls in `parser`'s format.
    pub forced: bool,
    /// The format of calls the model chose (`--tool-call-parser`).
    pub parser: ToolParser,
    /// `parallel_tool_calls: false`: only the first call is kept (vLLM truncates the same way).
    pub at_most_one: bool,
}

impl CallFormat {
    /// The format of a forced reply.
    #[cfg(test)]
    pub const FORCED: CallFormat = CallFormat {
        forced: true,
        parser: ToolParser::Hermes,
        at_most_one: false,
    };
    /// The format of a reply the model chose (Hermes blocks).
    #[cfg(test)]
    pub const HERMES: CallFormat = CallFormat {
        forced: false,
        parser: ToolParser::Hermes,
        at_most_one: false,
    };

    /// For a request's tools, with `auto` served in `auto_parser`'s format: None when no
    /// calls are read (`tool_choice: none`, no tools, `auto` not served).
    pub fn of(tools: Option<&Tools>, auto_parser: Option<ToolParser>) -> Option<Self> {
        let t = tools?;
        let (forced, parser) = match t.choice {
            ToolChoice::None => return None,
            ToolChoice::Auto => (false, auto_parser?),
            _ => (true, auto_parser.unwrap_or(ToolParser::Hermes)),
        };
        Some(CallFormat {
            forced,
            parser,
            at_most_one: !t.parallel,
        })
    }

    /// For a request's tools under the router's parsers; `tool_choice: auto` (tools without
    /// `tool_choice` too) is vLLM's 400 unless `--enable-auto-tool-choice` serves it.
    pub fn for_request(
        tools: Option<&Tools>,
        parsers: &OutputParsers,
    ) -> Result<Option<Self>, ApiError> {
        let auto = tools.is_some_and(|t| t.choice == ToolChoice::Auto);
        if auto && parsers.auto_tools().is_none() {
            // NOTE: vLLM's words.
            return Err(ApiError::invalid(
                "tool_choice",
                "\"auto\" tool choice requires --enable-auto-tool-choice and \
                 --tool-call-parser to be set",
            ));
        }
        Ok(Self::of(tools, parsers.auto_tools()))
    }

    /// (content, calls) of a finished reply's text.
    pub fn read(self, text: &str) -> (String, Vec<ToolCall>) {
        let (content, mut calls) = if self.forced {
            match forced_calls(text) {
                Some(calls) => (String::new(), calls),
                // NOTE: cut short (max_tokens): the partial JSON is returned as content.
                None => (text.to_string(), Vec::new()),
            }
        } else {
            self.parser.parse(text)
        };
        if self.at_most_one {
            calls.truncate(1);
        }
        (content, calls)
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
        let (msg, finish) = message(Some(CallFormat::FORCED), "r1", text, "stop");
        assert_eq!(finish, "tool_calls");
        assert_eq!(msg["content"], Value::Null);
        assert_eq!(msg["tool_calls"][0]["id"], "call_r1_0");
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "now");
        assert_eq!(
            msg["tool_calls"][0]["function"]["arguments"],
            r#"{"tz":"UTC"}"#
        );
        let cut = r#"{"name": "now", "argu"#.to_string();
        let (msg, finish) = message(Some(CallFormat::FORCED), "r1", cut.clone(), "length");
        assert_eq!(
            (msg["content"].as_str(), finish),
            (Some(cut.as_str()), "length")
        );
        let text = "ok <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>".to_string();
        let (deltas, finish) = final_deltas(CallFormat::HERMES, "r2", text, "stop");
        assert_eq!(finish, "tool_calls");
        assert_eq!(deltas[0], json!({"content": "ok"}));
        assert_eq!(deltas[1]["tool_calls"][0]["index"], 0);
        assert_eq!(deltas[1]["tool_calls"][0]["function"]["name"], "a");
        let two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\
                   <tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
        let (msg, _) = message(Some(CallFormat::HERMES), "r4", two.into(), "stop");
        assert_eq!(msg["tool_calls"][1]["id"], "call_r4_1");
        let one = CallFormat {
            at_most_one: true,
            ..CallFormat::HERMES
        };
        let (msg, _) = message(Some(one), "r4", two.into(), "stop");
        assert_eq!(msg["tool_calls"].as_array().unwrap().len(), 1);
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "a");
        let forced = r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]"#;
        let (msg, finish) = message(Some(CallFormat::FORCED), "r5", forced.into(), "stop");
        assert_eq!(
            (msg["tool_calls"][1]["function"]["name"].as_str(), finish),
            (Some("b"), "tool_calls")
        );
        let (msg, finish) = message(None, "r3", "hi".into(), "stop");
        assert_eq!((msg["content"].as_str(), finish), (Some("hi"), "stop"));
    }
}
