//! Stop strings, matched in the router on detokenized text.
//!
//! Output is truncated right before the first stop string and nothing after it is ever
//! streamed. A tail of the text that could be the beginning of a stop string is held back
//! until the next chunk decides it (or the stream ends).

/// Result of feeding one chunk of text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopStep {
    /// Text that is safe to send now.
    pub emit: String,
    /// A stop string was found: the request is finished, `emit` ends right before it.
    pub stopped: bool,
}

/// Per-request stop string matcher.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not emitted yet.
    held: String,
    stopped: bool,
    /// Keep the matched stop string at the end of the text (vLLM's
    /// `include_stop_str_in_output`).
    keep_stop: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Default::default()
        }
    }

    /// The matched stop string stays in the output (it still ends it).
    pub fn keeping_stop(mut self) -> Self {
        self.keep_stop = true;
        self
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Feed newly decoded text.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stopped {
            return StopStep {
                emit: String::new(),
                stopped: true,
            };
        }
        if self.stops.is_empty() {
            return StopStep {
                emit: text.to_string(),
                stopped: false,
            };
        }
        self.held.push_str(text);
        // NOTE: everything emitted so far was checked not to contain a stop string nor to
        // end with a stop prefix, so any match lies entirely inside `held`.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|pos| (pos, s.len())))
            .min_by_key(|&(pos, len)| (pos, std::cmp::Reverse(len)));
        if let Some((pos, len)) = first {
            self.stopped = true;
            let end = if self.keep_stop { pos + len } else { pos };
            let emit = self.held[..end].to_string();
            self.held.clear();
            return StopStep {
                emit,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopStep {
            emit,
            stopped: false,
        }
    }

    /// End of stream without a stop string: release the held-back text.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop
    /// string, on a char boundary.
    fn partial_suffix_len(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let max = held.len().min(stop.len().saturating_sub(1));
            for len in (best + 1..=max).rev() {
                let start = held.len() - len;
                if held.is_char_boundary(start) && stop.starts_with(&held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (Vec<String>, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for c in chunks {
            let step = m.push(c);
            out.push(step.emit);
            if step.stopped {
                return (out, true, String::new());
            }
        }
        let rest = m.flush();
        (out, false, rest)
    }

    #[test]
    fn stop_split_across_chunks_is_truncated_and_never_streamed() {
        let (out, stopped, _) = run(&["END"], &["hello E", "N", "D and more"]);
        assert!(stopped);
        assert_eq!(out, ["hello ", "", ""]);
        assert_eq!(out.concat(), "hello ");
    }

    #[test]
    fn a_kept_stop_string_ends_the_text_and_nothing_after_it_streams() {
        let mut m = StopMatcher::new(vec!["END".into()]).keeping_stop();
        assert_eq!(m.push("hello E").emit, "hello ");
        let step = m.push("ND and more");
        assert!(step.stopped);
        assert_eq!(step.emit, "END");
        assert_eq!(m.push("x").emit, "");
    }

    #[test]
    fn false_partial_match_is_released() {
        let (out, stopped, rest) = run(&["END"], &["an E", "ND", "x"]);
        assert!(stopped);
        assert_eq!(out.concat(), "an ");
        let (out, stopped, rest2) = run(&["END"], &["an E", "Nx", "y E"]);
        assert!(!stopped);
        assert_eq!(out, ["an ", "ENx", "y "]);
        assert_eq!(rest2, "E");
        assert_eq!(rest, "");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_is_safe() {
        let (out, stopped, _) = run(&["é!", "zz"], &["aaz", "zé!"]);
        assert!(stopped);
        assert_eq!(out.concat(), "aa");
        let (out, stopped, rest) = run(&["日本"], &["x日", "y"]);
        assert!(!stopped);
        assert_eq!(out, ["x", "日y"]);
        assert_eq!(rest, "");
    }

    #[test]
    fn no_stops_passes_through() {
        let (out, stopped, rest) = run(&[], &["a", "b"]);
        assert_eq!(
            (out, stopped, rest),
            (vec!["a".into(), "b".into()], false, String::new())
        );
    }
}
