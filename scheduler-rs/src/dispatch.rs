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
    /// Over the tier's bandwidth: spilled to its prefix's group (else round-robin), served
    /// with leftover capacity.
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
    /// Feasible requests assigned and not yet finished (or released: `release`).
    assigned: u32,
    /// Best-effort and background requests placed here and not yet finished: they hold no
    /// SLO bandwidth, but keep a prefix's spills from all piling onto one group (pick.rs).
    leftover: u32,
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
    /// Unfinished feasible request → the groups it was charged to.
    charged: IntMap<u64, (u32, Option<u32>)>,
    /// Unfinished best-effort or background request → the group it was placed on.
    spilled: IntMap<u64, u32>,
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
            let (assigned, leftover) = match old.remove(&leader) {
                Some(prev) if prev.plan.members == g.members => {
                    survived.insert(leader);
                    (prev.assigned, prev.leftover)
                }
                _ => (0, 0),
            };
            self.order.push(leader);
            self.groups.insert(
                leader,
                GroupLoad {
                    plan: g.clone(),
                    assigned,
                    leftover,
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
        for pre in self.spilled.values_mut() {
            if !survived.contains(pre) {
                *pre = NO_GROUP;
            }
        }
        self.spill_cursor = 0;
        self.background_cursor = 0;
    }

    /// Route a request and charge it to the chosen groups: a feasible one against their SLO
    /// bandwidth, another one as leftover work. `None` when no group can take it.
    ///
    /// NOTE: every class follows `req.affinity` (the group holding its prefix's KV) when it
    /// can: a conversation's next turn or a repeated prompt that lands elsewhere recomputes
    /// its whole prompt. Only the least-loaded pick (feasible) and the round-robin fallback
    /// (best effort, background) differ.
    pub fn dispatch(&mut self, id: u64, req: &DispatchRequest) -> Option<Decision> {
        let (prefill, class) = if req.background {
            (self.next_background(req.affinity)?, Class::Background)
        } else {
            let feasible = |g: &GroupLoad| g.prefills() && g.serves(req.tier) && g.has_room();
            match self.prefer(req.affinity, self.least_loaded(feasible), feasible) {
                Some(leader) => (leader, Class::Feasible),
                None => (self.next_spill(req.affinity)?, Class::BestEffort),
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
        if class == Class::Feasible {
            self.charge(id, prefill, decode);
        } else {
            self.spill(id, prefill);
        }
        Some(Decision {
            prefill_leader: prefill,
            decode_leader: decode,
            class,
        })
    }

    /// Release a finished (or failed) request: its SLO charge and its leftover count. Unknown
    /// ids are ignored.
    pub fn complete(&mut self, id: u64) {
        self.release(id);
        if let Some(pre) = self.spilled.remove(&id) {
            if let Some(g) = self.groups.get_mut(&pre) {
                g.leftover = g.leftover.saturating_sub(1);
            }
        }
    }

    /// Release only a request's SLO-bandwidth charge (it can no longer meet its SLO, or it was
    /// demoted): it stays counted nowhere until it completes. Unknown ids are ignored.
    pub fn release(&mut self, id: u64) {
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

    /// Feasible requests in flight (those holding SLO bandwidth).
    pub fn inflight(&self) -> usize {
        self.charged.len()
    }

    /// Best-effort and background requests in flight on the group led by `leader`.
    pub fn leftover(&self, leader: u32) -> u32 {
        self.groups.get(&leader).map_or(0, |g| g.leftover)
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

    /// Count request `id` as leftover work on `prefill` (released by `complete`).
    pub fn spill(&mut self, id: u64, prefill: u32) {
        if let Some(g) = self.groups.get_mut(&prefill) {
            g.leftover += 1;
        }
        // NOTE: a request placed again (its group was rebuilt) is counted once, where it is now.
        if let Some(old) = self.spilled.insert(id, prefill) {
            if let Some(g) = self.groups.get_mut(&old) {
                g.leftover = g.leftover.saturating_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests;
