//! Which connection (ZeroMQ routing identity) is bound to which worker id, and the pending
//! handshake challenges.
//!
//! NOTE (invariants): a worker id is bound to at most one connection and a connection to at
//! most one worker id (`bound` and `by_worker` mirror each other); a nonce is issued to one
//! connection (for the worker id and worker nonce of its `hello`), expires after [`NONCE_TTL`]
//! and is consumed by its first use. The pending table
//! is bounded ([`MAX_PENDING`]), so unauthenticated peers cannot grow router memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::{hex, random_bytes, unhex};
use crate::ids::WorkerId;

/// How long a challenge may be answered.
pub const NONCE_TTL: Duration = Duration::from_secs(30);
/// Pending challenges kept at most (the oldest is dropped beyond it).
pub const MAX_PENDING: usize = 1024;

/// A 32-byte handshake nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nonce([u8; 32]);

impl Nonce {
    /// A fresh nonce from the OS CSPRNG.
    pub fn random() -> Self {
        Nonce(random_bytes())
    }

    /// Parse 64 hex characters.
    pub fn from_hex(s: &str) -> Option<Self> {
        unhex(s)?.try_into().ok().map(Nonce)
    }

    /// 64 lowercase hex characters (its form on the wire).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// The two nonces of one handshake: the worker's (from `hello`) and the router's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeNonces {
    pub worker: Nonce,
    pub router: Nonce,
}

/// A challenge waiting for its `register`.
#[derive(Debug)]
struct Pending {
    nonces: HandshakeNonces,
    worker: WorkerId,
    at: Instant,
    /// SHA-256 over the exact `hello` and `challenge` frames so far (`register` follows).
    transcript: Sha256,
}

/// A live challenge, taken by the `register` that answers it.
#[derive(Debug)]
pub struct Challenge {
    pub nonces: HandshakeNonces,
    /// The worker id its `hello` named.
    pub worker: WorkerId,
    /// SHA-256 state over `hello` ‖ `challenge` (channel.rs).
    pub transcript: Sha256,
}

/// A connection's routing identity.
pub type ConnId = Bytes;

/// Handshake and binding state of the worker plane.
#[derive(Debug, Default)]
pub struct Sessions {
    pending: HashMap<ConnId, Pending>,
    bound: HashMap<ConnId, WorkerId>,
    by_worker: HashMap<WorkerId, ConnId>,
}

impl Sessions {
    /// Issue a fresh challenge to `conn`, answering the `hello` of `worker` with
    /// `worker_nonce` (replacing a challenge it had).
    pub fn challenge(
        &mut self,
        conn: &ConnId,
        worker: WorkerId,
        worker_nonce: Nonce,
        now: Instant,
    ) -> HandshakeNonces {
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(conn) {
            self.pending
                .retain(|_, p| now.saturating_duration_since(p.at) < NONCE_TTL);
            if self.pending.len() >= MAX_PENDING {
                let oldest = self.pending.iter().min_by_key(|(_, p)| p.at);
                let oldest = oldest.map(|(c, _)| c.clone()).expect("table is full");
                self.pending.remove(&oldest);
            }
        }
        let nonces = HandshakeNonces {
            worker: worker_nonce,
            router: Nonce::random(),
        };
        let (at, transcript) = (now, Sha256::new());
        let pending = Pending {
            nonces,
            worker,
            at,
            transcript,
        };
        self.pending.insert(conn.clone(), pending);
        nonces
    }

    /// Record the exact `hello` and `challenge` frames of `conn`'s pending challenge.
    pub fn record(&mut self, conn: &ConnId, hello: &[u8], challenge: &[u8]) {
        if let Some(p) = self.pending.get_mut(conn) {
            p.transcript.update(hello);
            p.transcript.update(challenge);
        }
    }

    /// Whether `conn` has a challenge pending.
    pub fn is_pending(&self, conn: &ConnId) -> bool {
        self.pending.contains_key(conn)
    }

    /// The live challenge issued to `conn`, consumed: a second call returns `None`.
    pub fn take_challenge(&mut self, conn: &ConnId, now: Instant) -> Option<Challenge> {
        let p = self.pending.remove(conn)?;
        (now.saturating_duration_since(p.at) < NONCE_TTL).then_some(Challenge {
            nonces: p.nonces,
            worker: p.worker,
            transcript: p.transcript,
        })
    }

