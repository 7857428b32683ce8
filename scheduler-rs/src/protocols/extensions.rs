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
    ("prediction", Accept::Neutral(Vec::new)),
    ("audio", Accept::Neutral(Vec::new)),
    ("web_search_options", Accept::Neutral(Vec::new)),
    // vLLM / SGLang sampling and detokenization extensions
    (
        "spaces_between_special_tokens",
        Accept::Neutral(|| vec![json!(true)]),
    ),
    ("use_beam_search", Accept::Neutral(|| vec![json!(false)])),
    (
        "length_penalty",
        Accept::Neutral(|| vec![json!(1), json!(1.0)]),
    ),
    // NOTE: vLLM fields Nitsum implements are typed in vllm_fields.rs, not listed here.
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

/// Fields of SGLang's native `/generate` (top level) that Nitsum does not implement.
const NATIVE: &[(&str, Accept)] = &[
    ("lora_path", Accept::Neutral(Vec::new)),
    ("image_data", Accept::Neutral(|| vec![json!([])])),
    ("video_data", Accept::Neutral(|| vec![json!([])])),
    ("audio_data", Accept::Neutral(|| vec![json!([])])),
    ("modalities", Accept::Neutral(|| vec![json!([])])),
    ("custom_logit_processor", Accept::Neutral(Vec::new)),
    ("session_params", Accept::Neutral(Vec::new)),
    (
        "return_hidden_states",
        Accept::Neutral(|| vec![json!(false)]),
    ),
    (
        "return_routed_experts",
        Accept::Neutral(|| vec![json!(false)]),
    ),
    ("log_metrics", Accept::Any),
];

/// Fields of SGLang's `sampling_params` that Nitsum does not implement.
const NATIVE_SAMPLING: &[(&str, Accept)] = &[
    ("skip_special_tokens", Accept::Neutral(|| vec![json!(true)])),
    (
        "spaces_between_special_tokens",
        Accept::Neutral(|| vec![json!(true)]),
    ),
    ("no_stop_trim", Accept::Neutral(|| vec![json!(false)])),
    ("structural_tag", Accept::Neutral(Vec::new)),
    // NOTE: SGLang's frontend sends `stop_regex: []` (none) with every request.
    ("stop_regex", Accept::Neutral(|| vec![json!([])])),
    ("custom_params", Accept::Neutral(Vec::new)),
];

/// Why a request that asks for field `name` is refused.
pub fn not_supported(name: &str) -> String {
    format!("`{name}` is not supported by this server")
}

/// The first field of `extra` (fields no typed member took) that is refused, with why: a 400
/// names it.
pub fn refused(extra: &Map<String, Value>) -> Option<(String, String)> {
    refused_from(LISTED, extra, "")
}

/// `refused` for the top level of `/generate`.
pub fn refused_native(extra: &Map<String, Value>) -> Option<(String, String)> {
    refused_from(NATIVE, extra, "")
}

/// `refused` for `/generate`'s `sampling_params` (the field is named `sampling_params.X`).
pub fn refused_native_sampling(extra: &Map<String, Value>) -> Option<(String, String)> {
    refused_from(NATIVE_SAMPLING, extra, "sampling_params.")
}

fn refused_from(
    table: &[(&str, Accept)],
    extra: &Map<String, Value>,
    prefix: &str,
) -> Option<(String, String)> {
    extra.iter().find_map(|(key, value)| {
        let name = format!("{prefix}{key}");
        let why = match table.iter().find(|(n, _)| n == key) {
            None => format!("Unrecognized request argument supplied: {name}"),
            Some((_, Accept::Any)) => return None,
            Some((_, Accept::Neutral(values))) => {
                if value.is_null() || values().contains(value) {
                    return None;
                }
                not_supported(&name)
            }
        };
        Some((name, why))
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
            check(json!({"use_beam_search": false, "length_penalty": 1.0, "store": null})),
            None
        );
        let (name, why) = check(json!({"spaces_between_special_tokens": false})).unwrap();
        assert_eq!(name, "spaces_between_special_tokens");
        assert!(why.contains("not supported"), "{why}");
        assert_eq!(
            check(json!({"chat_template_kwargs": {"enable_thinking": false}}))
                .unwrap()
                .0,
            "chat_template_kwargs"
        );
    }

    #[test]
    fn native_fields_are_refused_by_their_path_unless_neutral() {
        let top = |v: Value| refused_native(v.as_object().unwrap());
        let sampling = |v: Value| refused_native_sampling(v.as_object().unwrap());
        // SGLang's bench_serving payload at its defaults passes.
        assert_eq!(top(json!({"lora_path": null, "log_metrics": true})), None);
        assert_eq!(top(json!({"lora_path": "a"})).unwrap().0, "lora_path");
        assert_eq!(
            top(json!({"input_embeds": [1.0]})).unwrap().0,
            "input_embeds"
        );
        // SGLang's frontend sends `stop_regex: []` (none); `n`, `regex` and `ebnf` are typed.
        let neutral = json!({"skip_special_tokens": true, "stop_regex": [], "no_stop_trim": false});
        assert_eq!(sampling(neutral), None);
        let (name, why) = sampling(json!({"stop_regex": ["a+"]})).unwrap();
        assert_eq!(name, "sampling_params.stop_regex");
        assert!(why.contains("not supported"), "{why}");
        let (name, why) = sampling(json!({"structural_tag": "{}"})).unwrap();
        assert_eq!(name, "sampling_params.structural_tag");
        assert!(why.contains("not supported"), "{why}");
        let (name, why) = sampling(json!({"temprature": 0})).unwrap();
        assert_eq!(name, "sampling_params.temprature");
        assert!(why.contains("Unrecognized"), "{why}");
    }
}
