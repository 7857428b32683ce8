//! What the router reads from each worker → router fixture, built here: every message, the
//! full `stats` (with a `last_bind` decision) and the names of its fields.

use std::collections::HashMap;

use serde_json::Value;

use super::{RID, RID2};
use crate::binding::{BindDecision, BindMode, BindOption};
use crate::protocols::worker::*;
use crate::worker_auth::HANDSHAKE_VERSION;

/// What the router reads from each worker → router fixture, built here.
pub(super) fn worker_messages() -> Vec<(&'static str, Body)> {
    let lp = |logprob: f32, top: &[(u32, f32)]| TokenLogprob {
        logprob,
        top: top.to_vec(),
    };
    vec![
        (
            "hello",
            Body::Hello(Hello {
                handshake: Some(HANDSHAKE_VERSION),
                nonce: Some("ef".repeat(32)),
            }),
        ),
        (
            "register",
            Body::Register(Register {
                device: Some("cuda:1".into()),
                model: Some("tiny".into()),
                tp_levels: Some(vec![1, 2, 4]),
                domain: Some(2),
                kv_capacity_tokens: Some(65536),
                max_context: Some(4096),
                eos_token_ids: Some(vec![2, 7]),
                kv_transport: Some("tcp://10.0.0.1:29500".into()),
                auth: Some("ab".repeat(32)),
            }),
        ),
        (
            "heartbeat",
            Body::Heartbeat(Heartbeat {
                running: Some(2),
                waiting: Some(5),
                free_pages: Some(120),
                epoch: Some(9),
            }),
        ),
        (
            "device_lost",
            Body::DeviceLost(DeviceLost {
                reason: Some("device process exited with code -9".into()),
            }),
        ),
        (
            "tokens",
            Body::Tokens(Tokens {
                request_id: Some(RID.into()),
                token_ids: Some(vec![5, 9]),
                prompt_tokens: Some(11),
                queue_ms: Some(12.5),
                logprobs: Some(vec![lp(-0.25, &[(5, -0.25), (6, -1.5)]), lp(-3.0, &[])]),
                prompt_logprobs: Some(vec![lp(-1.5, &[(4, -1.5)])]),
                cached_tokens: Some(8),
                ..Tokens::default()
            }),
        ),
        (
            "tokens_error",
            Body::Tokens(Tokens {
                request_id: Some(RID2.into()),
                token_ids: Some(vec![]),
                finish_reason: Some("error".into()),
                error: Some("min_p: must be in [0, 1], got 2.0".into()),
                error_param: Some("min_p".into()),
                prompt_tokens: Some(4),
                ..Tokens::default()
            }),
        ),
        ("stats", Body::Stats(Box::new(golden_stats()))),
        (
            "reconfigured",
            Body::Reconfigured(Reconfigured {
                epoch: Some(9),
                ok: Some(false),
                error: Some("TP 3 not in the allowed levels (1, 2, 4)".into()),
                timings_ms: Some(HashMap::from([("total".to_string(), 1.5)])),
            }),
        ),
    ]
}

/// Every stat set, each to 100 + its position (so two swapped names show).
fn golden_stats() -> Stats {
    let map: serde_json::Map<String, Value> = STAT_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), Value::from(100 + i as u64)))
        .collect();
    let mut stats: Stats = serde_json::from_value(Value::Object(map)).unwrap();
    assert_eq!(stats.fields().len(), STAT_NAMES.len(), "a name Stats lacks");
    stats.last_bind = Some(golden_decision());
    stats
}

/// The fixture's `last_bind` (tests/wire_golden.py `GOLDEN_DECISION`): every mode and field.
fn golden_decision() -> BindDecision {
    let option = |mode: BindMode, ttft_ms, tpot_ms, meets, lost_tokens, value| BindOption {
        mode,
        ttft_ms,
        tpot_ms,
        meets,
        lost_tokens,
        value,
    };
    BindDecision {
        mode: BindMode::Prefill,
        level: 2,
        replica: 1,
        gain: 0.25,
        options: vec![
            option(BindMode::Dp, 185.5, 108.25, 0.125, 12.0, 0.03125),
            option(BindMode::Prefill, 60.5, 108.25, 0.5, 24.0, 0.28125),
            option(BindMode::Full, 58.0, 59.25, 0.75, 640.0, -4.25),
        ],
    }
}

/// The `Stats` fields in their declaration order (the Python `Stats` fields').
pub(super) const STAT_NAMES: &[&str] = &[
    "kv_handoffs",
    "kv_handoff_bytes",
    "reconfigurations",
    "kv_migrated_bytes",
    "sp_steps",
    "tp_steps",
    "pp_steps",
    "tp_binds",
    "tp_binds_soft",
    "tp_bound_requests",
    "tp_binds_clamped",
    "bind_decisions_dp",
    "bind_decisions_prefill",
    "bind_decisions_full",
    "bind_handbacks",
    "bind_soft_yields",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefix_cache_host_hits",
    "num_preemptions",
    "num_preemptions_swap",
    "swap_out_pages",
    "swap_in_pages",
    "swap_bytes",
    "swap_copies",
    "swap_waits",
    "kv_cache_usage_perc",
    "host_kv_usage_perc",
    "kv_remote_out",
    "kv_remote_in",
    "kv_remote_bytes",
    "kv_remote_failed",
    "kv_remote_recomputed",
];
