//! vLLM's request fields on the OpenAI endpoints (protocols/vllm_fields.rs), applied: what
//! they change in the request (grammar, sampling masks, cache hints, the prompt, the text) and
//! in the reply (its id, token ids, logprob token names, prompt logprobs); streams: api/
//! fields_stream.rs.

use serde_json::{json, Value};

use super::output::{OutputOptions, TextStream};
use super::prepare::{self, SamplingInput};
use super::AppState;
use crate::errors::ApiError;
use crate::protocols::openai::CommonParams;
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::{Decode, ModelFiles};

/// What the fields ask of the reply.
#[derive(Debug, Clone, Default)]
pub struct Replies {
    /// The caller's `request_id` (the response id is `<prefix><it>`).
    pub request_id: Option<String>,
    /// `prompt_token_ids` on the response, `token_ids` on each choice (and chunk).
    pub token_ids: bool,
    /// Logprob tokens named `token_id:<id>`.
    pub tokens_as_ids: bool,
    /// Alternatives per prompt token for the response's `prompt_logprobs`.
    pub prompt_logprobs: Option<u32>,
    /// `stream_options.continuous_usage_stats`: usage on every chunk.
    pub continuous_usage: bool,
    /// No log line for this request (`--disable-log-requests`).
    pub quiet: bool,
}

/// Apply the request side of the fields to `sampling` (after the endpoint set its own
/// grammar: a vLLM structured field with `response_format` or a forced call is a 400).
pub async fn apply(
    state: &AppState,
    c: &CommonParams,
    sampling: &mut SamplingInput,
) -> Result<Replies, ApiError> {
    let f = &c.vllm;
    if let Some((name, grammar)) = f.grammar().map_err(|(n, why)| ApiError::invalid(&n, why))? {
        if sampling.grammar.is_some() {
            return Err(ApiError::invalid(
                &name,
                "cannot be combined with response_format or a tool_choice that forces a call",
            ));
        }
        sampling.grammar = Some(grammar);
    }
    if let Some(allowed) = &f.allowed_token_ids {
        check_ids(state, "allowed_token_ids", allowed)?;
        sampling.allowed_token_ids = allowed.clone();
    }
    for word in f.bad_words.iter().flatten() {
        sampling.bad_words.extend(bad_word_ids(state, word).await?);
    }
    if let Some(salt) = &f.cache_salt {
        if salt.is_empty() {
            return Err(ApiError::invalid(
                "cache_salt",
                "cache_salt must not be empty",
            ));
        }
        sampling.cache.salt = Some(salt.clone());
    }
    sampling.cache.key = f.prompt_cache_key.clone().filter(|k| !k.is_empty());
    sampling.output = OutputOptions {
        keep_special: f.skip_special_tokens == Some(false),
        keep_stop: f.include_stop_str_in_output == Some(true),
    };
    let prompt_logprobs = match f.prompt_logprobs {
        None => None,
        Some(_) if c.stream => {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                "prompt_logprobs are not available when stream is true",
            ))
        }
        Some(k) if (0..=super::logprobs::MAX_TOP).contains(&k) => Some(k as u32),
        Some(k) => {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                format!("prompt_logprobs must be an integer in [0, 20], got {k}"),
            ))
        }
    };
    let continuous = c
        .stream_options
        .as_ref()
        .is_some_and(|o| o.continuous_usage_stats);
    Ok(Replies {
        request_id: f.request_id.clone(),
        token_ids: f.return_token_ids == Some(true),
        tokens_as_ids: f.return_tokens_as_token_ids == Some(true),
        prompt_logprobs,
        continuous_usage: continuous && c.stream,
        quiet: !state.router.cfg.log_requests,
    })
}

/// Ask the worker for the prompt's logprobs when the reply needs them (at least as many
/// alternatives as another use asked for).
pub fn want_prompt_logprobs(sampling: &mut SamplingInput, replies: &Replies) {
    if let Some(k) = replies.prompt_logprobs {
        sampling.prompt_logprobs = Some(sampling.prompt_logprobs.map_or(k, |had| had.max(k)));
    }
}

/// 400 naming `field` unless `ids` is non-empty and inside the vocabulary.
fn check_ids(state: &AppState, field: &str, ids: &[u32]) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid(
            field,
            format!("{field} must not be empty"),
        ));
    }
    let vocab = state
        .model
        .as_deref()
        .map_or(u32::MAX, |m| m.vocab_size() as u32);
    match ids.iter().find(|&&t| t >= vocab) {
        Some(bad) => Err(ApiError::invalid(
            field,
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        )),
        None => Ok(()),
    }
}

/// A bad word's token id sequences (vLLM's rule): the word as it is, and with a leading
/// space when that tokenizes to as many tokens, starting differently.
async fn bad_word_ids(state: &AppState, word: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let word = word.trim_start();
    if word.is_empty() {
        return Err(ApiError::invalid(
            "bad_words",
            "a bad word must not be empty",
        ));
    }
    let bare = prepare::encode(state, word, false, "bad_words").await?;
    let spaced = prepare::encode(state, &format!(" {word}"), false, "bad_words").await?;
    let mut out = vec![bare.clone()];
    if spaced.len() == bare.len() && spaced.first() != bare.first() {
        out.push(spaced);
    }
    Ok(out.into_iter().filter(|ids| !ids.is_empty()).collect())
}

