//! The window statistics of several routers (architecture §4 "Several routers"): a follower
//! keeps what its requests add to the window until it forwards it to the leader
//! (`peer_stats`); the leader merges every follower's into its own window, as if the requests
//! had come to it, and keeps each follower's requests in flight (the censored output lengths
//! and the forecast count them).
//!
//! NOTE: a follower's first message to a leader (of a term it has not written to) carries its
//! whole window history, later ones what came since the previous; a leader never had a
//! follower's events before that first message, so nothing is counted twice.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::leadership::{unix_ms, RouterRole};
use super::{RouterState, State};
use crate::ids::TierId;
use crate::protocols::peer::{self, PeerMessage, PeerStats};
use crate::sim::forecast::InFlight;
use crate::stats::insert_sorted;
use crate::worker_auth::Rejection;

/// Most events of each kind a follower keeps between two messages (the oldest go first).
const MAX_FORWARD: usize = 1 << 16;

/// Seconds of completed requests' outcomes a history carries (what the lookahead reads).
const OUTCOMES_S: f64 = 120.0;

/// What a follower's requests added to the window since its last message, engine clock.
#[derive(Debug, Default)]
pub(super) struct Forward {
    arrivals: VecDeque<(f64, TierId, u32)>,
    completions: VecDeque<(f64, TierId, u32)>,
    outcomes: VecDeque<(f64, TierId, bool)>,
    /// Events dropped because a message was overdue (the leader unreachable).
    pub dropped: u64,
}

fn bounded<T>(q: &mut VecDeque<T>, x: T, dropped: &mut u64) {
    if q.len() >= MAX_FORWARD {
        q.pop_front();
        *dropped += 1;
    }
    q.push_back(x);
}

impl Forward {
    pub(super) fn arrival(&mut self, t: f64, tier: TierId, prompt: u32) {
        bounded(&mut self.arrivals, (t, tier, prompt), &mut self.dropped);
    }
    pub(super) fn completion(&mut self, t: f64, tier: TierId, output: u32) {
        bounded(&mut self.completions, (t, tier, output), &mut self.dropped);
    }
    pub(super) fn outcome(&mut self, arrival: f64, tier: TierId, met: bool) {
        bounded(&mut self.outcomes, (arrival, tier, met), &mut self.dropped);
    }
}

/// What the leader keeps of one follower.
#[derive(Debug)]
pub(super) struct PeerView {
    /// When its latest message arrived (it counts among the routers while recent).
    pub seen: Instant,
    /// Its latest `sent_ms` (an older or equal one is a replay, dropped).
    sent_ms: u64,
    /// Its requests in flight, as its latest message listed them.
    inflight: Vec<InFlight>,
}

impl RouterState {
    /// A follower's message for the leader of `term`: its whole window history the first
    /// time it writes to that term, else what came since its last message.
    pub fn peer_stats(&self, term: u64) -> PeerStats {
        let now = self.now_s();
        let mut st = self.lock();
        let full = st.forwarded_term != term;
        st.forwarded_term = term;
        let name = |t: TierId| self.cfg.tier(t).name.clone();
        let fwd = std::mem::take(&mut st.forward);
        let (arrivals, completions, outcomes) = if full {
            let lookback = st.stats.length_window_s();
            let own = |v: Vec<(&str, f64, f64)>| -> Vec<(String, f64, u32)> {
                v.into_iter()
                    .map(|(tier, age, n)| (tier.to_string(), age, n as u32))
                    .collect()
            };
            (
                own(st.stats.recent_arrivals(now, lookback)),
                own(st.stats.recent_completions(now, lookback)),
                st.outcomes
                    .iter()
                    .filter(|o| now - o.0 <= OUTCOMES_S)
                    .map(|&(t, tier, met)| (now - t, name(tier), met))
                    .collect(),
            )
        } else {
            let events = |q: VecDeque<(f64, TierId, u32)>| {
                q.into_iter()
                    .map(|(t, tier, n)| (name(tier), now - t, n))
                    .collect()
            };
            (
                events(fwd.arrivals),
                events(fwd.completions),
                fwd.outcomes
                    .into_iter()
                    .map(|(t, tier, met)| (now - t, name(tier), met))
                    .collect(),
            )
        };
        if fwd.dropped > 0 {
            tracing::warn!(
                dropped = fwd.dropped,
                "window events dropped before they reached the leader"
            );
        }
        let inflight = st
            .inflight
            .iter()
            .map(|(&id, e)| {
                let age = e.start.elapsed().as_secs_f64();
                (
                    name(e.req.tier),
                    e.tokens() as f64,
                    age,
                    st.dispatcher.holds(id),
                )
            })
            .collect();
        PeerStats {
            term,
            sent_ms: unix_ms(),
            full,
            arrivals,
            completions,
            outcomes,
            inflight,
        }
    }

