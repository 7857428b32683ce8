//! The worker-plane gate: the `register` handshake and the binding of worker ids to
//! connections (docs/protocol.md "Handshake", docs/security.md).
//!
//! NOTE (invariants): only `hello` and `register` are read from a connection that is not bound
//! to a worker id; every other message from it is dropped and counted. A connection is bound by
//! an accepted `register` (when the router has a secret: a valid proof over both nonces of the
//! challenge issued to that connection, for the worker id its `hello` named; the served model;
//! an id no other live connection holds), and from then on its messages act for that worker
//! id only. With a secret, a bound connection's messages are read only from its sealed channel
//! (keys from this handshake, worker_auth/channel.rs; state/inbound_frames.rs).

use std::time::Instant;

use bytes::Bytes;
use sha2::Digest;

use super::RouterState;
use crate::ids::WorkerId;
use crate::protocols::worker::{self as wire, Body, Hello, Incoming, Register, PROTOCOL_VERSION};
use crate::registry::WorkerInfo;
use crate::worker_auth::{ChannelKeys, Nonce, Rejection, HANDSHAKE_VERSION};

impl RouterState {
    /// Handle one decoded message from connection `identity`: `raw` is its exact frame (the
    /// handshake's transcript), `sealed` whether it came out of the connection's channel.
    pub(super) fn on_message(&self, identity: Bytes, m: Incoming, raw: &[u8], sealed: bool) {
        if m.v != PROTOCOL_VERSION {
            self.metrics.plane.count(Rejection::Version);
            tracing::error!(
                v = m.v,
                "refusing a worker message with another protocol version"
            );
            return;
        }
        let Incoming {
            worker_id, body, ..
        } = m;
        let body = match body {
            // NOTE: the handshake is clear by design (its frames are the keys' transcript).
            Body::Hello(_) | Body::Register(_) if sealed => {
                self.metrics.plane.count(Rejection::Handshake);
                tracing::debug!("dropped a handshake message inside a sealed frame");
                return;
            }
            Body::Hello(h) => return self.on_hello(identity, worker_id, h, raw),
            Body::Register(r) => return self.on_register(identity, worker_id, r, raw),
            other => other,
        };
        let secure = self.cfg.worker_secret.is_some();
        if secure && !sealed && self.channels.has(&identity) {
            return self.close_channel(identity, "a clear message where a sealed one was due");
        }
        let bound = self.lock().sessions.worker_of(&identity);
        let Some(worker) = bound.filter(|_| sealed || !secure) else {
            self.metrics.plane.count(Rejection::Unauthenticated);
            tracing::debug!(
                ty = body.kind(),
                "dropped a message from an unauthenticated connection"
            );
            if matches!(body, Body::Heartbeat(_)) {
                // NOTE: how a worker learns that a restarted router does not know it; it
                // answers with the handshake. Nothing else is revealed.
                self.send_clear(identity, wire::encode_reregister());
            }
            return;
        };
        if worker_id.is_some_and(|w| w != worker) {
            self.metrics.plane.count(Rejection::WrongWorker);
            tracing::warn!(
                %worker,
                claimed = worker_id.map(|w| w.0),
                ty = body.kind(),
                "dropped a message naming another worker than its connection's"
            );
            return;
        }
        self.on_bound_message(worker, identity, body);
    }

    /// `hello`: answer with a challenge (a fresh nonce and the router's proof of the secret).
    fn on_hello(&self, identity: Bytes, worker_id: Option<WorkerId>, h: Hello, raw: &[u8]) {
        let Some(worker) = worker_id else {
            self.metrics.plane.count(Rejection::Malformed);
            tracing::warn!("dropped a hello without worker_id");
            return;
        };
        let Some(secret) = &self.cfg.worker_secret else {
            let why = "this router runs without worker authentication (--insecure-worker-plane): \
                       it cannot prove a secret; a worker without one registers directly";
            return self.refuse(identity, worker, Rejection::Handshake, why);
        };
        if h.handshake != Some(HANDSHAKE_VERSION) {
            let why = format!(
                "handshake version {:?} is not supported; this router speaks {HANDSHAKE_VERSION} \
                 (every frame after it sealed): upgrade the worker",
                h.handshake
            );
            return self.refuse(identity, worker, Rejection::Handshake, &why);
        }
        let Some(worker_nonce) = h.nonce.as_deref().and_then(Nonce::from_hex) else {
            let why = "hello needs `nonce`: 64 hex characters";
            return self.refuse(identity, worker, Rejection::Handshake, why);
        };
        // NOTE: a new handshake ends the connection's channel: nothing more is sealed with
        // keys the worker has dropped (its requests resume when it registers again).
        self.channels.close(&identity);
        let now = Instant::now();
        let mut st = self.lock();
        let nonces = st.sessions.challenge(&identity, worker, worker_nonce, now);
        let proof = secret.router_proof(&nonces, worker);
        let challenge = wire::encode_challenge(worker, &nonces.router.to_hex(), &proof);
        st.sessions.record(&identity, raw, &challenge);
        drop(st);
        self.send_clear(identity, challenge);
    }

