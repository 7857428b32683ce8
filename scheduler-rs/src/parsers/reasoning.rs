//! Reasoning read out of a model's text (`--reasoning-parser`): the `<think>…</think>` family.
//! A state machine over text pieces: every piece splits into reasoning and content, and a
//! tag cut between pieces (a `</th` at a piece's end) is held back until the next piece
//! decides it. A whole reply is one piece and the end, so streamed and whole replies go
//! through the same code and agree.
//!
//! - `deepseek_r1`: the reply starts inside the think block (DeepSeek-R1's template opens it
//!   in the prompt); a leading `<think>` is dropped if the model writes it anyway. Everything
//!   up to `</think>` is reasoning, the rest content; with no `</think>` it is all reasoning.
//! - `qwen3`: content until `<think>`, reasoning until `</think>`, content after. A reply with
//!   no `<think>` (e.g. `enable_thinking: false`) is all content; one cut inside the block
//!   keeps what it had as reasoning (vLLM's streamed answer; its whole answer differs).

/// Opens a think block.
const OPEN: &str = "<think>";
/// Closes a think block.
const CLOSE: &str = "</think>";

/// A reasoning parser by its `--reasoning-parser` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    DeepSeekR1,
    Qwen3,
}

impl ReasoningParser {
    /// The names `--reasoning-parser` takes.
    pub const NAMES: [&'static str; 2] = ["deepseek_r1", "qwen3"];

    /// The parser named `name`; None for a name not in [`Self::NAMES`].
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "deepseek_r1" => Some(ReasoningParser::DeepSeekR1),
            "qwen3" => Some(ReasoningParser::Qwen3),
            _ => None,
        }
    }

    /// Its `--reasoning-parser` name.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::DeepSeekR1 => "deepseek_r1",
            ReasoningParser::Qwen3 => "qwen3",
        }
    }

    /// A whole reply split (the streamed path's code: one piece, then the end).
    pub fn split(self, text: &str) -> Split {
        let mut stream = ReasoningStream::new(self);
        let mut out = stream.push(text);
        out.append(stream.finish());
        out
    }
}

/// What a piece of text held: its reasoning and its content (either may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    /// `other` after `self`.
    pub fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

/// Where the reply stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// DeepSeek-R1 at the reply's start: a `<think>` here is dropped.
    Opening,
    /// Content before any think block (Qwen3): looking for `<think>`.
    Before,
    /// Inside the think block: looking for `</think>`.
    Thinking,
    /// After the think block: the rest is content.
    After,
}

/// One reply's parser state.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    state: State,
    /// Text not yet decided: the start of a tag that the next piece may complete.
    /// NOTE: only ever a proper prefix of the tag the state looks for.
    held: String,
}

impl ReasoningStream {
    pub fn new(parser: ReasoningParser) -> Self {
        let state = match parser {
            ReasoningParser::DeepSeekR1 => State::Opening,
            ReasoningParser::Qwen3 => State::Before,
        };
        ReasoningStream {
            state,
            held: String::new(),
        }
    }

    /// The next piece of the reply: what it decided.
    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        let mut text = std::mem::take(&mut self.held);
        text.push_str(piece);
        let mut rest = text.as_str();
        loop {
            match self.state {
                State::Opening => {
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        rest = after;
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(rest) {
                        // NOTE: `rest` may still become `<think>` (empty included).
                        self.held = rest.to_string();
                        return out;
                    } else {
                        self.state = State::Thinking;
                    }
                }
                State::Before | State::Thinking => {
                    let (tag, next) = if self.state == State::Before {
                        (OPEN, State::Thinking)
                    } else {
                        (CLOSE, State::After)
                    };
                    let sink = if self.state == State::Before {
                        &mut out.content
                    } else {
                        &mut out.reasoning
                    };
                    if let Some(at) = rest.find(tag) {
                        sink.push_str(&rest[..at]);
                        rest = &rest[at + tag.len()..];
                        self.state = next;
                        continue;
                    }
                    let keep = partial_tag_len(rest, tag);
                    sink.push_str(&rest[..rest.len() - keep]);
                    self.held = rest[rest.len() - keep..].to_string();
                    return out;
                }
                State::After => {
                    out.content.push_str(rest);
                    return out;
                }
            }
        }
    }

    /// The reply ended: what was held back is text of the state it was held in.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Opening | State::Thinking => Split {
                reasoning: held,
                content: String::new(),
            },
            State::Before | State::After => Split {
                reasoning: String::new(),
                content: held,
            },
        }
    }
}

