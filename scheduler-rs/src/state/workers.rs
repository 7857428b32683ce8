//! Worker-side events: registration, heartbeats, acks, death, and plan changes.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use bytes::Bytes;

use std::sync::Arc;

use super::{Event, FinishReason, Inflight, RouterState, State, Submit};
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Plan};
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
    fn bury(&self, st: MutexGuard<'_, State>, dead: &[WorkerId]) {
        let mut st = st;
        // Rebuild first so retries cannot land on a dead worker.
        let plan = self.rebuild_plan(&mut st);
        let mut actions = Vec::new();
        self.orphan(&mut st, dead, &mut actions);
        drop(st);
        self.broadcast_plan(&plan);
        self.run_actions(actions);
    }

    /// Requests served by `dead` workers: re-dispatch each (up to `max_retries` times) to a
    /// live group, the others end with an explicit error. A request that has streamed tokens
    /// resumes from them: its new worker prefills `input_ids ‖ generated` and generates only
    /// what is left of `max_tokens`, so the client sees no token lost or repeated.
    fn orphan(&self, st: &mut State, dead: &[WorkerId], actions: &mut Vec<Action>) {
        let hit: Vec<u64> = st
            .inflight
            .iter()
            .filter(|(_, e)| {
                e.held_since.is_none()
                    && (dead.contains(&e.leader) || e.decode.is_some_and(|d| dead.contains(&d)))
            })
            .map(|(id, _)| *id)
            .collect();
        let mut held = st.held_count();
        for id in hit {
            st.dispatcher.complete(id);
            let e = st.inflight.get_mut(&id).expect("listed above");
            // Its workers that live on (a prefill or decode side of another process, P/D
            // across hosts) are told to drop it once it runs elsewhere.
            let survivors: Vec<WorkerId> = [Some(e.leader), e.decode]
                .into_iter()
                .flatten()
                .filter(|w| !dead.contains(w))
                .collect();
            let Some(rest) = resumed(&e.req, &e.generated) else {
                // NOTE: all of max_tokens streamed; only the finishing message died with the
                // worker. The request is complete.
                let e = st.release(id).expect("listed above");
                self.stats_completion(st, e.req.tier, e.tokens());
                let done = Event::Tokens {
                    ids: Vec::new(),
                    finish: Some(FinishReason::Length),
                    logprobs: None,
                };
                actions.push(Action::End(e, done));
                continue;
            };
            if e.retries < self.cfg.max_retries {
                let tier_id = e.req.tier;
                let background = self.cfg.tier(tier_id).background;
                let keys = rest.cache.keys(&rest.input_ids);
                if let Some((identity, d)) = Self::place(st, id, tier_id, background, &keys) {
                    let e = st.inflight.get_mut(&id).expect("listed above");
                    e.retries += 1;
                    e.leader = WorkerId::of_device(d.prefill_leader);
                    e.decode = d.decode_leader.map(WorkerId::of_device);
                    // NOTE: not a survivor that serves it again: its abort would end the
                    // new run (a worker keeps a request it already runs, docs/protocol.md).
                    let (leader, decode) = (e.leader, e.decode);
                    let abort = wire::encode_abort(&self.ids.encode(id));
                    for w in survivors {
                        if w != leader && Some(w) != decode {
                            if let Some(w) = st.registry.get(w) {
                                self.send(w.identity.clone(), abort.clone());
                            }
                        }
                    }
                    let tm = self.metrics.tier(e.req.tier);
                    tm.retries.fetch_add(1, Ordering::Relaxed);
                    if !e.generated.is_empty() {
                        tm.resumed.fetch_add(1, Ordering::Relaxed);
                    }
                    actions.push(Action::Resend(id, rest, identity, d));
                    continue;
                }
            }
            let e = st.inflight.get_mut(&id).expect("listed above");
            if e.retries < self.cfg.max_retries && held < super::MAX_HELD {
                // NOTE: no live group can take it now: hold it for a worker that returns or
                // registers within the retry window (held.rs) rather than fail it.
                e.retries += 1;
                e.held_since = Some(Instant::now());
                held += 1;
                self.metrics
                    .tier(e.req.tier)
                    .retries
                    .fetch_add(1, Ordering::Relaxed);
                let abort = wire::encode_abort(&self.ids.encode(id));
                for w in survivors {
                    if let Some(w) = st.registry.get(w) {
                        self.send(w.identity.clone(), abort.clone());
                    }
                }
                continue;
            }
            let e = st.release(id).expect("listed above");
            let why = if e.retries >= self.cfg.max_retries {
                format!(
                    "worker {} died and this request was already re-dispatched {} times",
                    e.leader, e.retries
                )
            } else {
                format!(
                    "worker {} died and no other worker could take this request",
                    e.leader
                )
            };
            actions.push(Action::End(e, Event::Error(why)));
        }
    }

    fn run_actions(&self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Resend(id, req, identity, d) => self.send_generate(id, &req, identity, d),
                Action::End(e, event) => self.finish(e, event, Instant::now()),
            }
        }
    }

    /// Replace the plan at once, without a control round (no acks awaited; the control loop
    /// uses `begin_round` / `end_round`). Groups with a member that is not registered are
    /// left out until it is. The epoch is the router's own (monotonic).
    pub fn set_plan(&self, groups: Vec<GroupPlan>) -> Plan {
        let mut st = self.lock();
        st.planned = Some(groups);
        st.max_batch.clear();
        let plan = self.rebuild_plan(&mut st);
        drop(st);
        self.broadcast_plan(&plan);
        plan
    }

    /// Recompute the plan over live workers, bump the epoch, switch the dispatcher.
    pub(super) fn rebuild_plan(&self, st: &mut State) -> Plan {
        self.rebuild_plan_with(st, None)
    }

    /// [`Self::rebuild_plan`] under `epoch` (a control round's, not yet superseded) or, with
    /// `None`, a fresh one.
    pub(super) fn rebuild_plan_with(&self, st: &mut State, epoch: Option<u64>) -> Plan {
        // NOTE: suspect workers are left out: no new work goes to a worker that stopped
        // answering (its requests stay with it until it returns or is gone).
        let alive = |g: &GroupPlan| {
            g.members
                .iter()
                .all(|&m| st.registry.is_live(WorkerId::of_device(m)))
        };
        let mut groups: Vec<GroupPlan> = match st.planned.as_ref().or(self.cfg.static_plan.as_ref())
        {
            Some(groups) => groups.iter().filter(|g| alive(g)).cloned().collect(),
            None => self.default_groups(st.registry.live_ids()),
        };
        if st.planned.is_some() {
            // NOTE: a worker that registered after the control loop's last plan serves as its
            // own TP-1 group until the next window plans it, rather than sitting idle.
            let covered: Vec<u32> = groups.iter().flat_map(|g| g.members.clone()).collect();
            let new: Vec<WorkerId> = st
                .registry
                .live_ids()
                .filter(|w| !covered.contains(&w.device()))
                .collect();
            groups.extend(new.into_iter().map(|w| self.default_group(w)));
            groups.sort_by_key(GroupPlan::leader);
        }
        let epoch = match epoch {
            Some(e) => e,
            None => {
                st.last_epoch += 1;
                st.last_epoch
            }
        };
        st.plan = Plan { epoch, groups };
        st.dispatcher.set_plan(&st.plan);
        st.plan.clone()
    }

    /// Send `reconfigure` with the whole plan to every live worker.
    pub(super) fn broadcast_plan(&self, plan: &Plan) {
        let st = self.lock();
        let payload =
            wire::encode_reconfigure(plan, &self.cfg.tiers, |g| Self::max_batch_of(&st, g));
        // NOTE: not to suspect workers: one that returns gets the plan its return rebuilds.
        let idents: Vec<Bytes> = st
            .registry
            .iter()
            .filter(|(_, w)| !w.suspect)
            .map(|(_, w)| w.identity.clone())
            .collect();
        drop(st);
        for ident in idents {
            self.send(ident, payload.clone());
        }
    }

    /// Send `flush_cache` to every live worker; returns how many were told.
    pub fn flush_prefix_caches(&self) -> usize {
        let idents: Vec<Bytes> = self
            .lock()
            .registry
            .iter()
            .map(|(_, w)| w.identity.clone())
            .collect();
        for ident in &idents {
            self.send(ident.clone(), wire::encode_flush_cache());
        }
        idents.len()
    }

    /// Send `shutdown` to every live worker.
    pub fn shutdown_workers(&self) {
        let idents: Vec<Bytes> = self
            .lock()
            .registry
            .iter()
            .map(|(_, w)| w.identity.clone())
            .collect();
        for ident in idents {
            self.send(ident, wire::encode_shutdown());
        }
    }
}

