//! Global dispatch (Nitsum §3.3.2): label each request feasible / best-effort / background and
//! pick its prefill group (and decode group when the prefill group does not decode).
//!
//! Pure and synchronous: the router calls it on the request path and the simulator calls the
//! very same code, so both see identical routing decisions.

mod pick;

use crate::fasthash::IntMap;
use crate::ids::TierId;
use crate::plan::{GroupPlan, Plan, Role};

/// Marks a charge whose group no longer exists.
const NO_GROUP: u32 = u32::MAX;

/// How the worker's local scheduler should queue a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Fits its tier's SLO-compliant bandwidth.
    Feasible,
    /// Over the tier's bandwidth: spilled round-robin, served with leftover capacity.
    BestEffort,
    /// Background tier: no SLO, lowest priority.
    Background,
}

impl Class {
    /// Wire name used in the `generate` message (docs/protocol.md).
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Feasible => "feasible",
            Class::BestEffort => "best_effort",
            Class::Background => "background",
        }
    }
}

/// What the dispatcher needs to know about a request.
#[derive(Debug, Clone)]
pub struct DispatchRequest {
    pub tier: TierId,
    pub background: bool,
    /// The group leader that probably holds the prompt's prefix in its KV cache
    /// (`prefix_index.rs`): preferred when it is a candidate and not much busier.
    pub affinity: Option<u32>,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Leader of the group that prefills (and, for a mixed group, decodes).
    pub prefill_leader: u32,
    /// Leader of the decode group when the prefill group is prefill-only.
    pub decode_leader: Option<u32>,
    pub class: Class,
}

#[derive(Debug)]
struct GroupLoad {
    plan: GroupPlan,
    /// Requests assigned and not yet finished.
    assigned: u32,
}

impl GroupLoad {
    fn capacity(&self) -> f64 {
        if self.plan.max_inflight <= 0.0 {
            f64::INFINITY
        } else {
            self.plan.max_inflight
        }
    }

    fn has_room(&self) -> bool {
        f64::from(self.assigned) + 1.0 <= self.capacity()
    }

    /// Load as a fraction of capacity; raw count when the capacity is unbounded.
    fn load(&self) -> f64 {
        let cap = self.capacity();
        if cap.is_finite() {
            f64::from(self.assigned) / cap
        } else {
            f64::from(self.assigned)
        }
    }

    fn prefills(&self) -> bool {
        matches!(self.plan.role, Role::Prefill | Role::Mixed)
    }

    fn serves(&self, tier: TierId) -> bool {
        self.plan.tiers.contains(&tier)
    }
}

/// Per-plan routing state with SLO-compliant bandwidth accounting.
#[derive(Debug, Default)]
pub struct Dispatcher {
    /// Keyed by group leader; the order of `plan.groups` is kept in `order`.
    groups: IntMap<u32, GroupLoad>,
    order: Vec<u32>,
    /// Unfinished request → the groups it was charged to.
    charged: IntMap<u64, (u32, Option<u32>)>,
    spill_cursor: usize,
    background_cursor: usize,
}

impl Dispatcher {
    /// A dispatcher routing by `plan` (requests' and groups' `TierId`s index one tier list).
    pub fn new(plan: &Plan) -> Self {
        let mut d = Dispatcher::default();
        d.set_plan(plan);
        d
    }

    /// Switch to a new plan. Groups that survive unchanged (same members) keep their
    /// assigned-work count; requests charged to vanished groups are simply released when
    /// they complete.
    pub fn set_plan(&mut self, plan: &Plan) {
        let mut old = std::mem::take(&mut self.groups);
        self.order.clear();
        let mut survived = std::collections::HashSet::new();
        for g in &plan.groups {
            let leader = g.leader();
            let assigned = match old.remove(&leader) {
                Some(prev) if prev.plan.members == g.members => {
                    survived.insert(leader);
                    prev.assigned
                }
                _ => 0,
            };
            self.order.push(leader);
            self.groups.insert(
                leader,
                GroupLoad {
                    plan: g.clone(),
                    assigned,
                },
            );
        }
        // NOTE: charges against vanished or rebuilt groups are forgotten now (the new groups
        // start at zero), so their later completions must not touch the new counts.
        for (pre, dec) in self.charged.values_mut() {
            if !survived.contains(pre) {
                *pre = NO_GROUP;
            }
            if dec.is_some_and(|d| !survived.contains(&d)) {
                *dec = None;
            }
        }
        self.spill_cursor = 0;
        self.background_cursor = 0;
    }

    /// Route a request and charge it to the chosen groups. `None` when no group can take it.
    pub fn dispatch(&mut self, id: u64, req: &DispatchRequest) -> Option<Decision> {
        let (prefill, class) = if req.background {
            (self.next_background()?, Class::Background)
        } else {
            let feasible = |g: &GroupLoad| g.prefills() && g.serves(req.tier) && g.has_room();
            match self.prefer(req.affinity, self.least_loaded(feasible), feasible) {
                Some(leader) => (leader, Class::Feasible),
                None => (self.next_spill()?, Class::BestEffort),
            }
        };
        let decode = if self.groups[&prefill].plan.role == Role::Prefill {
            let tier_decode =
                self.least_loaded(|g| g.plan.role == Role::Decode && g.serves(req.tier));
            let fallback = || self.least_loaded(|g| g.plan.role == Role::Decode);
            // NOTE: with no decode group left (its host died) the prefill group decodes the
            // request itself, as a worker does without a `decode_target`: never refuse it.
            tier_decode.or_else(fallback)
        } else {
            None
        };
        self.charge(id, prefill, decode);
        Some(Decision {
            prefill_leader: prefill,
            decode_leader: decode,
            class,
        })
    }

    /// Release a finished (or failed) request's charge. Unknown ids are ignored.
    pub fn complete(&mut self, id: u64) {
        if let Some((pre, dec)) = self.charged.remove(&id) {
            for leader in std::iter::once(pre).chain(dec) {
                if let Some(g) = self.groups.get_mut(&leader) {
                    g.assigned = g.assigned.saturating_sub(1);
                }
            }
        }
    }

    /// Whether request `id` holds SLO bandwidth (it was dispatched feasible and is unfinished).
    pub fn holds(&self, id: u64) -> bool {
        self.charged.contains_key(&id)
    }

    /// Unfinished requests charged to the group led by `leader`.
    pub fn assigned(&self, leader: u32) -> u32 {
        self.groups.get(&leader).map_or(0, |g| g.assigned)
    }

    /// Remaining SLO-compliant bandwidth (requests) of the group led by `leader`.
    pub fn available(&self, leader: u32) -> f64 {
        self.groups
            .get(&leader)
            .map_or(0.0, |g| g.capacity() - f64::from(g.assigned))
    }

    pub fn inflight(&self) -> usize {
        self.charged.len()
    }

    /// Charge request `id` to these groups (released by `complete`).
    pub fn charge(&mut self, id: u64, prefill: u32, decode: Option<u32>) {
        for leader in std::iter::once(prefill).chain(decode) {
            if let Some(g) = self.groups.get_mut(&leader) {
                g.assigned += 1;
            }
        }
        self.charged.insert(id, (prefill, decode));
    }
}

#[cfg(test)]
mod tests;
