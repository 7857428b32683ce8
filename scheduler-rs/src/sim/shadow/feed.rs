//! What a shadow run does beyond a simulated cluster: take requests as they arrive, forget
//! the resolved ones, run to the present and tell whether a request is on track.

use crate::dispatch::Class;
use crate::sim::cluster::{req_of, Cluster};
use crate::sim::{report, TraceRequest};

impl Cluster<'static> {
    /// Append a request arriving at or after the shadow's present.
    pub(super) fn feed(&mut self, r: &TraceRequest) {
        let i = self.reqs.len();
        // The bank builds requests of known tiers and positive lengths.
        let req = req_of(&self.cfg, i, r).expect("a valid shadow request");
        self.reqs.push(req);
        self.arrivals.push(i);
    }

    /// Drop the scored requests (below index `scored`) that are resolved, oldest first, and
    /// the arrivals already read: a shadow runs as long as the router.
    pub(super) fn forget_resolved(&mut self, scored: usize) {
        self.reqs
            .drop_front(scored, |r| r.finish.is_some() || r.dropped);
        self.arrivals.drain(..self.next_arrival);
        self.next_arrival = 0;
    }

    /// Run to `now` and bring every decoding request's token count up to date.
    pub(super) fn advance_shadow(&mut self, now: f64) {
        self.advance(now);
        self.now = self.now.max(now);
        for g in self.groups.values() {
            g.sync(&mut self.reqs);
        }
        self.sync_bound();
    }

    /// Whether request `i` met its SLOs, or, still running at `now`, had its first token in
    /// time and has kept its TPOT so far.
    pub(super) fn on_track(&self, i: usize, now: f64) -> bool {
        let r = &self.reqs[i];
        let tier = &self.cfg.tiers[r.tier.index()];
        if r.dropped || (r.class == Class::Background && !tier.background) {
            return false;
        }
        if r.finish.is_some() {
            return report::met(r, tier);
        }
        let Some(first) = r.first_token else {
            return false;
        };
        let tokens = f64::from(r.generated.max(2) - 1);
        (first - r.arrival) * 1e3 <= tier.ttft_ms && (now - first) * 1e3 <= tier.tpot_ms * tokens
    }
}
