//! `logprobs` / `top_logprobs`: reading them per endpoint (chat: a boolean and a count;
//! completions: a count) and writing the OpenAI response shapes from the worker's
//! per-token logprobs (docs/serving.md "Logprobs").

use serde_json::{json, Map, Value};

use crate::errors::ApiError;
use crate::protocols::native::NativeGenerateRequest;
use crate::protocols::openai::CommonParams;
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::{Decode, ModelFiles};

/// OpenAI's most alternatives per token.
pub const MAX_TOP: i64 = 20;

fn count(field: &str, n: i64) -> Result<u32, ApiError> {
    if (0..=MAX_TOP).contains(&n) {
        Ok(n as u32)
    } else {
        Err(ApiError::invalid(
            field,
            format!("{field} must be an integer in [0, {MAX_TOP}], got {n}"),
        ))
    }
}

/// `/generate`: `return_logprob` asks for them, with `top_logprobs_num` alternatives
/// (default 0); `logprob_start_len` ≥ 0 asks for the prompt's from that token on too (-1,
/// the default: none). Returns (alternatives, prompt start), or `None` when not asked.
pub fn native_request(
    req: &NativeGenerateRequest,
) -> Result<Option<(u32, Option<usize>)>, ApiError> {
    if !req.return_logprob {
        return Ok(None);
    }
    let start = match req.logprob_start_len.unwrap_or(-1) {
        -1 => None,
        s if s >= 0 => Some(s as usize),
        s => {
            return Err(ApiError::invalid(
                "logprob_start_len",
                format!("logprob_start_len must be -1 (no prompt logprobs) or >= 0, got {s}"),
            ))
        }
    };
    let top = count("top_logprobs_num", req.top_logprobs_num.unwrap_or(0))?;
    Ok(Some((top, start)))
}

/// Chat: `logprobs: true` asks for them, with `top_logprobs` alternatives (default 0).
pub fn chat_request(c: &CommonParams) -> Result<Option<u32>, ApiError> {
    let on = match &c.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be a boolean in chat completions, got {other}"),
            ))
        }
    };
    match (on, c.top_logprobs) {
        (true, top) => count("top_logprobs", top.unwrap_or(0)).map(Some),
        (false, None | Some(0)) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
    }
}

/// Completions: `logprobs` is the number of alternatives (0: the chosen token only).
pub fn completion_request(c: &CommonParams) -> Result<Option<u32>, ApiError> {
    if c.top_logprobs.is_some() {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs is a chat field; completions take logprobs: <count>",
        ));
    }
    match &c.logprobs {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(n) => count("logprobs", n).map(Some),
            None => Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be an integer in [0, {MAX_TOP}] in completions, got {v}"),
            )),
        },
    }
}

/// A token's text as the tokenizer decodes it alone (empty without a tokenizer).
fn text(model: Option<&ModelFiles>, id: u32) -> String {
    model.map(|m| m.decode(&[id])).unwrap_or_default()
}

