//! The golden wire fixtures (`tests/golden/wire/`, written from the Python worker's message
//! dataclasses by `scripts/regen_wire_fixtures.py`) against the router's types: each fixture
//! decodes into its Rust type and re-encodes to the same message, and the message the router
//! builds (its `encode_*` functions) or expects is the fixture. `tests/test_wire_golden.py`
//! checks the Python side against the same files, so neither side can drift alone.
//!
//! NOTE: messages are compared as values: maps unordered, every number as an f64. Python's
//! msgpack and rmp_serde pick different widths (an f32 field re-encodes as float32, a Python
//! float is a float64); the fixtures' floats are exact in f32, so nothing is lost.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use serde_json::Value;

use super::structured::{Grammar, GrammarKind};
use super::worker::*;
use crate::binding::{BindDecision, BindMode, BindOption};
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, NamedGroupPlan, NamedPlan, Plan, Role};
use crate::tiers::Tier;

const RID: &str = "0123456789abcdef0123456789abcdef";
const RID2: &str = "fedcba9876543210fedcba9876543210";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/wire")
}

fn fixture(name: &str) -> Vec<u8> {
    let path = golden_dir().join(format!("{name}.msgpack"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `v` with every number as an f64 (maps compare unordered already).
fn canon(v: Value) -> Value {
    match v {
        Value::Number(n) => serde_json::Number::from_f64(n.as_f64().unwrap())
            .map(Value::Number)
            .unwrap(),
        Value::Array(a) => Value::Array(a.into_iter().map(canon).collect()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, canon(v))).collect()),
        other => other,
    }
}

fn value_of(bytes: &[u8]) -> Value {
    canon(rmp_serde::from_slice(bytes).expect("a msgpack map"))
}

#[track_caller]
fn assert_matches_fixture(name: &str, got: Value) {
    let want = value_of(&fixture(name));
    assert_eq!(
        canon(got),
        want,
        "{name}: the router's message differs from tests/golden/wire/{name}.msgpack \
         (left: Rust, right: fixture)"
    );
}

/// A decoded worker message back on the wire: its envelope and its body's fields.
fn wire_of(m: &Incoming) -> Value {
    let body = match &m.body {
        Body::Hello(b) => serde_json::to_value(b),
        Body::Register(b) => serde_json::to_value(b),
        Body::Heartbeat(b) => serde_json::to_value(b),
        Body::DeviceLost(b) => serde_json::to_value(b),
        Body::Tokens(b) => serde_json::to_value(b),
        Body::Reconfigured(b) => serde_json::to_value(b),
        Body::Stats(b) => serde_json::to_value(b),
        Body::Unknown(ty) => panic!("a fixture of unknown type {ty}"),
    };
    let mut v = body.unwrap();
    v["v"] = m.v.into();
    v["type"] = m.body.kind().into();
    v["worker_id"] = serde_json::to_value(m.worker_id).unwrap();
    v
}

/// What the router reads from each worker → router fixture, built here.
fn worker_messages() -> Vec<(&'static str, Body)> {
    let lp = |logprob: f32, top: &[(u32, f32)]| TokenLogprob {
        logprob,
        top: top.to_vec(),
    };
    vec![
        (
            "hello",
            Body::Hello(Hello {
                handshake: Some(2),
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
const STAT_NAMES: &[&str] = &[
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

fn golden_sampling() -> Sampling {
    Sampling {
        max_tokens: 32,
        temperature: 0.5,
        top_p: 0.75,
        top_k: 40,
        seed: Some(1234),
        stop_token_ids: vec![2, 13],
        ignore_eos: false,
        presence_penalty: 0.25,
        frequency_penalty: -0.5,
        repetition_penalty: 1.25,
        logit_bias: vec![(7, 2.5)],
        min_tokens: 3,
        min_p: 0.125,
        logprobs: Some(2),
        resumed_tokens: 1,
        prompt_logprobs: Some(1),
        allowed_token_ids: vec![5, 9, 27],
        bad_words: vec![vec![13], vec![15, 27]],
    }
}

/// The tier list the golden plan's tier ids index.
fn golden_tiers() -> Vec<Tier> {
    vec![Tier::with_name("gold"), Tier::with_name("silver")]
}

fn golden_plan() -> Plan {
    let group = |members: Vec<u32>, tp, pp, role, tiers: &[&str], background| NamedGroupPlan {
        members,
        tp,
        pp,
        role,
        tiers: tiers.iter().map(|t| t.to_string()).collect(),
        accepts_background: background,
        max_rps: 0.0,
        max_inflight: 0.0,
    };
    NamedPlan {
        epoch: 9,
        groups: vec![
            group(
                vec![0, 1, 2, 3],
                2,
                2,
                Role::Decode,
                &["gold", "silver"],
                false,
            ),
            group(vec![4], 1, 1, Role::Prefill, &[], true),
        ],
    }
    .resolve(&golden_tiers())
    .expect("golden tiers are listed")
}

/// What the router sends, by its own encoders, for each router → worker fixture.
fn router_messages() -> Vec<(&'static str, Vec<u8>)> {
    let sampling = golden_sampling();
    let grammar = Grammar {
        kind: GrammarKind::JsonSchema,
        schema: Some(r#"{"type":"object"}"#.into()),
        replay: 1,
    };
    let generate = Generate {
        v: PROTOCOL_VERSION,
        ty: "generate",
        request_id: RID,
        input_ids: Cow::Borrowed(&[1, 15, 27, 3]),
        sampling: Cow::Borrowed(&sampling),
        tier: "gold",
        class: "feasible",
        decode_target: Some(WorkerId(2)),
        ttft_ms: Some(250.0),
        tpot_ms: Some(40.0),
        weight: 2.5,
        priority: -1,
        preempt: false,
        bind_tp: Some(2),
        fork_of: Some(RID2),
        truncate_prompt_tokens: Some(3),
        cache_salt: Some("tenant-a"),
        grammar: Some(Cow::Borrowed(&grammar)),
    };
    let caps = |g: &GroupPlan| (g.pp == 2).then_some(8);
    vec![
        ("generate", encode_generate(&generate)),
        (
            "challenge",
            encode_challenge(WorkerId(3), &"cd".repeat(32), &"12".repeat(32)),
        ),
        (
            "refused",
            encode_refused(WorkerId(3), "model 'other' is not the served model 'tiny'"),
        ),
        ("registered", encode_registered(WorkerId(3), 9)),
        ("reregister", encode_reregister()),
        ("abort", encode_abort(RID)),
        (
            "reconfigure",
            encode_reconfigure(&golden_plan(), &golden_tiers(), caps),
        ),
        ("flush_cache", encode_flush_cache()),
        ("shutdown", encode_shutdown()),
    ]
}

/// Decode a router → worker fixture into its Rust type and encode it again.
fn reencode_router_message(bytes: &[u8]) -> Vec<u8> {
    let ty = value_of(bytes)["type"].as_str().unwrap().to_string();
    let again = match ty.as_str() {
        "generate" => rmp_serde::to_vec_named(&rmp_serde::from_slice::<Generate>(bytes).unwrap()),
        "reconfigure" => {
            rmp_serde::to_vec_named(&rmp_serde::from_slice::<Reconfigure>(bytes).unwrap())
        }
        "challenge" => rmp_serde::to_vec_named(&rmp_serde::from_slice::<Challenge>(bytes).unwrap()),
        "refused" => rmp_serde::to_vec_named(&rmp_serde::from_slice::<Refused>(bytes).unwrap()),
        "registered" => {
            rmp_serde::to_vec_named(&rmp_serde::from_slice::<Registered>(bytes).unwrap())
        }
        "abort" => rmp_serde::to_vec_named(&rmp_serde::from_slice::<Abort>(bytes).unwrap()),
        "reregister" | "shutdown" | "flush_cache" => {
            rmp_serde::to_vec_named(&rmp_serde::from_slice::<Bare>(bytes).unwrap())
        }
        other => panic!("no router type for {other}"),
    };
    again.unwrap()
}

#[test]
fn every_fixture_is_checked_here() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "msgpack"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let here: BTreeSet<String> = worker_messages()
        .iter()
        .map(|(n, _)| n.to_string())
        .chain(router_messages().iter().map(|(n, _)| n.to_string()))
        .collect();
    assert_eq!(on_disk, here);
}

#[test]
fn worker_fixtures_decode_to_the_router_types_and_back() {
    for (name, want) in worker_messages() {
        let m = decode_incoming(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((m.v, m.worker_id), (PROTOCOL_VERSION, Some(WorkerId(3))));
        assert_matches_fixture(name, wire_of(&m));
        // The fields the router reads are the ones written here.
        assert_eq!(m.body, want, "{name}");
    }
}

#[test]
fn router_messages_encode_to_the_fixtures_and_decode_back() {
    for (name, bytes) in router_messages() {
        assert_matches_fixture(name, value_of(&bytes));
        assert_matches_fixture(name, value_of(&reencode_router_message(&fixture(name))));
    }
}

#[test]
fn stats_fields_reach_the_metrics_by_name() {
    let Body::Stats(s) = decode_incoming(&fixture("stats")).unwrap().body else {
        panic!("not stats")
    };
    let got: Vec<(&str, f64)> = s.fields();
    let want: Vec<(&str, f64)> = STAT_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, 100.0 + i as f64))
        .collect();
    assert_eq!(got, want);
}
