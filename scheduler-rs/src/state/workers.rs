//! Worker-side events: registration, heartbeats, acks, death. What becomes of a dead
//! worker's requests is `orphans.rs`; the plan over the live workers `live_plan.rs`.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{RouterState, State};
use crate::ids::WorkerId;
use crate::protocols::worker::{self as wire, Body};
use crate::registry::WorkerInfo;

impl RouterState {
    /// Handle a message from a connection bound to `worker` (the handshake in
    /// `handshake.rs` checked the connection first).
    pub(super) fn on_bound_message(&self, worker: WorkerId, identity: Bytes, body: Body) {
        let now = Instant::now();
        match body {
            Body::Tokens(m) => self.on_tokens(worker, m, now),
            Body::Heartbeat(m) => {
                let mut st = self.lock();
                if let Some(w) = st.registry.get_mut(worker) {
                    w.last_seen = now;
                    w.running = m.running.unwrap_or(0);
                    w.waiting = m.waiting.unwrap_or(0);
                    w.free_pages = m.free_pages.unwrap_or(0);
                    w.epoch = m.epoch.unwrap_or(w.epoch);
                    if st.registry.recover(worker) {
                        self.on_recovered(st, worker);
                    }
                } else {
                    // NOTE: a live worker we declared dead (a long step outlasted the
                    // heartbeat timeout) must come back: ask it to register again.
                    drop(st);
                    self.send(identity, wire::encode_reregister());
                }
            }
            Body::DeviceLost(m) => self.on_device_lost(worker, &m),
            Body::Reconfigured(m) => self.on_reconfigured(worker, &m, now),
            Body::Stats(stats) => {
                if let Some(w) = self.lock().registry.get_mut(worker) {
                    w.last_seen = now;
                    w.stats = *stats;
                }
            }
            // The handshake answers `hello` and `register` itself, also from a bound connection.
            Body::Hello(_) | Body::Register(_) => {}
            Body::Unknown(ty) => {
                tracing::warn!(%worker, ty, "dropping a message of unknown type")
            }
        }
    }

    /// Add a worker whose `register` the handshake accepted on `identity`.
    pub(super) fn admit(
        &self,
        st: MutexGuard<'_, State>,
        worker: WorkerId,
        identity: Bytes,
        info: WorkerInfo,
    ) {
        tracing::info!(%worker, device = %info.device, model = %info.model, "worker registered");
        let mut st = st;
        let restarted = st
            .registry
            .register(worker, identity.clone(), info, Instant::now());
        let mut actions = Vec::new();
        if restarted {
            // NOTE: a worker that registers again has lost its requests.
            self.orphan(&mut st, &[worker], &mut actions);
        }
        let plan = self.rebuild_plan(&mut st);
        // Requests held for a worker resume on this one if its group takes them.
        self.place_held(&mut st, &mut actions);
        let epoch = plan.epoch;
        drop(st);
        self.send(identity, wire::encode_registered(worker, epoch));
        self.broadcast_plan(&plan);
        self.run_actions(actions);
    }

    /// A suspect worker's heartbeat: it was slow, not gone. Its requests never left it; it
    /// takes new work again, and requests held for a worker may go to it.
    fn on_recovered(&self, st: MutexGuard<'_, State>, worker: WorkerId) {
        tracing::info!(%worker, "suspect worker answers again: live");
        let mut st = st;
        let plan = self.rebuild_plan(&mut st);
        let mut actions = Vec::new();
        self.place_held(&mut st, &mut actions);
        drop(st);
        self.broadcast_plan(&plan);
        self.run_actions(actions);
    }

    /// Liveness, called periodically by the server: a worker silent for longer than the
    /// heartbeat timeout becomes suspect (no new work; its requests stay with it), one silent
    /// for longer than `worker_gone_ms` is gone (its requests resume elsewhere, or are held
    /// for a worker when none is live); held requests past the retry window end. Returns the
    /// gone worker ids.
    pub fn reap_dead(&self, now: Instant) -> Vec<WorkerId> {
        let mut st = self.lock();
        let suspects = st.registry.mark_suspects(now, self.heartbeat_timeout());
        let gone = Duration::from_millis(self.cfg.worker_gone_ms);
        let dead = st.registry.reap(now, gone);
        let mut actions = Vec::new();
        let mut plan = None;
        if !suspects.is_empty() || !dead.is_empty() {
            if !suspects.is_empty() {
                tracing::warn!(
                    ?suspects,
                    "workers missed their heartbeats: suspect, no new work; their requests are held"
                );
            }
            if !dead.is_empty() {
                tracing::warn!(?dead, "workers gone: their requests resume elsewhere");
            }
            // Rebuild first so retries cannot land on a suspect or gone worker.
            plan = Some(self.rebuild_plan(&mut st));
            self.orphan(&mut st, &dead, &mut actions);
        }
        self.expire_held(&mut st, now, &mut actions);
        drop(st);
        if let Some(plan) = plan {
            self.broadcast_plan(&plan);
        }
        self.run_actions(actions);
        dead
    }

    /// `device_lost`: the worker's own process says its device died; it is dead now, exactly
    /// as if it had missed its heartbeats (out of the plan, its requests resumed elsewhere).
    /// NOTE: it comes after the device's last `tokens` on the same connection, so what it
    /// streamed is known; it comes back through `register` once restarted.
    fn on_device_lost(&self, worker: WorkerId, m: &wire::DeviceLost) {
        let mut st = self.lock();
        if !st.registry.remove(worker) {
            return; // already reaped (or never registered): nothing is left to resume
        }
        let reason = m.reason.as_deref().unwrap_or("no reason given");
        tracing::warn!(%worker, reason, "worker lost its device");
        self.bury(st, &[worker]);
    }

    /// Workers already out of the registry: rebuild the plan without them, then retry,
    /// resume or fail their requests.
    pub(super) fn bury(&self, st: MutexGuard<'_, State>, dead: &[WorkerId]) {
        let mut st = st;
        // Rebuild first so retries cannot land on a dead worker.
        let plan = self.rebuild_plan(&mut st);
        let mut actions = Vec::new();
        self.orphan(&mut st, dead, &mut actions);
        drop(st);
        self.broadcast_plan(&plan);
        self.run_actions(actions);
    }
}
