//! The output path: `tokens` messages from workers, and the end of a request (its final
//! event delivered, its completion recorded for metrics and the control loop).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Event, FinishReason, Inflight, RouterState};
use crate::ids::{TierId, WorkerId};
use crate::metrics::vllm::FinishedReason;
use crate::metrics::Completion;
use crate::prefix_index::prefix_keys;
use crate::protocols::worker::Tokens;
use crate::worker_auth::Rejection;

/// Index a finished request's prompt + answer under the group that decoded it.
///
/// NOTE: a conversation's next turn starts with this turn's prompt and answer (the chat
/// template renders the answer back as the same tokens, up to its last partial block), and the
/// group that decoded it holds that KV: without the answer, a short first prompt leaves the
/// next turn no prefix to follow (prefix_index.rs). A decode-only group is skipped: it
/// prefills nothing, so the prompt's prefill group stays the hint.
fn remember_answer(st: &mut super::State, e: &Inflight) {
    let decoder = e.decode.unwrap_or(e.leader).device();
    let prefills = st
        .plan
        .groups
        .iter()
        .any(|g| g.leader() == decoder && g.role != crate::plan::Role::Decode);
    if prefills && !e.generated.is_empty() {
        let mut seq = Vec::with_capacity(e.req.input_ids.len() + e.generated.len());
        seq.extend_from_slice(&e.req.input_ids);
        seq.extend_from_slice(&e.generated);
        st.prefixes.record(&prefix_keys(&seq), decoder);
    }
}

impl RouterState {
    /// A `tokens` message from a worker.
    pub(super) fn on_tokens(&self, worker: WorkerId, m: Tokens, now: Instant) {
        let Some(id) = m.request_id.as_deref().and_then(|s| self.ids.decode(s)) else {
            // NOTE: ids are unguessable: one this router did not issue is a forgery or garbage.
            self.metrics.plane.count(Rejection::UnknownRequest);
            tracing::debug!(
                %worker,
                "tokens message without a request_id this router issued"
            );
            return;
        };
        let ids = m.token_ids.unwrap_or_default();
        let logprobs = m.logprobs;
        let mut st = self.lock();
        // Any message proves liveness; one lock for both.
        st.registry.touch(worker, now);
        let Some(e) = st.inflight.get(&id) else {
            return; // finished, cancelled or retried elsewhere: a normal race
        };
        if e.held_since.is_some() {
            // NOTE: held for a worker (held.rs): what a stalled worker streams after it was
            // declared gone is stale; the request resumes from the tokens the client has.
            tracing::debug!(%worker, "dropped tokens for a held request");
            return;
        }
        let (leader, decode) = (e.leader, e.decode);
        if worker != leader && Some(worker) != decode {
            // NOTE: never mix outputs: only the worker currently serving the request counts.
            // After a plan change the request's worker may have joined a group led by another
            // worker, which then streams the request: accept its leader and follow it.
            let holder = |w: WorkerId| {
                st.plan
                    .groups
                    .iter()
                    .find(|g| g.members.contains(&w.device()))
                    .map(|g| WorkerId::of_device(g.leader()))
            };
            let moved = [Some(leader), decode]
                .into_iter()
                .flatten()
                .any(|w| holder(w) == Some(worker));
            if !moved {
                // Another worker's request: an injection attempt, or a stale worker.
                self.metrics.plane.count(Rejection::ForeignRequest);
                tracing::debug!(
                    %worker,
                    %leader,
                    "dropped tokens for a request it does not serve"
                );
                return;
            }
            let lead = holder(leader) == Some(worker);
            let e = st.inflight.get_mut(&id).expect("entry present");
            if lead {
                e.leader = worker;
            } else {
                e.decode = Some(worker);
            }
        }
        let e = st.inflight.get_mut(&id).expect("entry present");
        if let Some(lps) = m.prompt_logprobs {
            let _ = e.tx.send(Event::Prompt(lps));
        }
        if let Some(cached) = m.cached_tokens {
            let _ = e.tx.send(Event::Cached(cached));
        }
        if let Some(q) = m.queue_ms.filter(|q| q.is_finite() && *q >= 0.0) {
            e.queue_s.get_or_insert(q / 1e3);
        }
        if Some(worker) == e.decode && worker != e.leader {
            // NOTE: a decode target streams only once the KV was handed to it across
            // processes (P/D across hosts); the prefill side is done with the request, so
            // its death no longer concerns it.
            e.leader = worker;
        }
        if !ids.is_empty() {
            if e.first.is_none() {
                self.metrics
                    .vllm
                    .on_prefilled(e.req.input_ids.len(), m.cached_tokens);
            }
            e.first.get_or_insert(now);
            let gap = e.last.map(|t| (now - t).as_secs_f64());
            self.metrics.vllm.on_tokens(ids.len(), gap);
            e.last = Some(now);
            e.generated.extend_from_slice(&ids);
        }
        let event = match m.finish_reason.as_deref() {
            None => {
                let _ = e.tx.send(Event::Tokens {
                    ids,
                    finish: None,
                    logprobs,
                });
                return;
            }
            Some("stop") => Event::Tokens {
                ids,
                finish: Some(FinishReason::Stop),
                logprobs,
            },
            Some("length") => Event::Tokens {
                ids,
                finish: Some(FinishReason::Length),
                logprobs,
            },
            Some(other) => {
                let why = m
                    .error
                    .unwrap_or_else(|| format!("worker ended the request ({other})"));
                // NOTE: a refusal after output was streamed (a resume the new worker refused)
                // is the serving system's failure, not the client's input: a 500.
                match m.error_param {
                    Some(param) if other == "error" && e.generated.is_empty() => Event::Invalid {
                        param,
                        message: why,
                    },
                    _ => Event::Error(why),
                }
            }
        };
        let e = st.release(id).expect("entry present");
        st.dispatcher.complete(id);
        if matches!(event, Event::Tokens { .. }) {
            self.stats_completion(&mut st, e.req.tier, e.tokens());
            remember_answer(&mut st, &e);
        }
        drop(st);
        self.finish(e, event, now);
    }

