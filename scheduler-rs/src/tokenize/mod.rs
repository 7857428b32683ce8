//! Tokenization: the HF `tokenizer.json`, the chat template and the model's limits, loaded
//! from an HF-format model directory; incremental detokenization; stop strings.

pub mod detok;
pub mod info;
pub mod sources;
pub mod stop;
pub mod template;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

pub use detok::{Decode, IncrementalDetokenizer};
pub use sources::{GenerationSource, ModelSources};
pub use stop::StopMatcher;
pub use template::ChatTemplate;

/// Default sampling values from `generation_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
}

/// Everything the router needs from the model directory.
#[derive(Debug)]
pub struct ModelFiles {
    pub tokenizer: tokenizers::Tokenizer,
    pub template: Option<ChatTemplate>,
    /// `max_position_embeddings` of `config.json`.
    pub max_context: usize,
    /// EOS ids from `generation_config.json` and `tokenizer_config.json`.
    pub eos_token_ids: Vec<u32>,
    pub defaults: GenerationDefaults,
    /// `GET /tokenizer_info`'s answer (info.rs).
    pub info: Value,
}

impl Decode for tokenizers::Tokenizer {
    fn decode(&self, ids: &[u32]) -> String {
        // NOTE: a decode error (an id out of the vocabulary) yields no text rather than a
        // failure: the worker produced the id, the client still gets its token count.
        (**self).decode(ids, true).unwrap_or_default()
    }
}

