//! The control loop's view of the router state between rounds (architecture §4 "Control
//! loop"): window statistics recorded on the request path, the requests in flight and the
//! recent arrivals and outcomes for the lookahead, the tiers' demand and the pool the planner
//! may use. Rounds themselves (reconfigure, acks, the plan switch) are rounds/.

use std::time::Instant;

use super::{RouterState, State};
use crate::ids::TierId;
use crate::plan::Plan;
use crate::sim::choice::Choice;
use crate::sim::forecast::{recent_of, InFlight, RecentArrival};
use crate::stats::TierDemand;

/// How many of the latest planning times `/admin/plan` shows.
const PLANNED_AT_KEPT: usize = 16;

/// What the planner needs from the engine for one window.
#[derive(Debug, Clone)]
pub struct PlanningView {
    /// Devices the planner may use: workers `0..devices` are all registered.
    pub devices: u32,
    /// TP levels every one of those workers registered (`[1]` for a worker that sent none)
    /// whose groups cannot cross a worker process (domain) boundary.
    pub tp_levels: Vec<u32>,
    /// Whether any prefill group can hand KV to any decode group (one domain, or one KV
    /// transport between them; see `PoolShape`).
    pub kv_linked: bool,
    /// The plan routing runs on now.
    pub current: Plan,
}

impl RouterState {
    pub(super) fn now_s(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// Request path: an arrival (only recorded with the control loop on).
    pub(super) fn stats_arrival(&self, st: &mut State, tier: TierId, prompt_tokens: usize) {
        if self.control {
            let now = self.now_s();
            let name = &self.cfg.tier(tier).name;
            let prompt = u32::try_from(prompt_tokens).unwrap_or(u32::MAX);
            st.stats.on_arrival(now, name, prompt);
            if !st.role.plans() {
                st.forward.arrival(now, tier, prompt);
            }
        }
    }

    /// Request path: a completion with `output_tokens` generated.
    pub(super) fn stats_completion(&self, st: &mut State, tier: TierId, output_tokens: u64) {
        if self.control {
            let now = self.now_s();
            let name = &self.cfg.tier(tier).name;
            let output = u32::try_from(output_tokens).unwrap_or(u32::MAX);
            st.stats.on_completion(now, name, output);
            if !st.role.plans() {
                st.forward.completion(now, tier, output);
            }
        }
    }

    /// Release the dispatcher's SLO-bandwidth charge of requests still without a first token
    /// past their tier's TTFT: they can no longer meet their SLO, and the worker's local
    /// scheduler now serves them last (`ttft_ms` in `generate`). The simulator does the same.
    pub fn release_late_charges(&self) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let now = Instant::now();
        for (id, e) in &st.inflight {
            let tier = self.cfg.tier(e.req.tier);
            let late = e.first.is_none()
                && !tier.background
                && tier.ttft_ms > 0.0
                && now.duration_since(e.start).as_secs_f64() * 1e3 > tier.ttft_ms;
            if late {
                st.dispatcher.release(*id);
            }
        }
    }

    /// The requests in flight, for the lookahead's forecast (its `tier` is the bare index:
    /// the simulator indexes its own copy of the tier list).
    pub fn inflight_snapshot(&self) -> Vec<InFlight> {
        let st = self.lock();
        let now = Instant::now();
        let own = st.inflight.iter().map(|(&id, e)| InFlight {
            tier: e.req.tier.index(),
            generated: e.tokens() as f64,
            age_s: now.duration_since(e.start).as_secs_f64(),
            feasible: st.dispatcher.holds(id),
        });
        // NOTE: the followers' requests too, on the leader (peer_window.rs).
        own.chain(Self::peer_inflight(&st).copied()).collect()
    }

    /// Completions of requests that arrived in the last `window_s` (engine clock): (arrival
    /// s, tier index, met); older ones are dropped. Also returns the engine clock now.
    /// NOTE: the tier is the bare index the control loop weighs by (`weights[tier]`).
    pub fn recent_outcomes(&self, window_s: f64) -> (f64, Vec<(f64, usize, bool)>) {
        let now = self.now_s();
        let since_s = now - window_s;
        let mut st = self.lock();
        while st.outcomes.front().is_some_and(|o| o.0 < since_s) {
            st.outcomes.pop_front();
        }
        let outcomes = st.outcomes.iter();
        (
            now,
            outcomes
                .map(|&(t, tier, met)| (t, tier.index(), met))
                .collect(),
        )
    }

    /// Count a control window; returns how many came before it.
    pub fn next_control_window(&self) -> u64 {
        let mut st = self.lock();
        st.windows += 1;
        if st.planned_at.len() >= PLANNED_AT_KEPT {
            st.planned_at.pop_front();
        }
        st.planned_at.push_back(super::leadership::unix_ms());
        st.windows - 1
    }

    /// (control windows planned, unix ms of the latest ones planned, oldest first).
    pub fn planned_windows(&self) -> (u64, Vec<u64>) {
        let st = self.lock();
        (st.windows, st.planned_at.iter().copied().collect())
    }

    /// Record the control loop's latest strategy choice.
    pub fn set_choice(&self, choice: Choice) {
        self.lock().choice = Some(choice);
    }

    /// The control loop's latest strategy choice, if it runs one.
    pub fn last_choice(&self) -> Option<Choice> {
        self.lock().choice.clone()
    }

    /// Arrivals of the last `lookback_s` seconds, for the lookahead's replay forecast, and
    /// the seconds over which arrivals have been recorded (the engine's age).
    pub fn recent_arrivals(&self, lookback_s: f64) -> (Vec<RecentArrival>, f64) {
        let now = self.now_s();
        let st = self.lock();
        let recent = recent_of(&self.cfg.tiers, &st.stats.recent_arrivals(now, lookback_s));
        (recent, now)
    }

    /// Drop the window's expired samples without planning (a follower's control loop).
    pub fn prune_window(&self) {
        let now = self.now_s();
        self.lock().stats.prune(now);
    }

    /// Current demand of every tier (drops expired samples).
    pub fn demand_snapshot(&self) -> Vec<TierDemand> {
        let now = self.now_s();
        let mut st = self.lock();
        let names: Vec<&str> = self.cfg.tiers.iter().map(|t| t.name.as_str()).collect();
        let running: Vec<(&str, f64)> = st
            .inflight
            .values()
            .map(|e| (names[e.req.tier.index()], e.tokens() as f64))
            .chain(Self::peer_inflight(&st).map(|f| (names[f.tier], f.generated)))
            .collect();
        st.stats.snapshot(now, &running)
    }

    /// Devices, TP levels, domains and the current plan for the planner.
    pub fn planning_view(&self) -> PlanningView {
        let st = self.lock();
        let shape = st.registry.pool_shape();
        PlanningView {
            devices: shape.devices,
            tp_levels: shape.tp_levels,
            kv_linked: shape.kv_linked,
            current: st.plan.clone(),
        }
    }
}