/// What is left of `req` after `generated` was streamed: the prompt extended by the
/// generated tokens and `max_tokens` reduced by their count. `None` when nothing is left
/// (only the finishing message was lost with the worker).
/// NOTE: greedy decoding continues exactly as it would have on the dead worker; a sampled
/// request draws its remaining tokens afresh (a seeded one with its seed advanced by the
/// tokens it has, so a given resume point stays reproducible).
pub(super) fn resumed(req: &Arc<Submit>, generated: &[u32]) -> Option<Arc<Submit>> {
    if generated.is_empty() {
        return Some(req.clone());
    }
    let n = u32::try_from(generated.len()).ok()?;
    let left = req.sampling.max_tokens.checked_sub(n).filter(|&l| l > 0)?;
    let mut input_ids = Vec::with_capacity(req.input_ids.len() + generated.len());
    input_ids.extend_from_slice(&req.input_ids);
    input_ids.extend_from_slice(generated);
    let mut sampling = req.sampling.clone();
    sampling.max_tokens = left;
    sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(n)));
    // NOTE: the generated tokens are prompt now: `min_tokens` counts what is left to make,
    // and the penalties are told which prompt ids are output (as the grammar's replay is).
    sampling.min_tokens = sampling.min_tokens.saturating_sub(n);
    sampling.resumed_tokens += n;
    // NOTE: the new worker's grammar matcher replays the generated tokens, so it goes on
    // from where the output is in the grammar.
    let grammar = req.grammar.clone().map(|mut g| {
        g.replay += n;
        g
    });
    Some(Arc::new(Submit {
        input_ids,
        sampling,
        tier: req.tier,
        priority: req.priority,
        fork_of: None,
        grammar,
        cache: req.cache.clone(),
    }))
}

/// Work decided under the lock and carried out after it is released.
pub(super) enum Action {
    /// Send `generate` for request `id` (a retry, or the rest of a resumed request).
    Resend(u64, Arc<Submit>, Bytes, crate::dispatch::Decision),
    /// Deliver a request's final event (it already left `inflight`).
    End(Inflight, Event),
}
