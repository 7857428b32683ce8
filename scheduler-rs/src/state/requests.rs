//! The request path: submit (dispatch + `generate`), shutdown, early end. Outputs: `tokens.rs`.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{
    EarlyEnd, Event, Fork, Inflight, RequestHandle, RouterState, State, Submit, SubmitError,
};
use crate::dispatch::{Class, Decision, DispatchRequest};
use crate::ids::{TierId, WorkerId};
use crate::metrics::vllm::FinishedReason;
use crate::protocols::worker::{self as wire, PROTOCOL_VERSION};

impl State {
    /// Track a request in flight (counted against its tier's bound).
    fn hold(&mut self, id: u64, e: Inflight) {
        let t = e.req.tier.index();
        if self.held.len() <= t {
            self.held.resize(t + 1, 0);
        }
        self.held[t] += 1;
        self.inflight.insert(id, e);
    }

    /// Stop tracking a request; `None` if it already ended.
    pub(super) fn release(&mut self, id: u64) -> Option<Inflight> {
        let e = self.inflight.remove(&id)?;
        if let Some(n) = self.held.get_mut(e.req.tier.index()) {
            *n = n.saturating_sub(1);
        }
        Some(e)
    }

    /// Requests of `tier` in flight.
    fn held(&self, tier: TierId) -> u32 {
        self.held.get(tier.index()).copied().unwrap_or(0)
    }
}

