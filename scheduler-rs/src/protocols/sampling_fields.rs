//! The sampler's knobs as a client sends them, and the one trait through which both
//! generation bodies (OpenAI's `CommonParams`, the native `sampling_params`) fill the
//! `generate` message (Dynamo's sampling-options provider is the model).
//!
//! NOTE: a new sampler knob is one field in `SamplingFields` (flattened into both bodies, so
//! both APIs take it under the same name) with its range check in `SamplingFields::sampling`,
//! and its twin in the wire `Sampling` (protocols/worker/generate.rs); on the worker, its twin
//! in `Sampling` (python/nitsum/sampling.py) and its processor (sampling_processors.py).

use std::collections::HashMap;

use serde::Deserialize;

use super::worker::Sampling;
use crate::errors::ApiError;
use crate::tokenize::GenerationDefaults;

/// OpenAI's bound on a `logit_bias` value.
const MAX_BIAS: f64 = 100.0;

/// The sampler's knobs, as sent (`None`: the model's default, else the neutral value).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// -1 or 0: off.
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    /// Logit processors (vLLM's semantics): penalties over generated tokens
    /// (presence/frequency) or prompt and output (repetition).
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub min_p: Option<f64>,
    /// Token id (a decimal string key, as OpenAI sends it) → bias in [-100, 100].
    pub logit_bias: Option<HashMap<String, f64>>,
    /// Every n-gram of this size occurs at most once in prompt and output (transformers'
    /// `no_repeat_ngram_size`); 0: off.
    pub no_repeat_ngram_size: Option<i64>,
}

impl SamplingFields {
    /// The wire `Sampling` these fields ask for, every range checked (a 400 naming the
    /// field); unset fields take the model's `defaults` (generation_config.json), then the
    /// neutral value. `vocab` bounds `logit_bias`'s token ids when the router knows the model.
    pub fn sampling(
        &self,
        defaults: &GenerationDefaults,
        vocab: Option<u32>,
    ) -> Result<Sampling, ApiError> {
        let temperature = self.temperature.or(defaults.temperature).unwrap_or(1.0);
        if temperature.is_nan() || temperature < 0.0 {
            return Err(ApiError::invalid("temperature", "temperature must be >= 0"));
        }
        let top_p = self.top_p.or(defaults.top_p).unwrap_or(1.0);
        if top_p.is_nan() || top_p <= 0.0 || top_p > 1.0 {
            return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
        }
        let top_k = match self.top_k.or(defaults.top_k).unwrap_or(-1) {
            -1 | 0 => -1,
            k if k > 0 => k.min(i64::from(i32::MAX)) as i32,
            _ => return Err(ApiError::invalid("top_k", "top_k must be -1 (off) or >= 1")),
        };
        let repetition_penalty = match self.repetition_penalty {
            None => 1.0,
            Some(x) if x.is_finite() && x > 0.0 => x as f32,
            Some(x) => {
                return Err(ApiError::invalid(
                    "repetition_penalty",
                    format!("repetition_penalty must be > 0, got {x}"),
                ))
            }
        };
        Ok(Sampling {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: self.seed,
            presence_penalty: within("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?,
            frequency_penalty: within("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?,
            repetition_penalty,
            logit_bias: self.bias(vocab)?,
            min_p: within("min_p", self.min_p, 0.0, 1.0, 0.0)?,
            no_repeat_ngram_size: match self.no_repeat_ngram_size {
                None => 0,
                Some(n) => u32::try_from(n).map_err(|_| {
                    let why = format!("no_repeat_ngram_size must be >= 0 (0: off), got {n}");
                    ApiError::invalid("no_repeat_ngram_size", why)
                })?,
            },
            ..Sampling::default()
        })
    }

    /// `logit_bias` as sorted `(token id, bias)` pairs.
    fn bias(&self, vocab: Option<u32>) -> Result<Vec<(u32, f32)>, ApiError> {
        let bad = |why: String| ApiError::invalid("logit_bias", why);
        let mut out = Vec::new();
        for (key, &bias) in self.logit_bias.iter().flatten() {
            let id: u32 = key
                .trim()
                .parse()
                .map_err(|_| bad(format!("key `{key}` is not a token id")))?;
            if let Some(v) = vocab.filter(|&v| id >= v) {
                return Err(bad(format!(
                    "token id {id} is outside the vocabulary (size {v})"
                )));
            }
            if !(bias.is_finite() && (-MAX_BIAS..=MAX_BIAS).contains(&bias)) {
                return Err(bad(format!(
                    "bias for token {id} must be in [-100, 100], got {bias}"
                )));
            }
            out.push((id, bias as f32));
        }
        out.sort_by_key(|&(id, _)| id);
        Ok(out)
    }
}

/// `v` as f32 when finite and in `[lo, hi]`, `dflt` when absent; else a 400 naming `name`.
fn within(name: &str, v: Option<f64>, lo: f64, hi: f64, dflt: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(dflt as f32),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            name,
            format!("{name} must be in [{lo}, {hi}], got {x}"),
        )),
    }
}

/// A generation request body: what `api/prepare.rs` reads from it to build `generate`'s
/// `sampling` and `stop` parts, whatever the API's names for the stop fields.
pub trait GenerateBody {
    /// The sampler's knobs (the same names in every API).
    fn sampling_fields(&self) -> &SamplingFields;
    /// The output's length cap as sent, and the name of the field it came in.
    fn max_tokens(&self) -> (Option<i64>, &'static str);
    /// The least output before EOS or a stop id may end it, and the field it came in.
    fn min_tokens(&self) -> (Option<i64>, &'static str);
    /// Extra token ids that end the output.
    fn stop_token_ids(&self) -> &[u32];
    /// Whether EOS does not end the output.
    fn ignore_eos(&self) -> bool;
    /// Within its class on the worker, lower is served first (vLLM's `priority`; the native
    /// API has it beside `sampling_params`, not in it).
    fn priority(&self) -> Option<i64> {
        None
    }
}

#[cfg(test)]
#[path = "sampling_fields_tests.rs"]
mod tests;
