//! `POST /generate`, SGLang-style: `{"input_ids": [...] | "text": "...", "sampling_params":
//! {...}}` → `{"text", "output_ids", "meta_info"}`. With `"stream": true`, each SSE chunk
//! carries the text and ids generated so far (cumulative, as SGLang streams by default, so
//! its clients keep the last chunk's `text`); the last one has `meta_info.finish_reason`.
//! With `return_logprob`, `meta_info` carries SGLang's `output_token_logprobs` (and
//! `output_top_logprobs` with `top_logprobs_num`), cumulative like the text, and with
//! `logprob_start_len` ≥ 0 the prompt's (`input_token_logprobs`). Fields SGLang has
//! and Nitsum lacks are refused by name unless neutral (protocols/extensions.rs).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::logprobs;
use super::output::{Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::processors::Processors;
use super::sse::{self, ChunkFormat};
use super::AppState;
use crate::errors::ApiError;
use crate::protocols::extensions;
use crate::protocols::openai::{parse_body, NativeGenerateRequest};
use crate::protocols::structured::Grammar;
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::ModelFiles;

/// SGLang's default `max_new_tokens`.
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;

/// The logprobs a request asked for, gathered so far in SGLang's shapes.
struct Logprobs {
    files: Option<Arc<ModelFiles>>,
    top: u32,
    with_text: bool,
    tokens: Vec<Value>,
    tops: Vec<Value>,
    /// With `logprob_start_len` ≥ 0: the prompt and the token its logprobs start at.
    input: Option<(Vec<u32>, usize)>,
}

impl Logprobs {
    fn push(&mut self, ids: &[u32], lps: &[TokenLogprob]) {
        let (tokens, tops) =
            logprobs::sglang_entries(self.files.as_deref(), ids, lps, self.with_text);
        self.tokens.extend(tokens);
        self.tops.extend(tops);
    }
}

struct Meta {
    tier: String,
    start: Instant,
    /// The caller's `rid`, else the router's id.
    rid: Option<String>,
    /// Text and ids streamed so far.
    text: String,
    ids: Vec<u32>,
    logprobs: Option<Logprobs>,
}

impl Meta {
    fn info(&self, ts: &TextStream, finish: Option<&str>) -> Value {
        let mut info = json!({
            "id": self.rid.clone().unwrap_or_else(|| ts.id.to_string()),
            "prompt_tokens": ts.prompt_tokens,
            "completion_tokens": ts.completion_tokens,
            "cached_tokens": ts.cached_tokens.unwrap_or(0),
            "finish_reason": finish.map(|f| json!({"type": f})),
            "e2e_latency": self.start.elapsed().as_secs_f64(),
            "tier": self.tier,
            "class": ts.class.as_str(),
        });
        if let Some(lp) = &self.logprobs {
            info["output_token_logprobs"] = json!(lp.tokens);
            if lp.top > 0 {
                info["output_top_logprobs"] = json!(lp.tops);
            }
            if let (Some((ids, start)), Some(lps)) = (&lp.input, &ts.prompt_logprobs) {
                let files = lp.files.as_deref();
                let (tokens, tops) =
                    logprobs::sglang_input_entries(files, ids, lps, *start, lp.with_text);
                info["input_token_logprobs"] = json!(tokens);
                if lp.top > 0 {
                    info["input_top_logprobs"] = json!(tops);
                }
            }
        }
        info
    }
}

impl ChunkFormat for Meta {
    fn piece(&mut self, _index: usize, ts: &TextStream, p: &Piece) -> Vec<Value> {
        self.text.push_str(&p.text);
        self.ids.extend_from_slice(&p.ids);
        if let Some(lp) = &mut self.logprobs {
            lp.push(&p.ids, &p.logprobs);
        }
        let info = self.info(ts, p.finish);
        vec![json!({"text": self.text, "output_ids": self.ids, "meta_info": info})]
    }
}

/// Handler.
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    prepare::respond(run(state, headers, body).await)
}

async fn run(state: Arc<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req: NativeGenerateRequest = parse_body(&body)?;
    let sp = &req.sampling_params;
    let unknown = extensions::refused_native(&req.extra)
        .or_else(|| extensions::refused_native_sampling(&sp.extra));
    if let Some((field, why)) = unknown {
        return Err(ApiError::invalid(&field, why));
    }
    let asked = logprobs::native_request(&req)?;
    let grammar = match &sp.json_schema {
        None => None,
        Some(text) => {
            let field = "sampling_params.json_schema";
            let schema: Value = serde_json::from_str(text)
                .map_err(|e| ApiError::invalid(field, format!("not JSON: {e}")))?;
            Some(Grammar::json_schema(&schema).map_err(|e| ApiError::invalid(field, e))?)
        }
    };
    let tier = prepare::tier(&state, &headers, req.tier.as_deref())?;
    let (ids, field) = match (req.input_ids, req.text.as_deref()) {
        // NOTE: as SGLang, one prompt: which of two would win is a guess the client must
        // not have to make.
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "text",
                "send either `text` or `input_ids`, not both",
            ))
        }
        (Some(ids), None) => (ids, "input_ids"),
        (None, Some(t)) => (prepare::encode(&state, t, true, "text").await?, "text"),
        (None, None) => return Err(ApiError::invalid("input_ids", "send `input_ids` or `text`")),
    };
    let top = asked.map(|(top, _)| top);
    let input_start = asked.and_then(|(_, start)| start);
    if let Some(start) = input_start.filter(|&s| s >= ids.len()) {
        return Err(ApiError::invalid(
            "logprob_start_len",
            format!("{start} is not below the prompt's {} tokens", ids.len()),
        ));
    }
    let prompt = input_start.map(|s| (ids.clone(), s));
    let sampling = SamplingInput {
        max_tokens: sp.max_new_tokens,
        max_tokens_field: "max_new_tokens",
        default_max_tokens: Some(DEFAULT_MAX_NEW_TOKENS),
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: sp.top_k,
        seed: sp.seed,
        stop_token_ids: sp.stop_token_ids.clone(),
        ignore_eos: sp.ignore_eos,
        priority: req.priority,
        processors: Processors {
            presence_penalty: sp.presence_penalty,
            frequency_penalty: sp.frequency_penalty,
            repetition_penalty: sp.repetition_penalty,
            logit_bias: sp.logit_bias.clone(),
            min_tokens: sp.min_new_tokens,
            min_tokens_field: "min_new_tokens",
            min_p: sp.min_p,
        },
        logprobs: top,
        prompt_logprobs: input_start.and(top),
        grammar,
        ..SamplingInput::default()
    };
    let stops = sp.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    let mut ts = prepare::start(&state, tier, ids, field, &sampling, stops)?;
    let mut meta = Meta {
        tier: state.router.cfg.tier(tier).name.clone(),
        start,
        rid: req.rid.clone(),
        text: String::new(),
        ids: Vec::new(),
        logprobs: top.map(|top| Logprobs {
            files: state.model.clone(),
            top,
            with_text: req.return_text_in_logprobs,
            tokens: Vec::new(),
            tops: Vec::new(),
            input: prompt,
        }),
    };
    if req.stream {
        return Ok(sse::respond(vec![ts], meta));
    }
    let (text, output_ids, finish) = ts.collect().await?;
    if let Some(lp) = &mut meta.logprobs {
        lp.push(&output_ids, &ts.logprobs);
    }
    Ok(axum::Json(json!({
        "text": text,
        "output_ids": output_ids,
        "meta_info": meta.info(&ts, Some(finish)),
    }))
    .into_response())
}
