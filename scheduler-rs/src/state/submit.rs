//! What enters the router state: a request ready for dispatch, its prefix-cache hints and
//! the earlier choice a sibling choice shares its prefill with.

use crate::ids::TierId;
use crate::protocols::worker::{Output, Sampling, Stop};

/// A request ready for dispatch (already tokenized and validated).
#[derive(Debug, Clone)]
pub struct Submit {
    pub input_ids: Vec<u32>,
    /// The last this-many `input_ids` are output streamed before a resume (orphans.rs).
    pub resumed_tokens: u32,
    pub sampling: Sampling,
    pub stop: Stop,
    pub output: Output,
    /// The request's tier (resolved against the config's tiers).
    pub tier: TierId,
    /// Within its class on the worker, lower is served first (vLLM's `priority`).
    pub priority: i32,
    /// A sibling choice (n > 1) of this earlier request of the same prompt: it goes to the
    /// same groups so that it shares the prompt's prefill there (docs/serving.md "n").
    pub fork_of: Option<Fork>,
    /// Structured output: the grammar the output must match (protocols/structured.rs).
    pub grammar: Option<crate::protocols::structured::Grammar>,
    /// Prefix-cache salt and affinity key (prefix_index.rs `cache_keys`).
    pub cache: CacheHints,
}

/// A request's prefix-cache hints: vLLM's `cache_salt` and OpenAI's `prompt_cache_key`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheHints {
    /// Only requests with the same salt share cached KV (the worker's prefix cache and the
    /// router's prefix index both key on it).
    pub salt: Option<String>,
    /// Requests with the same key prefer the group that got the key last.
    pub key: Option<String>,
}

impl CacheHints {
    /// The prefix-index keys of a prompt under these hints.
    pub fn keys(&self, ids: &[u32]) -> Vec<u64> {
        crate::prefix_index::cache_keys(ids, self.salt.as_deref(), self.key.as_deref())
    }
}

/// The first choice a sibling choice shares its prefill with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    /// Its router request id.
    pub parent: u64,
    /// Its dispatch class (a sibling is charged as it was).
    pub class: crate::dispatch::Class,
}
