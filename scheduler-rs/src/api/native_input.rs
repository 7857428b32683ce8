//! What a `/generate` request asks for besides sampling: its prompts (one, or a batch of
//! texts or of id lists) and its grammar (`json_schema`, `regex` or `ebnf`).

use serde_json::Value;

use super::prepare;
use super::AppState;
use crate::errors::ApiError;
use crate::protocols::native::{NativeGenerateRequest, NativeIds, NativeSampling};
use crate::protocols::openai::StringOrList;
use crate::protocols::structured::Grammar;

/// The grammar `sampling_params` asks for (at most one of `json_schema`, `regex`, `ebnf`).
pub fn grammar(sp: &NativeSampling) -> Result<Option<Grammar>, ApiError> {
    let asked = [
        ("json_schema", sp.json_schema.as_deref()),
        ("regex", sp.regex.as_deref()),
        ("ebnf", sp.ebnf.as_deref()),
    ];
    let mut set = asked.iter().filter_map(|(n, v)| v.map(|v| (*n, v)));
    let Some((name, text)) = set.next() else {
        return Ok(None);
    };
    let field = format!("sampling_params.{name}");
    if let Some((other, _)) = set.next() {
        return Err(ApiError::invalid(
            &field,
            format!("send one of json_schema, regex and ebnf, not {name} and {other}"),
        ));
    }
    let grammar = match name {
        "json_schema" => {
            let schema: Value = serde_json::from_str(text)
                .map_err(|e| ApiError::invalid(&field, format!("not JSON: {e}")))?;
            Grammar::json_schema(&schema)
        }
        "regex" => Grammar::regex(text),
        _ => Grammar::ebnf(text),
    };
    grammar.map(Some).map_err(|e| ApiError::invalid(&field, e))
}

/// The prompts (one, or a batch of texts or of id lists) and the field they came in.
pub async fn prompts(
    state: &AppState,
    req: &NativeGenerateRequest,
) -> Result<(Vec<Vec<u32>>, bool, &'static str), ApiError> {
    if req.input_ids.is_some() && req.text.is_some() {
        // NOTE: as SGLang, one prompt: which of two would win is a guess the client must
        // not have to make.
        return Err(ApiError::invalid(
            "text",
            "send either `text` or `input_ids`, not both",
        ));
    }
    let (batch, field) = match (&req.input_ids, &req.text) {
        (Some(NativeIds::One(ids)), _) => return Ok((vec![ids.clone()], false, "input_ids")),
        (Some(NativeIds::Batch(v)), _) => (v.len(), "input_ids"),
        (None, Some(StringOrList::One(_))) => (1, "text"),
        (None, Some(StringOrList::Many(v))) => (v.len(), "text"),
        (None, None) => return Err(ApiError::invalid("input_ids", "send `input_ids` or `text`")),
    };
    let max = state.router.cfg.max_batch_prompts;
    if batch == 0 || batch > max {
        return Err(ApiError::invalid(
            field,
            format!("a batch holds 1 to {max} prompts (max_batch_prompts), got {batch}"),
        ));
    }
    match (&req.input_ids, &req.text) {
        (Some(NativeIds::Batch(v)), _) => Ok((v.clone(), true, field)),
        (_, Some(StringOrList::One(t))) => Ok((
            vec![prepare::encode(state, t, true, field).await?],
            false,
            field,
        )),
        (_, Some(StringOrList::Many(v))) => {
            let mut out = Vec::with_capacity(v.len());
            for t in v {
                out.push(prepare::encode(state, t, true, field).await?);
            }
            Ok((out, true, field))
        }
        _ => unreachable!("the cases above returned"),
    }
}
