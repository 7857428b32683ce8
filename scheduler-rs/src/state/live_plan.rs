//! The plan over the live workers: rebuilt as workers come and go (or set at once), and
//! sent to every worker as `reconfigure`; the other broadcasts (`flush_cache`, `shutdown`).

use bytes::Bytes;

use super::{RouterState, State};
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Plan};
use crate::protocols::worker as wire;

impl RouterState {
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
            // NOTE: a follower numbers no plan: its epoch stays the leader's last.
            None if !st.role.plans() => st.plan.epoch,
            None => {
                st.last_epoch += 1;
                st.last_epoch
            }
        };
        st.plan = Plan { epoch, groups };
        // NOTE: with several routers each dispatches up to its share of a group's bandwidth.
        st.dispatcher.set_plan(&st.plan.shared_by(st.share));
        st.plan.clone()
    }

    /// Send `reconfigure` with the whole plan to every live worker (not as a follower: only
    /// the leader sends plans).
    pub(super) fn broadcast_plan(&self, plan: &Plan) {
        let st = self.lock();
        if !st.role.plans() {
            return;
        }
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
        self.send_to_every_worker(wire::encode_flush_cache())
    }

    /// Send `shutdown` to every live worker.
    pub fn shutdown_workers(&self) {
        self.send_to_every_worker(wire::encode_shutdown());
    }

    /// Send `payload` (encoded once) to every registered worker; returns how many.
    fn send_to_every_worker(&self, payload: Vec<u8>) -> usize {
        let idents: Vec<Bytes> = self
            .lock()
            .registry
            .iter()
            .map(|(_, w)| w.identity.clone())
            .collect();
        for ident in &idents {
            self.send(ident.clone(), payload.clone());
        }
        idents.len()
    }
}
