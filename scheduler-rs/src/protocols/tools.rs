//! OpenAI `tools` / `tool_choice` / `parallel_tool_calls`: which functions the model may call
//! and the grammar that forces calls (`required`: one or more, or exactly one without parallel
//! calls; a named function: one call to it). Calls are read back in `tool_calls`.

use serde_json::{json, Value};

use super::structured::Grammar;

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model calls no tool (the tools are still shown to it).
    None,
    /// The model chooses; a call in the template's format is parsed out of its text.
    Auto,
    /// The model must call one of the tools (grammar-constrained).
    Required,
    /// The model must call this function (grammar-constrained).
    Named(String),
}

/// A request's tools, as validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The `tools` array as sent (the chat template renders it).
    pub list: Vec<Value>,
    /// (name, JSON schema of the arguments) per function.
    pub functions: Vec<(String, Value)>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false allows at most one call per reply.
    pub parallel: bool,
}

type Refusal = (&'static str, String);

/// Validate `tools` and `tool_choice`: None when no tools are given (then `tool_choice` may
/// only be absent, `none` or `auto`); the field and why for a 400 otherwise.
pub fn parse(tools: Option<&Value>, choice: Option<&Value>) -> Result<Option<Tools>, Refusal> {
    let list = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(("tools", "`tools` must be an array".into())),
    };
    let mut functions = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let bad = |why: &str| ("tools", format!("tools[{i}]: {why}"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("only `type: function` tools are supported"));
        }
        let f = t.get("function").ok_or_else(|| bad("missing `function`"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("`function.name` must be a non-empty string"))?;
        let params = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        if !params.is_object() {
            return Err(bad("`function.parameters` must be a JSON schema object"));
        }
        functions.push((name.to_string(), params));
    }
    let choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v @ Value::Object(_)) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    let shape = r#"{"type": "function", "function": {"name": ...}}"#;
                    ("tool_choice", format!("a named tool_choice is {shape}"))
                })?;
            if !functions.iter().any(|(n, _)| n == name) {
                return Err(("tool_choice", format!("no tool named `{name}` in `tools`")));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(v) => {
            return Err((
                "tool_choice",
                format!("must be none, auto, required or a named function; got {v}"),
            ))
        }
    };
    if functions.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(("tool_choice", "needs a non-empty `tools`".into())),
        };
    }
    Ok(Some(Tools {
        list,
        functions,
        choice,
        parallel: true,
    }))
}

/// `parallel_tool_calls`: absent or null is true (OpenAI's default); a non-boolean is a 400.
pub fn parallel(v: Option<&Value>) -> Result<bool, Refusal> {
    match v {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err((
            "parallel_tool_calls",
            format!("must be a boolean, got {other}"),
        )),
    }
}

/// The schema of one call to `name`: `{"name": name, "arguments": <valid arguments>}`.
fn call_schema(name: &str, params: &Value) -> Value {
    json!({"type": "object",
           "properties": {"name": {"const": name}, "arguments": params},
           "required": ["name", "arguments"], "additionalProperties": false})
}

impl Tools {
    /// The grammar that forces calls, None when the model chooses. Named: one call to that
    /// function, `{"name": ..., "arguments": ...}`. `required`: a JSON array of one or more
    /// calls to any tool (vLLM's shape), or one call object without `parallel`. A tool whose
    /// parameters llguidance refuses is a 400 on `tools`.
    pub fn grammar(&self) -> Result<Option<Grammar>, Refusal> {
        let schemas: Vec<Value> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return Ok(None),
            ToolChoice::Required => self
                .functions
                .iter()
                .map(|(n, p)| call_schema(n, p))
                .collect(),
            ToolChoice::Named(name) => self
                .functions
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(n, p)| call_schema(n, p))
                .collect(),
        };
        let one = match <[Value; 1]>::try_from(schemas) {
            Ok([one]) => one,
            Err(many) => json!({"anyOf": many}),
        };
        let schema = match self.choice {
            ToolChoice::Required if self.parallel => {
                json!({"type": "array", "items": one, "minItems": 1})
            }
            _ => one,
        };
        Grammar::json_schema(&schema)
            .map(Some)
            .map_err(|e| ("tools", e))
    }

    /// Whether the output is a forced call (the whole text is one JSON call).
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}},
               {"type": "function", "function": {"name": "now"}}])
    }

    #[test]
    fn tools_and_choices_parse_and_refuse_by_name() {
        let t = parse(Some(&weather()), None).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert_eq!(t.functions[0].0, "get_weather");
        assert_eq!(t.functions[1].1, json!({"type": "object"}));
        let named = json!({"type": "function", "function": {"name": "now"}});
        let t = parse(Some(&weather()), Some(&named)).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Named("now".into()));
        assert!(t.forced());
        let missing = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(
            parse(Some(&weather()), Some(&missing)).unwrap_err().0,
            "tool_choice"
        );
        assert_eq!(parse(Some(&json!({})), None).unwrap_err().0, "tools");
        assert_eq!(
            parse(Some(&json!([{"type": "retrieval"}])), None)
                .unwrap_err()
                .0,
            "tools"
        );
        assert_eq!(parse(None, Some(&json!("auto"))), Ok(None));
        assert_eq!(parse(Some(&json!([])), Some(&json!("none"))), Ok(None));
        assert_eq!(
            parse(None, Some(&json!("required"))).unwrap_err().0,
            "tool_choice"
        );
    }

    #[test]
    fn forced_choices_give_a_call_grammar() {
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = parse(Some(&weather()), Some(&named)).unwrap().unwrap();
        let g = t.grammar().unwrap().unwrap();
        let schema: Value = serde_json::from_str(g.schema.as_deref().unwrap()).unwrap();
        assert_eq!(
            schema["properties"]["name"],
            json!({"const": "get_weather"})
        );
        assert_eq!(
            schema["properties"]["arguments"]["required"],
            json!(["city"])
        );
        let mut t = parse(Some(&weather()), Some(&json!("required")))
            .unwrap()
            .unwrap();
        let g = t.grammar().unwrap().unwrap();
        let schema: Value = serde_json::from_str(g.schema.as_deref().unwrap()).unwrap();
        assert_eq!(
            (schema["type"].as_str(), &schema["minItems"]),
            (Some("array"), &json!(1))
        );
        assert_eq!(schema["items"]["anyOf"].as_array().unwrap().len(), 2);
        // Without parallel calls: exactly one call object.
        t.parallel = false;
        let g = t.grammar().unwrap().unwrap();
        let schema: Value = serde_json::from_str(g.schema.as_deref().unwrap()).unwrap();
        assert_eq!(schema["anyOf"].as_array().unwrap().len(), 2);
        assert_eq!(parallel(None), Ok(true));
        assert_eq!(parallel(Some(&json!(false))), Ok(false));
        assert_eq!(
            parallel(Some(&json!("no"))).unwrap_err().0,
            "parallel_tool_calls"
        );
        let auto = parse(Some(&weather()), None).unwrap().unwrap();
        assert_eq!(auto.grammar(), Ok(None));
    }
}
