//! A chat request's prompt: its messages through the chat template (the model's, or the
//! request's `chat_template`, with `chat_template_kwargs`), showing the model its `tools`:
//! through the template when it reads `tools`, else in the system prompt
//! (protocols/tool_prompt.rs).

use serde_json::{Map, Value};

use super::AppState;
use crate::errors::ApiError;
use crate::parsers::tool_calls::ToolParser;
use crate::protocols::openai::{ChatMessage, CHAT_ROLES};
use crate::protocols::tool_prompt;
use crate::protocols::tools::Tools;
use crate::tokenize::template::{ChatTemplate, RESERVED_KWARGS};

/// What shapes a chat prompt besides the messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct RenderOptions<'a> {
    pub tools: Option<&'a Tools>,
    /// The request's `chat_template` (Jinja source), replacing the model's.
    pub template: Option<&'a str>,
    /// The request's `chat_template_kwargs`, as sent.
    pub kwargs: Option<&'a Value>,
    /// `--tool-call-parser`: the format a template-less tool prompt asks for (Hermes without).
    pub tool_parser: Option<ToolParser>,
    /// The request's `reasoning_effort`: a template variable (a 400 if the template does not
    /// read it).
    pub reasoning_effort: Option<&'a str>,
}

/// Message content as plain text: a string, or the concatenated `text` parts.
fn content_text(m: &ChatMessage, i: usize) -> Result<String, ApiError> {
    let field = || format!("messages[{i}].content");
    match &m.content {
        // NOTE: only an assistant turn may come without content (e.g. one that made tool
        // calls); OpenAI requires it for every other role.
        None | Some(Value::Null) if m.role == "assistant" => Ok(String::new()),
        None | Some(Value::Null) => Err(ApiError::invalid(
            &field(),
            format!("a `{}` message needs content", m.role),
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            &field(),
                            "only text content parts are supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid(
            &field(),
            "content must be a string or a list of parts",
        )),
    }
}

/// `chat_template_kwargs`: an object without the variables the renderer owns.
fn kwargs(v: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    const FIELD: &str = "chat_template_kwargs";
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => match m.keys().find(|k| RESERVED_KWARGS.contains(&k.as_str())) {
            Some(k) => Err(ApiError::invalid(
                FIELD,
                format!("`{k}` is set by the request's own field, not by {FIELD}"),
            )),
            None => Ok(m.clone()),
        },
        Some(other) => Err(ApiError::invalid(
            FIELD,
            format!("must be an object, got {other}"),
        )),
    }
}

/// The messages as template input: roles checked, content as text.
fn template_messages(messages: &[ChatMessage]) -> Result<Vec<Map<String, Value>>, ApiError> {
    let mut msgs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !CHAT_ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!(
                    "unknown role `{}` (one of {})",
                    m.role,
                    CHAT_ROLES.join(", ")
                ),
            ));
        }
        let mut obj = m.extra.clone();
        obj.insert("role".into(), Value::String(m.role.clone()));
        obj.insert("content".into(), Value::String(content_text(m, i)?));
        msgs.push(obj);
    }
    Ok(msgs)
}

/// Show `tools` in the system prompt (a template that cannot render them): appended to a
/// leading system/developer message, else as a new first system message; earlier assistant
/// `tool_calls` are written in the format the model is told to use.
fn inject_tools(msgs: &mut Vec<Map<String, Value>>, tools: &Tools, parser: ToolParser) {
    let Some(text) = tool_prompt::system_text(tools, parser) else {
        return;
    };
    for m in msgs.iter_mut() {
        let calls = match m.get("tool_calls") {
            Some(c) if m.get("role").and_then(Value::as_str) == Some("assistant") => {
                tool_prompt::calls_as_text(c, parser)
            }
            _ => continue,
        };
        if let Some(Value::String(content)) = m.get_mut("content") {
            if !content.is_empty() && !calls.is_empty() {
                content.push('\n');
            }
            content.push_str(&calls);
        }
    }
    let leads = msgs
        .first()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        .is_some_and(|r| r == "system" || r == "developer");
    match (leads, msgs.first_mut().and_then(|m| m.get_mut("content"))) {
        (true, Some(Value::String(content))) => {
            content.push_str("\n\n");
            content.push_str(&text);
        }
        _ => {
            let system = Map::from_iter([
                ("role".to_string(), Value::String("system".into())),
                ("content".to_string(), Value::String(text)),
            ]);
            msgs.insert(0, system);
        }
    }
}

/// Render the conversation into the prompt text.
pub fn render(
    state: &AppState,
    messages: &[ChatMessage],
    opts: RenderOptions<'_>,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let model = state.model.as_deref().and_then(|m| m.template.as_ref());
    let own;
    let (template, error_field): (&ChatTemplate, &str) = match (opts.template, model) {
        (Some(src), base) => {
            // NOTE: with no model template (token-id-only router) the special tokens are empty.
            own = match base {
                Some(b) => b.with_source(src),
                None => ChatTemplate::new(src, "", ""),
            }
            .map_err(|e| ApiError::invalid("chat_template", format!("invalid template: {e}")))?;
            (&own, "chat_template")
        }
        (None, Some(t)) => (t, "messages"),
        (None, None) => {
            return Err(ApiError::invalid(
                "messages",
                "this model has no chat template (send `chat_template`)",
            ))
        }
    };
    let mut kwargs = kwargs(opts.kwargs)?;
    if let Some(effort) = opts.reasoning_effort {
        const FIELD: &str = "reasoning_effort";
        if !template.reads(FIELD) {
            return Err(ApiError::invalid(
                FIELD,
                "this model's chat template does not read `reasoning_effort`",
            ));
        }
        kwargs.insert(FIELD.into(), Value::String(effort.into()));
    }
    let mut msgs = template_messages(messages)?;
    let mut shown = None;
    if let Some(tools) = opts.tools {
        if template.supports_tools() {
            shown = Some(tools.list.as_slice());
        } else {
            let parser = opts.tool_parser.unwrap_or(ToolParser::Hermes);
            inject_tools(&mut msgs, tools, parser);
        }
    }
    let msgs: Vec<Value> = msgs.into_iter().map(Value::Object).collect();
    template
        .render_with_kwargs(&msgs, shown, &kwargs)
        .map_err(|e| ApiError::invalid(error_field, format!("chat template error: {e}")))
}
