//! The handshake (docs/protocol.md "Handshake"): `hello` and `register` (worker → router),
//! answered by `challenge`, then `registered` or `refused` (router → worker).

use serde::{Deserialize, Serialize};

use super::frame::{encode, PROTOCOL_VERSION};
use crate::ids::WorkerId;
use crate::worker_auth::HANDSHAKE_VERSION;

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
