//! Tool calls read back out of a model's output: a forced call (the whole text is one JSON
//! call) or Hermes-style `<tool_call>` blocks.

use serde_json::{json, Value};

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI `tool_calls` entry.
    pub fn to_json(&self, id: &str) -> Value {
        json!({"id": id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}})
    }

    /// From `{"name": ..., "arguments": {...}}` (the shape forced calls and Hermes use).
    fn from_value(v: &Value) -> Option<Self> {
        let name = v.get("name")?.as_str()?.to_string();
        let args = v.get("arguments").or_else(|| v.get("parameters"))?;
        let arguments = match args {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Some(ToolCall { name, arguments })
    }
}

/// The calls a forced output holds: one call object, or an array of them (`required` with
/// parallel calls). None if it is not that, e.g. cut by `max_tokens`.
pub fn forced_calls(text: &str) -> Option<Vec<ToolCall>> {
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        Value::Array(items) if !items.is_empty() => {
            items.iter().map(ToolCall::from_value).collect()
        }
        one => Some(vec![ToolCall::from_value(&one)?]),
    }
}

/// Hermes-style calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen
/// and Hermes templates ask for) out of `text`: (the text outside them, trimmed; the calls).
/// NOTE: a block that does not parse leaves the whole text as content, without calls.
pub fn hermes_calls(text: &str) -> (String, Vec<ToolCall>) {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let (mut rest, mut content, mut calls) = (text, String::new(), Vec::new());
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let body = &rest[start + OPEN.len()..];
        let (inner, after) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        match serde_json::from_str::<Value>(inner.trim())
            .ok()
            .and_then(|v| ToolCall::from_value(&v))
        {
            Some(call) => calls.push(call),
            None => return (text.to_string(), Vec::new()),
        }
        rest = after;
    }
    content.push_str(rest);
    (content.trim().to_string(), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_read_back() {
        let c = forced_calls(r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#).unwrap();
        assert_eq!(c[0].name, "get_weather");
        assert_eq!(c[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(forced_calls(r#"{"name": "get_weather", "argu"#), None);
        let two = forced_calls(
            r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]"#,
        )
        .unwrap();
        assert_eq!(
            two.iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect::<Vec<_>>(),
            [("a", "{}"), ("b", r#"{"x":1}"#)]
        );
        assert_eq!(forced_calls("[]"), None);
        assert_eq!(forced_calls(r#"[{"name": "a"}]"#), None);
        let text =
            "Let me check.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = hermes_calls(text);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "now".into(),
                arguments: "{}".into()
            }]
        );
        let (content, calls) = hermes_calls("<tool_call>{oops}</tool_call>");
        assert_eq!(
            (content.as_str(), calls.len()),
            ("<tool_call>{oops}</tool_call>", 0)
        );
        assert_eq!(hermes_calls("plain").1.len(), 0);
    }
}
