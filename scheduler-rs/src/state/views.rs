//! What HTTP handlers and `/metrics` read of the router's state: the plan, the workers, the
//! per-group load and the wire ids.

use std::time::Duration;

use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Plan};
use crate::protocols::worker::Stats;
use crate::registry::WorkerInfo;

use super::RouterState;

/// Per-group numbers for `/metrics`.
#[derive(Debug, Clone)]
pub struct GroupSnapshot {
    pub group: GroupPlan,
    pub assigned: u32,
    pub running: u64,
    pub waiting: u64,
}

impl RouterState {
    /// The id request `id` has on the worker wire (docs/protocol.md).
    pub fn wire_id(&self, id: u64) -> String {
        self.ids.encode(id)
    }

    /// The current plan.
    pub fn plan(&self) -> Plan {
        self.lock().plan.clone()
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.lock().inflight.len()
    }

    /// Live workers (registered, not suspect): (id, info).
    pub fn workers(&self) -> Vec<(WorkerId, WorkerInfo)> {
        self.lock()
            .registry
            .iter()
            .filter(|(_, w)| !w.suspect)
            .map(|(id, w)| (*id, w.info.clone()))
            .collect()
    }

    /// The longest context a live worker says it serves (`register`'s `max_context`: a host
    /// worker's is what its largest TP group's KV holds); None: none said.
    pub fn worker_max_context(&self) -> Option<u64> {
        self.lock()
            .registry
            .iter()
            .map(|(_, w)| w.info.max_context)
            .filter(|&c| c > 0)
            .max()
    }

    /// Per-group load for `/metrics`.
    pub fn groups(&self) -> Vec<GroupSnapshot> {
        let st = self.lock();
        st.plan
            .groups
            .iter()
            .map(|g| {
                let (running, waiting) = g
                    .members
                    .iter()
                    .filter_map(|&m| st.registry.get(WorkerId::of_device(m)))
                    .fold((0, 0), |(r, w), e| (r + e.running, w + e.waiting));
                GroupSnapshot {
                    group: g.clone(),
                    assigned: st.dispatcher.assigned(g.leader()),
                    running,
                    waiting,
                }
            })
            .collect()
    }

    /// Each live worker's last `stats` message.
    pub fn worker_stats(&self) -> Vec<(WorkerId, Stats)> {
        let st = self.lock();
        st.registry
            .iter()
            .map(|(id, w)| (*id, w.stats.clone()))
            .collect()
    }

    /// Heartbeat timeout from the config.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.heartbeat_timeout_ms)
    }
}
