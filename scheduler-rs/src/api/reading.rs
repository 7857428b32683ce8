//! How a chat reply's text is read: reasoning split off first (api/reasoning_reply.rs), then tool
//! calls read from the rest (api/tool_reply.rs). Whole replies and streams read alike.

use serde_json::{json, Value};

use super::reasoning_reply::{Reasoning, ReasoningPieces};
use super::tool_reply::{self, CallFormat};
use crate::parsers::reasoning::Split;

/// How one request's replies are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// Set when tool calls are read from the replies.
    pub calls: Option<CallFormat>,
    /// Set with `--reasoning-parser`.
    pub reasoning: Option<Reasoning>,
}

impl Reading {
    /// A whole reply's reasoning and content (all content without a reasoning parser).
    pub fn split(&self, text: &str) -> Split {
        match self.reasoning {
            Some(r) => r.split(text),
            None => Split {
                reasoning: String::new(),
                content: text.to_string(),
            },
        }
    }

    /// A streamed reply's reasoning state (None without a reasoning parser).
    pub fn pieces(&self) -> Option<ReasoningPieces> {
        self.reasoning.map(ReasoningPieces::new)
    }

    /// The assistant message and finish reason of a finished reply. With a reasoning
    /// parser the message has `reasoning_content` (null when none), and content null when
    /// none is left (as vLLM answers).
    pub fn message(
        &self,
        request_id: &str,
        text: &str,
        finish: &'static str,
    ) -> (Value, &'static str) {
        let split = self.split(text);
        let (mut msg, finish) = tool_reply::message(self.calls, request_id, split.content, finish);
        if self.reasoning.is_some() {
            let reasoning = (!split.reasoning.is_empty()).then_some(split.reasoning);
            msg["reasoning_content"] = json!(reasoning);
            if msg["content"] == "" {
                msg["content"] = Value::Null;
            }
        }
        (msg, finish)
    }
}
