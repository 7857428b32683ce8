//! Simulation events, ordered by time and then by insertion (deterministic ties).

use std::cmp::Ordering;

/// What happens. Group events carry (leader, engine generation) so a dissolved group's
/// late events are recognised and ignored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Request (index) arrives at the router.
    Arrival(usize),
    /// The group's iteration in flight ends.
    IterDone(u32, u64),
    /// The group's switch/migration pause is over.
    Ready(u32, u64),
    /// A prefilled request's KV reached the decode group led by the second field.
    KvArrived(usize, u32),
    /// A bound request's first token (request, binding id; `sim::bind`).
    BoundFirst(usize, u64),
    /// A fully bound request's last token (request, binding id).
    BoundDone(usize, u64),
    /// Control window: re-plan.
    Control,
}

/// An event at simulated time `t` (seconds); `seq` orders equal times by insertion.
#[derive(Debug)]
pub struct Event {
    pub t: f64,
    pub seq: u64,
    pub kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest (then first-pushed).
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}
