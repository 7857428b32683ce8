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

mod end;

use std::collections::{HashMap, HashSet};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

use super::plan_record::{PlanRecord, Refusal};
use super::{RouterState, State};
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Plan};
use crate::protocols::worker::{self as wire, Reconfigured};
use crate::stats::TierDemand;

/// Control decisions kept for `/admin/plan`.
pub const HISTORY_LEN: usize = 64;

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

    /// Recent control decisions, oldest first.
    pub fn plan_history(&self) -> Vec<PlanRecord> {
        self.lock().history.iter().cloned().collect()
    }

    /// The wire `max_batch` of a group of the current plan.
    pub(super) fn max_batch_of(st: &State, g: &GroupPlan) -> Option<u32> {
        st.max_batch.get(&g.members).copied()
    }
}
