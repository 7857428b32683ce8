//! Counters of what the worker plane refused (`nitsum_worker_plane_rejected_total{reason}`),
//! and the rate limit on logging refused registers ([`RefusalLog`]).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::refusal_log::RefusalLog;

/// Why a worker message was dropped or a `register` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Not a msgpack map of the protocol (random bytes, truncated msgpack, wrong frames).
    Undecodable,
    /// Another protocol version.
    Version,
    /// A message other than the handshake from a connection that has not authenticated.
    Unauthenticated,
    /// `hello` the router cannot answer: another handshake version, no nonce, or no secret.
    Handshake,
    /// `register` with a missing, wrong, expired or reused proof.
    BadProof,
    /// `register` for a model this router does not serve.
    WrongModel,
    /// `register` for an id a live worker on another connection holds.
    IdTaken,
    /// `register` for a second id on a connection already bound to one.
    ConnectionBound,
    /// A message whose `worker_id` is not the one its connection is bound to.
    WrongWorker,
    /// A `register` without `worker_id`.
    Malformed,
    /// `tokens` with a request id this router never issued.
    UnknownRequest,
    /// `tokens` for a live request that another connection serves.
    ForeignRequest,
    /// A router ↔ router message with a wrong or missing MAC, or that does not decode.
    BadPeer,
    /// A sealed frame that does not open (forged, modified, replayed, reordered, after a
    /// dropped one), or a clear frame where a sealed one was due: the channel is closed.
    BadFrame,
}

impl Rejection {
    pub const ALL: [Rejection; 14] = [
        Rejection::Undecodable,
        Rejection::Version,
        Rejection::Unauthenticated,
        Rejection::Handshake,
        Rejection::BadProof,
        Rejection::WrongModel,
        Rejection::IdTaken,
        Rejection::ConnectionBound,
        Rejection::WrongWorker,
        Rejection::Malformed,
        Rejection::UnknownRequest,
        Rejection::ForeignRequest,
        Rejection::BadPeer,
        Rejection::BadFrame,
    ];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Undecodable => "undecodable",
            Rejection::Version => "version",
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::Handshake => "handshake",
            Rejection::BadProof => "bad_proof",
            Rejection::WrongModel => "wrong_model",
            Rejection::IdTaken => "id_taken",
            Rejection::ConnectionBound => "connection_bound",
            Rejection::WrongWorker => "wrong_worker",
            Rejection::Malformed => "malformed",
            Rejection::UnknownRequest => "unknown_request",
            Rejection::ForeignRequest => "foreign_request",
            Rejection::BadPeer => "bad_peer",
            Rejection::BadFrame => "bad_frame",
        }
    }
}

/// One counter per [`Rejection`].
#[derive(Debug, Default)]
pub struct PlaneMetrics {
    counts: [AtomicU64; Rejection::ALL.len()],
    /// Which refused registers are logged (every one is counted).
    pub refusals: RefusalLog,
}

impl PlaneMetrics {
    pub fn count(&self, why: Rejection) {
        self.counts[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, why: Rejection) -> u64 {
        self.counts[why as usize].load(Ordering::Relaxed)
    }

    /// Prometheus text.
    pub fn render(&self, out: &mut String) {
        let name = "nitsum_worker_plane_rejected_total";
        let _ = writeln!(
            out,
            "# HELP {name} Worker messages dropped and registers refused, by reason.\n\
             # TYPE {name} counter"
        );
        for why in Rejection::ALL {
            let _ = writeln!(
                out,
                "{name}{{reason=\"{}\"}} {}",
                why.as_str(),
                self.get(why)
            );
        }
    }
}
