//! Hermes-style calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen
//! and Hermes templates ask for), anywhere in the text.

use serde_json::Value;

use super::call::ToolCall;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// (the text outside the blocks, trimmed; the calls). None when a block does not parse.
/// NOTE: an unclosed last block (cut by `max_tokens`) is read to the end of the text.
pub(super) fn parse(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let (mut rest, mut content, mut calls) = (text, String::new(), Vec::new());
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let body = &rest[start + OPEN.len()..];
        let (inner, after) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        let value = serde_json::from_str::<Value>(inner.trim()).ok()?;
        calls.push(ToolCall::from_value(&value)?);
        rest = after;
    }
    content.push_str(rest);
    Some((content.trim().to_string(), calls))
}
