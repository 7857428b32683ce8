//! Binding in the simulator (`bind.rs`): it pays where the premium tier's TTFT needs TP, it
//! stays off where it cannot pay, it is deterministic, and its decisions are the cost model's.

use crate::binding::{BindMode, BindingModel};
use crate::planner::strategy::Strategy;
use crate::profile::Profile;

use crate::sim::{simulate, BindPolicy, Policy, SimConfig, SimResult, TraceRequest};

const H100: &str = include_str!("../../../profiles/h100-llama3-8b-analytic.json");

/// Premium: 4,096-token prompts under a 100 ms TTFT: alone a TP-1 replica takes 119 ms (the
/// analytic H100), TP 4 38 ms. Relaxed: 512-token prompts, 2 s TTFT, 100 ms TPOT.
fn config(binding: BindPolicy, premium_ttft_ms: f64, relaxed_every_s: f64) -> SimConfig {
    let mut requests = Vec::new();
    let span = 20.0;
    let mut t = 0.0;
    let mut k = 0u32;
    while t < span {
        requests.push(TraceRequest {
            arrival_s: t,
            input_len: 512 + 37 * (k % 7),
            output_len: 128 + 16 * (k % 5),
            tier: "relaxed".into(),
            leftover: false,
        });
        k += 1;
        t = f64::from(k) * relaxed_every_s;
    }
    for i in 0..80 {
        requests.push(TraceRequest {
            arrival_s: 0.013 + 0.25 * f64::from(i),
            input_len: 3584 + 64 * (i % 9),
            output_len: 64,
            tier: "premium".into(),
            leftover: false,
        });
    }
    requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    serde_json::from_value(serde_json::json!({
        "profile": serde_json::from_str::<serde_json::Value>(H100).unwrap(),
        "tiers": [
            {"name": "premium", "ttft_ms": premium_ttft_ms, "tpot_ms": 50.0, "bind_tp": 4},
            {"name": "relaxed", "ttft_ms": 2000.0, "tpot_ms": 100.0},
        ],
        "devices": 8,
        "policy": Policy::Fixed(Strategy::FixedTp { tp: 1 }),
        "requests": requests,
        "binding": binding,
    }))
    .unwrap()
}

fn premium(r: &SimResult) -> f64 {
    r.per_tier["premium"].attainment
}

#[test]
fn binding_pays_where_the_premium_ttft_needs_tp() {
    let off = simulate(&config(BindPolicy::Off, 100.0, 0.05)).unwrap();
    let cost = simulate(&config(BindPolicy::Cost, 100.0, 0.05)).unwrap();
    assert!(off.bindings.is_zero(), "{:?}", off.bindings);
    assert!(cost.bindings.bound() > 40, "{:?}", cost.bindings);
    // TP 1 cannot prefill 3.5-4k tokens within 100 ms; TP 4 can.
    assert!(premium(&off) < 0.2, "off: {}", premium(&off));
    assert!(
        premium(&cost) > premium(&off) + 0.5,
        "premium attainment: cost {} vs off {}",
        premium(&cost),
        premium(&off)
    );
    assert!(
        cost.goodput_rps >= off.goodput_rps,
        "goodput: cost {} vs off {}",
        cost.goodput_rps,
        off.goodput_rps
    );
    // The relaxed tier pays little for it.
    let relaxed = |r: &SimResult| r.per_tier["relaxed"].attainment;
    assert!(relaxed(&cost) >= relaxed(&off) - 0.02);
}

#[test]
fn binding_that_cannot_pay_is_not_taken() {
    // A relaxed premium target (TP 1 meets it) on busy replicas: a binding gains nothing
    // and pauses every replica of its block.
    let off = simulate(&config(BindPolicy::Off, 2000.0, 0.003)).unwrap();
    let cost = simulate(&config(BindPolicy::Cost, 2000.0, 0.003)).unwrap();
    let always = simulate(&config(BindPolicy::Always, 2000.0, 0.003)).unwrap();
    let decisions = cost.bindings.dp + cost.bindings.bound();
    assert_eq!(decisions, 80, "{:?}", cost.bindings);
    assert!(cost.bindings.bound() <= 2, "cost bound {:?}", cost.bindings);
    assert_eq!(always.bindings.full, 80, "{:?}", always.bindings);
    let within = (cost.goodput_rps - off.goodput_rps).abs() <= 0.02 * off.goodput_rps;
    assert!(
        within,
        "cost {} vs off {}",
        cost.goodput_rps, off.goodput_rps
    );
    assert!(
        always.goodput_rps < off.goodput_rps,
        "always {} vs off {}",
        always.goodput_rps,
        off.goodput_rps
    );
}

#[test]
fn binding_runs_are_deterministic() {
    let cfg = config(BindPolicy::Cost, 100.0, 0.02);
    let a = serde_json::to_string(&simulate(&cfg).unwrap()).unwrap();
    let b = serde_json::to_string(&simulate(&cfg).unwrap()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn the_sims_decisions_are_the_cost_models() {
    let cfg = config(BindPolicy::Cost, 100.0, 0.02);
    let out = simulate(&cfg).unwrap();
    let model = BindingModel::new(Profile::from_file(cfg.profile.clone()).unwrap());
    assert!(out.bind_log.len() > 10);
    assert!(out.bind_log.iter().any(|d| d.decision.mode != BindMode::Dp));
    for rec in &out.bind_log {
        assert_eq!(model.decide(&rec.query).unwrap(), rec.decision, "{rec:?}");
    }
    // The first premium request (t = 13 ms) finds the block of devices 0-3 as the relaxed
    // request of t = 0 left it: four TP-1 replicas, one of them prefilling or decoding it.
    let first = &out.bind_log[0];
    assert_eq!(first.id, 1);
    let q = &first.query;
    assert_eq!((q.level, q.prompt_tokens, q.output_tokens), (4, 3584, 64));
    assert_eq!(
        (q.ttft_ms, q.tpot_ms, q.token_budget),
        (Some(100.0), Some(50.0), 512)
    );
    assert_eq!(q.replicas.len(), 4);
    assert!(q.replicas.iter().all(|r| r.tp == 1));
    let busy: u32 = q.replicas.iter().map(|r| r.decoding).sum::<u32>()
        + q.replicas.iter().map(|r| r.prefill_tokens).sum::<u32>();
    assert!(busy > 0, "{q:?}");
}

#[test]
fn a_bound_prefill_gives_the_first_token_at_the_models_estimate() {
    // One premium request on an idle pool: an idle block binds (in full: nothing pauses),
    // and its TTFT and TPOT are the chosen option's.
    let mut cfg = config(BindPolicy::Cost, 100.0, 100.0);
    cfg.requests.retain(|r| r.tier == "premium");
    cfg.requests.truncate(1);
    let out = simulate(&cfg).unwrap();
    assert_eq!(out.bindings.full, 1, "{:?}", out.bindings);
    let d = &out.bind_log[0].decision;
    let full = d.options.iter().find(|o| o.mode == BindMode::Full).unwrap();
    let rec = &out.records[0];
    assert!(
        (rec.ttft_ms.unwrap() - full.ttft_ms).abs() < 1e-6,
        "{rec:?}"
    );
    assert!(
        (rec.tpot_ms.unwrap() - full.tpot_ms).abs() < 1e-6,
        "{rec:?}"
    );
    assert!(rec.met);
}
