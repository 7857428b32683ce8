//! The choices of a `/v1/completions` response, streamed or whole: echo, logprobs, usage.
//!
//! NOTE: a request of `p` prompts and `n` choices has `p * n` choices, choice `i` answering
//! prompt `i / n` (vLLM's and OpenAI's order: `index = prompt_index * n + choice`); the
//! streams are kept in that order, so a stream's position is its choice's `index`.

use std::sync::Arc;

use serde_json::{json, Value};

use super::answer::{Collected, WholeBody};
use super::logprobs::CompletionLogprobs;
use super::output::{Piece, TextStream};
use super::sse::ChunkFormat;
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::ModelFiles;

/// What one prompt of the batch echoes.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    /// The prompt text every choice of this prompt starts with (`echo`).
    pub text: Option<String>,
    /// With echo and logprobs: the prompt's ids; the echo then goes out with the first piece,
    /// which carries the prompt's logprobs (they come with the first token).
    pub ids: Option<Vec<u32>>,
}

pub struct CompletionChunks {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub include_usage: bool,
    /// Choices per prompt (`n`).
    pub n: usize,
    /// One per prompt.
    pub echoes: Vec<Echo>,
    /// `echo` with `max_tokens: 0`: only the prompt is answered (its logprobs when asked);
    /// the one token generated to get them is dropped.
    pub prompt_only: bool,
    /// One per choice when the request asked for logprobs (the tokenizer names tokens).
    pub logprobs: Option<Vec<CompletionLogprobs>>,
    pub files: Option<Arc<ModelFiles>>,
    /// Per choice: whether its echo went out.
    pub echoed: Vec<bool>,
}

impl CompletionChunks {
    fn chunk(&self, index: usize, text: &str, finish: Option<&str>, logprobs: Value) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created,
               "model": self.model,
               "choices": [{"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": finish}]})
    }

    fn echo(&self, index: usize) -> &Echo {
        &self.echoes[index / self.n]
    }

    /// Choice `index`'s `logprobs` for these tokens (null when the request did not ask),
    /// after the echoed prompt's when `prompt` is given.
    fn logprobs(
        &mut self,
        index: usize,
        prompt: Option<&[TokenLogprob]>,
        ids: &[u32],
        lps: &[TokenLogprob],
    ) -> Value {
        let echo_ids = self.echoes[index / self.n].ids.clone();
        match self.logprobs.as_mut() {
            None => Value::Null,
            Some(all) => {
                if let (Some(p), Some(echo)) = (prompt, echo_ids.as_deref()) {
                    all[index].push_prompt(self.files.as_deref(), echo, p);
                }
                all[index].push(self.files.as_deref(), ids, lps);
                all[index].take()
            }
        }
    }
}

impl WholeBody for CompletionChunks {
    const OBJECT: &'static str = "text_completion";

    fn head(&self) -> (&str, u64, &str) {
        (&self.id, self.created, &self.model)
    }

    fn choice(&mut self, index: usize, out: &Collected, ts: &TextStream) -> Value {
        let (text, ids, finish) = out;
        let prompt = ts.prompt_logprobs.as_deref().or(Some(&[]));
        let (text, ids, lps, finish) = if self.prompt_only {
            ("", &[][..], &[][..], "length")
        } else {
            (text.as_str(), &ids[..], &ts.logprobs[..], *finish)
        };
        let lps = self.logprobs(index, prompt, ids, lps);
        let echo = self.echo(index).text.clone().unwrap_or_default();
        json!({"index": index, "text": echo + text, "logprobs": lps, "finish_reason": finish})
    }

    /// `usage` of the whole batch: each prompt's tokens once (however many choices it has),
    /// every choice's completion tokens (none when only the prompt is answered).
    fn usage(&self, all: &[TextStream]) -> Value {
        let prompt: usize = all.iter().step_by(self.n).map(|ts| ts.prompt_tokens).sum();
        let completion: usize = if self.prompt_only {
            0
        } else {
            all.iter().map(|ts| ts.completion_tokens).sum()
        };
        // The prompt tokens each prompt's choice 0 found in its worker's prefix cache.
        let cached: usize = all
            .iter()
            .step_by(self.n)
            .map(|ts| ts.cached_tokens.unwrap_or(0) as usize)
            .sum();
        json!({"prompt_tokens": prompt, "completion_tokens": completion,
               "total_tokens": prompt + completion,
               "prompt_tokens_details": {"cached_tokens": cached}})
    }
}

impl ChunkFormat for CompletionChunks {
    fn start(&mut self, index: usize, _ts: &TextStream) -> Vec<Value> {
        let echo = self.echo(index);
        match &echo.text {
            Some(t) if !t.is_empty() && echo.ids.is_none() && !self.prompt_only => {
                let t = t.clone();
                self.echoed[index] = true;
                vec![self.chunk(index, &t, None, Value::Null)]
            }
            _ => Vec::new(),
        }
    }

    fn piece(&mut self, index: usize, ts: &TextStream, p: &Piece) -> Vec<Value> {
        // NOTE: with echo and logprobs (or prompt only) the first piece carries the prompt.
        let first = !self.echoed[index] && self.echo(index).text.is_some();
        if self.prompt_only {
            let finish = p.finish.map(|_| "length");
            if !first && finish.is_none() {
                return Vec::new();
            }
            let prompt = first.then(|| ts.prompt_logprobs.as_deref().unwrap_or_default());
            let lps = if first {
                self.logprobs(index, prompt, &[], &[])
            } else {
                Value::Null
            };
            self.echoed[index] = true;
            let text = match first {
                true => self.echo(index).text.clone().unwrap_or_default(),
                false => String::new(),
            };
            return vec![self.chunk(index, &text, finish, lps)];
        }
        if !first && p.text.is_empty() && p.finish.is_none() && p.logprobs.is_empty() {
            return Vec::new();
        }
        let prompt = first.then(|| ts.prompt_logprobs.as_deref().unwrap_or_default());
        let lps = self.logprobs(index, prompt, &p.ids, &p.logprobs);
        let text = match (first, &self.echo(index).text) {
            (true, Some(echo)) => format!("{echo}{}", p.text),
            _ => p.text.clone(),
        };
        self.echoed[index] = true;
        vec![self.chunk(index, &text, p.finish, lps)]
    }

    fn end(&mut self, all: &[TextStream]) -> Vec<Value> {
        if !self.include_usage {
            return Vec::new();
        }
        vec![
            json!({"id": self.id, "object": "text_completion", "created": self.created,
                   "model": self.model, "choices": [], "usage": self.usage(all)}),
        ]
    }
}
