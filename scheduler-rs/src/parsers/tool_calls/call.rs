//! One tool call read out of a reply.

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

    /// From `{"name": ..., "arguments": {...}}` (or `parameters`, as Llama writes it).
    pub fn from_value(v: &Value) -> Option<Self> {
        let name = v.get("name")?.as_str()?.to_string();
        let args = v.get("arguments").or_else(|| v.get("parameters"))?;
        let arguments = match args {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Some(ToolCall { name, arguments })
    }

    /// The arguments as a JSON value (text that is not JSON stays a string).
    pub(super) fn arguments_value(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or(Value::String(self.arguments.clone()))
    }
}