    /// Deliver the final event of a request that already left `inflight` and record it.
    pub(super) fn finish(&self, e: Inflight, event: Event, now: Instant) {
        match &event {
            Event::Tokens { finish, .. } => {
                let reason = match finish {
                    Some(FinishReason::Length) => FinishedReason::Length,
                    Some(FinishReason::Stop) | None => FinishedReason::Stop,
                };
                self.record(e.req.tier, &e, now, reason);
            }
            Event::Prompt(_) | Event::Cached(_) => {} // NOTE: never final events
            Event::Error(_) | Event::Invalid { .. } => {
                self.metrics
                    .tier(e.req.tier)
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
                self.metrics.vllm.count(FinishedReason::Error);
            }
        }
        let _ = e.tx.send(event);
    }

    pub(super) fn record(&self, tier: TierId, e: &Inflight, now: Instant, why: FinishedReason) {
        let c = Completion {
            ttft_s: e.first.map(|f| (f - e.start).as_secs_f64()),
            e2e_s: (now - e.start).as_secs_f64(),
            tokens: e.tokens(),
            prompt_tokens: e.req.input_ids.len() as u64,
            queue_s: e.queue_s,
        };
        if self.control {
            let arrival = e.start.saturating_duration_since(self.clock).as_secs_f64();
            let met = c.meets(self.cfg.tier(tier));
            let mut st = self.lock();
            // NOTE: bounded whether or not a control round reads them (2 minutes).
            while st.outcomes.front().is_some_and(|o| o.0 < arrival - 120.0) {
                st.outcomes.pop_front();
            }
            st.outcomes.push_back((arrival, tier, met));
            if !st.role.plans() {
                st.forward.outcome(arrival, tier, met);
            }
        }
        self.metrics
            .record_completion(tier, self.cfg.tier(tier), c, why);
    }
}
