//! `POST /v1/completions`: `prompt` is text or a list of token ids, or a batch of either
//! (a list of texts, a list of id lists: lm-eval's `--batch_size`), each prompt answered by
//! `n` choices (api/completion_chunks.rs formats them).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::answer;
use super::choices;
use super::completion_chunks::{CompletionChunks, Echo};
use super::fields;
use super::logprobs::{self, CompletionLogprobs};
use super::prepare::{self, SamplingInput};
use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::body::parse_body;
use crate::protocols::openai::{CompletionRequest, Prompt};

/// One prompt of the request: its ids, and its text when it was sent as text.
struct PromptIn {
    ids: Vec<u32>,
    text: Option<String>,
}

/// The request's prompts: one (text or ids), or a batch (a list of texts or of id lists, at
/// most `max_batch_prompts`). Every element is checked before any is submitted.
async fn prompts(state: &AppState, prompt: Option<Prompt>) -> Result<Vec<PromptIn>, ApiError> {
    let texts = match prompt {
        None => {
            return Err(ApiError::invalid(
                "prompt",
                "missing required field `prompt`",
            ))
        }
        Some(Prompt::Ids(ids)) => return Ok(vec![PromptIn { ids, text: None }]),
        Some(Prompt::IdBatch(v)) => {
            check_batch(state, v.len())?;
            return Ok(v
                .into_iter()
                .map(|ids| PromptIn { ids, text: None })
                .collect());
        }
        Some(Prompt::Text(t)) => vec![t],
        Some(Prompt::Texts(v)) => {
            check_batch(state, v.len())?;
            v
        }
    };
    let mut out = Vec::with_capacity(texts.len());
    for t in texts {
        let ids = prepare::encode(state, &t, true, "prompt").await?;
        out.push(PromptIn { ids, text: Some(t) });
    }
    Ok(out)
}

/// 400 naming `prompt` for an empty batch or one over the configured limit.
fn check_batch(state: &AppState, len: usize) -> Result<(), ApiError> {
    let max = state.router.cfg.max_batch_prompts;
    if len == 0 {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    if len > max {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{len} prompts in one request; this server takes at most {max} (max_batch_prompts)"
            ),
        ));
    }
    Ok(())
}

/// Handler (an error is answered in the OpenAI shape, `ApiError`'s `IntoResponse`).
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(&body)?;
    let (tier, n) = prepare::openai_common(&state, &headers, &req.common)?;
    let mut sampling = SamplingInput::from_body(&req.common);
    // OpenAI's default for /v1/completions is 16 tokens.
    sampling.default_max_tokens = Some(16);
    sampling.logprobs = logprobs::completion_request(&req.common)?;
    sampling.grammar = structured_only(&req.common)?;
    // OpenAI's echo with logprobs reports the prompt's tokens too (lm-evaluation-harness
    // scores continuations this way).
    sampling.prompt_logprobs = sampling.logprobs.filter(|_| req.echo);
    let replies = fields::apply(&state, &req.common, &mut sampling).await?;
    if replies.tokens_as_ids {
        return Err(ApiError::invalid(
            "return_tokens_as_token_ids",
            "return_tokens_as_token_ids is supported by /v1/chat/completions only",
        ));
    }
    // NOTE: echo with max_tokens 0 answers the prompt alone (vLLM's scoring request): one
    // token is generated to get the prompt's logprobs, and dropped.
    let prompt_only = req.echo && sampling.max_tokens == Some(0);
    if prompt_only {
        sampling.max_tokens = Some(1);
    }
    let batched = matches!(req.prompt, Some(Prompt::Texts(_) | Prompt::IdBatch(_)));
    if batched && (replies.token_ids || replies.prompt_logprobs.is_some()) {
        let field = if replies.token_ids {
            "return_token_ids"
        } else {
            "prompt_logprobs"
        };
        return Err(ApiError::invalid(
            field,
            format!("{field} is supported for a single prompt only, not a batch"),
        ));
    }
    let batch = prompts(&state, req.prompt).await?;
    let stops = req.common.stop_strings();
    // NOTE: the echo's logprobs follow `echo`, not `prompt_logprobs` (asked for below).
    let echo_logprobs = sampling.prompt_logprobs;
    fields::want_prompt_logprobs(&mut sampling, &replies);
    let mut built = Vec::with_capacity(batch.len());
    let mut echoes = Vec::with_capacity(batch.len());
    for (i, p) in batch.into_iter().enumerate() {
        let ids = fields::truncate(&state, &req.common, p.ids);
        let submit = prepare::build(&state, tier, ids, "prompt", &sampling).map_err(|mut e| {
            // NOTE: a batch's prompt errors say which prompt; sampling errors are the same
            // for every prompt and say nothing more.
            if batched && e.param.as_deref() == Some("prompt") {
                e.message = format!("prompt {i}: {}", e.message);
            }
            e
        })?;
        let ids = &submit.input_ids;
        let text = req.echo.then(|| match (p.text, state.model.as_deref()) {
            (Some(t), _) => t,
            (None, Some(m)) => crate::tokenize::Decode::decode(m, ids),
            (None, None) => String::new(),
        });
        let ids = echo_logprobs.map(|_| ids.clone());
        echoes.push(Echo { text, ids });
        built.push(submit);
    }
    let prompt_ids = built[0].input_ids.clone();
    let all = choices::submit_batch(&state, built, &stops, sampling.output, n)?;
    replies.log(&all);
    let choices = all.len();
    let fmt = CompletionChunks {
        id: replies.response_id("cmpl-", all[0].id),
        model: state.served_model().to_string(),
        created: unix_now(),
        include_usage: req.common.include_usage(),
        n,
        echoes,
        prompt_only,
        logprobs: sampling.logprobs.map(|_| {
            (0..choices)
                .map(|_| CompletionLogprobs::default())
                .collect()
        }),
        files: state.model.clone(),
        echoed: vec![false; choices],
    };
    answer::respond(&state, all, req.common.stream, fmt, replies, &prompt_ids).await
}

/// `response_format`'s grammar; `tools` (a chat feature: calls need a chat template) refused.
fn structured_only(
    c: &crate::protocols::openai::CommonParams,
) -> Result<Option<crate::protocols::structured::Grammar>, ApiError> {
    use crate::protocols::{structured, tools};
    let tools = tools::parse(c.tools.as_ref(), c.tool_choice.as_ref())
        .map_err(|(field, why)| ApiError::invalid(field, why))?;
    if tools.is_some() {
        return Err(ApiError::invalid(
            "tools",
            "tools are supported by /v1/chat/completions only",
        ));
    }
    structured::response_format(c.response_format.as_ref())
        .map_err(|why| ApiError::invalid(structured::FIELD, why))
}
