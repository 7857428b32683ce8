//! The simulator's event loop: queued events and the trace's arrivals in time order, each
//! handled as it comes; a group engine's iterations started (`kick`) and finished.

use crate::planner::strategy::Strategy;

use super::cluster::Cluster;
use super::event_queue::{Event, Kind};
use super::policy::Policy;

impl Cluster<'_> {
    /// Process every event up to time `until` (arrivals included).
    pub(super) fn advance(&mut self, until: f64) {
        while let Some(ev) = self.next_event(until) {
            self.now = ev.t;
            match ev.kind {
                Kind::Arrival(r) => self.on_arrival(r),
                Kind::IterDone(l, gen) => self.on_iteration(l, gen),
                Kind::Ready(l, gen) => {
                    if self.groups.get(&l).is_some_and(|g| g.generation == gen) {
                        self.kick(l);
                    }
                }
                Kind::KvArrived(r, l) => self.hand_to_decoder(r, Some(l), 0.0),
                Kind::BoundFirst(r, id) => self.on_bound_first(r, id),
                Kind::BoundDone(r, id) => self.on_bound_done(r, id),
                Kind::Control => self.on_control(),
            }
        }
    }

    /// The earliest of the queued events and the next arrival, if it comes by `until`.
    fn next_event(&mut self, until: f64) -> Option<Event> {
        let arrival = self.arrivals.get(self.next_arrival).map(|&i| Event {
            t: self.reqs[i].arrival,
            seq: self.arrival_seq + 1 + i as u64,
            kind: Kind::Arrival(i),
        });
        let first = match (&arrival, self.events.peek()) {
            (Some(a), Some(e)) => a.t.min(e.t),
            (Some(a), None) => a.t,
            (None, Some(e)) => e.t,
            (None, None) => return None,
        };
        if first > until {
            return None;
        }
        match (arrival, self.events.peek()) {
            // `Event` orders reversed (for the max-heap): greater = earlier.
            (Some(a), Some(e)) if *e > a => self.events.pop(),
            (Some(a), _) => {
                self.next_arrival += 1;
                Some(a)
            }
            (None, _) => self.events.pop(),
        }
    }

    pub(super) fn push(&mut self, t: f64, kind: Kind) {
        self.seq += 1;
        self.events.push(Event {
            t,
            seq: self.seq,
            kind,
        });
    }

    fn on_iteration(&mut self, leader: u32, gen: u64) {
        let Some(g) = self.groups.get_mut(&leader) else {
            return;
        };
        if g.generation != gen || !g.busy() {
            return;
        }
        let out = g.finish(&mut self.reqs, self.now);
        for r in out.finished {
            self.done(r);
        }
        for r in out.handoff {
            let bytes = f64::from(self.reqs[r].input) * self.cfg.kv_bytes_per_token;
            let target = self.decode_target(self.reqs[r].decode_leader, None);
            match target {
                Some(l) => self.push(self.now + self.transfer_s(bytes), Kind::KvArrived(r, l)),
                None => self.drop_request(r),
            }
        }
        self.kick(leader);
    }

    pub(super) fn kick(&mut self, leader: u32) {
        let Some(g) = self.groups.get_mut(&leader) else {
            return;
        };
        if g.busy() {
            return;
        }
        let gen = g.generation;
        if self.now < g.ready_at {
            let at = g.ready_at;
            self.push(at, Kind::Ready(leader, gen));
            return;
        }
        let started = g.start(&mut self.reqs, &self.profile, self.now);
        // A demoted request no longer holds SLO bandwidth at the dispatcher.
        for r in g.take_demoted() {
            self.dispatcher.release(r as u64);
        }
        if let Some(lat) = started {
            g.busy_until = self.now + lat;
            self.push(self.now + lat, Kind::IterDone(leader, gen));
        }
    }

    /// Whether group engines demote requests past their TTFT deadline: Nitsum's local
    /// scheduler does; the baselines (SLO-agnostic FCFS, Split) keep their own rules.
    pub(super) fn demotes_late(&self) -> bool {
        !matches!(
            self.cfg.policy,
            Policy::Fixed(Strategy::StaticTp { .. } | Strategy::Split)
        )
    }
}
