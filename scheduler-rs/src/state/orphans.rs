//! The requests of dead workers: re-dispatched (resuming from the tokens they streamed),
//! held for a worker that returns, or ended with an explicit error.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::{Event, FinishReason, Inflight, RouterState, State, Submit};
use crate::ids::WorkerId;
use crate::protocols::worker as wire;

impl RouterState {
    /// Requests served by `dead` workers: re-dispatch each (up to `max_retries` times) to a
    /// live group, the others end with an explicit error. A request that has streamed tokens
    /// resumes from them: its new worker prefills `input_ids ‖ generated` and generates only
    /// what is left of `max_tokens`, so the client sees no token lost or repeated.
    pub(super) fn orphan(&self, st: &mut State, dead: &[WorkerId], actions: &mut Vec<Action>) {
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

    pub(super) fn run_actions(&self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Resend(id, req, identity, d) => self.send_generate(id, &req, identity, d),
                Action::End(e, event) => self.finish(e, event, Instant::now()),
            }
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
    let left = req.stop.max_tokens.checked_sub(n).filter(|&l| l > 0)?;
    let mut input_ids = Vec::with_capacity(req.input_ids.len() + generated.len());
    input_ids.extend_from_slice(&req.input_ids);
    input_ids.extend_from_slice(generated);
    let mut sampling = req.sampling.clone();
    let mut stop = req.stop.clone();
    stop.max_tokens = left;
    sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(n)));
    // NOTE: the generated tokens are prompt now: `min_tokens` counts what is left to make,
    // and the penalties are told which prompt ids are output (as the grammar's replay is).
    stop.min_tokens = stop.min_tokens.saturating_sub(n);
    // NOTE: the new worker's grammar matcher replays the generated tokens, so it goes on
    // from where the output is in the grammar.
    let grammar = req.grammar.clone().map(|mut g| {
        g.replay += n;
        g
    });
    Some(Arc::new(Submit {
        input_ids,
        resumed_tokens: req.resumed_tokens + n,
        sampling,
        stop,
        output: req.output.clone(),
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
