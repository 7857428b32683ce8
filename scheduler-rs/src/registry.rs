//! Registered device workers and their liveness (heartbeats).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocols::worker::Incoming;

/// What a worker said about itself in `register`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerInfo {
    pub device: String,
    pub model: String,
    pub tp_levels: Vec<u32>,
    pub kv_capacity_tokens: u64,
    pub max_context: u64,
    pub eos_token_ids: Vec<u32>,
}

impl WorkerInfo {
    pub fn from_register(m: &Incoming) -> Self {
        WorkerInfo {
            device: m.device.clone().unwrap_or_default(),
            model: m.model.clone().unwrap_or_default(),
            tp_levels: m.tp_levels.clone().unwrap_or_default(),
            kv_capacity_tokens: m.kv_capacity_tokens.unwrap_or(0),
            max_context: m.max_context.unwrap_or(0),
            eos_token_ids: m.eos_token_ids.clone().unwrap_or_default(),
        }
    }
}

/// One live worker.
#[derive(Debug, Clone)]
pub struct WorkerEntry {
    /// ZeroMQ identity to address it by.
    pub identity: Bytes,
    pub info: WorkerInfo,
    pub last_seen: Instant,
    /// From the last heartbeat.
    pub running: u64,
    pub waiting: u64,
    pub free_pages: u64,
    /// Plan epoch the worker last reported (heartbeat or `reconfigured`).
    pub epoch: u64,
    /// Numeric fields of the last `stats` message.
    pub stats: HashMap<String, f64>,
}

/// Live workers by id (ordered, so default plans list them by id).
#[derive(Debug, Default)]
pub struct Registry {
    workers: BTreeMap<u32, WorkerEntry>,
}

impl Registry {
    /// Add or replace a worker. Returns true if it was already registered (a restart).
    pub fn register(&mut self, id: u32, identity: Bytes, info: WorkerInfo, now: Instant) -> bool {
        let entry = WorkerEntry {
            identity,
            info,
            last_seen: now,
            running: 0,
            waiting: 0,
            free_pages: 0,
            epoch: 0,
            stats: HashMap::new(),
        };
        self.workers.insert(id, entry).is_some()
    }

    pub fn get(&self, id: u32) -> Option<&WorkerEntry> {
        self.workers.get(&id)
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut WorkerEntry> {
        self.workers.get_mut(&id)
    }

    /// Refresh liveness; false for an unknown worker.
    pub fn touch(&mut self, id: u32, now: Instant) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) => {
                w.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// Remove and return the ids of workers silent for longer than `timeout`.
    pub fn reap(&mut self, now: Instant, timeout: Duration) -> Vec<u32> {
        let dead: Vec<u32> = self
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

    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.workers.keys().copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u32, &WorkerEntry)> {
        self.workers.iter()
    }

    pub fn contains(&self, id: u32) -> bool {
        self.workers.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_workers_are_reaped() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        assert!(!r.register(0, Bytes::from_static(b"0"), WorkerInfo::default(), t0));
        r.register(1, Bytes::from_static(b"1"), WorkerInfo::default(), t0);
        let later = t0 + Duration::from_millis(2000);
        assert!(r.touch(1, later));
        assert!(!r.touch(7, later));
        assert_eq!(
            r.reap(t0 + Duration::from_millis(3500), Duration::from_secs(3)),
            [0]
        );
        assert_eq!(r.ids().collect::<Vec<_>>(), [1]);
        assert!(r.register(1, Bytes::from_static(b"1"), WorkerInfo::default(), later));
    }
}
