//! The simulated requests, by index in arrival order. A shadow run (`shadow.rs`) goes on for
//! as long as the router does, so it drops the prefix of requests that are resolved; indices
//! stay those given at arrival.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use super::group::Req;

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
