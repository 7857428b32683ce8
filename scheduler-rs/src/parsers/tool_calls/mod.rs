//! Tool calls read out of a model's text in the format of `--tool-call-parser`, and the same
//! format written back (earlier calls shown to a template that cannot render them, and the
//! answer shape a template-less tool prompt asks for).
//!
//! | name          | what the model writes                                              |
//! |---------------|--------------------------------------------------------------------|
//! | `hermes`      | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks  |
//! | `llama3_json` | `{"name": ..., "parameters": {...}}` (`; `-separated), the whole text |
//! | `mistral`     | `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` after any text |
//! | `pythonic`    | `[get_weather(city="Oslo"), now()]`, the whole text                |
//!
//! NOTE: a reply whose calls do not parse is all content, without calls (as vLLM answers).

mod call;
mod hermes;
mod llama3_json;
mod mistral;
mod pythonic;

use serde_json::Value;

pub use call::ToolCall;

/// A tool-call format by its `--tool-call-parser` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParser {
    Hermes,
    Llama3Json,
    Mistral,
    Pythonic,
}

impl ToolParser {
    /// The names `--tool-call-parser` takes.
    pub const NAMES: [&'static str; 4] = ["hermes", "llama3_json", "mistral", "pythonic"];

    /// The parser named `name`; None for a name not in [`Self::NAMES`].
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" => Some(ToolParser::Hermes),
            "llama3_json" => Some(ToolParser::Llama3Json),
            "mistral" => Some(ToolParser::Mistral),
            "pythonic" => Some(ToolParser::Pythonic),
            _ => None,
        }
    }

    /// Its `--tool-call-parser` name.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// A whole reply: (its content, trimmed; its calls).
    pub fn parse(self, text: &str) -> (String, Vec<ToolCall>) {
        let parsed = match self {
            ToolParser::Hermes => hermes::parse(text),
            ToolParser::Llama3Json => llama3_json::parse(text),
            ToolParser::Mistral => mistral::parse(text),
            ToolParser::Pythonic => pythonic::parse(text),
        };
        parsed.unwrap_or_else(|| (text.trim().to_string(), Vec::new()))
    }

    /// Whether the format's markers are special tokens that detokenization must keep
    /// (Mistral's `[TOOL_CALLS]`; vLLM turns `skip_special_tokens` off for it too).
    pub fn needs_special_tokens(self) -> bool {
        self == ToolParser::Mistral
    }

    /// How a template-less tool prompt asks for calls: (one call, as the model writes it;
    /// how several are written).
    pub fn answer_shape(self) -> (&'static str, &'static str) {
        match self {
            ToolParser::Hermes => (
                "<tool_call>\n{\"name\": \"<function name>\", \"arguments\": <arguments as a \
                 JSON object>}\n</tool_call>",
                "one <tool_call></tool_call> block each",
            ),
            ToolParser::Llama3Json => (
                "{\"name\": \"<function name>\", \"parameters\": <arguments as a JSON object>}",
                "the JSON objects separated by \"; \"",
            ),
            ToolParser::Mistral => (
                "[TOOL_CALLS][{\"name\": \"<function name>\", \"arguments\": <arguments as a \
                 JSON object>}]",
                "all of them in the one JSON array after [TOOL_CALLS]",
            ),
            ToolParser::Pythonic => (
                "[function_name(argument_name=value, ...)]",
                "all of them in the one Python list, separated by commas",
            ),
        }
    }

    /// Earlier calls as the model was told to write them.
    pub fn write(self, calls: &[ToolCall]) -> String {
        let object = |c: &ToolCall, key: &str| {
            // NOTE: written by hand so that `name` comes first, as the model was shown.
            let name = Value::String(c.name.clone());
            format!("{{\"name\": {name}, \"{key}\": {}}}", c.arguments_value())
        };
        match self {
            ToolParser::Hermes => calls
                .iter()
                .map(|c| format!("<tool_call>\n{}\n</tool_call>", object(c, "arguments")))
                .collect::<Vec<_>>()
                .join("\n"),
            ToolParser::Llama3Json => calls
                .iter()
                .map(|c| object(c, "parameters"))
                .collect::<Vec<_>>()
                .join("; "),
            ToolParser::Mistral => {
                let all: Vec<String> = calls.iter().map(|c| object(c, "arguments")).collect();
                format!("[TOOL_CALLS][{}]", all.join(", "))
            }
            ToolParser::Pythonic => pythonic::write(calls),
        }
    }
}

#[cfg(test)]
mod tests;
