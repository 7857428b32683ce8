//! The router-state side of the control loop (architecture §4 "Control loop"): window statistics from the
//! request path, control rounds (send `reconfigure`, collect `reconfigured` acks) and the
//! switch of the routing tables to an acknowledged plan. The timing (windows, ack timeout)
//! lives in `crate::control`.
//!
//! NOTE: a round is all-or-nothing. The proposed plan becomes the routing plan only when every
//! live worker acknowledged it with `ok: true`; on a refusal or a timeout the router keeps the
//! old plan and re-broadcasts it under a fresh epoch so workers that already switched go back.
//! Partial application could leave a device in two groups (a refused group's members are
//! usually re-used by the accepted ones), so it is not attempted.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::oneshot;

use super::{RouterState, State};
use crate::ids::{TierId, WorkerId};
use crate::plan::{GroupPlan, Plan};
use crate::protocols::worker::{self as wire, Reconfigured};
use crate::sim::choice::Choice;
use crate::sim::forecast::{recent_of, InFlight, RecentArrival};
use crate::stats::TierDemand;
use crate::tiers::Tier;

/// Control decisions kept for `/admin/plan`.
pub const HISTORY_LEN: usize = 64;

/// How a control round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanResult {
    /// Every worker acknowledged: routing switched to the new epoch.
    Applied,
    /// A worker answered `ok: false`: the old plan stays.
    Refused,
    /// Not every worker answered in time: the old plan stays.
    Timeout,
}

impl PlanResult {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanResult::Applied => "applied",
            PlanResult::Refused => "refused",
            PlanResult::Timeout => "timeout",
        }
    }
}

/// A worker's `ok: false` answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    /// The refusing worker.
    pub worker: WorkerId,
    pub error: Option<String>,
}

/// One control decision, as logged and shown in `/admin/plan` history; its groups' tiers as
/// `T` (ids in the router, names once [`PlanRecord::named`] for JSON; see [`GroupPlan`]).
#[derive(Debug, Clone, Serialize)]
#[serde(bound(serialize = "T: Serialize + AsRef<str>"))]
pub struct PlanRecord<T = TierId> {
    /// Epoch the plan was proposed under (the `reconfigure` epoch).
    pub epoch: u64,
    /// Epoch routing runs under after the round (the new plan's, or the old plan's
    /// re-broadcast).
    pub routing_epoch: u64,
    pub result: PlanResult,
    pub unix_ms: u64,
    /// The proposed groups and their planner batch caps (0 = none).
    pub groups: Vec<GroupPlan<T>>,
    pub batch_caps: Vec<f64>,
    /// The groups routing ran on before the round.
    pub previous: Vec<GroupPlan<T>>,
    /// The demand the planner saw.
    pub demand: Vec<TierDemand>,
    pub refused: Vec<Refusal>,
    /// Workers that had not answered when the round ended.
    pub missing: Vec<WorkerId>,
    /// Planner decision time and round time (send → last ack or timeout).
    pub plan_ms: f64,
    pub round_ms: f64,
}

impl PlanRecord {
    /// The serde form: the groups' tier ids named from `tiers` (the list they index).
    pub fn named(&self, tiers: &[Tier]) -> PlanRecord<String> {
        let named = |groups: &[GroupPlan]| groups.iter().map(|g| g.named(tiers)).collect();
        PlanRecord {
            epoch: self.epoch,
            routing_epoch: self.routing_epoch,
            result: self.result,
            unix_ms: self.unix_ms,
            groups: named(&self.groups),
            batch_caps: self.batch_caps.clone(),
            previous: named(&self.previous),
            demand: self.demand.clone(),
            refused: self.refused.clone(),
            missing: self.missing.clone(),
            plan_ms: self.plan_ms,
            round_ms: self.round_ms,
        }
    }
}

/// A control round waiting for acks.
pub(crate) struct Round {
    epoch: u64,
    groups: Vec<GroupPlan>,
    batch_caps: Vec<f64>,
    demand: Vec<TierDemand>,
    plan_ms: f64,
    /// Workers whose ack is still due.
    waiting: HashSet<WorkerId>,
    refused: Vec<Refusal>,
    started: Instant,
    done: Option<oneshot::Sender<()>>,
}

impl Round {
    fn finish(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
    }
}

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

/// Result of waiting for a round's acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundOutcome {
    /// Every ack arrived or a refusal came in.
    Answered,
    TimedOut,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Planner batch cap → wire `max_batch` (None when the planner sets no cap).
fn cap(c: f64) -> Option<u32> {
    (c.is_finite() && c >= 1.0).then(|| c.floor() as u32)
}

