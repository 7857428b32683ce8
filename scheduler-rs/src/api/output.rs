//! From engine events to client text: incremental detokenization, then stop strings.

use std::sync::Arc;

use crate::errors::ApiError;
use crate::protocols::worker::TokenLogprob;
use crate::state::{Event, RequestHandle};
use crate::tokenize::{Decode, IncrementalDetokenizer, ModelFiles, StopMatcher};

/// How a choice's text is made (vLLM's detokenization fields; the defaults are OpenAI's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputOptions {
    /// `skip_special_tokens: false`: special tokens appear in the text.
    pub keep_special: bool,
    /// `include_stop_str_in_output: true`: the matched stop string ends the text.
    pub keep_stop: bool,
}

/// The tokenizer decoding special tokens too.
struct WithSpecial<'a>(&'a ModelFiles);

impl Decode for WithSpecial<'_> {
    fn decode(&self, ids: &[u32]) -> String {
        (*self.0.tokenizer).decode(ids, false).unwrap_or_default()
    }
}

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
    options: OutputOptions,
    /// Prompt tokens the worker found in its prefix cache (first report; `None`: none yet).
    pub cached_tokens: Option<u32>,
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
            options: OutputOptions::default(),
            cached_tokens: None,
        }
    }

    /// Make the text as `options` say.
    pub fn with_options(mut self, options: OutputOptions) -> Self {
        if options.keep_stop {
            self.stop = std::mem::take(&mut self.stop).keeping_stop();
        }
        self.options = options;
        self
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
                Event::Cached(n) => {
                    // NOTE: a resumed request's new worker reports again: the first counts.
                    self.cached_tokens.get_or_insert(n);
                }
                ev => break ev,
            }
        };
        let (ids, finish, logprobs) = match ev {
            Event::Prompt(_) | Event::Cached(_) => unreachable!("taken by the loop above"),
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
        let keep_special = self.options.keep_special;
        // NOTE: as vLLM, the EOS that ends a request is not text, even with special tokens
        // shown (unless `include_stop_str_in_output`).
        let shown = match (&self.model, finish) {
            (Some(m), Some(crate::state::FinishReason::Stop))
                if keep_special
                    && !self.options.keep_stop
                    && ids.last().is_some_and(|t| m.eos_token_ids.contains(t)) =>
            {
                &ids[..ids.len() - 1]
            }
            _ => &ids[..],
        };
        let mut text = match &self.model {
            Some(m) if keep_special => self.detok.push(&WithSpecial(m), shown),
            Some(m) => self.detok.push(m.as_ref(), &ids),
            None => String::new(),
        };
        if finish.is_some() {
            if let Some(m) = &self.model {
                let rest = match keep_special {
                    true => self.detok.flush(&WithSpecial(m)),
                    false => self.detok.flush(m.as_ref()),
                };
                text.push_str(&rest);
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
/// n > 1), the completion tokens of every choice; `prompt_tokens_details.cached_tokens`:
/// the prompt tokens choice 0's worker found in its prefix cache.
pub fn usage(choices: &[TextStream]) -> serde_json::Value {
    let prompt = choices.first().map_or(0, |ts| ts.prompt_tokens);
    let completion: usize = choices.iter().map(|ts| ts.completion_tokens).sum();
    let cached = choices.first().and_then(|ts| ts.cached_tokens).unwrap_or(0);
    serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}