/// The length of the longest end of `text` that is a proper start of `tag` (a tag that may
/// be cut there). NOTE: tags are ASCII, so the cut is on a char boundary.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.as_bytes().ends_with(&tag.as_bytes()[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: ReasoningParser, r: &str, c: &str) -> (ReasoningParser, Split) {
        let s = Split {
            reasoning: r.into(),
            content: c.into(),
        };
        (p, s)
    }

    /// Samples and their whole answers.
    fn samples() -> Vec<(&'static str, (ReasoningParser, Split))> {
        use ReasoningParser::{DeepSeekR1 as R1, Qwen3 as Q3};
        vec![
            (
                "<think>a b</think>\n\nAnswer.",
                split(R1, "a b", "\n\nAnswer."),
            ),
            ("no tag</think>ok", split(R1, "no tag", "ok")),
            ("still thinking <th", split(R1, "still thinking <th", "")),
            ("<thin", split(R1, "<thin", "")),
            ("x </think", split(R1, "x </think", "")),
            ("é<think>ü</think>ö", split(R1, "é<think>ü", "ö")),
            ("</think></think>", split(R1, "", "</think>")),
            (
                "<think>why</think>Hi <think>",
                split(Q3, "why", "Hi <think>"),
            ),
            ("Plain answer.", split(Q3, "", "Plain answer.")),
            ("pre <think>r", split(Q3, "r", "pre ")),
            ("a <thi", split(Q3, "", "a <thi")),
            ("<<think>></think>>", split(Q3, ">", "<>")),
            ("", split(Q3, "", "")),
            ("", split(R1, "", "")),
        ]
    }

    #[test]
    fn whole_replies_split_as_documented() {
        for (text, (parser, want)) in samples() {
            assert_eq!(parser.split(text), want, "{text:?} with {parser:?}");
        }
        assert_eq!(
            ReasoningParser::from_name("qwen3"),
            Some(ReasoningParser::Qwen3)
        );
        assert_eq!(ReasoningParser::from_name("x"), None);
        for name in ReasoningParser::NAMES {
            assert_eq!(ReasoningParser::from_name(name).unwrap().name(), name);
        }
    }

    /// Every char boundary of `text`.
    fn cuts(text: &str) -> Vec<usize> {
        (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect()
    }

    #[test]
    fn every_cut_into_two_and_three_pieces_streams_the_whole_answer() {
        for (text, (parser, want)) in samples() {
            for &i in &cuts(text) {
                for &j in cuts(text).iter().filter(|&&j| j >= i) {
                    let mut s = ReasoningStream::new(parser);
                    let mut got = Split::default();
                    for piece in [&text[..i], &text[i..j], &text[j..]] {
                        let out = s.push(piece);
                        // NOTE: nothing that may still be a tag goes out early.
                        assert!(!out.content.ends_with("<th") || want.content.contains("<th"));
                        got.append(out);
                    }
                    got.append(s.finish());
                    assert_eq!(got, want, "{text:?} cut at {i}, {j} with {parser:?}");
                }
            }
        }
    }

    #[test]
    fn a_cut_tag_is_held_until_decided() {
        let mut s = ReasoningStream::new(ReasoningParser::Qwen3);
        assert_eq!(s.push("Hi <th").content, "Hi ");
        let out = s.push("ink>hm</thi");
        assert_eq!((out.content.as_str(), out.reasoning.as_str()), ("", "hm"));
        let out = s.push("nk>ok");
        assert_eq!((out.content.as_str(), out.reasoning.as_str()), ("ok", ""));
        let mut s = ReasoningStream::new(ReasoningParser::DeepSeekR1);
        assert_eq!(s.push("<"), Split::default());
        assert_eq!(s.push("b").reasoning, "<b");
    }
}
