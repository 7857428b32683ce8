//! A grammar's first steps, walked at validation time: llguidance builds its lexer lazily,
//! so a schema that compiles can still fail on the worker at its first tokens (a regex whose
//! automaton outgrows the lexer's limits) or admit no JSON value at all (a schema that only
//! refers to itself). Walking a few tokens here, over a byte-level vocabulary and with the
//! worker's limits, finds both before the request is queued.

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

/// How llguidance says that its grammar allows no token at all (`StopReason`'s name).
const NO_TOKEN_ALLOWED: &str = "NoExtensionBias";

/// Tokens walked (one byte each): past a JSON value's opening and into its first lexeme.
const PROBE_STEPS: usize = 8;

/// The x-guidance options the worker compiles schemas with (python/nitsum/structured/
/// compiler.py `_JSON_OPTIONS`): the grammar probed is the one the worker runs.
fn worker_options() -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// Walk the grammar of JSON Schema `schema` (an object) for its first tokens, always taking
/// the lowest byte it allows; the reason the worker could not serve it, if any.
pub fn probe_schema(schema: &Value) -> Result<(), String> {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(worker_options);
    }
    let env: TokEnv = ApproximateTokEnv::single_byte_env();
    let eos = env.tok_trie().eos_token() as usize;
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    factory.quiet();
    // NOTE: without this the library's errors carry its parser state and the grammar.
    factory.limits_mut().verbose_errors = false;
    let mut m = Matcher::new(factory.create_parser(TopLevelGrammar::from_json_schema(schema)));
    for step in 0..PROBE_STEPS {
        if step > 0 && m.is_stopped() && !m.is_error() {
            return Ok(()); // a complete value that allows nothing more
        }
        let mask = match m.compute_mask() {
            Ok(mask) => mask,
            // NOTE: the error state keeps only the message: the stop reason is in its text.
            Err(e) if step == 0 && e.to_string().contains(NO_TOKEN_ALLOWED) => {
                return Err(
                    "the schema admits no JSON value (it only refers to itself, or \
                            its constraints contradict each other)"
                        .into(),
                )
            }
            Err(e) => return Err(cannot_enforce(&e.to_string())),
        };
        let mut next = None;
        mask.iter_set_entries(|t| {
            if t != eos && next.is_none() {
                next = Some(t as u32);
            }
        });
        match next {
            Some(t) => m
                .consume_token(t)
                .map_err(|e| cannot_enforce(&e.to_string()))?,
            None => return Ok(()), // a complete value: nothing more to walk
        }
    }
    Ok(())
}

fn cannot_enforce(why: &str) -> String {
    let why = why.trim().trim_end_matches("<non-verbose/>").trim();
    format!("the schema cannot be enforced: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ordinary_schemas_pass() {
        for s in [
            json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
            json!({"type": "string", "pattern": "^[a-z]{3}$"}),
            json!({"type": "integer"}),
            json!({"enum": [1]}),
            // Recursion with a way out is fine.
            json!({"type": "object", "properties": {"child": {"$ref": "#"}}}),
        ] {
            assert_eq!(probe_schema(&s), Ok(()), "{s}");
        }
    }

    #[test]
    fn self_references_without_a_value_are_refused() {
        for s in [
            json!({"$ref": "#"}),
            json!({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                   "$ref": "#/$defs/A"}),
        ] {
            let e = probe_schema(&s).unwrap_err();
            assert!(e.contains("admits no JSON value"), "{s}: {e}");
        }
    }

    #[test]
    fn a_lexer_too_large_for_the_limits_is_refused_without_parser_state() {
        let s = json!({"type": "string", "pattern": "^(a{1000}){1000}$"});
        let t = std::time::Instant::now();
        let e = probe_schema(&s).unwrap_err();
        assert!(e.contains("cannot be enforced"), "{e}");
        assert!(
            !e.contains("<state>") && !e.contains("<non-verbose/>"),
            "{e}"
        );
        assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());
    }
}
