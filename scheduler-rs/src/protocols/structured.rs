//! Structured output (`response_format` `json_object` / `json_schema`): the grammar a request's
//! output must match, validated here with llguidance (the library the worker constrains
//! decoding with) and sent to the worker in `generate` (docs/protocol.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The request field grammar errors name.
pub const FIELD: &str = "response_format";

/// What the output must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrammarKind {
    /// Any JSON object.
    JsonObject,
    /// A JSON value valid under `Grammar::schema`.
    JsonSchema,
    /// Text matching the regular expression `Grammar::schema` (vLLM's `guided_regex`).
    Regex,
    /// Text of the llguidance Lark grammar `Grammar::schema` (vLLM's `guided_grammar`,
    /// `guided_choice`).
    Lark,
    /// Text the EBNF (GBNF: `root ::= ...`) grammar in `Grammar::schema` derives (SGLang's
    /// `ebnf`); the worker converts it for llguidance and refuses one it cannot compile.
    Ebnf,
}

/// The `grammar` field of a `generate` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grammar {
    pub kind: GrammarKind,
    /// The JSON Schema as JSON text (`json_schema`), the regex (`regex`), the grammar
    /// (`lark`) or the EBNF grammar (`ebnf`); none for `json_object`.
    pub schema: Option<String>,
    /// How many tokens at the end of `input_ids` are output the grammar already matched
    /// (a request resumed on another worker): the worker's matcher replays them first.
    pub replay: u32,
}

impl Grammar {
    /// A grammar for JSON values valid under `schema` (an object), checked by llguidance;
    /// the library's message when it refuses the schema.
    pub fn json_schema(schema: &Value) -> Result<Self, String> {
        if !schema.is_object() {
            return Err("the JSON schema must be an object".into());
        }
        check_schema(schema)?;
        off_the_async_threads(|| super::grammar_probe::probe_schema(schema))?;
        Ok(Grammar {
            kind: GrammarKind::JsonSchema,
            schema: Some(schema.to_string()),
            replay: 0,
        })
    }

    /// Text matching the regular expression `rx` (Rust `regex` syntax, anchored at both
    /// ends), checked by llguidance.
    pub fn regex(rx: &str) -> Result<Self, String> {
        use llguidance::api::TopLevelGrammar;
        validate(TopLevelGrammar::from_regex(rx)).map_err(|e| format!("invalid regex: {e}"))?;
        Ok(Grammar {
            kind: GrammarKind::Regex,
            schema: Some(rx.to_string()),
            replay: 0,
        })
    }

    /// Text of the llguidance Lark grammar `lark` (its `start` rule), checked by llguidance.
    pub fn lark(lark: &str) -> Result<Self, String> {
        use llguidance::api::TopLevelGrammar;
        validate(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| format!("invalid grammar: {e}"))?;
        Ok(Grammar {
            kind: GrammarKind::Lark,
            schema: Some(lark.to_string()),
            replay: 0,
        })
    }

    /// Text the EBNF grammar `ebnf` derives (compiled, and refused if it cannot be, by the
    /// worker: llguidance reads GBNF through its Python converter only).
    pub fn ebnf(ebnf: &str) -> Result<Self, String> {
        if ebnf.trim().is_empty() {
            return Err("the EBNF grammar is empty".into());
        }
        Ok(Grammar {
            kind: GrammarKind::Ebnf,
            schema: Some(ebnf.to_string()),
            replay: 0,
        })
    }

    /// Exactly one of `choices` (vLLM's `guided_choice`): a Lark grammar of string literals.
    pub fn choice(choices: &[String]) -> Result<Self, String> {
        if choices.is_empty() || choices.iter().any(String::is_empty) {
            return Err("the choices must be a non-empty list of non-empty strings".into());
        }
        // NOTE: a JSON string is a valid Lark string literal (same escapes).
        let alternatives: Vec<String> = choices
            .iter()
            .map(|c| Value::from(c.as_str()).to_string())
            .collect();
        Self::lark(&format!("start: {}", alternatives.join(" | ")))
    }

    /// Any JSON object.
    pub fn json_object() -> Self {
        Grammar {
            kind: GrammarKind::JsonObject,
            schema: None,
            replay: 0,
        }
    }
}

/// Whether llguidance compiles `schema` (as the worker will).
fn check_schema(schema: &Value) -> Result<(), String> {
    use llguidance::api::TopLevelGrammar;
    validate(TopLevelGrammar::from_json_schema(schema.clone()))
        .map_err(|e| format!("invalid JSON schema: {e}"))
}