    /// Pending challenges (for tests and metrics).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The worker id `conn` is bound to.
    pub fn worker_of(&self, conn: &ConnId) -> Option<WorkerId> {
        self.bound.get(conn).copied()
    }

    /// The connection bound to `worker`.
    pub fn conn_of(&self, worker: WorkerId) -> Option<&ConnId> {
        self.by_worker.get(&worker)
    }

    /// Unbind `conn` (its channel was closed); returns the worker id it served.
    pub fn unbind(&mut self, conn: &ConnId) -> Option<WorkerId> {
        let worker = self.bound.remove(conn)?;
        self.by_worker.remove(&worker);
        Some(worker)
    }

    /// Bind `conn` to `worker`, dropping both sides' previous bindings.
    pub fn bind(&mut self, conn: &ConnId, worker: WorkerId) {
        if let Some(old) = self.by_worker.remove(&worker) {
            self.bound.remove(&old);
        }
        if let Some(old) = self.bound.remove(conn) {
            self.by_worker.remove(&old);
        }
        self.bound.insert(conn.clone(), worker);
        self.by_worker.insert(worker, conn.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(s: &str) -> ConnId {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn nonces_are_single_use_per_connection_and_expire() {
        let mut s = Sessions::default();
        let t0 = Instant::now();
        let (w1, theirs) = (WorkerId(1), Nonce::random());
        let n = s.challenge(&conn("a"), w1, theirs, t0);
        assert_eq!(n.worker, theirs);
        assert_ne!(n.router, theirs);
        assert!(
            s.take_challenge(&conn("b"), t0).is_none(),
            "issued to another connection"
        );
        let taken = s.take_challenge(&conn("a"), t0).unwrap();
        assert_eq!((taken.nonces, taken.worker), (n, w1));
        assert!(s.take_challenge(&conn("a"), t0).is_none(), "used once");
        s.challenge(&conn("a"), w1, theirs, t0);
        assert!(
            s.take_challenge(&conn("a"), t0 + NONCE_TTL).is_none(),
            "expired"
        );
        let again = s.challenge(&conn("a"), w1, theirs, t0);
        assert_ne!(again.router, n.router, "a fresh router nonce per challenge");
        assert_eq!(Nonce::from_hex(&n.router.to_hex()), Some(n.router));
        assert_eq!(Nonce::from_hex("abcd"), None);
    }

    #[test]
    fn pending_challenges_are_bounded() {
        let mut s = Sessions::default();
        let t0 = Instant::now();
        for i in 0..MAX_PENDING + 50 {
            let at = t0 + Duration::from_millis(i as u64);
            s.challenge(&conn(&i.to_string()), WorkerId(0), Nonce::random(), at);
        }
        assert_eq!(s.pending(), MAX_PENDING);
        // The oldest went first; the newest is still answerable.
        let now = t0 + Duration::from_secs(1);
        assert!(s.take_challenge(&conn("0"), now).is_none());
        assert!(s
            .take_challenge(&conn(&(MAX_PENDING + 49).to_string()), now)
            .is_some());
    }

    #[test]
    fn binding_is_one_to_one() {
        let mut s = Sessions::default();
        let (w0, w1, w2) = (WorkerId(0), WorkerId(1), WorkerId(2));
        s.bind(&conn("a"), w0);
        s.bind(&conn("b"), w1);
        assert_eq!(
            (s.worker_of(&conn("a")), s.conn_of(w1)),
            (Some(w0), Some(&conn("b")))
        );
        // Worker 0 moves to connection c: a is unbound.
        s.bind(&conn("c"), w0);
        assert_eq!(s.worker_of(&conn("a")), None);
        assert_eq!(s.conn_of(w0), Some(&conn("c")));
        // Connection c now serves worker 2: worker 0 is unbound.
        s.bind(&conn("c"), w2);
        assert_eq!(s.conn_of(w0), None);
        assert_eq!(s.worker_of(&conn("c")), Some(w2));
        assert_eq!(s.unbind(&conn("c")), Some(w2));
        assert_eq!((s.worker_of(&conn("c")), s.conn_of(w2)), (None, None));
    }
}
