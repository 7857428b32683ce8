//! Step 4 of the planner (architecture §4): put groups on aligned device blocks (a group of `t`
//! devices starts at a multiple of `t`), keeping groups of the previous plan where possible.
//!
//! Order of preference per wanted group: (1) a previous group with the same TP, role and
//! tiers (nothing changes); (2) a previous group with the same TP whose devices are still free
//! (only its role/tiers change, no device moves); (3) the first free aligned block, largest
//! groups first. If a group then finds no block (kept groups fragmented the pool), everything
//! is re-placed from scratch by packing groups contiguously, largest first.
//!
//! NOTE: contiguous largest-first packing is always aligned when the TP levels form a
//! divisibility chain (each level divides the next, e.g. {1,2,4,8} or {1,3}): every group
//! starts at a sum of sizes that are multiples of its own size. The planner only plans
//! chain levels, so the fallback always succeeds when the sizes sum to at most N.

use std::collections::HashMap;

use crate::ids::TierId;
use crate::plan::{GroupPlan, Plan, Role};
use crate::profile::Shape;

/// A group the planner wants, before it has devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    /// TP level, or pipeline (stages of TP devices).
    pub shape: Shape,
    pub role: Role,
    pub tiers: Vec<TierId>,
    pub accepts_background: bool,
    pub max_rps: f64,
    pub max_inflight: f64,
    /// Decode batch cap for the group's local scheduler (0: no SLO cap).
    pub batch_cap: f64,
}

impl Wanted {
    fn into_group(self, start: u32) -> (GroupPlan, f64) {
        let group = GroupPlan {
            members: (start..start + self.shape.devices()).collect(),
            tp: self.shape.tp,
            pp: self.shape.pp,
            role: self.role,
            tiers: self.tiers,
            accepts_background: self.accepts_background,
            max_rps: self.max_rps,
            max_inflight: self.max_inflight,
        };
        (group, self.batch_cap)
    }
}

/// Place `wanted` on `n` devices. Returns groups sorted by leader, each with its batch cap.
pub fn place(mut wanted: Vec<Wanted>, n: u32, previous: Option<&Plan>) -> Vec<(GroupPlan, f64)> {
    // Largest first, stable: equal inputs give equal placements.
    wanted.sort_by_key(|w| std::cmp::Reverse((w.shape.devices(), w.shape.pp)));
    let placed = previous
        .and_then(|prev| place_keeping(&wanted, n, prev))
        .unwrap_or_else(|| pack(&wanted));
    let mut out: Vec<(GroupPlan, f64)> = wanted
        .into_iter()
        .zip(placed)
        .map(|(w, start)| w.into_group(start))
        .collect();
    out.sort_by_key(|(g, _)| g.leader());
    out
}

/// Contiguous packing in the given (largest-first) order.
fn pack(wanted: &[Wanted]) -> Vec<u32> {
    let mut at = 0;
    wanted
        .iter()
        .map(|w| {
            let s = at;
            at += w.shape.devices();
            s
        })
        .collect()
}

