//! vLLM's request extensions (and OpenAI's newer fields) that Nitsum implements on
//! `/v1/chat/completions` and `/v1/completions`, typed (docs/serving.md "vLLM request
//! fields"); `api/fields.rs` applies them. What no member here takes falls to
//! `extensions::refused`.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::structured::Grammar;

/// The fields, as sent (checked by `check` and where they are applied).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct VllmFields {
    /// Structured output, vLLM's pre-0.10 spelling: a JSON schema (object or JSON text).
    pub guided_json: Option<Value>,
    /// The output is exactly one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// The output matches this regex (Rust `regex` syntax).
    pub guided_regex: Option<String>,
    /// The output is a sentence of this llguidance Lark grammar.
    pub guided_grammar: Option<String>,
    /// vLLM ≥ 0.10: `{json | regex | choice | grammar | json_object}`.
    pub structured_outputs: Option<Map<String, Value>>,
    /// The caller's request id: the response `id` is `chatcmpl-<it>` / `cmpl-<it>`.
    pub request_id: Option<String>,
    /// Return `prompt_token_ids` and each choice's `token_ids`.
    pub return_token_ids: Option<bool>,
    /// Prefix-cache isolation: only requests with the same salt share cached KV.
    pub cache_salt: Option<String>,
    /// Only these token ids may be sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words the output must not contain (vLLM's token-level ban).
    pub bad_words: Option<Vec<String>>,
    /// `false`: special tokens appear in the text.
    pub skip_special_tokens: Option<bool>,
    /// `true`: the matched stop string is kept at the end of the text.
    pub include_stop_str_in_output: Option<bool>,
    /// Top alternatives per prompt token (the response's `prompt_logprobs`).
    pub prompt_logprobs: Option<i64>,
    /// Keep only the last k prompt tokens (-1: as many as the context window allows).
    pub truncate_prompt_tokens: Option<i64>,
    /// Logprob tokens are rendered `token_id:<id>`.
    pub return_tokens_as_token_ids: Option<bool>,
    /// OpenAI: requests with the same key prefer the same device (cache-aware dispatch).
    pub prompt_cache_key: Option<String>,
    /// OpenAI: an end-user id for abuse monitoring; accepted, no effect on the answer.
    pub safety_identifier: Option<String>,
    /// OpenAI: `low`, `medium` or `high`; no effect on a model without reasoning controls.
    pub verbosity: Option<String>,
}

/// OpenAI's `verbosity` values.
pub const VERBOSITIES: [&str; 3] = ["low", "medium", "high"];

/// `structured_outputs` keys read as they are; `structural_tag` is refused by name, and
/// vLLM's backend knobs are accepted at their neutral value only.
const NEUTRAL_STRUCTURED_OPTIONS: [&str; 3] = [
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
];

impl VllmFields {
    /// The grammar the structured fields ask for (at most one may be given); on error the
    /// field to name and why.
    pub fn grammar(&self) -> Result<Option<(String, Grammar)>, (String, String)> {
        let mut asked: Vec<(String, Grammar)> = Vec::new();
        let mut add = |name: &str, g: Result<Grammar, String>| {
            g.map(|g| asked.push((name.to_string(), g)))
                .map_err(|why| (name.to_string(), why))
        };
        if let Some(v) = self.guided_json.as_ref().filter(|v| !v.is_null()) {
            add("guided_json", json_schema(v))?;
        }
        if let Some(c) = &self.guided_choice {
            add("guided_choice", Grammar::choice(c))?;
        }
        if let Some(rx) = &self.guided_regex {
            add("guided_regex", Grammar::regex(rx))?;
        }
        if let Some(g) = &self.guided_grammar {
            add("guided_grammar", Grammar::lark(g))?;
        }
        for (key, v) in self.structured_outputs.iter().flatten() {
            let name = format!("structured_outputs.{key}");
            let as_str = || v.as_str().ok_or(format!("`{name}` must be a string"));
            match key.as_str() {
                _ if v.is_null() => {}
                "json" => add(&name, json_schema(v))?,
                "regex" => add(&name, as_str().and_then(Grammar::regex))?,
                "grammar" => add(&name, as_str().and_then(Grammar::lark))?,
                "choice" => add(
                    &name,
                    string_list(v, &name).and_then(|c| Grammar::choice(&c)),
                )?,
                "json_object" if v == &Value::Bool(true) => add(&name, Ok(Grammar::json_object()))?,
                "json_object" if v == &Value::Bool(false) => {}
                "json_object" => return Err((name.clone(), format!("`{name}` must be a boolean"))),
                k if NEUTRAL_STRUCTURED_OPTIONS.contains(&k) && v == &Value::Bool(false) => {}
                "structural_tag"
                | "whitespace_pattern"
                | "disable_fallback"
                | "disable_any_whitespace"
                | "disable_additional_properties" => {
                    return Err((
                        name.clone(),
                        format!("`{name}` is not supported by this server"),
                    ))
                }
                _ => {
                    return Err((
                        name.clone(),
                        format!("Unrecognized request argument supplied: {name}"),
                    ))
                }
            }
        }
        if asked.len() > 1 {
            let names: Vec<&str> = asked.iter().map(|(n, _)| n.as_str()).collect();
            return Err((
                asked[1].0.clone(),
                format!(
                    "only one kind of structured output may be asked for, got {}",
                    names.join(" and ")
                ),
            ));
        }
        Ok(asked.pop())
    }

