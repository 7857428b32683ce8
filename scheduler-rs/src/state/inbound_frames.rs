//! Frames in from the worker socket: sealed ones opened on their connection's channel
//! (worker_auth/channel.rs), clear ones decoded; a frame that fails closes the channel.
//!
//! NOTE (invariants): with a secret, a bound connection acts only through frames that opened
//! on its channel, in order; the first one that fails (forged, modified, replayed, reordered,
//! after a dropped one, or a clear message where a sealed one was due) closes the channel and
//! the worker is lost to the plan, exactly as if it had died: its requests resume elsewhere
//! and nothing that frame said is acted on. The worker authenticates again (`reregister`).

use bytes::Bytes;

use super::RouterState;
use crate::protocols::worker::{self as wire, decode_incoming, Body, Incoming};
use crate::worker_auth::channel::is_sealed;
use crate::worker_auth::{Opened, Rejection};

impl RouterState {
    /// One frame from connection `identity` (the transport's entry point).
    pub fn on_frame(&self, identity: Bytes, payload: &[u8]) {
        if self.cfg.worker_secret.is_some() && is_sealed(payload) {
            return self.on_sealed(identity, payload);
        }
        match decode_incoming(payload) {
            // NOTE: another router's message (several routers, protocols/peer.rs): no worker
            // handshake; its MAC is checked on the way in.
            Ok(Incoming {
                body: Body::Unknown(ty),
                ..
            }) if ty.starts_with("peer_") => self.on_peer(identity, payload),
            Ok(m) => self.on_message(identity, m, payload, false),
            Err(e) => {
                // NOTE: debug, not warn: any peer can send garbage; the metric counts it.
                self.metrics.plane.count(Rejection::Undecodable);
                tracing::debug!("undecodable worker message: {e}");
            }
        }
    }

    fn on_sealed(&self, identity: Bytes, frame: &[u8]) {
        match self.channels.open(&identity, frame) {
            Opened::Plain(plain) => match decode_incoming(&plain) {
                Ok(m) => self.on_message(identity, m, &plain, true),
                Err(e) => {
                    self.metrics.plane.count(Rejection::Undecodable);
                    tracing::warn!("undecodable message in a sealed frame: {e}");
                }
            },
            Opened::NoChannel => {
                self.metrics.plane.count(Rejection::Unauthenticated);
                tracing::debug!("dropped a sealed frame from a connection without a channel");
                // NOTE: a worker sealing for a channel this router does not have (it restarted,
                // or closed it): ask it to authenticate again, unless it is doing so.
                if !self.lock().sessions.is_pending(&identity) {
                    self.send_clear(identity, wire::encode_reregister());
                }
            }
            Opened::Failed(e) => {
                let why = format!("a sealed frame failed to open ({e:?})");
                self.close_channel(identity, &why);
            }
        }
    }

    /// Close `identity`'s channel: the worker it served leaves the plan (its requests resume
    /// elsewhere) and is asked to authenticate again.
    pub(super) fn close_channel(&self, identity: Bytes, why: &str) {
        self.metrics.plane.count(Rejection::BadFrame);
        self.channels.close(&identity);
        let mut st = self.lock();
        let worker = st.sessions.unbind(&identity);
        tracing::warn!(
            worker = ?worker.map(|w| w.0),
            "closed a worker's sealed channel: {why} (tampering on the network path?); the \
             worker leaves the plan and authenticates again"
        );
        match worker {
            Some(w) if st.registry.remove(w) => self.bury(st, &[w]),
            _ => drop(st),
        }
        self.send_clear(identity, wire::encode_reregister());
    }
}