    /// A router ↔ router frame on the worker endpoint from connection `identity`: as the
    /// leader, merge a follower's statistics and answer with the plan. Anything else (a
    /// follower gets no statistics; plans come on a follower's own link) is dropped.
    pub fn on_peer(&self, identity: Bytes, payload: &[u8]) {
        let (router, stats) = match peer::decode_peer(payload, self.cfg.worker_secret.as_ref()) {
            Ok((router, PeerMessage::Stats(s))) => (router, s),
            Ok((_, PeerMessage::Plan(_))) => return,
            Err(e) => {
                self.metrics.plane.count(Rejection::BadPeer);
                tracing::debug!(?e, "dropped a router message");
                return;
            }
        };
        if router == self.cfg.router_index {
            return; // NOTE: a stale follower link of our own (we lead now).
        }
        if !self.merge_peer_stats(router, stats) {
            return;
        }
        if let Some(plan) = self.leader_plan() {
            let msg = PeerMessage::Plan(plan);
            let payload =
                peer::encode_peer(&msg, self.cfg.router_index, self.cfg.worker_secret.as_ref());
            self.send_clear(identity, payload);
        }
    }

    /// Merge follower `router`'s statistics into the window, if this router leads the term
    /// they are meant for and they are newer than its last. Returns whether it took them.
    pub fn merge_peer_stats(&self, router: u32, s: PeerStats) -> bool {
        let now = self.now_s();
        let at = Instant::now();
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.role != (RouterRole::Leader { term: s.term }) {
            return false;
        }
        if st
            .peers
            .get(&router)
            .is_some_and(|p| s.sent_ms <= p.sent_ms)
        {
            return false; // a replay, or reordered
        }
        let tier = |name: &str| self.cfg.tier_index(name);
        // NOTE: recorded like our own requests' (the control loop may be off: no stats).
        if self.control {
            for (name, age, prompt) in &s.arrivals {
                if tier(name).is_some() {
                    st.stats.insert_arrival(now - age, name, *prompt);
                }
            }
            for (name, age, output) in &s.completions {
                if tier(name).is_some() {
                    st.stats.insert_completion(now - age, name, *output);
                }
            }
            for (age, name, met) in &s.outcomes {
                if let Some(t) = tier(name) {
                    insert_sorted(&mut st.outcomes, (now - age, t, *met), |o| o.0);
                }
            }
        }
        let inflight = s
            .inflight
            .iter()
            .filter_map(|(name, generated, age_s, feasible)| {
                Some(InFlight {
                    tier: tier(name)?.index(),
                    generated: *generated,
                    age_s: *age_s,
                    feasible: *feasible,
                })
            })
            .collect();
        st.peers.insert(
            router,
            PeerView {
                seen: at,
                sent_ms: s.sent_ms,
                inflight,
            },
        );
        self.refresh_share(st, at);
        true
    }

    /// As the leader: forget followers not heard from lately (their share of the bandwidth
    /// goes back to the others).
    pub fn refresh_peers(&self) {
        let mut st = self.lock();
        self.refresh_share(&mut st, Instant::now());
    }

    /// The followers' requests in flight (the leader's view; empty on others).
    pub(super) fn peer_inflight(st: &State) -> impl Iterator<Item = &InFlight> {
        st.peers.values().flat_map(|p| p.inflight.iter())
    }

    /// Routers the leader heard from lately, by index (for `/admin/plan`): seconds since.
    pub fn followers(&self) -> BTreeMap<u32, f64> {
        let st = self.lock();
        st.peers
            .iter()
            .map(|(&r, p)| (r, p.seen.elapsed().as_secs_f64()))
            .collect()
    }
}

/// How often a follower writes to the leader: four times a control window (at most every
/// 250 ms), so the leader plans with at most a quarter window of its latest arrivals missing.
pub fn forward_period(control_window_ms: u64) -> Duration {
    Duration::from_millis((control_window_ms / 4).clamp(10, 250))
}
