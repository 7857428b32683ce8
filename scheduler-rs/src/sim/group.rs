//! One simulated TP group: an iteration-level engine with continuous batching, chunked
//! prefill and the local scheduler's queues (feasible, then best-effort, then background).
//!
//! An iteration runs the whole decode batch for one step plus up to `budget` prompt tokens;
//! its latency is `decode_ms(batch, mean context) + prefill_extra_ms(tokens)` from the profile
//! (the planner's mixed-group model: the forward's fixed part is paid once), or
//! `prefill_ms(tokens)` when nothing decodes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::dispatch::Class;
use crate::plan::{GroupPlan, Role};
use crate::profile::Profile;

use super::prompt_order::{overtake, Pace};
use super::reqs::{queue_of, Reqs, Stint};

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

/// What an iteration processed.
#[derive(Debug, Default)]
struct Iteration {
    prefill: Vec<(usize, u32)>,
    /// Whether the batch (`running`, unchanged until the iteration ends) decodes a step.
    decode: bool,
}

/// Requests an iteration moved on.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Finished (last token generated).
    pub finished: Vec<usize>,
    /// Prefilled on a prefill-only group: their KV must go to a decode group.
    pub handoff: Vec<usize>,
}

/// One simulated TP group's engine (the simulator's counterpart of a worker's Engine).
#[derive(Debug)]
pub struct GroupSim {
    pub plan: GroupPlan,
    /// Decode batch cap (running + admitted prefills on a mixed group).
    pub batch_cap: usize,
    /// Prefill tokens per iteration.
    pub budget: u32,
    /// Iteration latency (ms) that lower-class prefills must not push past while feasible
    /// requests share the iteration: the group's TPOT target; infinite for non-SLO groups.
    pub iter_limit_ms: f64,
    /// Not yet admitted for prefill, per class.
    waiting: [VecDeque<usize>; 3],
    /// Admitted for prefill (holding a batch slot on a mixed group), FCFS.
    prefilling: VecDeque<usize>,
    /// Prefilled elsewhere, waiting for a decode slot, per class.
    pending: [VecDeque<usize>; 3],
    /// The decode batch, oldest first.
    /// NOTE: a running request's `generated` is stale (its [`Stint`] holds the count) until
    /// it leaves the batch or [`Engine::sync`] writes it back.
    running: Vec<usize>,
    /// Decode steps completed.
    steps: u64,
    /// Σ (input + base − joined) over the batch: its total context is this + len × steps.
    context_base: i64,
    /// (step at which it generates its last token, request), for the batch; stale entries
    /// (requests that left) are skipped.
    finishing: BinaryHeap<Reverse<(u64, usize)>>,
    current: Option<Iteration>,
    /// Unique per engine: events carry it so a dissolved engine's events are ignored.
    pub generation: u64,
    /// Not before this time (switching TP / migrating KV, or paused for a binding).
    pub ready_at: f64,
    /// When the iteration in flight ends (the cluster sets it as it starts one).
    pub busy_until: f64,
    /// Demote waiting requests past their TTFT deadline to the background queue (Nitsum's
    /// local scheduler; off for the SLO-agnostic baselines).
    pub demote_late: bool,
    /// Requests demoted since the last `take_demoted`.
    demoted: Vec<usize>,
    /// Reused by `start` for the prompt order (no allocation per iteration).
    order: Vec<usize>,
    /// Scratch space of `prompt_order::overtake`.
    scratch: Vec<usize>,
}

