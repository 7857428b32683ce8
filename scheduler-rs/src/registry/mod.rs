//! Registered device workers and their liveness (heartbeats).

mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::ids::WorkerId;
use crate::protocols::worker::Stats;

pub use worker::{WorkerEntry, WorkerInfo};

/// Live workers by id (ordered, so default plans list them by id).
#[derive(Debug, Default)]
pub struct Registry {
    workers: BTreeMap<WorkerId, WorkerEntry>,
}

impl Registry {
    /// Add or replace a worker. Returns true if it was already registered (a restart).
    pub fn register(
        &mut self,
        id: WorkerId,
        identity: Bytes,
        info: WorkerInfo,
        now: Instant,
    ) -> bool {
        let entry = WorkerEntry {
            identity,
            info,
            last_seen: now,
            running: 0,
            waiting: 0,
            free_pages: 0,
            epoch: 0,
            stats: Stats::default(),
            suspect: false,
        };
        self.workers.insert(id, entry).is_some()
    }

    /// The live worker `id`.
    pub fn get(&self, id: WorkerId) -> Option<&WorkerEntry> {
        self.workers.get(&id)
    }

    /// The live worker `id`, to update from its messages.
    pub fn get_mut(&mut self, id: WorkerId) -> Option<&mut WorkerEntry> {
        self.workers.get_mut(&id)
    }

    /// Refresh liveness; false for an unknown worker.
    pub fn touch(&mut self, id: WorkerId, now: Instant) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) => {
                w.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// Remove and return the ids of workers silent for longer than `timeout`.
    pub fn reap(&mut self, now: Instant, timeout: Duration) -> Vec<WorkerId> {
        let dead: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.last_seen) > timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            self.workers.remove(id);
        }
        dead
    }

    /// Remove worker `id` (declared dead by its own process); false if it was not live.
    pub fn remove(&mut self, id: WorkerId) -> bool {
        self.workers.remove(&id).is_some()
    }

    /// Mark the workers silent for longer than `timeout` as suspect; returns those newly so.
    pub fn mark_suspects(&mut self, now: Instant, timeout: Duration) -> Vec<WorkerId> {
        let mut newly = Vec::new();
        for (id, w) in self.workers.iter_mut() {
            if !w.suspect && now.saturating_duration_since(w.last_seen) > timeout {
                w.suspect = true;
                newly.push(*id);
            }
        }
        newly
    }

    /// A heartbeat from worker `id`: true when it was suspect (it is live again).
    pub fn recover(&mut self, id: WorkerId) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) if w.suspect => {
                w.suspect = false;
                true
            }
            _ => false,
        }
    }

    /// Whether worker `id` is registered and not suspect: it may get new work.
    pub fn is_live(&self, id: WorkerId) -> bool {
        self.workers.get(&id).is_some_and(|w| !w.suspect)
    }

    /// Ids of the registered workers that are not suspect, ascending.
    pub fn live_ids(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.workers
            .iter()
            .filter(|(_, w)| !w.suspect)
            .map(|(id, _)| *id)
    }

    /// Ids of the live workers, ascending.
    pub fn ids(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.workers.keys().copied()
    }

    /// Live workers by ascending id.
    pub fn iter(&self) -> impl Iterator<Item = (&WorkerId, &WorkerEntry)> {
        self.workers.iter()
    }

    /// Whether worker `id` is live.
    pub fn contains(&self, id: WorkerId) -> bool {
        self.workers.contains_key(&id)
    }

    /// Live workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether no worker is live.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

/// What the planner may use of workers `0..n` (every one registered).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolShape {
    pub devices: u32,
    /// TP levels every worker registered (`[1]` for one that sent none) whose aligned blocks
    /// never cross a domain boundary, ascending.
    pub tp_levels: Vec<u32>,
    /// Whether every prefill group can hand KV to every decode group: all workers share one
    /// domain, or every worker joined the same KV transport between host worker processes
    /// (P/D across hosts; a TP group still never spans domains, see `tp_levels`).
    pub kv_linked: bool,
}

impl Registry {
    /// The planner's view of the contiguous workers `0..n`: see [`PoolShape`].
    pub fn pool_shape(&self) -> PoolShape {
        let mut devices = 0u32;
        let mut levels: Option<Vec<u32>> = None;
        let mut domains: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
        let mut transports: Vec<Option<&str>> = Vec::new();
        // NOTE: device `d` is worker `d` (see `WorkerId`): the pool is the run of registered
        // ids from 0.
        while let Some(w) = self.get(WorkerId::of_device(devices)) {
            let mine: &[u32] = if w.info.tp_levels.is_empty() {
                &[1]
            } else {
                &w.info.tp_levels
            };
            levels = Some(match levels {
                None => mine.to_vec(),
                Some(l) => l.into_iter().filter(|t| mine.contains(t)).collect(),
            });
            domains.entry(w.info.domain).or_default().push(devices);
            transports.push(w.info.kv_transport.as_deref());
            devices += 1;
        }
        // NOTE: aligned TP-t blocks stay inside a domain iff every domain is a contiguous run
        // of ids that starts at a multiple of t and has a multiple of t members.
        let fits = |t: u32| {
            domains.values().all(|ids| {
                let contiguous = ids.windows(2).all(|w| w[1] == w[0] + 1);
                t == 1
                    || (contiguous
                        && ids[0].is_multiple_of(t)
                        && (ids.len() as u32).is_multiple_of(t))
            })
        };
        let mut tp_levels: Vec<u32> = levels.unwrap_or_default();
        tp_levels.retain(|&t| fits(t));
        tp_levels.sort_unstable();
        PoolShape {
            devices,
            tp_levels,
            // NOTE: one transport for all, so any prefill group reaches any decode group.
            kv_linked: domains.len() <= 1
                || (transports[0].is_some() && transports.windows(2).all(|w| w[0] == w[1])),
        }
    }
}

#[cfg(test)]
mod tests;
