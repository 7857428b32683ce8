//! What leaves the router state: messages for the transport, a request's events to its
//! receiver, and why a request ended early.

use bytes::Bytes;

/// A message for the transport to send to one worker.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub identity: Bytes,
    pub payload: Bytes,
}

/// Why generation finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a request's receiver gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New token ids; the last event of a request carries a finish reason.
    Tokens {
        ids: Vec<u32>,
        finish: Option<FinishReason>,
        /// One per id when the request asked for logprobs.
        logprobs: Option<Vec<crate::protocols::worker::TokenLogprob>>,
    },
    /// The request failed; nothing follows.
    Error(String),
    /// The worker refused the request's input `param` (a 400 naming it); nothing follows.
    Invalid { param: String, message: String },
    /// The prompt tokens' logprobs after the first (echo with logprobs), before the first
    /// `Tokens`; not a final event.
    Prompt(Vec<crate::protocols::worker::TokenLogprob>),
    /// Prompt tokens the worker found in its prefix cache, before the first `Tokens`; not a
    /// final event.
    Cached(u32),
}

/// Why a request left before its worker finished it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyEnd {
    /// The router matched a stop string: a normal completion.
    StopString,
    /// The client disconnected.
    Cancelled,
    /// The request ran past `request_timeout_ms`.
    TimedOut,
}
