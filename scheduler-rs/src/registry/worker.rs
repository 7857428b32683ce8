//! What the registry keeps per worker: what it said in `register` and what it reported since.

use std::time::Instant;

use bytes::Bytes;

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
