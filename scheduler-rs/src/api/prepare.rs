//! Request validation shared by every generation endpoint: model name, tier, prompt length
//! against the context window, and sampling parameters.

use axum::http::HeaderMap;

use super::output::OutputOptions;
use super::AppState;
use crate::errors::ApiError;
use crate::ids::TierId;
use crate::protocols::openai::CommonParams;
use crate::protocols::sampling_fields::{GenerateBody, SamplingFields};
use crate::protocols::worker::{Output, Sampling, Stop};
use crate::state::{CacheHints, Submit};

/// A generation's fields as the endpoint gathered them from the body (`from_body`) and its
/// own fields (logprobs, grammar, vLLM's extensions), with the names of the fields used.
#[derive(Debug, Clone, Default)]
pub struct SamplingInput {
    pub max_tokens: Option<i64>,
    /// `max_tokens`, `max_completion_tokens` or `max_new_tokens`, for error messages.
    pub max_tokens_field: &'static str,
    /// Used when `max_tokens` is absent (capped by the context window).
    pub default_max_tokens: Option<u32>,
    pub min_tokens: Option<i64>,
    /// `min_tokens` or `min_new_tokens`, for error messages.
    pub min_tokens_field: &'static str,
    /// The sampler's knobs (protocols/sampling_fields.rs checks them).
    pub knobs: SamplingFields,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Within its class on the worker, lower is served first (vLLM's `priority`).
    pub priority: Option<i64>,
    /// Alternatives per token with logprobs (already checked, 0..=20); `None`: no logprobs.
    pub logprobs: Option<u32>,
    /// The same for the prompt's tokens (completions' echo); `None`: none.
    pub prompt_logprobs: Option<u32>,
    /// Structured output: the grammar the output must match (set by the endpoint).
    pub grammar: Option<crate::protocols::structured::Grammar>,
    /// vLLM's `allowed_token_ids` and tokenized `bad_words` (api/fields.rs).
    pub allowed_token_ids: Vec<u32>,
    pub bad_words: Vec<Vec<u32>>,
    /// Prefix-cache salt and affinity key (api/fields.rs).
    pub cache: CacheHints,
    /// How the text is made (special tokens, the stop string).
    pub output: OutputOptions,
}

impl SamplingInput {
    /// What every generation body says (OpenAI's or the native one, through `GenerateBody`).
    pub fn from_body(body: &impl GenerateBody) -> Self {
        let (max_tokens, max_tokens_field) = body.max_tokens();
        let (min_tokens, min_tokens_field) = body.min_tokens();
        SamplingInput {
            max_tokens,
            max_tokens_field,
            min_tokens,
            min_tokens_field,
            knobs: body.sampling_fields().clone(),
            stop_token_ids: body.stop_token_ids().to_vec(),
            ignore_eos: body.ignore_eos(),
            priority: body.priority(),
            ..SamplingInput::default()
        }
    }
}

/// 404 unless `model` is one of the served model's names.
///
/// NOTE: a request without `model` gets the one served model, as vLLM and SGLang answer it
/// (OpenAI's 400 broke clients written for them).
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !state.serves_model(m) => Err(ApiError::model_not_found(m)),
        _ => Ok(()),
    }
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: i64 = 16;

/// The number of choices: 400 for `n` outside `1..=MAX_CHOICES`.
pub fn check_n(n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(k) if (1..=MAX_CHOICES).contains(&k) => Ok(k as usize),
        Some(k) => Err(ApiError::invalid(
            "n",
            format!("n must be an integer in [1, {MAX_CHOICES}], got {k}"),
        )),
    }
}

/// Resolve the tier (auth included). Called before any expensive work.
pub fn tier(
    state: &AppState,
    headers: &HeaderMap,
    body_tier: Option<&str>,
) -> Result<TierId, ApiError> {
    state.auth.resolve_tier(headers, body_tier)
}

/// The checks every OpenAI endpoint makes first: tier and auth, model name, `n`.
/// Returns the tier and the number of choices.
pub fn openai_common(
    state: &AppState,
    headers: &HeaderMap,
    common: &CommonParams,
) -> Result<(TierId, usize), ApiError> {
    let tier = tier(state, headers, common.tier.as_deref())?;
    check_model(state, common.model.as_deref())?;
    let n = check_n(common.n)?;
    if let Some((field, why)) = crate::protocols::openai::unsupported(common) {
        return Err(ApiError::invalid(&field, why));
    }
    Ok((tier, n))
}

