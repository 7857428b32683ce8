//! Router ↔ worker messages (docs/protocol.md, v1): one msgpack map per ZeroMQ frame with
//! keys `v` and `type`. Encoded with named fields (`rmp_serde::to_vec_named`).
//!
//! Every message type both encodes and decodes, so the golden fixtures of
//! `tests/golden/wire/` (shared with the Python worker's dataclasses) pin both directions
//! (`protocols/wire_golden.rs`). Router → worker messages borrow what they send (`Cow`), so
//! encoding copies nothing.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use super::worker_stats::Stats;
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Plan, Role};
use crate::tiers::Tier;
use crate::worker_auth::HANDSHAKE_VERSION;

/// Protocol version carried in every message as `v`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Sampling parameters of a `generate` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    /// -1 = off.
    pub top_k: i32,
    pub seed: Option<u64>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Logit processors (0, 0, 1, empty, 0, 0: off); see python/nitsum/sampling_processors.py.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    /// `[token id, bias]` pairs (a list: msgpack maps with integer keys are refused by the
    /// Python decoder's `strict_map_key`).
    pub logit_bias: Vec<(u32, f32)>,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_tokens: u32,
    pub min_p: f32,
    /// Alternatives per token to return with logprobs; `None`: no logprobs.
    pub logprobs: Option<u32>,
    /// The last this-many `input_ids` are output streamed before a resume: the worker's
    /// penalties count them as output (0: a fresh request).
    #[serde(default)]
    pub resumed_tokens: u32,
    /// Alternatives per prompt token with the prompt's logprobs (echo); `None`: none.
    #[serde(default)]
    pub prompt_logprobs: Option<u32>,
    /// vLLM's `allowed_token_ids`: only these may be sampled (empty: any).
    #[serde(default)]
    pub allowed_token_ids: Vec<u32>,
    /// vLLM's `bad_words` as token id sequences: a sequence's last id is banned when the
    /// output ends with the ids before it.
    #[serde(default)]
    pub bad_words: Vec<Vec<u32>>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            max_tokens: 16,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            seed: None,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            min_p: 0.0,
            logprobs: None,
            resumed_tokens: 0,
            prompt_logprobs: None,
            allowed_token_ids: Vec::new(),
            bad_words: Vec::new(),
        }
    }
}

/// `generate` (router → group leader).
fn unit_weight() -> f64 {
    1.0
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Generate<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub request_id: &'a str,
    pub input_ids: Cow<'a, [u32]>,
    pub sampling: Cow<'a, Sampling>,
    pub tier: &'a str,
    pub class: &'a str,
    /// The decode group's leader when this group only prefills: the worker to hand KV to.
    pub decode_target: Option<WorkerId>,
    /// The tier's TTFT target (ms) for SLO tiers: the worker's local scheduler serves a
    /// request that has not started within it last (it can no longer meet its SLO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// The tier's TPOT target (ms) for SLO tiers: what the worker's binding cost model
    /// (binding.rs) weighs a request's decode against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    /// The tier's goodput weight (`Tier::weight`): the binding cost model's value of the
    /// request against the requests a binding delays.
    #[serde(default = "unit_weight")]
    pub weight: f64,
    /// Within its class, lower is served first (0 when absent).
    pub priority: i32,
    /// May preempt running requests of a lower class or priority (the tier's `preempt`).
    pub preempt: bool,
    /// Run on a TP group of this size bound for the request (the tier's `bind_tp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_tp: Option<u32>,
    /// The first of n > 1 choices of the same prompt, whose prefill this one shares.
    #[serde(skip_serializing_if = "Option::is_none", borrow, default)]
    pub fork_of: Option<&'a str>,
    /// vLLM's `truncate_prompt_tokens`: the worker serves only the last this-many
    /// `input_ids` (left truncation); absent: the whole prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncate_prompt_tokens: Option<u32>,
    /// Structured output: the grammar the output must match (absent: none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub grammar: Option<Cow<'a, super::structured::Grammar>>,
    /// vLLM's `cache_salt`: only requests with the same salt share prefix-cached KV.
    #[serde(skip_serializing_if = "Option::is_none", borrow, default)]
    pub cache_salt: Option<&'a str>,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn one() -> u32 {
    1
}

/// One group of a `reconfigure` message.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct WireGroup<'a> {
    pub members: Cow<'a, [u32]>,
    pub tp: u32,
    /// Pipeline stages of `tp` devices (members stage-major); absent: 1, a TP group.
    #[serde(skip_serializing_if = "is_one", default = "one")]
    pub pp: u32,
    pub role: Role,
    pub tiers: Cow<'a, [String]>,
    pub accepts_background: bool,
    /// Local batch cap from the planner (TPOT bound); absent = the worker's own limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<u32>,
}

