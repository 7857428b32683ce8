//! Incremental detokenization that never emits broken UTF-8.
//!
//! Standard prefix-offset / read-offset technique (vLLM, TGI): decode a small window of
//! recent tokens twice, without and with the new tokens, and emit only the extra text. A
//! byte-level BPE may split one character over several tokens; while the window decodes to
//! a trailing U+FFFD (an incomplete UTF-8 sequence) nothing is emitted and the tokens wait.

/// Decodes token ids to text; implemented by the HF tokenizer wrapper and by tests.
pub trait Decode {
    /// Decode ids to text, skipping special tokens. Incomplete UTF-8 becomes U+FFFD.
    fn decode(&self, ids: &[u32]) -> String;
}

/// Per-request streaming detokenizer state.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDetokenizer {
    tokens: Vec<u32>,
    /// Start of the context window decoded for alignment.
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
}

impl IncrementalDetokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add tokens and return the newly complete text (possibly empty).
    pub fn push(&mut self, dec: &impl Decode, ids: &[u32]) -> String {
        self.tokens.extend_from_slice(ids);
        self.step(dec, false)
    }

    /// End of stream: emit whatever is left, even an incomplete character (as U+FFFD).
    pub fn flush(&mut self, dec: &impl Decode) -> String {
        self.step(dec, true)
    }

    /// Number of tokens pushed so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    fn step(&mut self, dec: &impl Decode, last: bool) -> String {
        if self.read_offset == self.tokens.len() {
            return String::new();
        }
        let prefix = dec.decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let full = dec.decode(&self.tokens[self.prefix_offset..]);
        // NOTE: a trailing U+FFFD means the last character is still incomplete; waiting for
        // more tokens is what keeps every emitted chunk valid, whole UTF-8.
        let complete = !full.ends_with('\u{FFFD}');
        if !(complete || last) || full.len() <= prefix.len() {
            return String::new();
        }
        // The window with more tokens normally extends the shorter decode; if a decoder
        // rewrote earlier text (rare), fall back to the common prefix.
        let start = if full.starts_with(&prefix) {
            prefix.len()
        } else {
            common_prefix_len(&prefix, &full)
        };
        let delta = full[start..].to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        delta
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per byte, decoded lossily like a byte-level BPE decoder.
    struct Bytes;
    impl Decode for Bytes {
        fn decode(&self, ids: &[u32]) -> String {
            let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
            String::from_utf8_lossy(&b).into_owned()
        }
    }

    fn ids(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn multibyte_characters_split_over_tokens_are_held_back() {
        let text = "aé😀b";
        let mut d = IncrementalDetokenizer::new();
        let mut out = Vec::new();
        for id in ids(text) {
            out.push(d.push(&Bytes, &[id]));
        }
        // a | é (2 bytes: nothing, then "é") | 😀 (4 bytes: three empties, then the emoji) | b
        assert_eq!(out, ["a", "", "é", "", "", "", "😀", "b"]);
        assert_eq!(out.concat(), text);
        assert_eq!(d.flush(&Bytes), "");
    }

    #[test]
    fn flush_emits_a_truncated_character_as_replacement() {
        let mut d = IncrementalDetokenizer::new();
        let emoji = ids("😀");
        assert_eq!(d.push(&Bytes, &ids("x")), "x");
        assert_eq!(d.push(&Bytes, &emoji[..2]), "");
        assert_eq!(d.flush(&Bytes), "\u{FFFD}");
    }

    #[test]
    fn chunks_of_many_tokens() {
        let text = "héllo wörld ✓";
        let all = ids(text);
        let mut d = IncrementalDetokenizer::new();
        let mut out = String::new();
        for chunk in all.chunks(3) {
            let piece = d.push(&Bytes, chunk);
            assert!(!piece.contains('\u{FFFD}'));
            out.push_str(&piece);
        }
        out.push_str(&d.flush(&Bytes));
        assert_eq!(out, text);
    }
}
