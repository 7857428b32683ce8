//! The worker-plane gate: the `register` handshake and the binding of worker ids to
//! connections (docs/protocol.md "Handshake", docs/security.md).
//!
//! NOTE (invariants): only `register` is read from a connection that is not bound to a worker
//! id; every other message from it is dropped and counted. A connection is bound by an
//! accepted `register` (a valid proof over a nonce issued to that connection when the router
//! has a secret, the served model, an id no other live connection holds), and from then on
//! its messages act for that worker id only.

use std::time::Instant;

use bytes::Bytes;

use super::RouterState;
use crate::ids::WorkerId;
use crate::protocols::worker::{self as wire, Body, Incoming, Register, PROTOCOL_VERSION};
use crate::registry::WorkerInfo;
use crate::worker_auth::Rejection;

impl RouterState {
    /// Handle one decoded message from connection `identity`.
    pub fn on_message(&self, identity: Bytes, m: Incoming) {
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
            Body::Register(r) => return self.on_register(identity, worker_id, r),
            other => other,
        };
        let bound = self.lock().sessions.worker_of(&identity);
        let Some(worker) = bound else {
            self.metrics.plane.count(Rejection::Unauthenticated);
            tracing::debug!(
                ty = body.kind(),
                "dropped a message from an unauthenticated connection"
            );
            if matches!(body, Body::Heartbeat(_)) {
                // NOTE: how a worker learns that a restarted router does not know it; it
                // answers with the handshake. Nothing else is revealed.
                self.send(identity, wire::encode_reregister());
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

    /// `register`: challenge it, or check its proof, model and id, then admit the worker.
    fn on_register(&self, identity: Bytes, worker_id: Option<WorkerId>, m: Register) {
        let Some(worker) = worker_id else {
            self.metrics.plane.count(Rejection::Malformed);
            tracing::warn!("dropped a register without worker_id");
            return;
        };
        let model = m.model.as_deref().unwrap_or("");
        let mut st = self.lock();
        if let Some(secret) = &self.cfg.worker_secret {
            let now = Instant::now();
            let Some(proof) = m.auth.as_deref() else {
                let nonce = st.sessions.challenge(&identity, now);
                drop(st);
                self.send(identity, wire::encode_challenge(worker, &nonce.to_hex()));
                return;
            };
            let nonce = st.sessions.take_nonce(&identity, now);
            if !nonce.is_some_and(|n| secret.verify(&n, worker, model, proof)) {
                drop(st);
                let why = "authentication failed (wrong worker secret, or no live challenge)";
                return self.refuse(identity, worker, Rejection::BadProof, why);
            }
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
        st.sessions.bind(&identity, worker);
        self.admit(st, worker, identity, WorkerInfo::from_register(&m));
    }

    /// Refuse a `register`: count, log, and tell the peer why.
    fn refuse(&self, identity: Bytes, worker: WorkerId, why: Rejection, error: &str) {
        self.metrics.plane.count(why);
        tracing::warn!(
            %worker,
            reason = why.as_str(),
            "refused a worker register: {error}"
        );
        self.send(identity, wire::encode_refused(worker, error));
    }
}