/// `reconfigure` (router → every worker): the whole new plan.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Reconfigure<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub epoch: u64,
    pub groups: Vec<WireGroup<'a>>,
}

/// `registered` (router → worker): its `register` was accepted; `epoch` is the plan's.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Registered<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub worker_id: WorkerId,
    pub epoch: u64,
}

/// `challenge` (router → worker), the answer to `hello`: the router's `nonce` and its `proof`
/// of the secret over both nonces; the worker checks it, then sends `register` with `auth`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Challenge<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub worker_id: WorkerId,
    pub handshake: u32,
    pub nonce: &'a str,
    pub proof: &'a str,
}

/// `refused` (router → worker): a `register` the router did not accept, and why.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Refused<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub worker_id: WorkerId,
    pub error: &'a str,
}

/// `abort` (router → worker): end the request (a no-op when unknown or finished).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Abort<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub request_id: &'a str,
}

/// A message without fields: `shutdown`, `reregister`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Bare<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
}

fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // NOTE: serializing these plain structs into a Vec cannot fail.
    rmp_serde::to_vec_named(msg).expect("msgpack encode")
}

/// Encode `generate`.
pub fn encode_generate(msg: &Generate<'_>) -> Vec<u8> {
    encode(msg)
}

/// Encode `registered`.
pub fn encode_registered(worker_id: WorkerId, epoch: u64) -> Vec<u8> {
    encode(&Registered {
        v: PROTOCOL_VERSION,
        ty: "registered",
        worker_id,
        epoch,
    })
}

/// Encode `challenge` with the router's hex nonce and hex proof (docs/protocol.md "Handshake").
pub fn encode_challenge(worker_id: WorkerId, nonce_hex: &str, proof_hex: &str) -> Vec<u8> {
    encode(&Challenge {
        v: PROTOCOL_VERSION,
        ty: "challenge",
        worker_id,
        handshake: HANDSHAKE_VERSION,
        nonce: nonce_hex,
        proof: proof_hex,
    })
}

/// Encode `refused`: the router did not accept a `register` (bad proof, wrong model, id
/// served by another connection).
pub fn encode_refused(worker_id: WorkerId, error: &str) -> Vec<u8> {
    encode(&Refused {
        v: PROTOCOL_VERSION,
        ty: "refused",
        worker_id,
        error,
    })
}

/// Encode `abort`.
pub fn encode_abort(request_id: &str) -> Vec<u8> {
    encode(&Abort {
        v: PROTOCOL_VERSION,
        ty: "abort",
        request_id,
    })
}

/// Encode `flush_cache`: drop the prefix caches' pages no running request holds
/// (`/flush_cache`, `/reset_prefix_cache`).
pub fn encode_flush_cache() -> Vec<u8> {
    encode(&Bare {
        v: PROTOCOL_VERSION,
        ty: "flush_cache",
    })
}

/// Encode `shutdown`.
pub fn encode_shutdown() -> Vec<u8> {
    encode(&Bare {
        v: PROTOCOL_VERSION,
        ty: "shutdown",
    })
}

/// Encode `reregister`: the answer to a heartbeat from a worker the router does not know
/// (declared dead, or registered with a previous router process).
pub fn encode_reregister() -> Vec<u8> {
    encode(&Bare {
        v: PROTOCOL_VERSION,
        ty: "reregister",
    })
}

/// Encode `reconfigure` for a whole plan, its tiers named from `tiers` (the list its ids
/// index); `max_batch` gives each group's optional batch cap.
pub fn encode_reconfigure(
    plan: &Plan,
    tiers: &[Tier],
    max_batch: impl Fn(&GroupPlan) -> Option<u32>,
) -> Vec<u8> {
    encode(&Reconfigure {
        v: PROTOCOL_VERSION,
        ty: "reconfigure",
        epoch: plan.epoch,
        groups: plan
            .groups
            .iter()
            .map(|g| WireGroup {
                members: Cow::Borrowed(&g.members),
                tp: g.tp,
                pp: g.pp,
                role: g.role,
                tiers: Cow::Owned(
                    g.tiers
                        .iter()
                        .map(|id| tiers[id.index()].name.clone())
                        .collect(),
                ),
                accepts_background: g.accepts_background,
                max_batch: max_batch(g),
            })
            .collect(),
    })
}

/// Any worker → router message: the envelope every type shares (`v`, `worker_id`) and its
/// typed body. Unknown keys are ignored (forward compatible).
#[derive(Debug)]
pub struct Incoming {
    pub v: u32,
    /// The `worker_id` the message names (checked against its connection's binding).
    pub worker_id: Option<WorkerId>,
    pub body: Body,
}