impl GroupSim {
    pub fn new(
        plan: GroupPlan,
        batch_cap: usize,
        budget: u32,
        ready_at: f64,
        generation: u64,
    ) -> Self {
        GroupSim {
            plan,
            batch_cap: batch_cap.max(1),
            budget: budget.max(1),
            iter_limit_ms: f64::INFINITY,
            waiting: Default::default(),
            prefilling: VecDeque::new(),
            pending: Default::default(),
            running: Vec::new(),
            steps: 0,
            context_base: 0,
            finishing: BinaryHeap::new(),
            current: None,
            generation,
            ready_at,
            busy_until: 0.0,
            demote_late: false,
            demoted: Vec::new(),
            order: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub fn busy(&self) -> bool {
        self.current.is_some()
    }

    pub fn decodes(&self) -> bool {
        self.plan.role != Role::Prefill
    }

    /// A request to prefill here.
    pub fn push_prefill(&mut self, rid: usize, class: Class) {
        self.waiting[queue_of(class)].push_back(rid);
    }

    /// A request to prefill here first in its class (a priority request: binding's DP choice).
    pub fn push_prefill_front(&mut self, rid: usize, class: Class) {
        self.waiting[queue_of(class)].push_front(rid);
    }

    /// The decode batch (its requests' `generated` may be stale, see `running`).
    pub fn batch(&self) -> &[usize] {
        &self.running
    }

    /// Mean context of the decode batch (tokens; 0 when empty).
    pub fn mean_context(&self) -> f64 {
        if self.running.is_empty() {
            return 0.0;
        }
        let total = self.context_base + self.running.len() as i64 * self.steps as i64;
        total as f64 / self.running.len() as f64
    }

    /// Prompt tokens its next iteration runs: what is admitted or waiting, up to the budget.
    pub fn next_prompt_tokens(&self, reqs: &Reqs) -> u32 {
        let queued: u64 = self
            .prefilling
            .iter()
            .chain(self.waiting.iter().flatten())
            .map(|&r| u64::from(reqs[r].input - reqs[r].prefilled))
            .sum();
        queued.min(u64::from(self.budget)) as u32
    }

    /// A prefilled request (KV arrived) to decode here.
    pub fn push_decode(&mut self, rid: usize, class: Class) {
        self.pending[queue_of(class)].push_back(rid);
    }

    /// Requests held here (queued or running), for load-based choices.
    pub fn load(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum::<usize>()
            + self.pending.iter().map(VecDeque::len).sum::<usize>()
            + self.prefilling.len()
            + self.running.len()
    }

    /// `r` joins the decode batch.
    fn join(&mut self, reqs: &mut Reqs, r: usize) {
        let q = &mut reqs[r];
        let stint = Stint {
            engine: self.generation,
            joined: self.steps,
            base: q.generated,
        };
        q.stint = Some(stint);
        self.context_base += i64::from(q.input) + i64::from(q.generated) - self.steps as i64;
        let last = self.steps + u64::from(q.output.saturating_sub(q.generated));
        self.finishing.push(Reverse((last, r)));
        self.running.push(r);
    }

    /// Write back the token count of `r` (in this batch) and end its stint.
    fn leave(&mut self, reqs: &mut Reqs, r: usize) {
        let q = &mut reqs[r];
        if let Some(st) = q.stint.take() {
            q.generated = st.generated(self.steps);
            self.context_base -= i64::from(q.input) + i64::from(st.base) - st.joined as i64;
        }
    }

    /// Write back the token count of every request in the batch (for readers outside the
    /// engine: the control loop's in-flight snapshot).
    pub fn sync(&self, reqs: &mut Reqs) {
        for &r in &self.running {
            if let Some(st) = reqs[r].stint {
                reqs[r].generated = st.generated(self.steps);
            }
        }
    }

    /// Requests demoted to background since the last call (their SLO is lost).
    pub fn take_demoted(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.demoted)
    }

    /// NOTE: goodput only counts requests that meet their SLOs, and a request that has not
    /// started by its TTFT deadline never will: under overload, serving it first makes the
    /// requests behind it late too (the FCFS collapse). It still runs, last.
    fn demote_late(&mut self, reqs: &mut Reqs, now: f64) {
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

    /// NOTE: a feasible or best-effort request whose first token cannot come before its
    /// TTFT deadline, even if it got every prompt token of every iteration after the ones
    /// ahead of it in class-then-FCFS order, will miss its SLO whatever happens; prefilling
    /// it now only delays the requests behind it (the same FCFS collapse as a late start).
    /// It is demoted to background now (it keeps its progress and still runs, last), and the
    /// dispatcher gets its SLO bandwidth back. The estimate is a lower bound on its first
    /// token (full budgets, no new arrivals ahead), so no request that could still make it
    /// is demoted.
    fn demote_hopeless(
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
    fn preempt_for_higher_classes(&mut self, reqs: &mut Reqs) {
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

    /// Finish the iteration in flight at `now`.
    pub fn finish(&mut self, reqs: &mut Reqs, now: f64) -> Outcome {
        let it = self.current.take().expect("finish without an iteration");
        let mut out = Outcome::default();
        if it.decode {
            self.steps += 1;
            let mut any = false;
            while let Some(&Reverse((last, r))) = self.finishing.peek() {
                if last > self.steps {
                    break;
                }
                self.finishing.pop();
                let live = reqs[r].stint.is_some_and(|st| {
                    st.engine == self.generation
                        && st.joined + u64::from(reqs[r].output.saturating_sub(st.base)) == last
                });
                if live {
                    self.leave(reqs, r);
                    reqs[r].finish = Some(now);
                    any = true;
                }
            }
            if any {
                // In batch order, as the batch generated them.
                let done: Vec<usize> = self
                    .running
                    .iter()
                    .copied()
                    .filter(|&r| reqs[r].finish.is_some())
                    .collect();
                self.running.retain(|&r| reqs[r].finish.is_none());
                out.finished = done;
            }
        }
        for &(r, take) in &it.prefill {
            let q = &mut reqs[r];
            q.prefilled += take;
            if q.prefilled < q.input {
                continue;
            }
            q.first_token = Some(now);
            q.generated = 1;
            self.prefilling.retain(|&x| x != r);
            if q.output <= 1 {
                q.finish = Some(now);
                out.finished.push(r);
            } else if self.decodes() {
                self.join(reqs, r);
            } else {
                out.handoff.push(r);
            }
        }
        out
    }

    /// Dissolve: drop the in-flight iteration; return (not yet prefilled, decoding) requests.
    pub fn drain(&mut self, reqs: &mut Reqs) -> (Vec<usize>, Vec<usize>) {
        self.current = None;
        let mut pre: Vec<usize> = self.prefilling.drain(..).collect();
        pre.extend(self.waiting.iter_mut().flat_map(|q| q.drain(..)));
        let mut dec: Vec<usize> = std::mem::take(&mut self.running);
        for &r in &dec {
            self.leave(reqs, r);
        }
        self.finishing.clear();
        dec.extend(self.pending.iter_mut().flat_map(|q| q.drain(..)));
        (pre, dec)
    }
}
