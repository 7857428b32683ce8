//! Which connection (ZeroMQ routing identity) is bound to which worker id, and the pending
//! handshake challenges.
//!
//! NOTE (invariants): a worker id is bound to at most one connection and a connection to at
//! most one worker id (`bound` and `by_worker` mirror each other); a nonce is issued to one
//! connection, expires after [`NONCE_TTL`] and is consumed by its first use. The pending table
//! is bounded ([`MAX_PENDING`]), so unauthenticated peers cannot grow router memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

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

/// A connection's routing identity.
pub type ConnId = Bytes;

/// Handshake and binding state of the worker plane.
#[derive(Debug, Default)]
pub struct Sessions {
    pending: HashMap<ConnId, (Nonce, Instant)>,
    bound: HashMap<ConnId, WorkerId>,
    by_worker: HashMap<WorkerId, ConnId>,
}

impl Sessions {
    /// Issue a fresh challenge to `conn` (replacing one it had).
    pub fn challenge(&mut self, conn: &ConnId, now: Instant) -> Nonce {
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(conn) {
            self.pending
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < NONCE_TTL);
            if self.pending.len() >= MAX_PENDING {
                let oldest = self.pending.iter().min_by_key(|(_, (_, at))| *at);
                let oldest = oldest.map(|(c, _)| c.clone()).expect("table is full");
                self.pending.remove(&oldest);
            }
        }
        let nonce = Nonce::random();
        self.pending.insert(conn.clone(), (nonce, now));
        nonce
    }

    /// The live nonce issued to `conn`, consumed: a second call returns `None`.
    pub fn take_nonce(&mut self, conn: &ConnId, now: Instant) -> Option<Nonce> {
        let (nonce, at) = self.pending.remove(conn)?;
        (now.saturating_duration_since(at) < NONCE_TTL).then_some(nonce)
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
        let n = s.challenge(&conn("a"), t0);
        assert_eq!(
            s.take_nonce(&conn("b"), t0),
            None,
            "issued to another connection"
        );
        assert_eq!(s.take_nonce(&conn("a"), t0), Some(n));
        assert_eq!(s.take_nonce(&conn("a"), t0), None, "used once");
        s.challenge(&conn("a"), t0);
        assert_eq!(s.take_nonce(&conn("a"), t0 + NONCE_TTL), None, "expired");
        assert_eq!(Nonce::from_hex(&n.to_hex()), Some(n));
        assert_eq!(Nonce::from_hex("abcd"), None);
    }

    #[test]
    fn pending_challenges_are_bounded() {
        let mut s = Sessions::default();
        let t0 = Instant::now();
        for i in 0..MAX_PENDING + 50 {
            s.challenge(&conn(&i.to_string()), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(s.pending(), MAX_PENDING);
        // The oldest went first; the newest is still answerable.
        let now = t0 + Duration::from_secs(1);
        assert_eq!(s.take_nonce(&conn("0"), now), None);
        assert!(s
            .take_nonce(&conn(&(MAX_PENDING + 49).to_string()), now)
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
    }
}