/// A worker message's body, by its `type`.
#[derive(Debug, PartialEq)]
pub enum Body {
    Hello(Hello),
    Register(Register),
    Heartbeat(Heartbeat),
    /// A host worker's device process died: out of the plan at once, like a missed heartbeat.
    DeviceLost(DeviceLost),
    Tokens(Tokens),
    Reconfigured(Reconfigured),
    /// Counters and gauges for `/metrics` (boxed: it is the largest body by far).
    Stats(Box<Stats>),
    /// A type this router does not know (dropped with a warning).
    Unknown(String),
}

impl Body {
    /// The message's `type`, for logs.
    pub fn kind(&self) -> &str {
        match self {
            Body::Hello(_) => "hello",
            Body::Register(_) => "register",
            Body::Heartbeat(_) => "heartbeat",
            Body::DeviceLost(_) => "device_lost",
            Body::Tokens(_) => "tokens",
            Body::Reconfigured(_) => "reconfigured",
            Body::Stats(_) => "stats",
            Body::Unknown(ty) => ty,
        }
    }
}

/// `hello`: a worker opens the handshake with its own nonce (docs/protocol.md "Handshake").
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Hello {
    /// The handshake version the worker speaks ([`HANDSHAKE_VERSION`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handshake: Option<u32>,
    /// The worker's nonce: 64 hex characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

/// `register`: a worker introduces itself (and answers a `challenge` with `auth`).
/// NOTE: every field is optional when decoding (absent: unknown); none is sent as null.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Register {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp_levels: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eos_token_ids: Option<Vec<u32>>,
    /// Rendezvous address of the KV transport between host worker processes the worker
    /// joined (`nitsum worker --kv-peers`): domains that name the same one hand KV to each
    /// other, so P/D may span them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transport: Option<String>,
    /// Handshake proof: hex HMAC-SHA256 over both nonces of the handshake (docs/protocol.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
}

/// `heartbeat`: liveness and load.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Heartbeat {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub free_pages: Option<u64>,
    pub epoch: Option<u64>,
}

/// `device_lost`: the worker id's device process died (a host worker serves several ids);
/// the router treats it as dead now rather than after the heartbeat timeout. The id comes
/// back with a `register` once its host worker restarted the device.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceLost {
    /// Why, for the log (e.g. the exit code).
    pub reason: Option<String>,
}

/// `tokens`: new tokens of one request, and its end.
/// NOTE: `finish_reason` and `error` are sent as null when absent; the optional keys are
/// left out (as the Python worker does).
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tokens {
    pub request_id: Option<String>,
    pub token_ids: Option<Vec<u32>>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// With `error`: the request field the worker refused (the client's 400 names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_param: Option<String>,
    pub prompt_tokens: Option<u32>,
    /// Milliseconds the worker held the request before its first scheduled step (optional;
    /// sent with the request's first tokens): the queue / prefill split of `/metrics`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// One per token id when the request asked for logprobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// With the first token, when the request asked: its prompt tokens' after the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
    /// With the first token: its prompt tokens found in the worker's prefix cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
}

/// A sampled token's logprob and its top alternatives `(token id, logprob)`, most likely
/// first (docs/protocol.md `tokens`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// `reconfigured`: the ack of a `reconfigure`.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reconfigured {
    pub epoch: Option<u64>,
    pub ok: Option<bool>,
    pub error: Option<String>,
    pub timings_ms: Option<HashMap<String, f64>>,
}

/// What every worker message has.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope {
    v: u32,
    #[serde(rename = "type")]
    ty: String,
    worker_id: Option<WorkerId>,
}

