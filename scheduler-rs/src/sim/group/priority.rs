//! The local scheduler's class priorities in a group engine: requests that can no longer
//! meet their TTFT are demoted to background, and a waiting higher-class request preempts
//! the newest lowest-class holder of a batch slot.

use crate::dispatch::Class;
use crate::plan::Role;
use crate::sim::prompt_order::{overtake, Pace};
use crate::sim::reqs::{queue_of, Reqs};

use super::GroupSim;

impl GroupSim {
    /// Requests demoted to background since the last call (their SLO is lost).
    pub fn take_demoted(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.demoted)
    }

    /// NOTE: goodput only counts requests that meet their SLOs, and a request that has not
    /// started by its TTFT deadline never will: under overload, serving it first makes the
    /// requests behind it late too (the FCFS collapse). It still runs, last.
    pub(super) fn demote_late(&mut self, reqs: &mut Reqs, now: f64) {
        for q in 0..2 {
            // Queues are FIFO by arrival (up to preemption): the late ones are at the front.
            while let Some(&r) = self.waiting[q].front() {
                if reqs[r].prefilled > 0 || now <= reqs[r].deadline {
                    break;
                }
                self.waiting[q].pop_front();
                reqs[r].class = Class::Background;
                self.waiting[2].push_back(r);
                self.demoted.push(r);
            }
        }
    }

    /// NOTE: a feasible or best-effort request whose first token cannot come before its
    /// TTFT deadline, even if it got every prompt token of every iteration after the ones
    /// ahead of it in class-then-FCFS order, will miss its SLO whatever happens; prefilling
    /// it now only delays the requests behind it (the same FCFS collapse as a late start).
    /// It is demoted to background now (it keeps its progress and still runs, last), and the
    /// dispatcher gets its SLO bandwidth back. The estimate is a lower bound on its first
    /// token (full budgets, no new arrivals ahead), so no request that could still make it
    /// is demoted.
    pub(super) fn demote_hopeless(
        &mut self,
        reqs: &mut Reqs,
        iteration_ms: impl Fn(f64) -> f64,
        decode_ms: f64,
        pace: Pace,
    ) {
        // NOTE: only admitted prompts are checked: they are what takes the budget, and there
        // are at most `batch_cap` of them (a waiting one is demoted at its deadline, by
        // `demote_late`, before it can take any).
        let mut candidates: Vec<usize> = self
            .prefilling
            .iter()
            .copied()
            .filter(|&r| queue_of(reqs[r].class) <= 1 && !reqs[r].leftover)
            .collect();
        if candidates.is_empty() {
            return;
        }
        // The order `start` gives the budget in.
        candidates.sort_by_key(|&r| queue_of(reqs[r].class));
        overtake(&mut candidates, reqs, pace, &mut self.scratch);
        let budget = f64::from(self.budget);
        let full_ms = iteration_ms(budget);
        // The last, partial iteration costs at least the decode step it rides on.
        let last_ms = decode_ms;
        let mut ahead = 0.0;
        let mut hopeless = Vec::new();
        for r in candidates {
            let tokens = ahead + f64::from(reqs[r].input - reqs[r].prefilled);
            let iterations = (tokens / budget).ceil().max(1.0);
            let first_token_ms = (iterations - 1.0) * full_ms + last_ms;
            if pace.now + first_token_ms / 1000.0 > reqs[r].deadline {
                hopeless.push(r);
            } else {
                ahead = tokens;
            }
        }
        for r in hopeless {
            reqs[r].class = Class::Background;
            self.demoted.push(r);
        }
    }

    /// Local-scheduler priority (architecture §3): while a feasible (then best-effort) request waits
    /// for a batch slot held by a lower class, pause the newest lowest-class holder: a running
    /// one keeps its KV and waits in `pending`, a prefilling one keeps its prefilled tokens.
    pub(super) fn preempt_for_higher_classes(&mut self, reqs: &mut Reqs) {
        if self.plan.role == Role::Prefill {
            return;
        }
        for q in 0..2 {
            loop {
                let waiting = !self.pending[q].is_empty() || !self.waiting[q].is_empty();
                let free = self.running.len() + self.prefilling.len() < self.batch_cap;
                if !waiting || free {
                    break;
                }
                // NOTE: newest by arrival (request indices are in arrival order), as the
                // worker's `_make_room` picks; not by batch position, which overtaking reorders.
                let lowest = |v: &mut dyn Iterator<Item = (usize, usize)>| {
                    v.filter(|&(_, r)| queue_of(reqs[r].class) > q)
                        .max_by_key(|&(_, r)| (queue_of(reqs[r].class), r))
                };
                let run = lowest(&mut self.running.iter().copied().enumerate());
                let pre = lowest(&mut self.prefilling.iter().copied().enumerate());
                let victim_class =
                    |x: Option<(usize, usize)>| x.map(|(_, r)| queue_of(reqs[r].class));
                if run.is_none() && pre.is_none() {
                    break;
                }
                // Prefer evicting a prefilling request (cheaper to pause) of the lowest class.
                if victim_class(pre) >= victim_class(run) {
                    let (i, r) = pre.expect("some victim");
                    self.prefilling.remove(i);
                    self.waiting[queue_of(reqs[r].class)].push_front(r);
                } else {
                    let (i, r) = run.expect("some victim");
                    self.running.remove(i);
                    self.leave(reqs, r);
                    self.pending[queue_of(reqs[r].class)].push_front(r);
                }
                if let Some(r) = self.pending[q].pop_front() {
                    self.join(reqs, r);
                } else if let Some(r) = self.waiting[q].pop_front() {
                    self.prefilling.push_back(r);
                }
            }
        }
    }
}
