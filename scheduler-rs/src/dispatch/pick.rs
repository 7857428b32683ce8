//! How the dispatcher picks among the groups that can take a request: the affinity group
//! within a slack of the least loaded, the least loaded, or the next in round-robin order.

use crate::fasthash::IntMap;

use super::{Dispatcher, GroupLoad};

/// How much busier than the least loaded candidate the affinity group may be and still be
/// chosen: this fraction of its capacity, or this many requests when it is unbounded.
const AFFINITY_SLACK: f64 = 0.25;
const AFFINITY_SLACK_REQUESTS: f64 = 4.0;

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

    pub(super) fn next_spill(&mut self) -> Option<u32> {
        Self::round_robin(
            &self.order,
            &self.groups,
            &mut self.spill_cursor,
            GroupLoad::prefills,
        )
    }

    pub(super) fn next_background(&mut self) -> Option<u32> {
        Self::round_robin(
            &self.order,
            &self.groups,
            &mut self.background_cursor,
            |g| g.prefills() && g.plan.accepts_background,
        )
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