/// The prompt after vLLM's `truncate_prompt_tokens`: its last k tokens (-1: as many as the
/// context window leaves room for with one output token).
pub fn truncate(state: &AppState, c: &CommonParams, mut ids: Vec<u32>) -> Vec<u32> {
    let keep = match c.vllm.truncate_prompt_tokens {
        None => return ids,
        Some(-1) => {
            let window = state.model.as_deref().map_or(usize::MAX, |m| m.max_context);
            let workers = state
                .router
                .worker_max_context()
                .map_or(usize::MAX, |w| w as usize);
            window.min(workers).saturating_sub(1)
        }
        // NOTE: other values were refused by `VllmFields::check`.
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    if ids.len() > keep {
        ids.drain(..ids.len() - keep);
    }
    ids
}

impl Replies {
    /// The response id: `<prefix><request_id>`, else `<prefix><router id>`.
    pub fn response_id(&self, prefix: &str, router_id: u64) -> String {
        match &self.request_id {
            Some(rid) => format!("{prefix}{rid}"),
            None => format!("{prefix}{router_id}"),
        }
    }

    /// Log which router request serves the caller's `request_id` (the router's own ids stay
    /// unique: two requests may share a caller's id).
    pub fn log(&self, all: &[TextStream]) {
        if let Some(rid) = self.request_id.as_ref().filter(|_| !self.quiet) {
            let ids: Vec<u64> = all.iter().map(|ts| ts.id).collect();
            tracing::info!(request_id = %rid, router_ids = ?ids, "request");
        }
    }

    /// Add what the fields ask to a non-streamed response `body` (its `choices[i]` made from
    /// `outputs[i]`'s ids); `prompt` is the prompt's ids.
    pub fn finish_body(
        &self,
        body: &mut Value,
        prompt: &[u32],
        all: &[TextStream],
        ids: &[&[u32]],
        files: Option<&ModelFiles>,
    ) {
        if self.token_ids {
            body["prompt_token_ids"] = json!(prompt);
            if let Some(choices) = body["choices"].as_array_mut() {
                for (choice, ids) in choices.iter_mut().zip(ids) {
                    choice["token_ids"] = json!(ids);
                }
            }
        }
        if let Some(k) = self.prompt_logprobs {
            let lps = all.first().and_then(|ts| ts.prompt_logprobs.as_deref());
            body["prompt_logprobs"] = prompt_logprobs(files, prompt, lps.unwrap_or_default(), k);
        }
    }
}

/// vLLM's `prompt_logprobs`: null for the first token, then per token a map from token id
/// (as a string) to `{logprob, rank, decoded_token}`: the token itself and its `k` most
/// likely alternatives (`rank` 1 is the most likely; the token's own rank is its place among
/// them, or k + 1 when it is not one).
fn prompt_logprobs(files: Option<&ModelFiles>, ids: &[u32], lps: &[TokenLogprob], k: u32) -> Value {
    let text = |id: u32| files.map(|m| m.decode(&[id])).unwrap_or_default();
    let mut out = vec![Value::Null];
    for (&id, lp) in ids.iter().skip(1).zip(lps) {
        let top = &lp.top[..lp.top.len().min(k as usize)];
        let mut entry = serde_json::Map::new();
        for (rank, &(alt, v)) in top.iter().enumerate() {
            entry.insert(
                alt.to_string(),
                json!({"logprob": v, "rank": rank + 1, "decoded_token": text(alt)}),
            );
        }
        let rank = top
            .iter()
            .position(|&(alt, _)| alt == id)
            .map_or(k as usize + 1, |r| r + 1);
        entry.insert(
            id.to_string(),
            json!({"logprob": lp.logprob, "rank": rank, "decoded_token": text(id)}),
        );
        out.push(Value::Object(entry));
    }
    Value::Array(out)
}

/// Chat `logprobs.content` entries (and their alternatives) named `token_id:<id>`, as
/// vLLM's `return_tokens_as_token_ids` asks (`bytes` then hold that name's).
pub fn name_tokens_by_id(content: &mut [Value], ids: &[u32], lps: &[TokenLogprob]) {
    let rename = |e: &mut Value, id: u32| {
        let name = format!("token_id:{id}");
        e["bytes"] = json!(name.as_bytes());
        e["token"] = Value::String(name);
    };
    for ((entry, &id), lp) in content.iter_mut().zip(ids).zip(lps) {
        rename(entry, id);
        if let Some(top) = entry["top_logprobs"].as_array_mut() {
            for (alt, &(alt_id, _)) in top.iter_mut().zip(&lp.top) {
                rename(alt, alt_id);
            }
        }
    }
}
