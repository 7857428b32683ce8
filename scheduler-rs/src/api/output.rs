//! From engine events to client text: incremental detokenization, then stop strings.

use std::sync::Arc;

use crate::errors::ApiError;
use crate::protocols::worker::TokenLogprob;
use crate::state::{Event, RequestHandle};
use crate::tokenize::{IncrementalDetokenizer, ModelFiles, StopMatcher};

/// One step of output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Piece {
    /// New text (may be empty while a character or a possible stop string is incomplete).
    pub text: String,
    /// New token ids.
    pub ids: Vec<u32>,
    /// Set on the last piece: `"stop"` or `"length"`.
    pub finish: Option<&'static str>,
    /// One per id when the request asked for logprobs (else empty).
    pub logprobs: Vec<TokenLogprob>,
}

/// Output state of one request. Dropping it before the end aborts the request.
pub struct TextStream {
    handle: Option<RequestHandle>,
    model: Option<Arc<ModelFiles>>,
    detok: IncrementalDetokenizer,
    stop: StopMatcher,
    /// Completion tokens received.
    pub completion_tokens: usize,
    pub prompt_tokens: usize,
    /// Router request id.
    pub id: u64,
    pub class: crate::dispatch::Class,
    /// Every token's logprobs so far, when the request asked for them (non-stream responses).
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt tokens' logprobs after the first, once the worker sent them (echo).
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
    /// When the request times out (`request_timeout_ms` after submission); `None`: never.
    deadline: Option<tokio::time::Instant>,
}

impl TextStream {
    pub fn new(
        handle: RequestHandle,
        model: Option<Arc<ModelFiles>>,
        stops: Vec<String>,
        prompt_tokens: usize,
    ) -> Self {
        TextStream {
            id: handle.id(),
            class: handle.class(),
            handle: Some(handle),
            model,
            detok: IncrementalDetokenizer::new(),
            stop: StopMatcher::new(stops),
            completion_tokens: 0,
            logprobs: Vec::new(),
            prompt_logprobs: None,
            prompt_tokens,
            deadline: None,
        }
    }

    /// End the request with 408 if it is still generating `timeout` from now (0: never).
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.deadline = (!timeout.is_zero()).then(|| tokio::time::Instant::now() + timeout);
        self
    }

    /// Next piece; `None` once the final piece (or an error) was returned.
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        let ev = loop {
            let handle = self.handle.as_mut()?;
            let ev = match self.deadline {
                Some(at) => match tokio::time::timeout_at(at, handle.recv()).await {
                    Ok(ev) => ev?,
                    Err(_) => {
                        self.handle.take().expect("checked above").time_out();
                        return Some(Err(ApiError::timeout(format!(
                            "the request did not finish within the router's \
                             request_timeout_ms ({} tokens generated); it was aborted",
                            self.completion_tokens
                        ))));
                    }
                },
                None => handle.recv().await?,
            };
            match ev {
                Event::Prompt(lps) => self.prompt_logprobs = Some(lps),
                ev => break ev,
            }
        };
        let (ids, finish, logprobs) = match ev {
            Event::Prompt(_) => unreachable!("taken by the loop above"),
            Event::Error(msg) => {
                self.handle = None;
                return Some(Err(ApiError::internal(msg)));
            }
            Event::Invalid { param, message } => {
                self.handle = None;
                return Some(Err(ApiError::invalid(&param, message)));
            }
            Event::Tokens {
                ids,
                finish,
                logprobs,
            } => (ids, finish, logprobs.unwrap_or_default()),
        };
        self.logprobs.extend_from_slice(&logprobs);
        self.completion_tokens += ids.len();
        let mut text = match &self.model {
            Some(m) => self.detok.push(m.as_ref(), &ids),
            None => String::new(),
        };
        if finish.is_some() {
            if let Some(m) = &self.model {
                text.push_str(&self.detok.flush(m.as_ref()));
            }
        }
        let step = self.stop.push(&text);
        if step.stopped {
            // NOTE: the stop string ends the request here; nothing after it is streamed and
            // the worker is told to abort (unless it already finished).
            let handle = self.handle.take().expect("checked above");
            if finish.is_none() {
                handle.stop();
            }
            return Some(Ok(Piece {
                text: step.emit,
                ids,
                finish: Some("stop"),
                logprobs,
            }));
        }
        let mut out = step.emit;
        if let Some(f) = finish {
            out.push_str(&self.stop.flush());
            self.handle = None;
            return Some(Ok(Piece {
                text: out,
                ids,
                finish: Some(f.as_str()),
                logprobs,
            }));
        }
        Some(Ok(Piece {
            text: out,
            ids,
            finish: None,
            logprobs,
        }))
    }

    /// Drain the whole output (non-streaming responses): text, ids and finish reason.
    pub async fn collect(&mut self) -> Result<(String, Vec<u32>, &'static str), ApiError> {
        let mut text = String::new();
        let mut ids = Vec::new();
        while let Some(p) = self.next().await {
            let p = p?;
            text.push_str(&p.text);
            ids.extend_from_slice(&p.ids);
            if let Some(f) = p.finish {
                return Ok((text, ids, f));
            }
        }
        Err(ApiError::internal("the request ended without a result"))
    }

    /// `usage` object.
    pub fn usage(&self) -> serde_json::Value {
        usage(std::slice::from_ref(self))
    }
}

/// The `usage` of the choices of one request: the prompt counted once (OpenAI's way for
/// n > 1), the completion tokens of every choice.
pub fn usage(choices: &[TextStream]) -> serde_json::Value {
    let prompt = choices.first().map_or(0, |ts| ts.prompt_tokens);
    let completion: usize = choices.iter().map(|ts| ts.completion_tokens).sum();
    serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}