/// Validate the prompt and sampling and build the engine request.
pub fn build(
    state: &AppState,
    tier: TierId,
    input_ids: Vec<u32>,
    prompt_field: &str,
    s: &SamplingInput,
) -> Result<Submit, ApiError> {
    let model = state.model.as_deref();
    if input_ids.is_empty() {
        return Err(ApiError::invalid(prompt_field, "the prompt is empty"));
    }
    if let Some(m) = model {
        // NOTE: every token id a client sends is checked here: a worker indexing its logits
        // with an id past the vocabulary fails the whole batch, not just this request.
        let vocab = m.vocab_size() as u32;
        let outside = |ids: &[u32], field: &str| match ids.iter().find(|&&t| t >= vocab) {
            Some(bad) => Err(ApiError::invalid(
                field,
                format!("token id {bad} is outside the vocabulary (size {vocab})"),
            )),
            None => Ok(()),
        };
        outside(&input_ids, prompt_field)?;
        outside(&s.stop_token_ids, "stop_token_ids")?;
    }
    // NOTE: capped by the most any worker's KV holds (its largest TP group's), so a prompt
    // no worker can serve is refused here, with the limit, rather than failing there.
    let max_context = model.map_or(usize::MAX, |m| m.max_context).min(
        state
            .router
            .worker_max_context()
            .map_or(usize::MAX, |c| c as usize),
    );
    let prompt = input_ids.len();
    if prompt >= max_context {
        return Err(ApiError::invalid(
            prompt_field,
            format!(
                "This model's maximum context length is {max_context} tokens, but the prompt \
                 ({prompt_field}) has {prompt} tokens; at least one token must remain for the output."
            ),
        ));
    }
    let room = (max_context - prompt).min(u32::MAX as usize) as u32;
    let cap = state.router.cfg.tier(tier).max_tokens;
    let max_tokens = match s.max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                s.max_tokens_field,
                format!("{} must be at least 1, got {m}", s.max_tokens_field),
            ))
        }
        Some(m) if cap.is_some_and(|c| m > i64::from(c)) => {
            return Err(ApiError::invalid(
                s.max_tokens_field,
                format!(
                    "{} is {m}, above the {} tier's cap of {}",
                    s.max_tokens_field,
                    state.router.cfg.tier(tier).name,
                    cap.unwrap_or_default()
                ),
            ))
        }
        // NOTE: a request asking for more than the window allows is capped, not refused.
        Some(m) => (m.min(i64::from(u32::MAX)) as u32).min(room),
        None => s
            .default_max_tokens
            .unwrap_or(room)
            .min(room)
            .min(cap.unwrap_or(u32::MAX)),
    };
    let mut stop_token_ids = s.stop_token_ids.clone();
    if !s.ignore_eos {
        for id in model.map_or(&[][..], |m| &m.eos_token_ids) {
            if !stop_token_ids.contains(id) {
                stop_token_ids.push(*id);
            }
        }
    }
    let priority = match s.priority.map(i32::try_from) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(_)) => {
            return Err(ApiError::invalid(
                "priority",
                "priority must be an integer in [-2147483648, 2147483647]",
            ))
        }
    };
    let defaults = model.map(|m| m.defaults.clone()).unwrap_or_default();
    let sampling = Sampling {
        allowed_token_ids: s.allowed_token_ids.clone(),
        bad_words: s.bad_words.clone(),
        ..s.knobs
            .sampling(&defaults, model.map(|m| m.vocab_size() as u32))?
    };
    let field = s.min_tokens_field;
    let min_tokens = match s.min_tokens {
        None => 0,
        Some(m) if (0..=i64::from(max_tokens)).contains(&m) => m as u32,
        Some(m) => {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be in [0, {max_tokens}] (the max tokens), got {m}"),
            ))
        }
    };
    let stop = Stop {
        max_tokens,
        min_tokens,
        stop_token_ids,
        ignore_eos: s.ignore_eos,
    };
    Ok(Submit {
        input_ids,
        resumed_tokens: 0,
        sampling,
        stop,
        output: Output {
            logprobs: s.logprobs,
            prompt_logprobs: s.prompt_logprobs,
        },
        tier,
        priority,
        fork_of: None,
        grammar: s.grammar.clone(),
        cache: s.cache.clone(),
    })
}

/// Tokenize `text` (503-free: a missing tokenizer is the client's 400).
///
/// NOTE: tokenizing runs on a blocking thread: a prompt of megabytes takes long enough to
/// stall every other request (and `/health`) sharing its async worker thread.
pub async fn encode(
    state: &AppState,
    text: &str,
    special: bool,
    field: &str,
) -> Result<Vec<u32>, ApiError> {
    let model = state
        .model
        .clone()
        .ok_or_else(|| ApiError::invalid(field, "this router has no tokenizer; send token ids"))?;
    let text = text.to_string();
    tokio::task::spawn_blocking(move || model.encode(&text, special))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
        .map_err(|e| ApiError::invalid(field, e.to_string()))
}
