//! How the dispatcher picks among the groups that can take a request: the affinity group
//! within a slack of the least loaded, the least loaded, or the next in round-robin order.
//! Best-effort and background requests go to their affinity group too, unless it already has
//! `SPILL_SLACK` more of them in flight than the candidate with the fewest (then to that one).

use crate::fasthash::IntMap;

use super::{Dispatcher, GroupLoad};

/// How much busier than the least loaded candidate the affinity group may be and still be
/// chosen: this fraction of its capacity, or this many requests when it is unbounded.
const AFFINITY_SLACK: f64 = 0.25;
const AFFINITY_SLACK_REQUESTS: f64 = 4.0;

/// The affinity group stops getting best-effort or background requests once it has this many
/// more of them in flight than the candidate with the fewest.
///
/// NOTE: the first plan of a default server serves no tier yet, so every request is best
/// effort: round-robin alone sent a conversation's second turn (and a repeated prompt) to the
/// device without its KV (issue 40 item 3). The slack bounds how unbalanced one hot prefix can
/// make the groups.
const SPILL_SLACK: u32 = 4;

impl Dispatcher {
    /// `affinity` instead of `best` when it matches `pred` and is at most the slack busier.
    pub(super) fn prefer(
        &self,
        affinity: Option<u32>,
        best: Option<u32>,
        pred: impl Fn(&GroupLoad) -> bool,
    ) -> Option<u32> {
        let (Some(a), Some(b)) = (affinity, best) else {
            return best;
        };
        let Some(g) = self.groups.get(&a).filter(|g| pred(g)) else {
            return best;
        };
        let slack = if g.capacity().is_finite() {
            AFFINITY_SLACK
        } else {
            AFFINITY_SLACK_REQUESTS
        };
        if g.load() <= self.groups[&b].load() + slack {
            Some(a)
        } else {
            best
        }
    }

    /// The matching group with the lowest load; ties go to the earlier group in plan order.
    pub(super) fn least_loaded(&self, pred: impl Fn(&GroupLoad) -> bool) -> Option<u32> {
        let mut best: Option<(f64, u32)> = None;
        for leader in &self.order {
            let g = &self.groups[leader];
            if pred(g) && best.is_none_or(|(load, _)| g.load() < load) {
                best = Some((g.load(), *leader));
            }
        }
        best.map(|(_, leader)| leader)
    }

    /// A best-effort request's group: by `leftover_pick`, among the prefilling groups.
    pub(super) fn next_spill(&mut self, affinity: Option<u32>) -> Option<u32> {
        let pred = GroupLoad::prefills;
        match self.leftover_pick(affinity, pred) {
            Some(leader) => Some(leader),
            None => Self::round_robin(&self.order, &self.groups, &mut self.spill_cursor, pred),
        }
    }

    /// A background request's group: by `leftover_pick`, among the groups that accept
    /// background work.
    pub(super) fn next_background(&mut self, affinity: Option<u32>) -> Option<u32> {
        let pred = |g: &GroupLoad| g.prefills() && g.plan.accepts_background;
        match self.leftover_pick(affinity, pred) {
            Some(leader) => Some(leader),
            None => Self::round_robin(&self.order, &self.groups, &mut self.background_cursor, pred),
        }
    }

    /// For a request with an `affinity` group that matches `pred`: that group while it has
    /// fewer than `SPILL_SLACK` more leftover requests in flight than the matching group with
    /// the fewest, else that one (ties to the earlier in plan order). `None` without such an
    /// affinity: the caller goes round-robin.
    fn leftover_pick(
        &self,
        affinity: Option<u32>,
        pred: impl Fn(&GroupLoad) -> bool,
    ) -> Option<u32> {
        let a = affinity.filter(|a| self.groups.get(a).is_some_and(&pred))?;
        let fewest = self
            .order
            .iter()
            .filter(|l| pred(&self.groups[*l]))
            .min_by_key(|l| self.groups[*l].leftover)?;
        let (mine, least) = (self.groups[&a].leftover, self.groups[fewest].leftover);
        Some(if mine < least + SPILL_SLACK {
            a
        } else {
            *fewest
        })
    }

    fn round_robin(
        order: &[u32],
        groups: &IntMap<u32, GroupLoad>,
        cursor: &mut usize,
        pred: impl Fn(&GroupLoad) -> bool,
    ) -> Option<u32> {
        let n = order.len();
        for step in 0..n {
            let leader = order[(*cursor + step) % n];
            if pred(&groups[&leader]) {
                *cursor = (*cursor + step + 1) % n;
                return Some(leader);
            }
        }
        None
    }
}