/// Decode a worker message: the envelope, then the body its `type` names.
/// NOTE: a message of another protocol version keeps its body undecoded (`Unknown`): the
/// caller refuses it by its version, whatever shape its fields have there.
pub fn decode_incoming(bytes: &[u8]) -> Result<Incoming, rmp_serde::decode::Error> {
    let env: Envelope = rmp_serde::from_slice(bytes)?;
    if env.v != PROTOCOL_VERSION {
        return Ok(Incoming {
            v: env.v,
            worker_id: env.worker_id,
            body: Body::Unknown(env.ty),
        });
    }
    let body = match env.ty.as_str() {
        "hello" => Body::Hello(rmp_serde::from_slice(bytes)?),
        "register" => Body::Register(rmp_serde::from_slice(bytes)?),
        "heartbeat" => Body::Heartbeat(rmp_serde::from_slice(bytes)?),
        "device_lost" => Body::DeviceLost(rmp_serde::from_slice(bytes)?),
        "tokens" => Body::Tokens(rmp_serde::from_slice(bytes)?),
        "reconfigured" => Body::Reconfigured(rmp_serde::from_slice(bytes)?),
        "stats" => Body::Stats(Box::new(rmp_serde::from_slice(bytes)?)),
        _ => Body::Unknown(env.ty),
    };
    Ok(Incoming {
        v: env.v,
        worker_id: env.worker_id,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_is_a_named_map_and_round_trips() {
        let sampling = Sampling {
            max_tokens: 4,
            seed: Some(7),
            ..Sampling::default()
        };
        let bytes = encode_generate(&Generate {
            v: 1,
            ty: "generate",
            request_id: "42",
            input_ids: Cow::Borrowed(&[1, 2, 3]),
            sampling: Cow::Borrowed(&sampling),
            tier: "strict",
            class: "feasible",
            decode_target: None,
            ttft_ms: None,
            tpot_ms: None,
            weight: 1.0,
            priority: -3,
            preempt: false,
            bind_tp: Some(2),
            fork_of: None,
            truncate_prompt_tokens: Some(5),
            grammar: None,
            cache_salt: None,
        });
        // Generic decode: keys are strings (a map, not an array).
        let v: serde_json::Value = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(v["type"], "generate");
        assert_eq!(v["sampling"]["top_k"], -1);
        assert_eq!(v["sampling"]["seed"], 7);
        assert!(v["decode_target"].is_null());
        assert_eq!(v["input_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["priority"], -3);
        assert_eq!(v["preempt"], false);
        assert_eq!(v["bind_tp"], 2);
        assert_eq!(v["truncate_prompt_tokens"], 5);
    }

    #[test]
    fn worker_ids_encode_as_the_bare_u32_they_replaced() {
        // The wire form before `WorkerId`: the same struct with a plain `u32`.
        #[derive(Serialize)]
        struct Untyped {
            v: u32,
            #[serde(rename = "type")]
            ty: &'static str,
            worker_id: u32,
            epoch: u64,
        }
        let untyped = Untyped {
            v: PROTOCOL_VERSION,
            ty: "registered",
            worker_id: 70_000,
            epoch: 9,
        };
        assert_eq!(
            encode_registered(WorkerId(70_000), 9),
            rmp_serde::to_vec_named(&untyped).unwrap()
        );
        let m = decode_incoming(&rmp_serde::to_vec_named(&untyped).unwrap()).unwrap();
        assert_eq!(m.worker_id, Some(WorkerId(70_000)));
    }

    #[test]
    fn incoming_ignores_unknown_keys_and_reads_stats() {
        let tokens = serde_json::json!({"v": 1, "type": "tokens", "worker_id": 3,
            "request_id": "9", "token_ids": [5, 6], "finish_reason": null, "error": null,
            "prompt_tokens": 2, "future_field": {"x": 1}});
        let bytes = rmp_serde::to_vec_named(&tokens).unwrap();
        let m = decode_incoming(&bytes).unwrap();
        assert_eq!((m.body.kind(), m.worker_id), ("tokens", Some(WorkerId(3))));
        let Body::Tokens(t) = m.body else {
            panic!("{:?}", m.body)
        };
        assert_eq!(t.token_ids, Some(vec![5, 6]));
        assert_eq!(t.finish_reason, None);
        // Stats: known fields typed, unknown ones (a newer worker's) ignored.
        let stats = serde_json::json!({"v": 1, "type": "stats", "worker_id": 3, "util": 0.5,
            "kv_handoffs": 2, "kv_cache_usage_perc": 37});
        let m = decode_incoming(&rmp_serde::to_vec_named(&stats).unwrap()).unwrap();
        let Body::Stats(s) = m.body else {
            panic!("{:?}", m.body)
        };
        let want = Stats {
            kv_handoffs: Some(2),
            kv_cache_usage_perc: Some(37.0),
            ..Stats::default()
        };
        assert_eq!(*s, want);
        assert_eq!(
            s.fields(),
            vec![("kv_handoffs", 2.0), ("kv_cache_usage_perc", 37.0)]
        );
        // A known stat of the wrong type is undecodable (a counter is an unsigned integer).
        let bad = serde_json::json!({"v": 1, "type": "stats", "kv_handoffs": -1});
        assert!(decode_incoming(&rmp_serde::to_vec_named(&bad).unwrap()).is_err());
        // A known type whose field has the wrong type is undecodable; an unknown type is not.
        let bad = serde_json::json!({"v": 1, "type": "heartbeat", "running": "many"});
        assert!(decode_incoming(&rmp_serde::to_vec_named(&bad).unwrap()).is_err());
        let new = serde_json::json!({"v": 1, "type": "telemetry", "worker_id": 3});
        let m = decode_incoming(&rmp_serde::to_vec_named(&new).unwrap()).unwrap();
        assert!(matches!(m.body, Body::Unknown(ref t) if t == "telemetry"));
    }
}
