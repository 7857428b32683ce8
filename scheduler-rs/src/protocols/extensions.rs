//! Request fields outside the ones Nitsum implements: which are accepted, which refused.
//!
//! OpenAI answers an unknown field with a 400 naming it; vLLM and SGLang accept their own
//! extensions. Benchmark clients send some of those with neutral values (`vllm bench serve`
//! sends `repetition_penalty: 1.0`, SGLang's sends `best_of: 1`, guidellm `stop: null`), so a
//! field listed here is accepted at its neutral value (the one that changes nothing) and
//! refused by name otherwise; a field listed nowhere is refused as unrecognized.

use serde_json::{json, Map, Value};

/// What a listed field may carry and still be accepted.
enum Accept {
    /// Any value: the field has no effect on the answer by definition (`user` is an
    /// end-user id for the provider's abuse monitoring).
    Any,
    /// Only these values (or `null`): any other asks for behaviour Nitsum lacks.
    Neutral(fn() -> Vec<Value>),
}

/// Fields of the OpenAI API and of vLLM's and SGLang's extensions that Nitsum does not
/// implement, with what is accepted. Fields Nitsum implements are typed in `openai.rs`.
const LISTED: &[(&str, Accept)] = &[
    // OpenAI
    ("user", Accept::Any),
    ("metadata", Accept::Any),
    ("store", Accept::Neutral(|| vec![json!(false)])),
    (
        "service_tier",
        Accept::Neutral(|| vec![json!("auto"), json!("default")]),
    ),
    ("modalities", Accept::Neutral(|| vec![json!(["text"])])),
    ("parallel_tool_calls", Accept::Neutral(|| vec![json!(true)])),
    ("functions", Accept::Neutral(|| vec![json!([])])),
    (
        "function_call",
        Accept::Neutral(|| vec![json!("none"), json!("auto")]),
    ),
    ("reasoning_effort", Accept::Neutral(Vec::new)),
    ("prediction", Accept::Neutral(Vec::new)),
    ("audio", Accept::Neutral(Vec::new)),
    ("web_search_options", Accept::Neutral(Vec::new)),
    // vLLM / SGLang sampling and detokenization extensions
    ("skip_special_tokens", Accept::Neutral(|| vec![json!(true)])),
    (
        "spaces_between_special_tokens",
        Accept::Neutral(|| vec![json!(true)]),
    ),
    (
        "include_stop_str_in_output",
        Accept::Neutral(|| vec![json!(false)]),
    ),
    ("use_beam_search", Accept::Neutral(|| vec![json!(false)])),
    (
        "length_penalty",
        Accept::Neutral(|| vec![json!(1), json!(1.0)]),
    ),
    ("prompt_logprobs", Accept::Neutral(Vec::new)),
    ("truncate_prompt_tokens", Accept::Neutral(Vec::new)),
    (
        "return_tokens_as_token_ids",
        Accept::Neutral(|| vec![json!(false)]),
    ),
    ("chat_template_kwargs", Accept::Neutral(|| vec![json!({})])),
    (
        "add_generation_prompt",
        Accept::Neutral(|| vec![json!(true)]),
    ),
    (
        "continue_final_message",
        Accept::Neutral(|| vec![json!(false)]),
    ),
];

/// The first field of `extra` (fields no typed member took) that is refused, with why: a 400
/// names it.
pub fn refused(extra: &Map<String, Value>) -> Option<(String, String)> {
    extra.iter().find_map(|(name, value)| {
        let why = match LISTED.iter().find(|(n, _)| n == name) {
            None => format!("Unrecognized request argument supplied: {name}"),
            Some((_, Accept::Any)) => return None,
            Some((_, Accept::Neutral(values))) => {
                if value.is_null() || values().contains(value) {
                    return None;
                }
                super::openai::not_supported(name)
            }
        };
        Some((name.clone(), why))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: Value) -> Option<(String, String)> {
        refused(body.as_object().unwrap())
    }

    #[test]
    fn unknown_fields_are_refused_by_name_and_neutral_extensions_accepted() {
        let (name, why) = check(json!({"temprature": 0.5})).unwrap();
        assert_eq!(name, "temprature");
        assert!(why.contains("Unrecognized request argument supplied: temprature"));
        assert_eq!(check(json!({"user": "u-1", "metadata": {"k": "v"}})), None);
        assert_eq!(
            check(json!({"skip_special_tokens": true, "length_penalty": 1.0, "store": null})),
            None
        );
        let (name, why) = check(json!({"skip_special_tokens": false})).unwrap();
        assert_eq!(name, "skip_special_tokens");
        assert!(why.contains("not supported"), "{why}");
        assert_eq!(
            check(json!({"reasoning_effort": "high"})).unwrap().0,
            "reasoning_effort"
        );
        assert_eq!(
            check(json!({"chat_template_kwargs": {"enable_thinking": false}}))
                .unwrap()
                .0,
            "chat_template_kwargs"
        );
    }
}
