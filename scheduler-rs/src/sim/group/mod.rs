//! One simulated TP group: an iteration-level engine with continuous batching, chunked
//! prefill and the local scheduler's queues (feasible, then best-effort, then background).
//!
//! An iteration runs the whole decode batch for one step plus up to `budget` prompt tokens;
//! its latency is `decode_ms(batch, mean context) + prefill_extra_ms(tokens)` from the profile
//! (the planner's mixed-group model: the forward's fixed part is paid once), or
//! `prefill_ms(tokens)` when nothing decodes.
//!
//! The engine's state and its batch bookkeeping are here; starting an iteration is
//! `iteration.rs`, the local scheduler's class priorities (demotion, preemption)
//! `priority.rs`.

mod iteration;
mod priority;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::dispatch::Class;
use crate::plan::{GroupPlan, Role};

use super::reqs::{queue_of, Reqs, Stint};

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
