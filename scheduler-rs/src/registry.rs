//! Registered device workers and their liveness (heartbeats).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::ids::WorkerId;
use crate::protocols::worker::{Register, Stats};

/// What a worker said about itself in `register`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerInfo {
    pub device: String,
    pub model: String,
    pub tp_levels: Vec<u32>,
    /// KV/communication domain: workers of one domain (one host worker process) can form TP
    /// groups together and hand KV to each other. `None`: a worker that did not say (mock
    /// workers) shares the one default domain.
    pub domain: Option<u32>,
    pub kv_capacity_tokens: u64,
    pub max_context: u64,
    pub eos_token_ids: Vec<u32>,
    /// The KV transport between host worker processes it joined (`register`'s
    /// `kv_transport`); `None`: KV leaves its domain never.
    pub kv_transport: Option<String>,
}

impl WorkerInfo {
    pub fn from_register(m: &Register) -> Self {
        WorkerInfo {
            device: m.device.clone().unwrap_or_default(),
            model: m.model.clone().unwrap_or_default(),
            tp_levels: m.tp_levels.clone().unwrap_or_default(),
            domain: m.domain,
            kv_capacity_tokens: m.kv_capacity_tokens.unwrap_or(0),
            max_context: m.max_context.unwrap_or(0),
            eos_token_ids: m.eos_token_ids.clone().unwrap_or_default(),
            kv_transport: m.kv_transport.clone(),
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
    /// The last `stats` message.
    pub stats: Stats,
    /// Silent past the heartbeat timeout but not yet gone: no new work goes to it, its
    /// requests are held where they are (it may be slow, not dead).
    pub suspect: bool,
}

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
mod tests {
    use super::*;

    fn with_domains(domains: &[Option<u32>], levels: &[u32]) -> Registry {
        let mut r = Registry::default();
        for (id, &domain) in domains.iter().enumerate() {
            let info = WorkerInfo {
                tp_levels: levels.to_vec(),
                domain,
                ..WorkerInfo::default()
            };
            r.register(WorkerId(id as u32), Bytes::new(), info, Instant::now());
        }
        r
    }

    #[test]
    fn pool_shape_keeps_tp_groups_and_kv_handoffs_inside_domains() {
        // One host worker with 4 devices: every level, P/D possible.
        let one = with_domains(&[Some(0); 4], &[1, 2, 4]);
        let shape = one.pool_shape();
        assert_eq!(
            (shape.devices, shape.tp_levels.clone(), shape.kv_linked),
            (4, vec![1, 2, 4], true)
        );
        // Two host workers of 2 devices: TP 4 would span both; no P/D across them.
        let two = with_domains(&[Some(0), Some(0), Some(2), Some(2)], &[1, 2, 4]);
        assert_eq!(two.pool_shape().tp_levels, [1, 2]);
        assert!(!two.pool_shape().kv_linked);
        // Domains of 3 and 1 devices: TP 2 would straddle ids 2-3.
        let odd = with_domains(&[Some(0), Some(0), Some(0), Some(3)], &[1, 2]);
        assert_eq!(odd.pool_shape().tp_levels, [1]);
        // Workers that name no domain (mock workers) share one.
        assert_eq!(
            with_domains(&[None; 4], &[1, 2, 4]).pool_shape().tp_levels,
            [1, 2, 4]
        );
        // Separate single-device workers (`nitsum serve` without --tp-switching).
        let solo = with_domains(&[Some(0), Some(1)], &[1]).pool_shape();
        assert_eq!((solo.tp_levels, solo.kv_linked), (vec![1], false));
    }

    #[test]
    fn one_kv_transport_links_domains_for_pd_but_tp_stays_inside_each() {
        let mut r = with_domains(&[Some(0), Some(0), Some(2), Some(2)], &[1, 2, 4]);
        let join = |r: &mut Registry, id: u32, transport: Option<&str>| {
            let mut info = r.get(WorkerId(id)).expect("registered").info.clone();
            info.kv_transport = transport.map(str::to_owned);
            r.register(WorkerId(id), Bytes::new(), info, Instant::now());
        };
        for id in 0..4 {
            join(&mut r, id, Some("tcp://10.0.0.1:29600"));
        }
        let shape = r.pool_shape();
        // P/D may span the two processes; a TP-4 group still may not.
        assert_eq!((shape.tp_levels, shape.kv_linked), (vec![1, 2], true));
        // One worker on another transport (or none) unlinks them.
        join(&mut r, 3, Some("tcp://10.0.0.9:29600"));
        assert!(!r.pool_shape().kv_linked);
        join(&mut r, 3, None);
        assert!(!r.pool_shape().kv_linked);
    }

    #[test]
    fn silent_workers_are_reaped() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        let (w0, w1) = (WorkerId(0), WorkerId(1));
        assert!(!r.register(w0, Bytes::from_static(b"0"), WorkerInfo::default(), t0));
        r.register(w1, Bytes::from_static(b"1"), WorkerInfo::default(), t0);
        let later = t0 + Duration::from_millis(2000);
        assert!(r.touch(w1, later));
        assert!(!r.touch(WorkerId(7), later));
        assert_eq!(
            r.reap(t0 + Duration::from_millis(3500), Duration::from_secs(3)),
            [w0]
        );
        assert_eq!(r.ids().collect::<Vec<_>>(), [w1]);
        assert!(r.register(w1, Bytes::from_static(b"1"), WorkerInfo::default(), later));
    }
}
