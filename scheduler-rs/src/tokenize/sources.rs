//! Where the router reads a model's files from: the model directory, or vLLM's
//! `--tokenizer DIR` (tokenizer and chat template) and `--generation-config` (default
//! sampling values) instead.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Where the default sampling values (`temperature`, `top_p`, `top_k`) come from, as vLLM's
/// `--generation-config`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GenerationSource {
    /// The model directory's `generation_config.json` (`auto`).
    #[default]
    Model,
    /// None: a request's unset fields take the OpenAI defaults (`vllm`).
    Builtin,
    /// `generation_config.json` of this directory.
    Dir(PathBuf),
}

impl GenerationSource {
    /// `auto`, `vllm` or a directory holding `generation_config.json`.
    pub fn parse(text: &str) -> Result<Self> {
        Ok(match text {
            "auto" => GenerationSource::Model,
            "vllm" => GenerationSource::Builtin,
            dir => {
                let dir = PathBuf::from(dir);
                if !dir.join("generation_config.json").is_file() {
                    bail!(
                        "--generation-config {}: auto, vllm or a directory holding \
                         generation_config.json",
                        dir.display()
                    );
                }
                GenerationSource::Dir(dir)
            }
        })
    }
}

/// The files `ModelFiles::load_from` reads.
#[derive(Debug, Clone, Copy)]
pub struct ModelSources<'a> {
    /// `config.json` (the context window) and the EOS ids of `generation_config.json`.
    pub model_dir: &'a Path,
    /// `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` (default: the model
    /// directory).
    pub tokenizer_dir: Option<&'a Path>,
    /// A chat template file overriding the tokenizer directory's.
    pub chat_template: Option<&'a Path>,
    pub generation: &'a GenerationSource,
}

impl<'a> ModelSources<'a> {
    /// Everything from `model_dir`.
    pub fn dir(model_dir: &'a Path) -> Self {
        const MODEL: &GenerationSource = &GenerationSource::Model;
        ModelSources {
            model_dir,
            tokenizer_dir: None,
            chat_template: None,
            generation: MODEL,
        }
    }

    /// The directory the tokenizer files come from.
    pub fn tokenizer_dir(&self) -> &'a Path {
        self.tokenizer_dir.unwrap_or(self.model_dir)
    }

    /// The `generation_config.json` the default sampling values come from, if any.
    pub fn defaults_file(&self) -> Option<PathBuf> {
        match self.generation {
            GenerationSource::Model => Some(self.model_dir.join("generation_config.json")),
            GenerationSource::Builtin => None,
            GenerationSource::Dir(d) => Some(d.join("generation_config.json")),
        }
    }
}
