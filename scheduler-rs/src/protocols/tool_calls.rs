//! Tool calls read back out of a forced output (the whole text is one JSON call, or an array
//! of them, as the grammar of tools.rs forces). Calls the model chose to make are read by
//! the `--tool-call-parser` format (parsers/tool_calls).

use serde_json::Value;

pub use crate::parsers::tool_calls::ToolCall;

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
    }
}
