//! What a mock worker streams: a request's echo output (`plan_output`) and the `tokens`
//! messages that carry it.

use serde::Serialize;
use zeromq::ZmqMessage;

use super::MockOptions;
use crate::ids::WorkerId;
use crate::protocols::worker::{Stop, PROTOCOL_VERSION};

#[derive(Serialize)]
pub(super) struct Tokens<'a> {
    pub(super) v: u32,
    #[serde(rename = "type")]
    pub(super) ty: &'static str,
    pub(super) worker_id: WorkerId,
    pub(super) request_id: &'a str,
    pub(super) token_ids: &'a [u32],
    pub(super) finish_reason: Option<&'a str>,
    pub(super) error: Option<&'a str>,
    pub(super) prompt_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) queue_ms: Option<f64>,
}

pub(super) fn encode<T: Serialize>(v: &T) -> ZmqMessage {
    ZmqMessage::from(rmp_serde::to_vec_named(v).expect("msgpack encode"))
}

/// The mock's full output for a request and whether it ended on a stop token.
pub(super) fn plan_output(input: &[u32], s: &Stop) -> (Vec<u32>, &'static str) {
    let mut out = Vec::with_capacity(s.max_tokens as usize);
    for i in 0..s.max_tokens as usize {
        let tok = if input.is_empty() {
            i as u32
        } else {
            input[i % input.len()]
        };
        out.push(tok);
        if !s.ignore_eos && s.stop_token_ids.contains(&tok) {
            return (out, "stop");
        }
    }
    (out, "length")
}
pub(super) fn chunks(
    id: WorkerId,
    rid: &str,
    out: &[u32],
    finish: &str,
    prompt: usize,
    opts: &MockOptions,
) -> Vec<ZmqMessage> {
    let per = opts.tokens_per_message;
    let per = if per == 0 { out.len().max(1) } else { per };
    let parts: Vec<&[u32]> = if out.is_empty() {
        vec![&[][..]]
    } else {
        out.chunks(per).collect()
    };
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, ids)| {
            encode(&Tokens {
                v: PROTOCOL_VERSION,
                ty: "tokens",
                worker_id: id,
                request_id: rid,
                token_ids: ids,
                finish_reason: (i + 1 == n).then_some(finish),
                error: None,
                prompt_tokens: prompt,
                queue_ms: opts.queue_ms.filter(|_| i == 0),
            })
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_echoes_prompt_and_stops_on_stop_token() {
        let s = Stop {
            max_tokens: 5,
            ..Stop::default()
        };
        assert_eq!(plan_output(&[7, 8], &s), (vec![7, 8, 7, 8, 7], "length"));
        let s = Stop {
            max_tokens: 5,
            stop_token_ids: vec![8],
            ..Stop::default()
        };
        assert_eq!(plan_output(&[7, 8], &s), (vec![7, 8], "stop"));
        let s = Stop {
            ignore_eos: true,
            ..s
        };
        assert_eq!(plan_output(&[7, 8], &s).1, "length");
    }
}