/// Start device of each wanted group, reusing previous groups; `None` when fragmented.
fn place_keeping(wanted: &[Wanted], n: u32, prev: &Plan) -> Option<Vec<u32>> {
    let mut free = vec![true; n as usize];
    let mut start: Vec<Option<u32>> = vec![None; wanted.len()];
    // Previous groups that still fit the pool and are well-formed.
    let old: Vec<&GroupPlan> = prev
        .groups
        .iter()
        .filter(|g| {
            g.devices() as usize == g.members.len()
                && g.devices() > 0
                && g.leader() % g.devices() == 0
                && g.leader() + g.devices() <= n
                && g.members.iter().zip(g.leader()..).all(|(&m, k)| m == k)
        })
        .collect();
    let mut claimed = vec![false; old.len()];
    let mut by_exact: HashMap<(Shape, Role, &[TierId]), Vec<usize>> = HashMap::new();
    let mut by_shape: HashMap<Shape, Vec<usize>> = HashMap::new();
    // Reverse so `pop` yields previous groups in plan order.
    for (k, g) in old.iter().enumerate().rev() {
        by_exact
            .entry((g.shape(), g.role, g.tiers.as_slice()))
            .or_default()
            .push(k);
        by_shape.entry(g.shape()).or_default().push(k);
    }
    let take = |s: u32, tp: u32, free: &mut [bool]| -> bool {
        let r = s as usize..(s + tp) as usize;
        if free[r.clone()].iter().all(|&f| f) {
            free[r].iter_mut().for_each(|f| *f = false);
            true
        } else {
            false
        }
    };
    for (w, slot) in wanted.iter().zip(start.iter_mut()) {
        if let Some(list) = by_exact.get_mut(&(w.shape, w.role, w.tiers.as_slice())) {
            while let Some(k) = list.pop() {
                if !claimed[k] && take(old[k].leader(), w.shape.devices(), &mut free) {
                    claimed[k] = true;
                    *slot = Some(old[k].leader());
                    break;
                }
            }
        }
    }
    for (w, slot) in wanted.iter().zip(start.iter_mut()) {
        if slot.is_some() {
            continue;
        }
        if let Some(list) = by_shape.get_mut(&w.shape) {
            while let Some(k) = list.pop() {
                if !claimed[k] && take(old[k].leader(), w.shape.devices(), &mut free) {
                    claimed[k] = true;
                    *slot = Some(old[k].leader());
                    break;
                }
            }
        }
    }
    // Fresh groups: first free aligned block; a cursor per size only moves forward because
    // blocks only ever get taken.
    let mut cursor: HashMap<u32, u32> = HashMap::new();
    for (w, slot) in wanted.iter().zip(start.iter_mut()) {
        if slot.is_some() {
            continue;
        }
        let size = w.shape.devices();
        let c = cursor.entry(size).or_insert(0);
        while *c + size <= n && !take(*c, size, &mut free) {
            *c += size;
        }
        if *c + size > n {
            return None;
        }
        *slot = Some(*c);
        *c += size;
    }
    start.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mixed group for tier `tier`, a letter: `a` is `TierId(0)`, `b` `TierId(1)`, ...
    fn want(tp: u32, tier: &str) -> Wanted {
        Wanted {
            shape: Shape::from(tp),
            role: Role::Mixed,
            tiers: vec![TierId(usize::from(tier.as_bytes()[0] - b'a'))],
            accepts_background: false,
            max_rps: 1.0,
            max_inflight: 1.0,
            batch_cap: 1.0,
        }
    }

    fn layout(groups: &[(GroupPlan, f64)]) -> Vec<(u32, u32, String)> {
        groups
            .iter()
            .map(|(g, _)| {
                let letters = g.tiers.iter().map(|t| char::from(b'a' + t.index() as u8));
                (g.leader(), g.tp, letters.collect())
            })
            .collect()
    }

    #[test]
    fn fresh_placement_packs_largest_first() {
        let got = place(vec![want(1, "a"), want(4, "b"), want(2, "c")], 8, None);
        let expect = [(0, 4, "b"), (4, 2, "c"), (6, 1, "a")];
        assert_eq!(
            layout(&got),
            expect.map(|(l, t, s)| (l, t, s.to_string())).to_vec()
        );
    }

    #[test]
    fn keeps_existing_groups_and_relabels_before_moving() {
        let prev = Plan {
            epoch: 3,
            groups: place(vec![want(2, "a"), want(2, "b"), want(1, "c")], 8, None)
                .into_iter()
                .map(|(g, _)| g)
                .collect(),
        };
        // prev: a@0 (tp2), b@2 (tp2), c@4. Now: b keeps 2; a is gone, so its TP2 block at 0 is
        // relabelled for d; the new TP1 e takes the first free device (5); c keeps 4.
        let got = place(
            vec![want(2, "b"), want(2, "d"), want(1, "c"), want(1, "e")],
            8,
            Some(&prev),
        );
        let expect = [(0, 2, "d"), (2, 2, "b"), (4, 1, "c"), (5, 1, "e")];
        assert_eq!(
            layout(&got),
            expect.map(|(l, t, s)| (l, t, s.to_string())).to_vec()
        );
    }

    #[test]
    fn falls_back_to_packing_when_fragmented() {
        // TP1 groups kept at 1 and 4 leave no aligned TP4 block in 6 devices (0..4 holds
        // device 1, 4..8 runs past the end): everything is packed afresh.
        let prev = Plan {
            epoch: 1,
            groups: vec![want(1, "x").into_group(1).0, want(1, "y").into_group(4).0],
        };
        let got = place(
            vec![want(4, "z"), want(1, "x"), want(1, "y")],
            6,
            Some(&prev),
        );
        let expect = [(0, 4, "z"), (4, 1, "x"), (5, 1, "y")];
        assert_eq!(
            layout(&got),
            expect.map(|(l, t, s)| (l, t, s.to_string())).to_vec()
        );
    }
}
