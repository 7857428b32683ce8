//! The simulated requests ([`Req`]), by index in arrival order. A shadow run (`shadow/`) goes on for
//! as long as the router does, so it drops the prefix of requests that are resolved; indices
//! stay those given at arrival.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use crate::dispatch::Class;
use crate::ids::TierId;

/// Simulated state of one request.
#[derive(Debug, Clone)]
pub struct Req {
    pub arrival: f64,
    pub input: u32,
    pub output: u32,
    pub tier: TierId,
    pub class: Class,
    /// Prompt tokens already prefilled.
    pub prefilled: u32,
    /// Output tokens generated (the first comes with the end of prefill).
    pub generated: u32,
    pub first_token: Option<f64>,
    pub finish: Option<f64>,
    /// Decode group chosen at dispatch when the prefill group does not decode.
    pub decode_leader: Option<u32>,
    pub dropped: bool,
    /// Arrival + the tier's TTFT: a request not started by then can no longer meet its SLO.
    pub deadline: f64,
    /// Its stint in a decode batch, while it is in one (see [`super::group`]'s `Engine::sync`).
    pub stint: Option<Stint>,
    /// Served on leftover capacity whatever its tier (`TraceRequest::leftover`).
    pub leftover: bool,
}

/// A request's stay in one engine's decode batch: it generates one token per decode step of
/// that engine, so its count is `base + (steps - joined)` without touching it every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stint {
    pub engine: u64,
    pub joined: u64,
    pub base: u32,
}

impl Stint {
    /// Tokens generated once the engine has completed `steps` decode steps.
    pub fn generated(&self, steps: u64) -> u32 {
        self.base + (steps - self.joined) as u32
    }
}

/// The local scheduler queue a request of `class` waits in (0: served first).
pub fn queue_of(class: Class) -> usize {
    match class {
        Class::Feasible => 0,
        Class::BestEffort => 1,
        Class::Background => 2,
    }
}

/// Requests `base..base + len`, oldest first.
#[derive(Debug, Default)]
pub struct Reqs {
    base: usize,
    items: VecDeque<Req>,
}

impl Reqs {
    /// The index the next request pushed gets (every index below it was given).
    pub fn len(&self) -> usize {
        self.base + self.items.len()
    }

    pub fn push(&mut self, r: Req) {
        self.items.push_back(r);
    }

    /// The requests still held (indices `first()..len()`).
    pub fn iter(&self) -> impl Iterator<Item = &Req> {
        self.items.iter()
    }

    /// The oldest index still held.
    pub fn first(&self) -> usize {
        self.base
    }

    /// Drop the oldest requests below index `upto` while `done` holds for them.
    /// NOTE: only requests nothing refers to any more (finished or dropped) may go: a group
    /// queue or an event holding a dropped index would panic on it.
    pub fn drop_front(&mut self, upto: usize, done: impl Fn(&Req) -> bool) {
        while self.base < upto && self.items.front().is_some_and(&done) {
            self.items.pop_front();
            self.base += 1;
        }
    }
}

impl From<Vec<Req>> for Reqs {
    fn from(v: Vec<Req>) -> Self {
        Reqs {
            base: 0,
            items: v.into(),
        }
    }
}

impl Index<usize> for Reqs {
    type Output = Req;
    fn index(&self, i: usize) -> &Req {
        &self.items[i - self.base]
    }
}

impl IndexMut<usize> for Reqs {
    fn index_mut(&mut self, i: usize) -> &mut Req {
        &mut self.items[i - self.base]
    }
}