impl RouterState {
    fn now_s(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// Request path: an arrival (only recorded with the control loop on).
    pub(super) fn stats_arrival(&self, st: &mut State, tier: TierId, prompt_tokens: usize) {
        if self.control {
            let now = self.now_s();
            let name = &self.cfg.tier(tier).name;
            st.stats
                .on_arrival(now, name, u32::try_from(prompt_tokens).unwrap_or(u32::MAX));
        }
    }

    /// Request path: a completion with `output_tokens` generated.
    pub(super) fn stats_completion(&self, st: &mut State, tier: TierId, output_tokens: u64) {
        if self.control {
            let now = self.now_s();
            let name = &self.cfg.tier(tier).name;
            st.stats
                .on_completion(now, name, u32::try_from(output_tokens).unwrap_or(u32::MAX));
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
                st.dispatcher.complete(*id);
            }
        }
    }

    /// The requests in flight, for the lookahead's forecast (its `tier` is the bare index:
    /// the simulator indexes its own copy of the tier list).
    pub fn inflight_snapshot(&self) -> Vec<InFlight> {
        let st = self.lock();
        let now = Instant::now();
        st.inflight
            .iter()
            .map(|(&id, e)| InFlight {
                tier: e.req.tier.index(),
                generated: e.tokens() as f64,
                age_s: now.duration_since(e.start).as_secs_f64(),
                feasible: st.dispatcher.holds(id),
            })
            .collect()
    }