/// Chat `logprobs.content` entries of `ids` (`{token, logprob, bytes, top_logprobs}`).
pub fn chat_content(model: Option<&ModelFiles>, ids: &[u32], lps: &[TokenLogprob]) -> Vec<Value> {
    let entry = |id: u32, lp: f32| {
        let t = text(model, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    ids.iter()
        .zip(lps)
        .map(|(&id, lp)| {
            let mut e = entry(id, lp.logprob);
            let top: Vec<Value> = lp.top.iter().map(|&(t, v)| entry(t, v)).collect();
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect()
}

/// SGLang's `meta_info` logprobs of `ids`: `output_token_logprobs` entries `[logprob, token
/// id, text or null]`, and per token its `top` alternatives in the same shape (`top` 0: none).
pub fn sglang_entries(
    model: Option<&ModelFiles>,
    ids: &[u32],
    lps: &[TokenLogprob],
    with_text: bool,
) -> (Vec<Value>, Vec<Value>) {
    ids.iter()
        .zip(lps)
        .map(|(&id, lp)| sglang_entry(model, id, Some(lp), with_text))
        .unzip()
}

/// SGLang's `input_token_logprobs` / `input_top_logprobs` of the prompt `ids` from token
/// `start` on; `lps` has one entry per prompt token after the first (the first token has
/// none: its logprob and its alternatives are null).
pub fn sglang_input_entries(
    model: Option<&ModelFiles>,
    ids: &[u32],
    lps: &[TokenLogprob],
    start: usize,
    with_text: bool,
) -> (Vec<Value>, Vec<Value>) {
    (start..ids.len())
        .map(|i| {
            let lp = i.checked_sub(1).and_then(|j| lps.get(j));
            sglang_entry(model, ids[i], lp, with_text)
        })
        .unzip()
}

/// One token's SGLang entry `[logprob, id, text or null]` and its alternatives in that shape
/// (both null when the token has no logprob).
fn sglang_entry(
    model: Option<&ModelFiles>,
    id: u32,
    lp: Option<&TokenLogprob>,
    with_text: bool,
) -> (Value, Value) {
    let entry = |id: u32, v: Option<f32>| json!([v, id, with_text.then(|| text(model, id))]);
    match lp {
        None => (entry(id, None), Value::Null),
        Some(lp) => {
            let top = lp.top.iter().map(|&(t, v)| entry(t, Some(v))).collect();
            (entry(id, Some(lp.logprob)), Value::Array(top))
        }
    }
}

/// The legacy completions `logprobs` object, built piece by piece; `offset` is where the
/// next token's text starts in the choice's text (after any echoed prompt).
#[derive(Debug, Default)]
pub struct CompletionLogprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
    pub offset: usize,
}

impl CompletionLogprobs {
    /// Add the tokens of one piece.
    pub fn push(&mut self, model: Option<&ModelFiles>, ids: &[u32], lps: &[TokenLogprob]) {
        for (&id, lp) in ids.iter().zip(lps) {
            let t = text(model, id);
            let top: Map<String, Value> = lp
                .top
                .iter()
                .map(|&(a, v)| (text(model, a), json!(v)))
                .collect();
            self.text_offset.push(json!(self.offset));
            self.offset += t.len();
            self.tokens.push(Value::String(t));
            self.token_logprobs.push(json!(lp.logprob));
            self.top_logprobs.push(Value::Object(top));
        }
    }

    /// Add the echoed prompt's tokens: the first has no logprob (nothing precedes it), each
    /// other the logprob the worker computed for it (`lps`, one per prompt token after the
    /// first), as OpenAI's echo with logprobs reports them.
    pub fn push_prompt(&mut self, model: Option<&ModelFiles>, ids: &[u32], lps: &[TokenLogprob]) {
        let Some((&first, rest)) = ids.split_first() else {
            return;
        };
        let t = text(model, first);
        self.text_offset.push(json!(self.offset));
        self.offset += t.len();
        self.tokens.push(Value::String(t));
        self.token_logprobs.push(Value::Null);
        self.top_logprobs.push(Value::Null);
        self.push(model, rest, lps);
    }

    /// The object, and a fresh one for the next chunk (a stream sends each piece's tokens).
    pub fn take(&mut self) -> Value {
        let offset = self.offset;
        let done = std::mem::take(self);
        self.offset = offset;
        json!({"tokens": done.tokens, "token_logprobs": done.token_logprobs,
               "top_logprobs": done.top_logprobs, "text_offset": done.text_offset})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(body: Value) -> CommonParams {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn chat_and_completions_read_their_own_shapes() {
        let chat = |b| chat_request(&common(b)).map_err(|e| e.param.unwrap_or_default());
        assert_eq!(chat(json!({})), Ok(None));
        assert_eq!(chat(json!({"logprobs": false})), Ok(None));
        assert_eq!(chat(json!({"logprobs": true})), Ok(Some(0)));
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 5})),
            Ok(Some(5))
        );
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 21})).unwrap_err(),
            "top_logprobs"
        );
        assert_eq!(
            chat(json!({"top_logprobs": 2})).unwrap_err(),
            "top_logprobs"
        );
        assert_eq!(chat(json!({"logprobs": 3})).unwrap_err(), "logprobs");
        let cmpl = |b| completion_request(&common(b)).map_err(|e| e.param.unwrap_or_default());
        assert_eq!(cmpl(json!({"logprobs": 0})), Ok(Some(0)));
        assert_eq!(cmpl(json!({"logprobs": 20})), Ok(Some(20)));
        assert_eq!(cmpl(json!({"logprobs": -1})).unwrap_err(), "logprobs");
        assert_eq!(cmpl(json!({"logprobs": true})).unwrap_err(), "logprobs");
        assert_eq!(
            cmpl(json!({"top_logprobs": 1})).unwrap_err(),
            "top_logprobs"
        );
    }

    #[test]
    fn completion_logprobs_track_text_offsets_across_chunks() {
        let lp = |v: f32| TokenLogprob {
            logprob: v,
            top: vec![(1, v), (2, v - 1.0)],
        };
        let mut c = CompletionLogprobs {
            offset: 4,
            ..CompletionLogprobs::default()
        };
        c.push(None, &[1, 2], &[lp(-0.5), lp(-1.5)]);
        let first = c.take();
        assert_eq!(first["token_logprobs"], json!([-0.5, -1.5]));
        assert_eq!(first["text_offset"], json!([4, 4])); // no tokenizer: empty token texts
        c.push(None, &[3], &[lp(-2.0)]);
        assert_eq!(c.take()["token_logprobs"], json!([-2.0]));
    }
}
