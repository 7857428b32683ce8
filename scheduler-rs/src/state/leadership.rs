//! Several routers in front of one pool (architecture §4 "Several routers"): this router's
//! part in planning. Alone (no lease) or as the lease's leader it plans and sends
//! `reconfigure`; as a follower it routes by the plan the leader answers its statistics with
//! and never sends `reconfigure` (`live_plan.rs` asks [`RouterRole::plans`]).
//!
//! NOTE (invariants): a leader's epochs are its term in the high 32 bits and a count in the
//! low ones, so every plan of a later leader outranks every plan of an earlier one: workers
//! refuse a `reconfigure` older than their plan, hence a deposed leader cannot roll a plan
//! back. A follower's epoch is the last plan it took from a leader; it issues none.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{RouterState, State};
use crate::ids::WorkerId;
use crate::lease::LeaderInfo;
use crate::plan::GroupPlan;
use crate::protocols::peer::PeerPlan;

/// This router's part in planning.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum RouterRole {
    /// The only router (no lease configured): it plans, as ever.
    #[default]
    Alone,
    /// It holds the lease under `term`: it plans and sends `reconfigure`.
    Leader { term: u64 },
    /// Another router leads (`leader`, once the lease names it): it routes by its plan.
    Follower { leader: Option<LeaderInfo> },
}

impl RouterRole {
    /// Whether this router plans (and numbers and sends its plans).
    pub fn plans(&self) -> bool {
        !matches!(self, RouterRole::Follower { .. })
    }
}

/// Unix milliseconds now.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl RouterState {
    /// This router's role now.
    pub fn role(&self) -> RouterRole {
        self.lock().role.clone()
    }

    /// Unix ms when this router last took the lease (0: never).
    pub fn leading_since_ms(&self) -> u64 {
        self.lock().leading_since_ms
    }

    /// Whether this router plans now.
    pub fn plans(&self) -> bool {
        self.lock().role.plans()
    }

    /// This router took the lease under `term`: it leads from a fresh epoch above every
    /// epoch it has seen and sends its plan (the last one it followed) to every worker, so
    /// that they refuse the former leader's from now on. Wakes the control loop to plan.
    pub fn promote(&self, term: u64) {
        let mut st = self.lock();
        let seen = st
            .registry
            .iter()
            .map(|(_, w)| w.epoch)
            .fold(st.last_epoch.max(st.plan.epoch), u64::max);
        let mut base = term << 32;
        if base <= seen {
            // NOTE: a lease store that lost its history (a lease file deleted, a new etcd):
            // a term below what workers run would have every plan refused.
            tracing::warn!(
                term,
                seen,
                "lease: the term is not above the epochs already in use; numbering above them"
            );
            base = ((seen >> 32) + 1) << 32;
        }
        st.role = RouterRole::Leader { term };
        st.leading_since_ms = unix_ms();
        st.last_epoch = base;
        st.peers.clear();
        st.share = 1;
        let plan = self.rebuild_plan(&mut st);
        drop(st);
        tracing::info!(
            term,
            epoch = plan.epoch,
            "lease: this router leads; planning"
        );
        self.broadcast_plan(&plan);
        self.leading.notify_one();
    }

    /// This router lost the lease (or never had it): it follows `leader`, routing by the
    /// last plan it had until the leader's arrives.
    pub fn follow(&self, leader: Option<LeaderInfo>) {
        let mut st = self.lock();
        if matches!(st.role, RouterRole::Leader { .. }) {
            tracing::warn!(?leader, "lease: this router no longer leads; following");
        }
        if let RouterRole::Follower { leader: known } = &st.role {
            if *known == leader {
                return;
            }
        }
        tracing::info!(?leader, "lease: following");
        st.role = RouterRole::Follower { leader };
    }

    /// A follower takes the leader's plan, if newer than the last it took (a higher term, or
    /// the same term sent later). Routing switches to it; no `reconfigure` goes out: the
    /// leader sent those. Returns whether it took it.
    pub fn adopt_plan(&self, p: PeerPlan) -> bool {
        let mut st = self.lock();
        if st.role.plans() || (p.term, p.sent_ms) <= st.adopted {
            return false;
        }
        let groups: Result<Vec<GroupPlan>, _> = p
            .groups
            .into_iter()
            .map(|g| g.resolve(&self.cfg.tiers))
            .collect();
        let groups = match groups {
            Ok(g) => g,
            Err(e) => {
                // NOTE: routers of one pool need the same tiers (docs/deployment.md).
                tracing::error!("the leader's plan names a tier this router lacks: {e:#}");
                return false;
            }
        };
        st.adopted = (p.term, p.sent_ms);
        st.max_batch = groups
            .iter()
            .zip(&p.max_batch)
            .filter_map(|(g, c)| c.map(|c| (g.members.clone(), c)))
            .collect();
        st.share = p.routers.max(1);
        st.last_epoch = st.last_epoch.max(p.epoch);
        let changed = st.plan.epoch != p.epoch || st.planned.as_ref() != Some(&groups);
        st.planned = Some(groups);
        self.rebuild_plan_with(&mut st, Some(p.epoch));
        if changed {
            tracing::info!(epoch = p.epoch, "following the leader's plan");
        }
        true
    }

    /// The leader's plan as its followers take it (the groups it routes by, full SLO
    /// bandwidth; each router dispatches up to its share of `routers`).
    pub fn leader_plan(&self) -> Option<PeerPlan> {
        let st = self.lock();
        let RouterRole::Leader { term } = st.role else {
            return None;
        };
        Some(PeerPlan {
            term,
            sent_ms: unix_ms(),
            epoch: st.plan.epoch,
            routers: st.share,
            groups: st
                .plan
                .groups
                .iter()
                .map(|g| g.named(&self.cfg.tiers))
                .collect(),
            max_batch: st
                .plan
                .groups
                .iter()
                .map(|g| Self::max_batch_of(&st, g))
                .collect(),
        })
    }

    /// A leader counts the routers that share the pool's SLO bandwidth: itself and the
    /// followers heard from within two control windows (others are dropped); the dispatcher
    /// takes the new share at once.
    pub(super) fn refresh_share(&self, st: &mut State, now: Instant) {
        let fresh = std::time::Duration::from_millis(2 * self.cfg.control_window_ms);
        st.peers.retain(|_, p| now.duration_since(p.seen) <= fresh);
        let share = 1 + st.peers.len() as u32;
        if share != st.share {
            tracing::info!(routers = share, "routers sharing the pool changed");
            st.share = share;
            let epoch = st.plan.epoch;
            self.rebuild_plan_with(st, Some(epoch));
        }
    }

    /// Each worker's plan epoch as its latest heartbeat (or ack) reported it.
    pub fn worker_epochs(&self) -> Vec<(WorkerId, u64)> {
        self.lock()
            .registry
            .iter()
            .map(|(id, w)| (*id, w.epoch))
            .collect()
    }
}