impl Decode for ModelFiles {
    fn decode(&self, ids: &[u32]) -> String {
        Decode::decode(&self.tokenizer, ids)
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A special token in tokenizer_config.json: a string or an AddedToken dict.
fn token_str(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// The chat template: the `--chat-template` file if given, else `chat_template.jinja` if
/// present, else `chat_template` of tokenizer_config.json (a string, or a list of
/// `{name, template}` where `default` wins).
fn template_source(dir: &Path, tok_cfg: &Value, given: Option<&Path>) -> Result<Option<String>> {
    if let Some(file) = given {
        let src = std::fs::read_to_string(file)
            .with_context(|| format!("reading the chat template {}", file.display()))?;
        return Ok(Some(src));
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return Ok(Some(std::fs::read_to_string(jinja)?));
    }
    Ok(match tok_cfg.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t["name"] == "default")
            .or_else(|| list.first())
            .and_then(|t| t["template"].as_str().map(String::from)),
        _ => None,
    })
}

impl ModelFiles {
    /// Load from an HF model directory. `tokenizer.json` is required; the other files are
    /// optional (no template: chat requests are refused; no config: context 4096).
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, None)
    }

    /// `load`, with the chat template read from `chat_template` when given.
    pub fn load_with(dir: &Path, chat_template: Option<&Path>) -> Result<Self> {
        Self::load_from(ModelSources {
            chat_template,
            ..ModelSources::dir(dir)
        })
    }

    /// Load the tokenizer files from `src.tokenizer_dir()`, `config.json` and the EOS ids from
    /// the model directory, the default sampling values from `src.generation`'s file.
    pub fn load_from(src: ModelSources<'_>) -> Result<Self> {
        let (dir, tok_dir) = (src.model_dir, src.tokenizer_dir());
        let tokenizer = tokenizers::Tokenizer::from_file(tok_dir.join("tokenizer.json"))
            .map_err(|e| anyhow!("loading {}/tokenizer.json: {e}", tok_dir.display()))?;
        let opt = |p: PathBuf| -> Result<Value> {
            if p.exists() {
                read_json(&p)
            } else {
                Ok(Value::Null)
            }
        };
        let tok_cfg = opt(tok_dir.join("tokenizer_config.json"))?;
        let config = opt(dir.join("config.json"))?;
        let gen = opt(dir.join("generation_config.json"))?;
        let sampling = match src.defaults_file() {
            Some(p) => opt(p)?,
            None => Value::Null,
        };
        let chat_template = src.chat_template;

        let bos = token_str(tok_cfg.get("bos_token")).unwrap_or_default();
        let eos = token_str(tok_cfg.get("eos_token")).unwrap_or_default();
        let source = template_source(tok_dir, &tok_cfg, chat_template)?;
        let info = info::tokenizer_info(&tok_cfg, source.as_deref());
        let template = source
            .map(|src| ChatTemplate::new(&src, &bos, &eos))
            .transpose()
            .map_err(|e| anyhow!("compiling the chat template: {e}"))?;

        let mut eos_token_ids: Vec<u32> = match gen.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|n| n.as_u64())
                .map(|n| n as u32)
                .collect(),
            _ => Vec::new(),
        };
        if let Some(id) = tokenizer.token_to_id(&eos) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let max_context = config
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .unwrap_or(4096) as usize;
        let defaults = GenerationDefaults {
            temperature: sampling.get("temperature").and_then(Value::as_f64),
            top_p: sampling.get("top_p").and_then(Value::as_f64),
            top_k: sampling.get("top_k").and_then(Value::as_i64),
        };
        Ok(ModelFiles {
            tokenizer,
            template,
            max_context,
            eos_token_ids,
            defaults,
            info,
        })
    }

    /// Token ids of `text`; `special` adds BOS etc. through the post-processor.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode_fast(text, special)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The tokenizer's own string of each id (`Ġthe`, `<|im_end|>`: not decoded text), as
    /// vLLM's `/tokenize` `return_token_strs` gives them; empty for an unknown id.
    pub fn token_strs(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| self.tokenizer.id_to_token(id).unwrap_or_default())
            .collect()
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_byte_level_model_dir_loads_and_round_trips() {
        let dir = crate::testutil::tiny_model_dir();
        let m = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(m.max_context, 64);
        assert_eq!(m.eos_token_ids, vec![crate::testutil::EOS_ID]);
        assert_eq!(m.defaults.temperature, Some(0.7));
        let ids = m.encode("héllo 😀", false).unwrap();
        // Byte-level, no merges except "l"+"l": é is 2 tokens, the emoji 4.
        assert_eq!(ids.len(), "héllo 😀".len() - 1);
        assert_eq!(Decode::decode(&m, &ids), "héllo 😀");
        // Streaming through the real tokenizer never yields a broken character.
        let mut d = IncrementalDetokenizer::new();
        let pieces: Vec<String> = ids.iter().map(|&i| d.push(&m, &[i])).collect();
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
        assert_eq!(pieces.concat(), "héllo 😀");
        assert!(pieces.iter().any(|p| p == "😀"));
        // Special tokens are skipped in output text.
        let eos = crate::testutil::EOS_ID;
        assert_eq!(Decode::decode(&m, &[ids[0], eos]), "h");
        let chat = m.template.as_ref().unwrap();
        let text = chat
            .render(
                &[serde_json::json!({"role": "user", "content": "hi"})],
                true,
            )
            .unwrap();
        assert_eq!(
            m.encode(&text, false).unwrap()[0],
            crate::testutil::IM_START_ID
        );
    }

    /// `--generation-config` picks where the default sampling values come from, and
    /// `--tokenizer` where the tokenizer and its template do; EOS and the window stay the
    /// model's.
    #[test]
    fn generation_config_and_tokenizer_directory_are_read_from_where_they_say() {
        let model = crate::testutil::tiny_model_dir();
        let other = crate::testutil::tiny_model_dir();
        std::fs::write(
            other.path().join("generation_config.json"),
            r#"{"temperature": 0.2, "top_k": 5, "eos_token_id": 7}"#,
        )
        .unwrap();
        std::fs::write(
            other.path().join("chat_template.jinja"),
            "{{ messages[0].content }}",
        )
        .unwrap();
        let load = |generation: &GenerationSource, tok: Option<&Path>| {
            ModelFiles::load_from(ModelSources {
                tokenizer_dir: tok,
                generation,
                ..ModelSources::dir(model.path())
            })
            .unwrap()
        };
        let m = load(&GenerationSource::Builtin, None);
        assert_eq!(m.defaults, GenerationDefaults::default());
        let m = load(&GenerationSource::Dir(other.path().to_path_buf()), None);
        assert_eq!(
            (m.defaults.temperature, m.defaults.top_k),
            (Some(0.2), Some(5))
        );
        assert_eq!(m.eos_token_ids, vec![crate::testutil::EOS_ID]);
        let m = load(&GenerationSource::Model, Some(other.path()));
        assert_eq!(m.defaults.temperature, Some(0.7));
        let hi = serde_json::json!({"role": "user", "content": "hi"});
        assert_eq!(
            m.template.as_ref().unwrap().render(&[hi], true).unwrap(),
            "hi"
        );
        assert_eq!(m.max_context, 64);
    }

    /// The real SmolLM2 tokenizer, when `nitsum model prepare` has put it in the cache
    /// (skipped otherwise). Ids were produced by the Python `tokenizers` package.
    #[test]
    fn real_smollm2_matches_python_tokenizers_if_present() {
        let Some(home) = std::env::var_os("HOME") else {
            return;
        };
        let dir = std::path::Path::new(&home).join(".cache/nitsum/models/SmolLM2-135M-Instruct");
        if !dir.join("tokenizer.json").exists() {
            return;
        }
        let m = ModelFiles::load(&dir).unwrap();
        assert_eq!(m.max_context, 8192);
        assert!(m.eos_token_ids.contains(&2));
        let msgs = [serde_json::json!({"role": "user", "content": "Héllo 😀 wörld"})];
        let text = m.template.as_ref().unwrap().render(&msgs, true).unwrap();
        assert!(text.starts_with("<|im_start|>system\n"));
        let user = "<|im_start|>user\nHéllo 😀 wörld<|im_end|>\n<|im_start|>assistant\n";
        assert!(text.ends_with(user), "{text}");
        let ids = m.encode(user, false).unwrap();
        assert_eq!(
            ids,
            [
                1, 4093, 198, 56, 2756, 31394, 40303, 218, 267, 29989, 400, 2, 198, 1, 520, 9531,
                198
            ]
        );
        let mut d = IncrementalDetokenizer::new();
        let streamed: String = ids.iter().map(|&i| d.push(&m, &[i])).collect();
        assert!(!streamed.contains('\u{FFFD}'));
        assert_eq!(streamed, "user\nHéllo 😀 wörld\nassistant\n");
    }
}
