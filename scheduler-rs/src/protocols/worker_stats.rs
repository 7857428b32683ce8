//! The `stats` message (worker → router): a host worker's cumulative counters and KV gauges
//! (docs/protocol.md; the Python side is `python/nitsum/worker/stats.py`).
//!
//! NOTE: unknown keys are ignored, as in every worker message (forward compatible): a counter
//! a newer worker sends is dropped here, not exported, until it is added to [`Stats`]. A known
//! key of the wrong type makes the message undecodable (dropped and logged by the transport).
//! The golden fixture `tests/golden/wire/stats.msgpack` holds every field, so a field added or
//! renamed on one side only fails `protocols::wire_golden` and `tests/test_wire_golden.py`.

use serde::{Deserialize, Serialize};

use crate::binding::BindDecision;

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
/// [`Stats::fields`], which lists the present ones by their wire name. The one field that is
/// not a number, `last_bind`, is declared here beside them.
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
            /// The worker's most recent binding decision, as `nitsum._core.BindingModel.decide`
            /// returned it (absent: it took none). Not a `/metrics` sample: `/admin/plan`
            /// shows it (`Stats::binding`).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub last_bind: Option<BindDecision>,
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
    /// Cost-model binding decisions taken, by chosen mode (binding/query.rs `BindMode`).
    bind_decisions_dp: u64,
    bind_decisions_prefill: u64,
    bind_decisions_full: u64,
    /// Full bindings handed back to a replica mid-decode (the rest was cheaper in DP).
    bind_handbacks: u64,
    /// Iterations a soft binding gave to its replicas.
    bind_soft_yields: u64,
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

/// The binding counters (`/admin/plan`'s `binding.counters`, keyed by these names).
pub const BINDING_STATS: [&str; 9] = [
    "tp_binds",
    "tp_binds_soft",
    "tp_bound_requests",
    "tp_binds_clamped",
    "bind_decisions_dp",
    "bind_decisions_prefill",
    "bind_decisions_full",
    "bind_handbacks",
    "bind_soft_yields",
];

/// A worker's per-request TP bindings as `/admin/plan` shows them: its binding counters
/// (those it reports) and its last decision with every option's estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BindingReport {
    pub counters: std::collections::BTreeMap<&'static str, u64>,
    pub last: Option<BindDecision>,
}

impl Stats {
    /// The decisions taken per mode (`dp`, `prefill`, `full`), for the workers that report
    /// them: `nitsum_bind_decisions_total{mode}`.
    pub fn bind_decisions(&self) -> Option<[(&'static str, u64); 3]> {
        let counts = [
            self.bind_decisions_dp,
            self.bind_decisions_prefill,
            self.bind_decisions_full,
        ];
        if counts.iter().all(Option::is_none) {
            return None;
        }
        let [dp, prefill, full] = counts.map(Option::unwrap_or_default);
        Some([("dp", dp), ("prefill", prefill), ("full", full)])
    }

    /// The binding part of this report; None when the worker sent none of it (it has no
    /// binder, or runs an older build).
    pub fn binding(&self) -> Option<BindingReport> {
        let counters: std::collections::BTreeMap<_, _> = self
            .fields()
            .into_iter()
            .filter(|(name, _)| BINDING_STATS.contains(name))
            // NOTE: the binding stats are all u64 counters: the f64 is exact.
            .map(|(name, v)| (name, v as u64))
            .collect();
        if counters.is_empty() && self.last_bind.is_none() {
            return None;
        }
        Some(BindingReport {
            counters,
            last: self.last_bind.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::binding::BindMode;
    use crate::protocols::worker::{decode_incoming, Body};

    fn decode(msg: serde_json::Value) -> Stats {
        let bytes = rmp_serde::to_vec_named(&msg).unwrap();
        match decode_incoming(&bytes).expect("decodes").body {
            Body::Stats(s) => *s,
            other => panic!("not stats: {other:?}"),
        }
    }

    #[test]
    fn a_stats_message_with_binding_decisions_decodes_and_reports_them() {
        let s = decode(json!({"v": 1, "type": "stats", "worker_id": 2,
            "tp_binds": 4, "bind_decisions_dp": 9, "bind_decisions_prefill": 3,
            "bind_decisions_full": 1, "bind_handbacks": 1, "bind_soft_yields": 17,
            "last_bind": {"mode": "prefill", "level": 4, "replica": 2, "gain": 0.5,
                "options": [
                    {"mode": "dp", "ttft_ms": 300.0, "tpot_ms": 40.0, "meets": 0.25,
                     "lost_tokens": 3.0, "value": 0.2},
                    {"mode": "prefill", "ttft_ms": 90.0, "tpot_ms": 40.0, "meets": 0.75,
                     "lost_tokens": 8.0, "value": 0.7}]}}));
        assert_eq!(s.bind_soft_yields, Some(17));
        let last = s.last_bind.as_ref().expect("last_bind");
        assert_eq!(
            (last.mode, last.level, last.replica),
            (BindMode::Prefill, 4, 2)
        );
        assert_eq!(last.options[1].ttft_ms, 90.0);
        assert_eq!(
            s.bind_decisions(),
            Some([("dp", 9), ("prefill", 3), ("full", 1)])
        );
        let report = serde_json::to_value(s.binding().expect("a binding report")).unwrap();
        assert_eq!(
            report["counters"],
            json!({"tp_binds": 4, "bind_decisions_dp": 9, "bind_decisions_prefill": 3,
                   "bind_decisions_full": 1, "bind_handbacks": 1, "bind_soft_yields": 17})
        );
        assert_eq!(report["last"]["options"][0]["mode"], "dp");
        assert_eq!(report["last"]["gain"], 0.5);
        // `last_bind` is no `/metrics` number.
        assert!(s.fields().iter().all(|(name, _)| !name.contains("last")));
    }

    #[test]
    fn a_stats_message_without_them_has_no_binding_report() {
        let s = decode(json!({"v": 1, "type": "stats", "worker_id": 2, "swap_bytes": 5}));
        assert_eq!((s.last_bind.clone(), s.bind_decisions()), (None, None));
        assert_eq!(s.binding(), None);
        // A decision alone (a worker that took one but counts none) is still reported.
        let only_last = Stats {
            last_bind: Some(BindDecision {
                mode: BindMode::Dp,
                level: 2,
                replica: 0,
                gain: 0.0,
                options: vec![],
            }),
            ..Stats::default()
        };
        let report = only_last.binding().expect("a report");
        assert!(report.counters.is_empty());
    }

    #[test]
    fn a_last_bind_of_the_wrong_shape_makes_the_message_undecodable() {
        let bytes = rmp_serde::to_vec_named(&json!({"v": 1, "type": "stats", "worker_id": 2,
            "last_bind": {"mode": "sideways", "level": 2, "replica": 0, "gain": 0.0,
                          "options": []}}))
        .unwrap();
        assert!(decode_incoming(&bytes).is_err());
    }
}
