//! Test fixtures shared by unit tests, integration tests and the benchmark: a tiny,
//! self-contained HF model directory with a GPT-2-style byte-level BPE tokenizer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

/// Id of the one merge `l l` → `ll`.
pub const LL_ID: u32 = 256;
/// `<|endoftext|>`.
pub const ENDOFTEXT_ID: u32 = 257;
/// `<|im_start|>`.
pub const IM_START_ID: u32 = 258;
/// `<|im_end|>`: the EOS token.
pub const EOS_ID: u32 = 259;
/// Vocabulary size of the tiny tokenizer.
pub const VOCAB: u32 = 260;
/// `max_position_embeddings` of the tiny model.
pub const MAX_CONTEXT: usize = 64;

/// ChatML chat template.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("nitsum-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GPT-2's byte → printable-char table used by byte-level BPE vocabularies.
pub fn bytes_to_unicode() -> Vec<char> {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~'))
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in printable.iter().zip(chars) {
        table[*b as usize] = char::from_u32(c).expect("valid char");
    }
    table
}

/// The tiny tokenizer.json: 256 byte tokens (id = byte value), one merge, 3 special tokens.
pub fn tiny_tokenizer_json() -> Value {
    let table = bytes_to_unicode();
    let mut vocab = Map::new();
    for (b, c) in table.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    vocab.insert("ll".into(), json!(LL_ID));
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            special(ENDOFTEXT_ID, "<|endoftext|>"),
            special(IM_START_ID, "<|im_start|>"),
            special(EOS_ID, "<|im_end|>"),
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": ["l l"]}
    })
}

/// Write the tiny model directory (tokenizer, ChatML template, config, generation config).
pub fn write_tiny_model_dir(dir: &Path) {
    let write = |name: &str, v: &Value| {
        std::fs::write(dir.join(name), serde_json::to_string_pretty(v).unwrap()).unwrap()
    };
    write("tokenizer.json", &tiny_tokenizer_json());
    write(
        "tokenizer_config.json",
        &json!({"bos_token": null, "eos_token": "<|im_end|>", "chat_template": CHATML}),
    );
    write(
        "config.json",
        &json!({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": MAX_CONTEXT}),
    );
    write(
        "generation_config.json",
        &json!({"eos_token_id": EOS_ID, "temperature": 0.7}),
    );
}

/// A fresh temporary tiny model directory.
pub fn tiny_model_dir() -> TempDir {
    let dir = TempDir::new("model");
    write_tiny_model_dir(dir.path());
    dir
}

mod etcd_server;
pub use etcd_server::Etcd;
