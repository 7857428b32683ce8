//! The tool list shown in the system prompt when the chat template cannot show it (a template
//! that never reads `tools`, like the embedded SmolLM2's ChatML): the functions' JSON schemas
//! and how to answer: calls the model chooses in the `--tool-call-parser` format that
//! parsers/tool_calls reads back, forced calls as the JSON the grammar forces (vLLM's
//! fallback for such templates is the same idea: tools in the system prompt, forced calls by
//! grammar).

use serde_json::Value;

use super::tool_calls::ToolCall;
use super::tools::{ToolChoice, Tools};
use crate::parsers::tool_calls::ToolParser;

/// The text appended to the system prompt (or made the system prompt) for `tools`; None for
/// `tool_choice: none` (the model is not to call, so it is not told how). `parser`: the
/// format `auto` calls are read in.
pub fn system_text(tools: &Tools, parser: ToolParser) -> Option<String> {
    let listed: Vec<String> = tools.list.iter().map(Value::to_string).collect();
    let one = r#"{"name": "<function name>", "arguments": <arguments as a JSON object>}"#;
    // NOTE: forced replies are grammar-constrained to the shapes described here
    // (tools.rs `Tools::grammar`); `auto` replies are parsed in the parser's format.
    let how = match (&tools.choice, tools.parallel) {
        (ToolChoice::None, _) => return None,
        (ToolChoice::Auto, parallel) => {
            let (call, several) = parser.answer_shape();
            format!(
                "If a function helps to answer, call it: answer with the call, its name and \
                 arguments, written as:\n{call}\n{}",
                if parallel {
                    format!("You may make several calls: {several}.")
                } else {
                    "Make at most one call.".to_string()
                }
            )
        }
        (ToolChoice::Required, true) => format!(
            "You must call one or more of these functions. Answer only with a JSON array of \
             calls: [{one}, ...]"
        ),
        (ToolChoice::Required, false) => format!(
            "You must call exactly one of these functions. Answer only with the call as JSON: \
             {one}"
        ),
        (ToolChoice::Named(name), _) => {
            format!("You must call the function `{name}`. Answer only with the call as JSON: {one}")
        }
    };
    Some(format!(
        "# Tools\n\nYou can call functions. Their signatures, as JSON schemas, are within \
         <tools></tools> tags:\n<tools>\n{}\n</tools>\n\n{how}",
        listed.join("\n")
    ))
}

/// An assistant turn's earlier `tool_calls` written in the format the model was told to
/// use (a template that does not read `tools` does not render `tool_calls` either).
pub fn calls_as_text(calls: &Value, parser: ToolParser) -> String {
    let Some(calls) = calls.as_array() else {
        return String::new();
    };
    let calls: Vec<ToolCall> = calls
        .iter()
        .filter_map(|c| {
            let f = c.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            // NOTE: OpenAI sends arguments as JSON text; an object is taken as it is.
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => "{}".to_string(),
            };
            Some(ToolCall { name, arguments })
        })
        .collect();
    if calls.is_empty() {
        return String::new();
    }
    parser.write(&calls)
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
        let hermes = ToolParser::Hermes;
        let auto = system_text(&tools(json!("auto")), hermes).unwrap();
        assert!(auto.contains(r#""name":"get_weather""#), "{auto}");
        assert!(auto.contains(r#""city":{"type":"string"}"#), "{auto}");
        assert!(
            auto.contains("<tool_call>") && auto.contains("several calls"),
            "{auto}"
        );
        let pythonic = system_text(&tools(json!("auto")), ToolParser::Pythonic).unwrap();
        assert!(
            pythonic.contains("\n[function_name(argument_name=value, ...)]\n")
                && !pythonic.contains("<tool_call>"),
            "{pythonic}"
        );
        let mut one = tools(json!("auto"));
        one.parallel = false;
        assert!(system_text(&one, hermes)
            .unwrap()
            .contains("at most one call"));
        let required = system_text(&tools(json!("required")), hermes).unwrap();
        assert!(required.contains("JSON array"), "{required}");
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert!(system_text(&tools(named), hermes)
            .unwrap()
            .contains("`get_weather`"));
        assert_eq!(system_text(&tools(json!("none")), hermes), None);
    }

    #[test]
    fn earlier_calls_are_written_in_the_parsers_format() {
        let calls = json!([{"id": "c1", "type": "function",
                            "function": {"name": "now", "arguments": "{\"tz\":\"UTC\"}"}}]);
        assert_eq!(
            calls_as_text(&calls, ToolParser::Hermes),
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call>"
        );
        assert_eq!(
            calls_as_text(&calls, ToolParser::Mistral),
            "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {\"tz\":\"UTC\"}}]"
        );
        assert_eq!(calls_as_text(&Value::Null, ToolParser::Hermes), "");
    }
}
