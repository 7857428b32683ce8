//! Llama 3.x JSON calls: the whole reply is one or more `{"name": ..., "parameters": {...}}`
//! objects separated by `;`, optionally after `<|python_tag|>`. A reply that does not start
//! with either is content.

use serde_json::Value;

use super::call::ToolCall;

const PYTHON_TAG: &str = "<|python_tag|>";

/// (content, calls): ("", calls) when the whole reply is calls. None when it starts like
/// calls but does not parse as them.
pub(super) fn parse(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let trimmed = text.trim();
    let mut rest = match trimmed.strip_prefix(PYTHON_TAG) {
        Some(after) => after.trim_start(),
        None if trimmed.starts_with('{') => trimmed,
        None => return Some((trimmed.to_string(), Vec::new())),
    };
    let mut calls = Vec::new();
    loop {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(ToolCall::from_value(&value)?);
        rest = rest[values.byte_offset()..].trim_start();
        match rest.strip_prefix(';') {
            Some(after) => rest = after.trim_start(),
            None if rest.is_empty() => return Some((String::new(), calls)),
            None => return None,
        }
        if rest.is_empty() {
            return Some((String::new(), calls));
        }
    }
}