    /// `register`: check its proof (with a secret), model and id, then admit the worker.
    fn on_register(&self, identity: Bytes, worker_id: Option<WorkerId>, m: Register, raw: &[u8]) {
        let Some(worker) = worker_id else {
            self.metrics.plane.count(Rejection::Malformed);
            tracing::warn!("dropped a register without worker_id");
            return;
        };
        let model = m.model.as_deref().unwrap_or("");
        let mut st = self.lock();
        let mut keys = None;
        if let Some(secret) = &self.cfg.worker_secret {
            let Some(proof) = m.auth.as_deref() else {
                drop(st);
                let why = "this router requires worker authentication: open with `hello` \
                           (handshake 3, docs/protocol.md) and set the worker secret";
                return self.refuse(identity, worker, Rejection::BadProof, why);
            };
            // NOTE: the challenge is consumed whatever the outcome: one try per `hello`.
            let challenge = st.sessions.take_challenge(&identity, Instant::now());
            let valid = challenge.filter(|c| {
                c.worker == worker && secret.verify_worker_proof(&c.nonces, worker, model, proof)
            });
            let Some(mut c) = valid else {
                drop(st);
                let why = "authentication failed (wrong worker secret, or no live challenge)";
                return self.refuse(identity, worker, Rejection::BadProof, why);
            };
            c.transcript.update(raw);
            let transcript: [u8; 32] = c.transcript.finalize().into();
            keys = Some(ChannelKeys::derive(secret, &c.nonces, &transcript));
        }
        let served = &self.cfg.served_model_name;
        if model != served {
            drop(st);
            let why = format!("this router serves model {served:?}, not {model:?}");
            return self.refuse(identity, worker, Rejection::WrongModel, &why);
        }
        if let Some(other) = st.sessions.worker_of(&identity).filter(|w| *w != worker) {
            drop(st);
            let why = format!("this connection already serves worker {other}");
            return self.refuse(identity, worker, Rejection::ConnectionBound, &why);
        }
        let holder = st.sessions.conn_of(worker);
        if holder.is_some_and(|c| *c != identity) && st.registry.contains(worker) {
            drop(st);
            let why = format!("worker id {worker} is served by another live connection");
            return self.refuse(identity, worker, Rejection::IdTaken, &why);
        }
        let displaced = st
            .sessions
            .conn_of(worker)
            .filter(|c| **c != identity)
            .cloned();
        st.sessions.bind(&identity, worker);
        if let Some(old) = displaced {
            self.channels.close(&old); // NOTE: an unbound connection keeps no keys
        }
        if let Some(keys) = keys {
            // NOTE: before `admit` sends `registered`: from here on both ways are sealed.
            self.channels.install(&identity, &keys);
        }
        self.admit(st, worker, identity, WorkerInfo::from_register(&m));
    }

    /// Refuse a `register`: count, log (the first few per window, then a summary), and tell
    /// the peer why.
    fn refuse(&self, identity: Bytes, worker: WorkerId, why: Rejection, error: &str) {
        self.metrics.plane.count(why);
        let refusals = &self.metrics.plane.refusals;
        let (log_this, summary) = refusals.note(Instant::now(), why.as_str(), &identity, worker);
        if let Some(summary) = summary {
            tracing::warn!("{summary}");
        }
        if log_this {
            tracing::warn!(
                %worker,
                reason = why.as_str(),
                "refused a worker register: {error}"
            );
        }
        self.send_clear(identity, wire::encode_refused(worker, error));
    }

    /// Write the summary of refused registers not logged one by one, once their window is over
    /// (called periodically).
    pub fn flush_refusal_log(&self, now: Instant) {
        if let Some(summary) = self.metrics.plane.refusals.flush(now) {
            tracing::warn!("{summary}");
        }
    }
}
