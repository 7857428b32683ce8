//! `GET /tokenizer_info`'s answer, in vLLM's shape: the tokenizer's configuration
//! (`tokenizer_config.json`, special tokens as their text), its `tokenizer_class` and the chat
//! template in use. lm-evaluation-harness's `RemoteTokenizer` reads `eos_token`, `bos_token`,
//! `pad_token` and `chat_template` from it.

use serde_json::{Map, Value};

/// Fields left out: file paths, and the added-token table (the vocabulary has them).
const DROPPED: [&str; 4] = [
    "vocab_file",
    "merges_file",
    "added_tokens_decoder",
    "tokenizer_file",
];

/// The answer for a model directory's `tokenizer_config.json` (`Null` when absent) and the
/// chat template source in use.
pub fn tokenizer_info(tok_cfg: &Value, template: Option<&str>) -> Value {
    let mut out = Map::new();
    if let Value::Object(cfg) = tok_cfg {
        for (k, v) in cfg {
            if DROPPED.contains(&k.as_str()) || k == "chat_template" {
                continue;
            }
            out.insert(k.clone(), plain(v));
        }
    }
    // NOTE: vLLM names the class of the tokenizer it loaded: the router always loads the fast
    // tokenizer from tokenizer.json.
    let class = match out.get("tokenizer_class").and_then(Value::as_str) {
        Some(c) if c.ends_with("Fast") => c.to_string(),
        Some(c) => format!("{c}Fast"),
        None => "PreTrainedTokenizerFast".to_string(),
    };
    out.insert("tokenizer_class".into(), Value::String(class));
    if let Some(t) = template {
        out.insert("chat_template".into(), Value::String(t.to_string()));
    }
    Value::Object(out)
}

/// A special token written as an AddedToken dict becomes its text, as vLLM serializes it.
fn plain(v: &Value) -> Value {
    match v {
        Value::Object(o) if o.get("content").is_some_and(Value::is_string) => o["content"].clone(),
        Value::Array(items) => Value::Array(items.iter().map(plain).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn special_tokens_become_text_and_paths_and_tables_go() {
        let cfg = json!({
            "bos_token": "<s>",
            "eos_token": {"content": "</s>", "lstrip": false, "__type": "AddedToken"},
            "pad_token": null,
            "additional_special_tokens": ["<a>", {"content": "<b>"}],
            "added_tokens_decoder": {"0": {"content": "<s>"}},
            "vocab_file": "/tmp/vocab.json",
            "model_max_length": 8192,
            "tokenizer_class": "GPT2Tokenizer",
            "chat_template": [{"name": "default", "template": "old"}],
        });
        let info = tokenizer_info(&cfg, Some("{{ messages }}"));
        assert_eq!(
            info,
            json!({
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": null,
                "additional_special_tokens": ["<a>", "<b>"],
                "model_max_length": 8192,
                "tokenizer_class": "GPT2TokenizerFast",
                "chat_template": "{{ messages }}",
            })
        );
        let bare = tokenizer_info(&Value::Null, None);
        assert_eq!(bare, json!({"tokenizer_class": "PreTrainedTokenizerFast"}));
    }
}
