//! The tool list shown in the system prompt when the chat template cannot show it (a template
//! that never reads `tools`, like the embedded SmolLM2's ChatML): the functions' JSON schemas
//! and how to answer, in the Hermes format that `tool_calls.rs` reads back (vLLM's fallback
//! for such templates is the same idea: tools in the system prompt, forced calls by grammar).

use serde_json::Value;

use super::tools::{ToolChoice, Tools};

/// The text appended to the system prompt (or made the system prompt) for `tools`; None for
/// `tool_choice: none` (the model is not to call, so it is not told how).
pub fn system_text(tools: &Tools) -> Option<String> {
    let listed: Vec<String> = tools.list.iter().map(Value::to_string).collect();
    let one = r#"{"name": "<function name>", "arguments": <arguments as a JSON object>}"#;
    // NOTE: forced replies are grammar-constrained to the shapes described here
    // (tools.rs `Tools::grammar`); `auto` replies are parsed for the Hermes blocks.
    let how = match (&tools.choice, tools.parallel) {
        (ToolChoice::None, _) => return None,
        (ToolChoice::Auto, parallel) => format!(
            "If a function helps to answer, call it: put the call, a JSON object with its name \
             and arguments, within <tool_call></tool_call> tags:\n<tool_call>\n{one}\n</tool_call>\n{}",
            if parallel {
                "You may make several calls, one block each."
            } else {
                "Make at most one call."
            }
        ),
        (ToolChoice::Required, true) => format!(
            "You must call one or more of these functions. Answer only with a JSON array of \
             calls: [{one}, ...]"
        ),
        (ToolChoice::Required, false) => format!(
            "You must call exactly one of these functions. Answer only with the call as JSON: \
             {one}"
        ),
        (ToolChoice::Named(name), _) => format!(
            "You must call the function `{name}`. Answer only with the call as JSON: {one}"
        ),
    };
    Some(format!(
        "# Tools\n\nYou can call functions. Their signatures, as JSON schemas, are within \
         <tools></tools> tags:\n<tools>\n{}\n</tools>\n\n{how}",
        listed.join("\n")
    ))
}

/// An assistant turn's earlier `tool_calls` as the Hermes blocks the model was told to write
/// (a template that does not read `tools` does not render `tool_calls` either).
pub fn calls_as_text(calls: &Value) -> String {
    let Some(calls) = calls.as_array() else {
        return String::new();
    };
    let blocks: Vec<String> = calls
        .iter()
        .filter_map(|c| {
            let f = c.get("function")?;
            let args = match f.get("arguments") {
                // NOTE: OpenAI sends arguments as JSON text; shown as the object it encodes.
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                }
                Some(v) => v.clone(),
                None => Value::Object(Default::default()),
            };
            // NOTE: written by hand so that `name` comes first, as the model was shown.
            let name = f.get("name")?;
            Some(format!(
                "<tool_call>\n{{\"name\": {name}, \"arguments\": {args}}}\n</tool_call>"
            ))
        })
        .collect();
    blocks.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::tools::parse;
    use serde_json::json;

    fn tools(choice: Value) -> Tools {
        let list = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        parse(Some(&list), Some(&choice)).unwrap().unwrap()
    }

    #[test]
    fn the_prompt_lists_the_schemas_and_the_answer_shape_per_choice() {
        let auto = system_text(&tools(json!("auto"))).unwrap();
        assert!(auto.contains(r#""name":"get_weather""#), "{auto}");
        assert!(auto.contains(r#""city":{"type":"string"}"#), "{auto}");
        assert!(
            auto.contains("<tool_call>") && auto.contains("several calls"),
            "{auto}"
        );
        let mut one = tools(json!("auto"));
        one.parallel = false;
        assert!(system_text(&one).unwrap().contains("at most one call"));
        let required = system_text(&tools(json!("required"))).unwrap();
        assert!(required.contains("JSON array"), "{required}");
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert!(system_text(&tools(named))
            .unwrap()
            .contains("`get_weather`"));
        assert_eq!(system_text(&tools(json!("none"))), None);
    }

    #[test]
    fn earlier_calls_become_hermes_blocks() {
        let calls = json!([{"id": "c1", "type": "function",
                            "function": {"name": "now", "arguments": "{\"tz\":\"UTC\"}"}}]);
        assert_eq!(
            calls_as_text(&calls),
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call>"
        );
        assert_eq!(calls_as_text(&Value::Null), "");
    }
}
