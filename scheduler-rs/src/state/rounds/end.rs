//! Ending a control round: switch routing to the acknowledged plan, or keep the old one and
//! re-broadcast it under a fresh epoch; then log, count and record the decision.

use std::sync::atomic::Ordering;

use crate::ids::WorkerId;
use crate::state::plan_record::{PlanRecord, PlanResult};
use crate::state::RouterState;

use super::{cap, unix_ms, RoundOutcome, HISTORY_LEN};

impl RouterState {
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
}
