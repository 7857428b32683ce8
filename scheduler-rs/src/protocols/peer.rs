//! Router ↔ router messages of several routers in front of one pool (docs/protocol.md
//! "Router ↔ router"): a follower's `peer_stats` to the leader, the leader's `peer_plan`
//! answer. They travel on the leader's worker endpoint (a follower connects one DEALER
//! there), each one msgpack frame `{v, type, router, body, mac}`: `body` is the message's own
//! msgpack bytes and `mac` the hex HMAC-SHA256 of `"nitsum-peer-v1" ‖ type ‖ router (u32 BE) ‖
//! body` under the worker secret (empty on an insecure worker plane, which checks none).
//!
//! NOTE: both ends are this crate, so the types are the wire (no golden fixture: no Python
//! side). Replays are harmless: a follower adopts only a plan newer than the last it took
//! from that leader's term, a leader only statistics newer than the last from that follower.

use serde::{Deserialize, Serialize};

use super::worker::PROTOCOL_VERSION;
use crate::plan::NamedGroupPlan;
use crate::worker_auth::WorkerSecret;

/// The `type` of a follower's statistics.
pub const STATS_TYPE: &str = "peer_stats";
/// The `type` of the leader's plan.
pub const PLAN_TYPE: &str = "peer_plan";

/// A follower's window statistics since its last message (or, with `full`, everything its
/// own windows hold: its first message to a leader). Ages are seconds before `sent_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStats {
    /// The leader term it is meant for (another term's leader drops it).
    pub term: u64,
    /// Unix milliseconds when sent: a leader drops one not newer than the last it took.
    pub sent_ms: u64,
    /// Whether it carries the follower's whole window history (its first message to the
    /// leader of this term) rather than what came since its last message.
    pub full: bool,
    /// (tier, age s, prompt tokens) of arrivals.
    pub arrivals: Vec<(String, f64, u32)>,
    /// (tier, age s, output tokens) of completions.
    pub completions: Vec<(String, f64, u32)>,
    /// (age s of its arrival, tier, met its SLOs) of completed requests.
    pub outcomes: Vec<(f64, String, bool)>,
    /// (tier, tokens generated, age s, holds SLO bandwidth) of its requests in flight now.
    pub inflight: Vec<(String, f64, f64, bool)>,
}

/// The leader's plan as its followers route by it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerPlan {
    pub term: u64,
    /// Unix milliseconds when sent: a follower drops one not newer than the last it took.
    pub sent_ms: u64,
    pub epoch: u64,
    /// Routers that share each group's SLO bandwidth (`max_rps`, `max_inflight`): each
    /// dispatches up to its share.
    pub routers: u32,
    pub groups: Vec<NamedGroupPlan>,
    /// Each group's `max_batch` (the planner's batch cap), in `groups` order.
    pub max_batch: Vec<Option<u32>>,
}

/// A router ↔ router message.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerMessage {
    Stats(PeerStats),
    Plan(PeerPlan),
}

impl PeerMessage {
    fn kind(&self) -> &'static str {
        match self {
            PeerMessage::Stats(_) => STATS_TYPE,
            PeerMessage::Plan(_) => PLAN_TYPE,
        }
    }
}

/// A frame as it travels: the message's own msgpack bytes (`body`) and their MAC.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Frame {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: String,
    pub router: u32,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    pub mac: String,
}

/// Why a peer frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerError {
    /// Not a peer frame, or its body does not decode.
    Malformed(String),
    /// A missing or wrong MAC: not from a router of this deployment.
    BadMac,
}

const PEER_LABEL: &[u8] = b"nitsum-peer-v1";

fn signed(ty: &str, router: u32, body: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(PEER_LABEL.len() + ty.len() + 5 + body.len());
    data.extend_from_slice(PEER_LABEL);
    data.extend_from_slice(ty.as_bytes());
    data.push(0);
    data.extend_from_slice(&router.to_be_bytes());
    data.extend_from_slice(body);
    data
}

/// Encode `msg` from router `router`, MACed under `secret` (none: an insecure plane).
pub fn encode_peer(msg: &PeerMessage, router: u32, secret: Option<&WorkerSecret>) -> Vec<u8> {
    // NOTE: serializing these plain structs into a Vec cannot fail.
    let body = match msg {
        PeerMessage::Stats(s) => rmp_serde::to_vec_named(s),
        PeerMessage::Plan(p) => rmp_serde::to_vec_named(p),
    }
    .expect("msgpack encode");
    let ty = msg.kind();
    let mac = secret.map_or_else(String::new, |s| s.mac_hex(&signed(ty, router, &body)));
    let frame = Frame {
        v: PROTOCOL_VERSION,
        ty: ty.to_string(),
        router,
        body,
        mac,
    };
    rmp_serde::to_vec_named(&frame).expect("msgpack encode")
}

/// Decode a peer frame: (the sending router's index, the message), after its MAC checked
/// out under `secret` (none: an insecure plane, nothing to check).
pub fn decode_peer(
    bytes: &[u8],
    secret: Option<&WorkerSecret>,
) -> Result<(u32, PeerMessage), PeerError> {
    let malformed = |e: &dyn std::fmt::Display| PeerError::Malformed(e.to_string());
    let frame: Frame = rmp_serde::from_slice(bytes).map_err(|e| malformed(&e))?;
    if frame.v != PROTOCOL_VERSION {
        return Err(PeerError::Malformed(format!("version {}", frame.v)));
    }
    if let Some(s) = secret {
        if !s.verify_mac_hex(&signed(&frame.ty, frame.router, &frame.body), &frame.mac) {
            return Err(PeerError::BadMac);
        }
    }
    let msg = match frame.ty.as_str() {
        STATS_TYPE => {
            PeerMessage::Stats(rmp_serde::from_slice(&frame.body).map_err(|e| malformed(&e))?)
        }
        PLAN_TYPE => {
            PeerMessage::Plan(rmp_serde::from_slice(&frame.body).map_err(|e| malformed(&e))?)
        }
        other => return Err(PeerError::Malformed(format!("type {other:?}"))),
    };
    Ok((frame.router, msg))
}