    /// Take a plan whose groups differ from the current one only in their SLO capacities
    /// (`max_rps`, `max_inflight`) and whose batch caps are within 10% of the current ones:
    /// routing refreshes under the same epoch, with no `reconfigure` round. Returns whether
    /// it did. NOTE: every round reconfigures the workers and holds their steps; a window's
    /// noise in rates and lengths moves capacities every window.
    pub fn refresh_capacities(&self, groups: &[GroupPlan], batch_caps: &[f64]) -> bool {
        let mut guard = self.lock();
        let st = &mut *guard;
        let same_shape = |a: &GroupPlan, b: &GroupPlan| {
            (
                &a.members,
                a.shape(),
                a.role,
                &a.tiers,
                a.accepts_background,
            ) == (
                &b.members,
                b.shape(),
                b.role,
                &b.tiers,
                b.accepts_background,
            )
        };
        let close_cap =
            |g: &GroupPlan, c: f64| match (st.max_batch.get(&g.members).copied(), cap(c)) {
                (None, None) => true,
                (Some(old), Some(new)) => f64::from(old.abs_diff(new)) <= 0.1 * f64::from(old),
                _ => false,
            };
        let current = &st.plan.groups;
        let ok = current.len() == groups.len()
            && current.iter().zip(groups).all(|(a, b)| same_shape(a, b))
            && groups
                .iter()
                .zip(batch_caps.iter().copied().chain(std::iter::repeat(0.0)))
                .all(|(g, c)| close_cap(g, c));
        if ok && st.pending.is_none() {
            st.planned = Some(groups.to_vec());
            let epoch = st.plan.epoch;
            self.rebuild_plan_with(st, Some(epoch));
        }
        ok && st.pending.is_none()
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
        st.windows - 1
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

    /// Current demand of every tier (drops expired samples).
    pub fn demand_snapshot(&self) -> Vec<TierDemand> {
        let now = self.now_s();
        let mut st = self.lock();
        let names: Vec<&str> = self.cfg.tiers.iter().map(|t| t.name.as_str()).collect();
        let running: Vec<(&str, f64)> = st
            .inflight
            .values()
            .map(|e| (names[e.req.tier.index()], e.tokens() as f64))
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

    /// Whether a control round is waiting for acks.
    pub fn round_pending(&self) -> bool {
        self.lock().pending.is_some()
    }

    /// Start a control round: send `reconfigure` with `groups` (and their batch caps) under a
    /// fresh epoch to every live worker. Routing stays on the current plan. Returns the epoch
    /// and a receiver that fires once every worker acknowledged or one refused.
    pub fn begin_round(
        &self,
        groups: Vec<GroupPlan>,
        batch_caps: Vec<f64>,
        demand: Vec<TierDemand>,
        plan_ms: f64,
    ) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        st.last_epoch += 1;
        let epoch = st.last_epoch;
        let plan = Plan {
            epoch,
            groups: groups.clone(),
        };
        let caps: HashMap<&[u32], Option<u32>> = groups
            .iter()
            .zip(batch_caps.iter().copied().chain(std::iter::repeat(0.0)))
            .map(|(g, c)| (g.members.as_slice(), cap(c)))
            .collect();
        let payload = wire::encode_reconfigure(&plan, &self.cfg.tiers, |g| {
            caps.get(g.members.as_slice()).copied().flatten()
        });
        // NOTE: not suspect workers (silent): they get the plan their return rebuilds.
        let targets: Vec<(WorkerId, bytes::Bytes)> = st
            .registry
            .iter()
            .filter(|(_, w)| !w.suspect)
            .map(|(id, w)| (*id, w.identity.clone()))
            .collect();
        let mut round = Round {
            epoch,
            groups,
            batch_caps,
            demand,
            plan_ms,
            waiting: targets.iter().map(|t| t.0).collect(),
            refused: Vec::new(),
            started: Instant::now(),
            done: Some(tx),
        };
        if round.waiting.is_empty() {
            round.finish();
        }
        if let Some(mut old) = st.pending.replace(round) {
            // NOTE: the control loop ends every round before starting another; a leftover
            // round is abandoned (its waiter sees the channel close).
            old.done.take();
        }
        drop(st);
        tracing::info!(
            epoch,
            workers = targets.len(),
            "control: sending reconfigure"
        );
        for (_, ident) in targets {
            self.send(ident, payload.clone());
        }
        (epoch, rx)
    }

    /// A `reconfigured` ack from `worker`.
    pub(super) fn on_reconfigured(&self, worker: WorkerId, m: &Reconfigured, now: Instant) {
        let mut st = self.lock();
        let ok = m.ok == Some(true);
        if let Some(w) = st.registry.get_mut(worker) {
            w.last_seen = now;
            if ok {
                w.epoch = m.epoch.unwrap_or(w.epoch);
            }
        }
        if !ok {
            tracing::error!(%worker, epoch = ?m.epoch, error = ?m.error, "reconfigure failed");
        }
        let Some(round) = st.pending.as_mut() else {
            return;
        };
        if m.epoch != Some(round.epoch) || !round.waiting.remove(&worker) {
            return; // an ack of an earlier epoch (or a duplicate)
        }
        if !ok {
            round.refused.push(Refusal {
                worker,
                error: m.error.clone(),
            });
            round.finish(); // one refusal decides the round
        } else if round.waiting.is_empty() {
            round.finish();
        }
    }

    /// End the round of `epoch`: switch routing to its plan if every worker acknowledged,
    /// otherwise keep the old plan and re-broadcast it under a fresh epoch. Logs the decision,
    /// counts it in the metrics and keeps it in the history. `None` when no such round.
    pub fn end_round(&self, epoch: u64, outcome: RoundOutcome) -> Option<PlanRecord> {
        let mut st = self.lock();
        if st.pending.as_ref().is_none_or(|r| r.epoch != epoch) {
            return None;
        }
        let round = st.pending.take().expect("checked");
        let result = if !round.refused.is_empty() {
            PlanResult::Refused
        } else if round.waiting.is_empty() && outcome == RoundOutcome::Answered {
            PlanResult::Applied
        } else {
            PlanResult::Timeout
        };
        let previous = st.plan.groups.clone();
        let mut rebroadcast = true;
        if result == PlanResult::Applied {
            st.max_batch = round
                .groups
                .iter()
                .zip(&round.batch_caps)
                .filter_map(|(g, c)| cap(*c).map(|c| (g.members.clone(), c)))
                .collect();
            st.planned = Some(round.groups.clone());
            let fresh = st.last_epoch == round.epoch;
            self.rebuild_plan_with(&mut st, fresh.then_some(round.epoch));
            // The workers already have this plan under this epoch unless a registration or a
            // death since then changed either.
            rebroadcast = !(fresh && st.plan.groups == round.groups);
        } else {
            self.rebuild_plan(&mut st);
        }
        let plan = st.plan.clone();
        let record = PlanRecord {
            epoch: round.epoch,
            routing_epoch: plan.epoch,
            result,
            unix_ms: unix_ms(),
            groups: round.groups,
            batch_caps: round.batch_caps,
            previous,
            demand: round.demand,
            refused: round.refused,
            missing: {
                let mut m: Vec<WorkerId> = round.waiting.into_iter().collect();
                m.sort_unstable();
                m
            },
            plan_ms: round.plan_ms,
            round_ms: round.started.elapsed().as_secs_f64() * 1e3,
        };
        if st.history.len() >= HISTORY_LEN {
            st.history.pop_front();
        }
        st.history.push_back(record.clone());
        drop(st);
        match result {
            PlanResult::Applied => &self.metrics.plan_applied,
            PlanResult::Refused => &self.metrics.plan_refused,
            PlanResult::Timeout => &self.metrics.plan_timeout,
        }
        .fetch_add(1, Ordering::Relaxed);
        if result == PlanResult::Applied {
            let layout: Vec<String> = record
                .groups
                .iter()
                .map(|g| g.summary(&self.cfg.tiers))
                .collect();
            tracing::info!(
                epoch = plan.epoch,
                layout = layout.join(" "),
                round_ms = record.round_ms,
                "control: plan applied"
            );
        } else {
            tracing::warn!(epoch = record.epoch, result = result.as_str(), refused = ?record.refused,
                missing = ?record.missing, routing_epoch = plan.epoch,
                "control: plan not applied, keeping the old plan");
        }
        if rebroadcast {
            self.broadcast_plan(&plan);
        }
        Some(record)
    }

    /// Recent control decisions, oldest first.
    pub fn plan_history(&self) -> Vec<PlanRecord> {
        self.lock().history.iter().cloned().collect()
    }

    /// The wire `max_batch` of a group of the current plan.
    pub(super) fn max_batch_of(st: &State, g: &GroupPlan) -> Option<u32> {
        st.max_batch.get(&g.members).copied()
    }
}