/// Whether llguidance compiles `grammar` (without a tokenizer); its message when not.
fn validate(grammar: llguidance::api::TopLevelGrammar) -> Result<(), String> {
    use llguidance::api::{GrammarInit, ParserLimits};
    use llguidance::earley::ValidationResult;
    match GrammarInit::Serialized(grammar).validate(None, ParserLimits::default()) {
        ValidationResult::Error(e) => Err(e),
        _ => Ok(()),
    }
}

/// Run `f` (CPU work of up to seconds: a schema at the library's limits) so that it does not
/// hold up the other requests of an async worker thread: on a multi-thread runtime that
/// thread's tasks move to another thread meanwhile.
fn off_the_async_threads<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The grammar `response_format` asks for: None for absent or `{"type": "text"}`; the
/// message of a 400 naming `response_format` when it is malformed.
///
/// `json_schema` takes `{"json_schema": {"name": ..., "schema": {...}, "strict": bool}}`.
/// NOTE: the output always matches the schema, strict or not (OpenAI's `strict: true`);
/// llguidance refuses what it cannot enforce, so `strict` changes nothing.
pub fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ty = v.get("type").and_then(Value::as_str);
    match ty {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::json_object())),
        Some("json_schema") => {
            let js = v
                .get("json_schema")
                .filter(|j| j.is_object())
                .ok_or("`json_schema` must be an object with the schema under `schema`")?;
            if let Some(strict) = js.get("strict") {
                if !strict.is_boolean() && !strict.is_null() {
                    return Err("`json_schema.strict` must be a boolean".into());
                }
            }
            let schema = js.get("schema").ok_or("`json_schema.schema` is missing")?;
            Grammar::json_schema(schema).map(Some)
        }
        _ => Err(format!(
            "`type` must be one of text, json_object, json_schema; got {}",
            v.get("type").map_or("nothing".into(), Value::to_string)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn response_formats_map_to_grammars() {
        assert_eq!(response_format(None), Ok(None));
        assert_eq!(response_format(Some(&json!({"type": "text"}))), Ok(None));
        let g = response_format(Some(&json!({"type": "json_object"}))).unwrap();
        assert_eq!(g, Some(Grammar::json_object()));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_schema",
                        "json_schema": {"name": "x", "schema": schema, "strict": true}});
        let g = response_format(Some(&rf)).unwrap().unwrap();
        assert_eq!(g.kind, GrammarKind::JsonSchema);
        let back: Value = serde_json::from_str(g.schema.as_deref().unwrap()).unwrap();
        assert_eq!(back, schema);
    }

    #[test]
    fn malformed_formats_and_bad_schemas_are_refused_with_why() {
        let err = |v: Value| response_format(Some(&v)).unwrap_err();
        assert!(err(json!({"type": "yaml"})).contains("type"));
        assert!(err(json!({"type": "json_schema"})).contains("json_schema"));
        assert!(
            err(json!({"type": "json_schema", "json_schema": {"schema": [1]}}))
                .contains("must be an object")
        );
        assert!(err(json!({"type": "json_schema", "json_schema": {}})).contains("missing"));
        // The library's own message.
        let bad = json!({"type": "json_schema", "json_schema":
                         {"schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}});
        assert!(err(bad).contains("nonsense"));
    }

    #[test]
    fn refs_inside_the_schema_pass_and_others_are_refused() {
        let with = |schema: Value| {
            response_format(Some(&json!({"type": "json_schema",
                                         "json_schema": {"name": "x", "schema": schema}})))
        };
        // pydantic's shape: definitions under $defs, referenced as #/$defs/...
        let local = json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
                           "$defs": {"P": {"type": "integer"}}});
        assert!(with(local).unwrap().is_some());
        let outside = json!({"type": "object", "properties": {"p": {"$ref": "other.json"}}});
        assert!(with(outside).unwrap_err().contains("other.json"));
    }

    #[test]
    fn schemas_the_worker_cannot_serve_are_refused_here() {
        let with = |schema: Value| {
            response_format(Some(&json!({"type": "json_schema",
                                         "json_schema": {"name": "x", "schema": schema}})))
        };
        let e = with(json!({"$ref": "#"})).unwrap_err();
        assert!(e.contains("admits no JSON value"), "{e}");
        let e = with(json!({"type": "string", "pattern": "^(a{1000}){1000}$"})).unwrap_err();
        assert!(e.contains("cannot be enforced"), "{e}");
    }

    #[test]
    fn wire_shape_is_kind_schema_replay() {
        let g = Grammar::json_object();
        let v = serde_json::to_value(&g).unwrap();
        assert_eq!(
            v,
            json!({"kind": "json_object", "schema": null, "replay": 0})
        );
    }
}