    /// The first field with a value out of its range, and why (the rest are checked where
    /// they are applied, against the model).
    pub fn check(&self) -> Option<(String, String)> {
        if let Some(v) = self
            .verbosity
            .as_deref()
            .filter(|v| !VERBOSITIES.contains(v))
        {
            return Some((
                "verbosity".into(),
                format!(
                    "verbosity must be one of {}, got {v:?}",
                    VERBOSITIES.join(", ")
                ),
            ));
        }
        if let Some(k) = self.truncate_prompt_tokens.filter(|&k| k < -1 || k == 0) {
            return Some((
                "truncate_prompt_tokens".into(),
                format!("truncate_prompt_tokens must be -1 or >= 1, got {k}"),
            ));
        }
        if let Some(id) = self
            .request_id
            .as_deref()
            .filter(|id| id.is_empty() || id.len() > 256)
        {
            return Some((
                "request_id".into(),
                format!("request_id must have 1 to 256 characters, got {}", id.len()),
            ));
        }
        None
    }
}

/// A JSON schema given as an object (or a boolean) or as its JSON text.
fn json_schema(v: &Value) -> Result<Grammar, String> {
    match v {
        Value::String(text) => {
            let parsed: Value =
                serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
            Grammar::json_schema(&parsed)
        }
        v => Grammar::json_schema(v),
    }
}

fn string_list(v: &Value, name: &str) -> Result<Vec<String>, String> {
    serde_json::from_value(v.clone()).map_err(|_| format!("`{name}` must be a list of strings"))
}

/// Keys of `stream_options`.
pub const STREAM_OPTIONS: [&str; 2] = ["include_usage", "continuous_usage_stats"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::structured::GrammarKind;
    use serde_json::json;

    fn fields(v: Value) -> VllmFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_structured_field_maps_to_its_grammar() {
        let g = |v: Value| {
            fields(v)
                .grammar()
                .unwrap()
                .map(|(n, g)| (n, g.kind, g.schema))
        };
        assert_eq!(fields(json!({})).grammar().unwrap(), None);
        let (name, kind, _) = g(json!({"guided_json": {"type": "integer"}})).unwrap();
        assert_eq!(
            (name.as_str(), kind),
            ("guided_json", GrammarKind::JsonSchema)
        );
        // A schema as JSON text is the same schema.
        let text = g(json!({"guided_json": "{\"type\": \"integer\"}"})).unwrap();
        assert_eq!(text.2.as_deref(), Some("{\"type\":\"integer\"}"));
        let (_, kind, src) = g(json!({"guided_choice": ["yes", "no \"way\""]})).unwrap();
        assert_eq!(kind, GrammarKind::Lark);
        assert_eq!(src.as_deref(), Some(r#"start: "yes" | "no \"way\"""#));
        let (_, kind, src) = g(json!({"guided_regex": "[0-9]{3}"})).unwrap();
        assert_eq!(
            (kind, src.as_deref()),
            (GrammarKind::Regex, Some("[0-9]{3}"))
        );
        let (_, kind, _) = g(json!({"guided_grammar": "start: \"a\"+"})).unwrap();
        assert_eq!(kind, GrammarKind::Lark);
        let (name, kind, _) = g(json!({"structured_outputs": {"regex": "a+"}})).unwrap();
        assert_eq!(
            (name.as_str(), kind),
            ("structured_outputs.regex", GrammarKind::Regex)
        );
        let (_, kind, _) = g(json!({"structured_outputs": {"json_object": true}})).unwrap();
        assert_eq!(kind, GrammarKind::JsonObject);
        let (_, kind, _) =
            g(json!({"structured_outputs": {"choice": ["a"], "disable_fallback": false}})).unwrap();
        assert_eq!(kind, GrammarKind::Lark);
    }

    #[test]
    fn bad_or_conflicting_structured_fields_name_the_field() {
        let err = |v: Value| fields(v).grammar().unwrap_err();
        let (name, why) = err(json!({"guided_regex": "a", "guided_choice": ["b"]}));
        assert_eq!(name, "guided_regex");
        assert!(why.contains("only one"), "{why}");
        assert_eq!(err(json!({"guided_regex": "(a"})).0, "guided_regex");
        assert_eq!(
            err(json!({"guided_grammar": "root ::= \"a\""})).0,
            "guided_grammar"
        );
        assert_eq!(err(json!({"guided_choice": []})).0, "guided_choice");
        assert_eq!(err(json!({"guided_json": "{nope"})).0, "guided_json");
        let (name, why) = err(json!({"structured_outputs": {"structural_tag": "{}"}}));
        assert_eq!(name, "structured_outputs.structural_tag");
        assert!(why.contains("not supported"), "{why}");
        assert_eq!(
            err(json!({"structured_outputs": {"regexp": "a"}})).0,
            "structured_outputs.regexp"
        );
        // The second one asked for is named.
        assert_eq!(
            err(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).0,
            "structured_outputs.choice"
        );
    }

    #[test]
    fn ranges_are_checked_by_name() {
        let check = |v: Value| fields(v).check().map(|(n, _)| n);
        assert_eq!(
            check(json!({"verbosity": "low", "truncate_prompt_tokens": -1})),
            None
        );
        assert_eq!(
            check(json!({"verbosity": "loud"})).as_deref(),
            Some("verbosity")
        );
        assert_eq!(
            check(json!({"truncate_prompt_tokens": 0})).as_deref(),
            Some("truncate_prompt_tokens")
        );
        assert_eq!(
            check(json!({"request_id": ""})).as_deref(),
            Some("request_id")
        );
    }
}