impl RouterState {
    /// Dispatch a request: `Err` when its tier is full (the caller answers 429) or no group
    /// can take it (503).
    pub fn submit(self: &Arc<Self>, req: Submit) -> Result<RequestHandle, SubmitError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(SubmitError::Draining);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let req = Arc::new(req);
        let (tx, rx) = mpsc::unbounded_channel();
        let tier = self.cfg.tier(req.tier);
        let tm = self.metrics.tier(req.tier);
        let keys = req.cache.keys(&req.input_ids);
        let placed = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if let Some(limit) = tier.max_inflight.filter(|&l| st.held(req.tier) >= l) {
                tm.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(SubmitError::TierFull {
                    tier: tier.name.clone(),
                    limit,
                });
            }
            self.stats_arrival(st, req.tier, req.input_ids.len());
            let placed = match req.fork_of.and_then(|f| Self::place_sibling(st, id, f)) {
                Some(p) => Some(p),
                None => Self::place(st, id, req.tier, tier.background, &keys),
            };
            if let Some((_, d)) = &placed {
                if tier.reject_unattainable && d.class == Class::BestEffort {
                    st.dispatcher.complete(id);
                    tm.rejected.fetch_add(1, Ordering::Relaxed);
                    return Err(SubmitError::Unattainable {
                        tier: tier.name.clone(),
                    });
                }
                st.hold(
                    id,
                    Inflight {
                        tx,
                        req: req.clone(),
                        leader: WorkerId::of_device(d.prefill_leader),
                        decode: d.decode_leader.map(WorkerId::of_device),
                        generated: Vec::new(),
                        retries: 0,
                        held_since: None,
                        start: Instant::now(),
                        first: None,
                        last: None,
                        queue_s: None,
                    },
                );
            } else {
                // NOTE: workers are registered but none is live (all suspect: stalled, or
                // dead and not yet gone): hold the request for one that returns, as one
                // whose worker died is held (held.rs), rather than answer 503 at once.
                let none_live = st.registry.live_ids().next().is_none();
                let nominal = st.registry.ids().next().filter(|_| none_live);
                if let Some(w) = nominal.filter(|_| st.held_count() < super::MAX_HELD) {
                    let now = Instant::now();
                    st.hold(
                        id,
                        Inflight {
                            tx,
                            req: req.clone(),
                            leader: w,
                            decode: None,
                            generated: Vec::new(),
                            retries: 0,
                            held_since: Some(now),
                            start: now,
                            first: None,
                            last: None,
                            queue_s: None,
                        },
                    );
                    tm.best_effort.fetch_add(1, Ordering::Relaxed);
                    return Ok(RequestHandle::new(id, Class::BestEffort, rx, self.clone()));
                }
            }
            placed
        };
        let Some((identity, decision)) = placed else {
            tm.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::NoWorker);
        };
        match decision.class {
            Class::Feasible => &tm.feasible,
            Class::BestEffort => &tm.best_effort,
            Class::Background => &tm.background,
        }
        .fetch_add(1, Ordering::Relaxed);
        self.send_generate(id, &req, identity, decision);
        Ok(RequestHandle::new(id, decision.class, rx, self.clone()))
    }

    /// Ask the dispatcher for a group and resolve its leader's identity.
    pub(super) fn place(
        st: &mut State,
        id: u64,
        tier: TierId,
        background: bool,
        keys: &[u64],
    ) -> Option<(Bytes, Decision)> {
        let affinity = st.prefixes.lookup(keys).map(|(leader, _)| leader);
        let req = DispatchRequest {
            tier,
            background,
            affinity,
        };
        let d = st.dispatcher.dispatch(id, &req)?;
        // NOTE: the prefill group will hold this prompt's KV: later prompts that start the
        // same way go there when they can (prefix_index.rs).
        st.prefixes.record(keys, d.prefill_leader);
        // NOTE: only feasible work is charged against a group's SLO bandwidth (the dispatcher
        // counts the rest apart), as in the simulator: best-effort and background requests run
        // on leftover capacity, and charging them would let a spill backlog mark every later
        // request infeasible.
        match st.registry.get(WorkerId::of_device(d.prefill_leader)) {
            Some(w) => Some((w.identity.clone(), d)),
            None => {
                // NOTE: plans only hold live workers; this is a race with a reap.
                st.dispatcher.complete(id);
                None
            }
        }
    }

    /// A sibling choice goes where its first choice is (so that it shares its prefill),
    /// charged as that one was; `None` when the first choice is no longer in flight.
    fn place_sibling(st: &mut State, id: u64, fork: Fork) -> Option<(Bytes, Decision)> {
        let parent = st
            .inflight
            .get(&fork.parent)
            .filter(|p| p.held_since.is_none())?;
        let d = Decision {
            prefill_leader: parent.leader.device(),
            decode_leader: parent.decode.map(|w| w.device()),
            class: fork.class,
        };
        let identity = st.registry.get(parent.leader)?.identity.clone();
        if d.class == Class::Feasible {
            st.dispatcher.charge(id, d.prefill_leader, d.decode_leader);
        } else {
            st.dispatcher.spill(id, d.prefill_leader);
        }
        Some((identity, d))
    }

    pub(super) fn send_generate(&self, id: u64, req: &Submit, identity: Bytes, d: Decision) {
        let rid = self.ids.encode(id);
        let fork_of = req.fork_of.map(|f| self.ids.encode(f.parent));
        let tier = self.cfg.tier(req.tier);
        let slo = |ms: f64| Some(ms).filter(|&ms| !tier.background && ms > 0.0);
        let payload = wire::encode_generate(&wire::Generate {
            v: PROTOCOL_VERSION,
            ty: "generate",
            request_id: &rid,
            input_ids: Cow::Borrowed(&req.input_ids),
            resumed_tokens: req.resumed_tokens,
            sampling: Cow::Borrowed(&req.sampling),
            stop: Cow::Borrowed(&req.stop),
            output: Cow::Borrowed(&req.output),
            contract: wire::Contract {
                tier: &tier.name,
                class: wire_class(d.class),
                ttft_ms: slo(tier.ttft_ms),
                tpot_ms: slo(tier.tpot_ms),
                weight: tier.weight,
                priority: req.priority,
                preempt: tier.preempt,
                bind_tp: tier.bind_tp,
            },
            routing: wire::Routing {
                fork_of: fork_of.as_deref(),
                decode_target: d.decode_leader.map(WorkerId::of_device),
                cache_salt: req.cache.salt.as_deref(),
            },
            // NOTE: the HTTP API does not take it yet (protocols/extensions.rs lists it).
            truncate_prompt_tokens: None,
            grammar: req.grammar.as_ref().map(Cow::Borrowed),
        });
        self.send(identity, payload);
    }

    /// Refuse new requests from now on (shutdown); those in flight go on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// End every request in flight with an explicit error `why` (its client gets an error
    /// response or SSE error event) and abort it on its workers.
    pub fn fail_all(&self, why: &str) {
        let now = Instant::now();
        let ended: Vec<Inflight> = {
            let mut st = self.lock();
            let ids: Vec<u64> = st.inflight.keys().copied().collect();
            ids.into_iter()
                .filter_map(|id| self.release_and_abort(&mut st, id))
                .collect()
        };
        for e in ended {
            self.finish(e, Event::Error(why.to_string()), now);
        }
    }

    /// Stop tracking request `id` and tell its workers (prefill and decode) to abort it.
    fn release_and_abort(&self, st: &mut State, id: u64) -> Option<Inflight> {
        let e = st.release(id)?;
        st.dispatcher.complete(id);
        let payload = wire::encode_abort(&self.ids.encode(id));
        for w in [Some(e.leader), e.decode].into_iter().flatten() {
            if let Some(w) = st.registry.get(w) {
                self.send(w.identity.clone(), payload.clone());
            }
        }
        Some(e)
    }

    /// The client side ended a request before the worker did: abort it on the worker.
    pub(crate) fn end_early(&self, id: u64, why: EarlyEnd) {
        let mut st = self.lock();
        let Some(e) = self.release_and_abort(&mut st, id) else {
            return;
        };
        if why == EarlyEnd::StopString {
            self.stats_completion(&mut st, e.req.tier, e.tokens());
        }
        drop(st);
        match why {
            EarlyEnd::StopString => {
                self.record(e.req.tier, &e, Instant::now(), FinishedReason::Stop)
            }
            EarlyEnd::Cancelled => {
                self.metrics.vllm.count(FinishedReason::Abort);
                self.metrics
                    .tier(e.req.tier)
                    .cancelled
                    .fetch_add(1, Ordering::Relaxed);
            }
            EarlyEnd::TimedOut => {
                self.metrics.vllm.count(FinishedReason::Abort);
                self.metrics
                    .tier(e.req.tier)
                    .timed_out
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A dispatch class as the `generate` message names it.
fn wire_class(c: Class) -> wire::Class {
    match c {
        Class::Feasible => wire::Class::Feasible,
        Class::BestEffort => wire::Class::BestEffort,
        Class::Background => wire::Class::Background,
    }
}
