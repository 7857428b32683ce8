//! `POST /generate`, SGLang-style: `{"input_ids": [...] | "text": "...", "sampling_params":
//! {...}}` → `{"text", "output_ids", "meta_info"}`; a batch (`text: [..]`, `input_ids:
//! [[..]]`) or `sampling_params.n` > 1 → a list of them, prompt-major (streamed: each chunk
//! with its `index`). `regex`, `ebnf` and `json_schema` constrain the output. With `"stream": true`, each SSE chunk
//! carries the text and ids generated so far (cumulative, as SGLang streams by default, so
//! its clients keep the last chunk's `text`); the last one has `meta_info.finish_reason`.
//! With `return_logprob`, `meta_info` carries SGLang's `output_token_logprobs` (and
//! `output_top_logprobs` with `top_logprobs_num`), cumulative like the text, and with
//! `logprob_start_len` ≥ 0 the prompt's (`input_token_logprobs`). Fields SGLang has
//! and Nitsum lacks are refused by name unless neutral (protocols/extensions.rs).
//! `max_new_tokens: 0` answers the prompt alone, as SGLang does (its frontend's `select` and
//! prefix caching send it): no output, and with `return_logprob` the prompt's logprobs (from
//! its last token when `logprob_start_len` is -1, SGLang's default).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::choices;
use super::logprobs;
use super::native_input::{grammar, prompts};
use super::output::{Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::sse::{self, ChunkFormat};
use super::AppState;
use crate::errors::ApiError;
use crate::protocols::body::parse_body;
use crate::protocols::extensions;
use crate::protocols::native::NativeGenerateRequest;
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

/// One choice's output streamed so far.
struct Choice {
    text: String,
    ids: Vec<u32>,
    logprobs: Option<Logprobs>,
}

struct Meta {
    tier: String,
    start: Instant,
    /// The caller's `rid`, else the router's id.
    rid: Option<String>,
    /// One per choice: prompt `i / n`'s choice `i % n` (SGLang's order).
    choices: Vec<Choice>,
    /// Whether the answer is a list (a batch, or n > 1): streamed chunks then carry `index`.
    listed: bool,
    /// `max_new_tokens: 0`: the one token generated to get the prompt's logprobs is dropped.
    prompt_only: bool,
}

impl Choice {
    fn info(&self, meta: &Meta, ts: &TextStream, finish: Option<&str>) -> Value {
        let (completion_tokens, finish) = if meta.prompt_only {
            (0, finish.map(|_| json!({"type": "length", "length": 0})))
        } else {
            (ts.completion_tokens, finish.map(|f| json!({"type": f})))
        };
        let mut info = json!({
            "id": meta.rid.clone().unwrap_or_else(|| ts.id.to_string()),
            "prompt_tokens": ts.prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": ts.cached_tokens.unwrap_or(0),
            "finish_reason": finish,
            "e2e_latency": meta.start.elapsed().as_secs_f64(),
            "tier": meta.tier,
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
    fn piece(&mut self, index: usize, ts: &TextStream, p: &Piece) -> Vec<Value> {
        let mut c = std::mem::replace(
            &mut self.choices[index],
            Choice {
                text: String::new(),
                ids: Vec::new(),
                logprobs: None,
            },
        );
        if self.prompt_only && p.finish.is_none() {
            self.choices[index] = c;
            return Vec::new();
        }
        if !self.prompt_only {
            c.text.push_str(&p.text);
            c.ids.extend_from_slice(&p.ids);
            if let Some(lp) = &mut c.logprobs {
                lp.push(&p.ids, &p.logprobs);
            }
        }
        let mut chunk = json!({"text": c.text, "output_ids": c.ids,
                               "meta_info": c.info(self, ts, p.finish)});
        if self.listed {
            chunk["index"] = json!(index);
        }
        self.choices[index] = c;
        vec![chunk]
    }
}

/// Handler (an error is answered in the OpenAI shape, `ApiError`'s `IntoResponse`).
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req: NativeGenerateRequest = parse_body(&body)?;
    let sp = &req.sampling_params;
    let unknown = extensions::refused_native(&req.extra)
        .or_else(|| extensions::refused_native_sampling(&sp.extra));
    if let Some((field, why)) = unknown {
        return Err(ApiError::invalid(&field, why));
    }
    let asked = logprobs::native_request(&req)?;
    let grammar = grammar(sp)?;
    let n =
        prepare::check_n(sp.n).map_err(|e| ApiError::invalid("sampling_params.n", e.message))?;
    let tier = prepare::tier(&state, &headers, req.tier.as_deref())?;
    let (prompts, batched, field) = prompts(&state, &req).await?;
    let top = asked.map(|(top, _)| top);
    let input_start = asked.and_then(|(_, start)| start);
    // NOTE: SGLang reads `logprob_start_len: -1` as the prompt's last token: a prompt-only
    // request with `return_logprob` still has `input_token_logprobs` (select's unconditional
    // pass reads them).
    let prompt_only = sp.max_new_tokens == Some(0);
    let input_from = |prompt_len: usize| match input_start {
        Some(s) => Some(s),
        None if prompt_only && top.is_some() => Some(prompt_len.saturating_sub(1)),
        None => None,
    };
    if let Some(start) = input_start {
        if let Some(short) = prompts.iter().map(Vec::len).find(|&len| start >= len) {
            return Err(ApiError::invalid(
                "logprob_start_len",
                format!("{start} is not below the prompt's {short} tokens"),
            ));
        }
    }
    let sampling = SamplingInput {
        // One token is generated to get the prompt's logprobs, and dropped.
        max_tokens: if prompt_only {
            Some(1)
        } else {
            sp.max_new_tokens
        },
        default_max_tokens: Some(DEFAULT_MAX_NEW_TOKENS),
        priority: req.priority,
        logprobs: top,
        prompt_logprobs: if prompt_only {
            top
        } else {
            input_start.and(top)
        },
        grammar,
        ..SamplingInput::from_body(sp)
    };
    let stops = sp.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    // NOTE: every prompt is checked before any is submitted: a bad one costs no work.
    let built = prompts
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            prepare::build(&state, tier, ids.clone(), field, &sampling).map_err(|mut e| {
                if batched && e.param.as_deref() == Some(field) {
                    e.message = format!("prompt {i}: {}", e.message);
                }
                e
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut all = choices::submit_batch(&state, built, &stops, sampling.output, n)?;
    let choices = (0..all.len())
        .map(|i| Choice {
            text: String::new(),
            ids: Vec::new(),
            logprobs: top.map(|top| Logprobs {
                files: state.model.clone(),
                top,
                with_text: req.return_text_in_logprobs,
                tokens: Vec::new(),
                tops: Vec::new(),
                input: input_from(prompts[i / n].len()).map(|s| (prompts[i / n].clone(), s)),
            }),
        })
        .collect();
    let mut meta = Meta {
        tier: state.router.cfg.tier(tier).name.clone(),
        start,
        rid: req.rid.clone(),
        choices,
        listed: batched || n > 1,
        prompt_only,
    };
    if req.stream {
        return Ok(sse::respond(all, meta));
    }
    let outs = futures_util::future::try_join_all(all.iter_mut().map(TextStream::collect)).await?;
    let mut results = Vec::with_capacity(all.len());
    for (i, ((text, output_ids, finish), ts)) in outs.into_iter().zip(&all).enumerate() {
        let mut c = std::mem::replace(
            &mut meta.choices[i],
            Choice {
                text: String::new(),
                ids: Vec::new(),
                logprobs: None,
            },
        );
        let (text, output_ids) = if meta.prompt_only {
            (String::new(), Vec::new())
        } else {
            (text, output_ids)
        };
        if let Some(lp) = c.logprobs.as_mut().filter(|_| !meta.prompt_only) {
            lp.push(&output_ids, &ts.logprobs);
        }
        let info = c.info(&meta, ts, Some(finish));
        results.push(json!({"text": text, "output_ids": output_ids, "meta_info": info}));
    }
    // NOTE: SGLang answers one prompt with one object, a batch or n > 1 with a list.
    let body = if meta.listed {
        Value::Array(results)
    } else {
        results.pop().expect("one result")
    };
    Ok(axum::Json(body).into_response())
}
