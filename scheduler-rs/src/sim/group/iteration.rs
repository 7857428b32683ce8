//! Starting a group engine's iteration: decode and prefill admission, then the prompt
//! tokens of the budget in class order, within the group's TPOT while feasible requests
//! share it; its latency comes from the profile.

use crate::dispatch::Class;
use crate::plan::Role;
use crate::profile::Profile;
use crate::sim::prompt_order::{overtake, Pace};
use crate::sim::reqs::{queue_of, Reqs};

use super::{GroupSim, Iteration};

/// Largest `t ≤ hi` with `fits(t)` (0 when none), for `fits` true then false.
fn largest_fitting(hi: u32, fits: impl Fn(u32) -> bool) -> u32 {
    let (mut lo, mut hi) = (0u32, hi);
    if fits(hi) {
        return hi;
    }
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo > 0 || fits(0) {
        lo
    } else {
        0
    }
}
impl GroupSim {
    /// Start an iteration at `now` if there is work; returns its latency in seconds.
    pub fn start(&mut self, reqs: &mut Reqs, profile: &Profile, now: f64) -> Option<f64> {
        debug_assert!(self.current.is_none());
        if self.demote_late {
            self.demote_late(reqs, now);
        }
        let slots = |e: &GroupSim| {
            e.batch_cap
                .saturating_sub(e.running.len() + e.prefilling.len())
        };
        // Decode admission: prefilled requests first (they already hold KV).
        for q in 0..3 {
            while slots(self) > 0 && self.decodes() {
                match self.pending[q].pop_front() {
                    Some(r) => self.join(reqs, r),
                    None => break,
                }
            }
        }
        // Prefill admission, in class order; prefill-only groups have no decode slots to keep.
        for q in 0..3 {
            while self.plan.role == Role::Prefill || slots(self) > 0 {
                match self.waiting[q].pop_front() {
                    Some(r) => self.prefilling.push_back(r),
                    None => break,
                }
            }
        }
        self.preempt_for_higher_classes(reqs);
        // The decode batch is settled from here on: its step is computed once.
        let decode_ms = self.decode_ms(profile);
        let iteration_ms = self.iteration_ms(profile, decode_ms);
        let pace = Pace {
            budget: self.budget,
            full_s: iteration_ms(f64::from(self.budget)) / 1000.0,
            now: now.max(self.ready_at),
        };
        if self.demote_late {
            self.demote_hopeless(reqs, &iteration_ms, decode_ms, pace);
        }
        let reqs: &Reqs = reqs;
        let mut it = Iteration::default();
        let mut budget = self.budget;
        // Prompt tokens go to the highest class first (stable: FCFS within a class), short
        // ones overtaking long ones that can spare it under Nitsum's local scheduler.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(self.prefilling.iter().copied());
        order.sort_by_key(|&r| queue_of(reqs[r].class));
        if self.demote_late {
            overtake(&mut order, reqs, pace, &mut self.scratch);
        }
        it.decode = !self.running.is_empty();
        // NOTE: lower classes only get prompt tokens that keep the iteration within the
        // group's TPOT while feasible requests are in it: they run on leftover capacity.
        let feasible_here = self
            .running
            .iter()
            .chain(&order)
            .any(|&r| reqs[r].class == Class::Feasible);
        let limit = if feasible_here {
            self.iter_limit_ms
        } else {
            f64::INFINITY
        };
        let mut tokens = 0u32;
        for &r in &order {
            if budget == 0 {
                break;
            }
            let mut take = (reqs[r].input - reqs[r].prefilled).min(budget);
            if reqs[r].class != Class::Feasible && limit.is_finite() {
                let fits = |t: u32| iteration_ms(f64::from(tokens + t)) <= limit;
                take = largest_fitting(take, fits);
            }
            if take == 0 {
                continue;
            }
            budget -= take;
            tokens += take;
            it.prefill.push((r, take));
        }
        self.order = order;
        let ms = if tokens > 0 {
            iteration_ms(f64::from(tokens))
        } else {
            decode_ms
        };
        if it.prefill.is_empty() && !it.decode {
            return None;
        }
        self.current = Some(it);
        Some(ms / 1000.0)
    }

    /// One decode step of the current batch (ms; 0 when nothing decodes).
    fn decode_ms(&self, profile: &Profile) -> f64 {
        if self.running.is_empty() {
            return 0.0;
        }
        let b = self.running.len() as f64;
        let total = self.context_base + self.running.len() as i64 * self.steps as i64;
        profile.decode_ms(self.plan.shape(), b, total as f64 / b)
    }

    /// Iteration latency (ms) as a function of the prompt tokens beside the current decode
    /// batch, whose step is `decode_ms` (a mixed iteration pays the forward's fixed part
    /// once: `prefill_extra_ms`).
    fn iteration_ms<'p>(&self, profile: &'p Profile, decode_ms: f64) -> impl Fn(f64) -> f64 + 'p {
        let (tp, decoding) = (self.plan.shape(), !self.running.is_empty());
        move |tokens| {
            if decoding {
                decode_ms + profile.prefill_extra_ms(tp, tokens)
            } else {
                profile.prefill_ms(tp, tokens)
            }
        }
    }
}
