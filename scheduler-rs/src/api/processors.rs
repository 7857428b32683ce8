//! Logit-processor fields (penalties, `logit_bias`, `min_tokens`, `min_p`): checked here,
//! with a 400 naming the field, then carried to the worker's sampler in `Sampling`.

use std::collections::HashMap;

use crate::errors::ApiError;
use crate::protocols::openai::CommonParams;
use crate::protocols::worker::{Sampling, Stop};

/// OpenAI's bound on a `logit_bias` value.
const MAX_BIAS: f64 = 100.0;

/// The processor fields as a client sent them (OpenAI or native names).
#[derive(Debug, Clone, Default)]
pub struct Processors {
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub min_tokens: Option<i64>,
    /// `min_tokens` or `min_new_tokens`, for error messages.
    pub min_tokens_field: &'static str,
    pub min_p: Option<f64>,
}

impl Processors {
    /// From the OpenAI fields.
    pub fn from_common(c: &CommonParams) -> Self {
        Processors {
            presence_penalty: c.presence_penalty,
            frequency_penalty: c.frequency_penalty,
            repetition_penalty: c.repetition_penalty,
            logit_bias: c.logit_bias.clone(),
            min_tokens: c.min_tokens,
            min_tokens_field: "min_tokens",
            min_p: c.min_p,
        }
    }

    /// Check every field and write it into `s` and `stop` (whose `max_tokens` is already
    /// final); `vocab` bounds the `logit_bias` token ids when the router knows the model.
    pub fn apply(
        &self,
        s: &mut Sampling,
        stop: &mut Stop,
        vocab: Option<u32>,
    ) -> Result<(), ApiError> {
        let within = |name: &str, v: Option<f64>, lo: f64, hi: f64, dflt: f64| match v {
            None => Ok(dflt as f32),
            Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x as f32),
            Some(x) => Err(ApiError::invalid(
                name,
                format!("{name} must be in [{lo}, {hi}], got {x}"),
            )),
        };
        s.presence_penalty = within("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?;
        s.frequency_penalty = within("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?;
        s.min_p = within("min_p", self.min_p, 0.0, 1.0, 0.0)?;
        s.repetition_penalty = match self.repetition_penalty {
            None => 1.0,
            Some(x) if x.is_finite() && x > 0.0 => x as f32,
            Some(x) => {
                return Err(ApiError::invalid(
                    "repetition_penalty",
                    format!("repetition_penalty must be > 0, got {x}"),
                ))
            }
        };
        let field = self.min_tokens_field;
        stop.min_tokens = match self.min_tokens {
            None => 0,
            Some(m) if (0..=i64::from(stop.max_tokens)).contains(&m) => m as u32,
            Some(m) => {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "{field} must be in [0, {}] (the max tokens), got {m}",
                        stop.max_tokens
                    ),
                ))
            }
        };
        s.logit_bias = self.bias(vocab)?;
        Ok(())
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
            if vocab.is_some_and(|v| id >= v) {
                let v = vocab.unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(p: Processors) -> Result<(Sampling, Stop), String> {
        let mut s = Sampling::default();
        let mut stop = Stop {
            max_tokens: 8,
            ..Stop::default()
        };
        p.apply(&mut s, &mut stop, Some(100))
            .map(|()| (s, stop))
            .map_err(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn fields_reach_the_sampling_and_bad_values_name_their_field() {
        let ok = check(Processors {
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-1.0),
            repetition_penalty: Some(1.2),
            logit_bias: Some(HashMap::from([("7".into(), 100.0), ("3".into(), -5.5)])),
            min_tokens: Some(8),
            min_tokens_field: "min_tokens",
            min_p: Some(0.1),
        })
        .unwrap();
        let (ok, ok_stop) = ok;
        assert_eq!(
            (
                ok.presence_penalty,
                ok.frequency_penalty,
                ok.repetition_penalty
            ),
            (0.5, -1.0, 1.2)
        );
        assert_eq!(ok.logit_bias, vec![(3, -5.5), (7, 100.0)]);
        assert_eq!((ok_stop.min_tokens, ok.min_p), (8, 0.1));
        let neutral = check(Processors::default()).unwrap();
        assert_eq!(
            neutral,
            (
                Sampling::default(),
                Stop {
                    max_tokens: 8,
                    ..Stop::default()
                }
            )
        );
        let field = |p: Processors| check(p).unwrap_err();
        let p = Processors::default;
        assert_eq!(
            field(Processors {
                presence_penalty: Some(2.5),
                ..p()
            }),
            "presence_penalty"
        );
        assert_eq!(
            field(Processors {
                frequency_penalty: Some(f64::NAN),
                ..p()
            }),
            "frequency_penalty"
        );
        assert_eq!(
            field(Processors {
                repetition_penalty: Some(0.0),
                ..p()
            }),
            "repetition_penalty"
        );
        assert_eq!(
            field(Processors {
                min_p: Some(1.5),
                ..p()
            }),
            "min_p"
        );
        let min = |m| Processors {
            min_tokens: Some(m),
            min_tokens_field: "min_new_tokens",
            ..p()
        };
        assert_eq!(field(min(9)), "min_new_tokens");
        assert_eq!(field(min(-1)), "min_new_tokens");
        let bias = |k: &str, v| Processors {
            logit_bias: Some(HashMap::from([(k.into(), v)])),
            ..p()
        };
        assert_eq!(field(bias("x", 1.0)), "logit_bias");
        assert_eq!(field(bias("100", 1.0)), "logit_bias");
        assert_eq!(field(bias("5", 100.5)), "logit_bias");
    }
}
