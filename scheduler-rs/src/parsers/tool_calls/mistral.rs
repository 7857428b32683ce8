//! Mistral calls: any text, then `[TOOL_CALLS]` and a JSON array of `{"name": ...,
//! "arguments": {...}}` (or one such object). Newer Mistral tokenizers write
//! `[TOOL_CALLS]name[ARGS]{...}` per call instead; both are read.

use serde_json::Value;

use super::call::ToolCall;

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

/// (the text before `[TOOL_CALLS]`, trimmed; the calls). None when the calls do not parse.
pub(super) fn parse(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let Some(at) = text.find(TOOL_CALLS) else {
        return Some((text.trim().to_string(), Vec::new()));
    };
    let content = text[..at].trim().to_string();
    let body = text[at + TOOL_CALLS.len()..].trim();
    let calls = if body.starts_with('[') || body.starts_with('{') {
        match serde_json::from_str::<Value>(body).ok()? {
            Value::Array(items) => items
                .iter()
                .map(ToolCall::from_value)
                .collect::<Option<Vec<_>>>()?,
            one => vec![ToolCall::from_value(&one)?],
        }
    } else {
        body.split(TOOL_CALLS)
            .map(|call| {
                let (name, args) = call.split_once(ARGS)?;
                let args = serde_json::from_str::<Value>(args.trim()).ok()?;
                let name = name.trim();
                (!name.is_empty()).then(|| ToolCall {
                    name: name.to_string(),
                    arguments: args.to_string(),
                })
            })
            .collect::<Option<Vec<_>>>()?
    };
    (!calls.is_empty()).then_some((content, calls))
}
