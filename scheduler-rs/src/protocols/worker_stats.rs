//! The `stats` message (worker → router): a host worker's cumulative counters and KV gauges
//! (docs/protocol.md; the Python side is `python/nitsum/worker/stats.py`).
//!
//! NOTE: unknown keys are ignored, as in every worker message (forward compatible): a counter
//! a newer worker sends is dropped here, not exported, until it is added to [`Stats`]. A known
//! key of the wrong type makes the message undecodable (dropped and logged by the transport).
//! The golden fixture `tests/golden/wire/stats.msgpack` holds every field, so a field added or
//! renamed on one side only fails `protocols::wire_golden` and `tests/test_wire_golden.py`.

use serde::{Deserialize, Serialize};

/// A stat's value as the float `/metrics` prints.
pub trait StatValue: Copy {
    fn as_f64(self) -> f64;
}

impl StatValue for u64 {
    fn as_f64(self) -> f64 {
        // NOTE: exact below 2^53; counters of bytes stay far below that.
        self as f64
    }
}

impl StatValue for f64 {
    fn as_f64(self) -> f64 {
        self
    }
}

/// Declares [`Stats`] from one list of `name: type` lines (so adding a stat is one line) and
/// [`Stats::fields`], which lists the present ones by their wire name.
macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)*) => {
        /// A `stats` message's fields; None: the worker did not report it (it lacks the part
        /// that counts it: no host KV tier, no KV peers).
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Stats {
            $(
                $(#[$doc])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<$ty>,
            )*
        }

        impl Stats {
            /// (wire name, value) of every field present, in declaration order: the
            /// `nitsum_worker_stat{name}` samples of `/metrics`.
            pub fn fields(&self) -> Vec<(&'static str, f64)> {
                let mut out = Vec::new();
                $(
                    if let Some(v) = self.$name {
                        out.push((stringify!($name), StatValue::as_f64(v)));
                    }
                )*
                out
            }
        }
    };
}

stats! {
    /// P/D handoffs inside the process, and their KV bytes.
    kv_handoffs: u64,
    kv_handoff_bytes: u64,
    /// Plans applied, and the KV bytes they moved.
    reconfigurations: u64,
    kv_migrated_bytes: u64,
    /// Iterations a group of two or more devices ran as SP / TP / a pipeline.
    sp_steps: u64,
    tp_steps: u64,
    pp_steps: u64,
    /// Per-request TP bindings.
    tp_binds: u64,
    tp_binds_soft: u64,
    tp_bound_requests: u64,
    tp_binds_clamped: u64,
    /// Prompt tokens looked up in / found in the prefix caches; of the hits, those loaded
    /// back from the host tier.
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    prefix_cache_host_hits: u64,
    /// Preemptions, and of them those by swapping to the host tier.
    num_preemptions: u64,
    num_preemptions_swap: u64,
    /// The host KV tier's traffic: pages out and in, bytes and copies, steps that waited.
    swap_out_pages: u64,
    swap_in_pages: u64,
    swap_bytes: u64,
    swap_copies: u64,
    swap_waits: u64,
    /// Gauges: percent of device / host KV pages in use (idle cached pages count as free).
    kv_cache_usage_perc: f64,
    host_kv_usage_perc: f64,
    /// KV handed to / from other host worker processes.
    kv_remote_out: u64,
    kv_remote_in: u64,
    kv_remote_bytes: u64,
    kv_remote_failed: u64,
    kv_remote_recomputed: u64,
}
