//! Reasoning in chat replies: `--reasoning-parser` splits it off the reply's text into
//! `reasoning_content` (Responses: a reasoning item); the request's `include_reasoning:
//! false` drops it, and its `reasoning_effort` is a chat template variable.

use serde_json::Value;

use super::AppState;
use crate::errors::ApiError;
use crate::parsers::reasoning::{ReasoningParser, ReasoningStream, Split};
use crate::protocols::openai::ChatCompletionRequest;

/// OpenAI's `reasoning_effort` values.
pub const EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// How a request's reasoning is read out of its replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reasoning {
    pub parser: ReasoningParser,
    /// `include_reasoning` (default true): false drops what the parser read.
    pub include: bool,
}

impl Reasoning {
    /// A whole reply: its reasoning (empty when dropped) and its content.
    pub fn split(self, text: &str) -> Split {
        let mut s = self.parser.split(text);
        if !self.include {
            s.reasoning.clear();
        }
        s
    }
}

/// One streamed reply's reasoning state.
#[derive(Debug, Clone)]
pub struct ReasoningPieces {
    stream: ReasoningStream,
    include: bool,
}

impl ReasoningPieces {
    pub fn new(r: Reasoning) -> Self {
        ReasoningPieces {
            stream: ReasoningStream::new(r.parser),
            include: r.include,
        }
    }

    /// The next piece of the reply (`last`: the reply ends with it): what it decided.
    pub fn push(&mut self, text: &str, last: bool) -> Split {
        let mut s = self.stream.push(text);
        if last {
            s.append(self.stream.finish());
        }
        if !self.include {
            s.reasoning.clear();
        }
        s
    }
}

/// The request's `reasoning_effort` (for the chat template) and how its replies' reasoning
/// is read (None without `--reasoning-parser`).
pub fn from_request(
    state: &AppState,
    req: &ChatCompletionRequest,
) -> Result<(Option<String>, Option<Reasoning>), ApiError> {
    let effort = match &req.reasoning_effort {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Some(e.clone()),
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!(
                    "reasoning_effort must be one of {}, got {other}",
                    EFFORTS.join(", ")
                ),
            ))
        }
    };
    let include = match &req.include_reasoning {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::invalid(
                "include_reasoning",
                format!("include_reasoning must be a boolean, got {other}"),
            ))
        }
    };
    let parser = state.router.cfg.parsers.reasoning;
    Ok((effort, parser.map(|parser| Reasoning { parser, include })))
}
