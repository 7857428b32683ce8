//! vLLM's fields on a stream's chunks (api/fields.rs applies them to the request): each
//! choice's `token_ids` and, with `stream_options.continuous_usage_stats`, its usage so far.

use serde_json::{json, Value};

use super::fields::Replies;
use super::output::{Piece, TextStream};
use super::sse::ChunkFormat;

/// A stream's chunks with what the fields add: each choice's `token_ids` (the ids of its
/// pieces since its last chunk) and, with `continuous_usage`, the choice's usage so far.
pub struct Shaped<F> {
    pub inner: F,
    pub replies: Replies,
    /// Per choice: ids not yet sent on a chunk.
    pending: Vec<Vec<u32>>,
}

impl<F> Shaped<F> {
    pub fn new(inner: F, replies: Replies) -> Self {
        Shaped {
            inner,
            replies,
            pending: Vec::new(),
        }
    }
}

impl<F: ChunkFormat> ChunkFormat for Shaped<F> {
    fn start(&mut self, index: usize, ts: &TextStream) -> Vec<Value> {
        let mut chunks = self.inner.start(index, ts);
        self.shape(index, ts, &mut chunks);
        chunks
    }

    fn piece(&mut self, index: usize, ts: &TextStream, p: &Piece) -> Vec<Value> {
        if self.pending.len() <= index {
            self.pending.resize_with(index + 1, Vec::new);
        }
        self.pending[index].extend_from_slice(&p.ids);
        let mut chunks = self.inner.piece(index, ts, p);
        self.shape(index, ts, &mut chunks);
        chunks
    }

    fn end(&mut self, all: &[TextStream]) -> Vec<Value> {
        self.inner.end(all)
    }
}

impl<F> Shaped<F> {
    fn shape(&mut self, index: usize, ts: &TextStream, chunks: &mut [Value]) {
        for chunk in chunks.iter_mut() {
            let Some(choice) = chunk["choices"].get_mut(0) else {
                continue;
            };
            if self.replies.token_ids {
                let ids = self
                    .pending
                    .get_mut(index)
                    .map(std::mem::take)
                    .unwrap_or_default();
                choice["token_ids"] = json!(ids);
            }
            if self.replies.continuous_usage {
                let (prompt, completion) = (ts.prompt_tokens, ts.completion_tokens);
                chunk["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                                        "total_tokens": prompt + completion,
                                        "prompt_tokens_details":
                                            {"cached_tokens": ts.cached_tokens.unwrap_or(0)}});
            }
        }
    }
}
