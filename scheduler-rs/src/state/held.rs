//! Held requests: in flight, but on no worker, because no live group could take them (their
//! worker is gone and none is left, or every worker is suspect). A held request waits up to
//! `retry_window_ms` for a worker that can: one that returns from a stall, or a replacement
//! that registers. Then it resumes there from its tokens; after the window it ends with an
//! explicit error (docs/serving.md "Stalls and deaths").
//!
//! NOTE: a held request stays in `inflight` (its client still waits, its tier still counts
//! it) with `held_since` set and no dispatcher charge. Its `leader` is the worker it last ran
//! on (or a suspect one): `on_tokens` drops whatever arrives for it while it is held, so a
//! stalled worker that wakes up and streams what it had can never mix with the resumed run.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::orphans::{resumed, Action};
use super::{Event, RouterState, State, Submit};
use crate::ids::WorkerId;
use crate::prefix_index::prefix_keys;

impl State {
    /// Requests held for a worker.
    pub(super) fn held_count(&self) -> usize {
        self.inflight
            .values()
            .filter(|e| e.held_since.is_some())
            .count()
    }
}

impl RouterState {
    /// The retry window from the config.
    fn retry_window(&self) -> Duration {
        Duration::from_millis(self.cfg.retry_window_ms)
    }

    /// Place every held request a live group can take now (oldest first): each resumes from
    /// the tokens its client already has.
    pub(super) fn place_held(&self, st: &mut State, actions: &mut Vec<Action>) {
        let mut held: Vec<u64> = st
            .inflight
            .iter()
            .filter(|(_, e)| e.held_since.is_some())
            .map(|(id, _)| *id)
            .collect();
        held.sort_unstable();
        for id in held {
            let e = st.inflight.get(&id).expect("listed above");
            let Some(rest) = resumed(&e.req, &e.generated) else {
                continue; // NOTE: `orphan` ends a request with nothing left before holding it
            };
            // NOTE: a sibling choice (n > 1) no longer shares its first choice's prefill.
            let rest = if rest.fork_of.is_some() {
                Arc::new(Submit {
                    fork_of: None,
                    ..(*rest).clone()
                })
            } else {
                rest
            };
            let (tier_id, has_tokens) = (e.req.tier, !e.generated.is_empty());
            let background = self.cfg.tier(tier_id).background;
            let keys = prefix_keys(&rest.input_ids);
            let Some((identity, d)) = Self::place(st, id, tier_id, background, &keys) else {
                return; // no group takes this one: none takes a later one either
            };
            let e = st.inflight.get_mut(&id).expect("listed above");
            e.held_since = None;
            e.leader = WorkerId::of_device(d.prefill_leader);
            e.decode = d.decode_leader.map(WorkerId::of_device);
            if has_tokens {
                self.metrics
                    .tier(tier_id)
                    .resumed
                    .fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(request = id, worker = %e.leader, "held request resumed");
            actions.push(Action::Resend(id, rest, identity, d));
        }
    }

    /// End the held requests that waited longer than the retry window.
    pub(super) fn expire_held(&self, st: &mut State, now: Instant, actions: &mut Vec<Action>) {
        let window = self.retry_window();
        let expired: Vec<u64> = st
            .inflight
            .iter()
            .filter(|(_, e)| {
                e.held_since
                    .is_some_and(|t| now.saturating_duration_since(t) > window)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let e = st.release(id).expect("listed above");
            let why = format!(
                "no worker could take this request within retry_window_ms ({} ms) after worker {} stopped answering",
                self.cfg.retry_window_ms, e.leader
            );
            actions.push(Action::End(e, Event::Error(why)));
        }
    }
}
