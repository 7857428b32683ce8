use super::*;

const H100: &str = include_str!("../../../profiles/h100-llama3-8b-analytic.json");

fn model() -> BindingModel {
    BindingModel::from_json(H100).expect("the shipped profile")
}

fn busy(decoding: u32) -> ReplicaLoad {
    ReplicaLoad {
        tp: 1,
        decoding,
        context: 1024.0,
        prefill_tokens: 0,
        slowdown: 1.0,
    }
}

fn query(level: u32, prompt: u32, ttft: Option<f64>, replicas: Vec<ReplicaLoad>) -> BindQuery {
    BindQuery {
        level,
        prompt_tokens: prompt,
        output_tokens: 128,
        context_tokens: 0,
        ttft_ms: ttft,
        tpot_ms: Some(50.0),
        weight: 1.0,
        replicas,
        token_budget: 2048,
        handoff_ms_per_token: 0.0,
        bound_slowdown: 1.0,
        replica_output_tokens: 256.0,
        replica_weight: 1.0,
        wait_ms: 0.0,
    }
}

fn option(d: &BindDecision, mode: BindMode) -> &BindOption {
    d.options.iter().find(|o| o.mode == mode).expect("weighed")
}

#[test]
fn an_idle_block_binds_in_full() {
    let d = model()
        .decide(&query(4, 4096, Some(100.0), vec![busy(0); 4]))
        .unwrap();
    assert_eq!(d.mode, BindMode::Full, "{d:?}");
    let full = option(&d, BindMode::Full);
    assert_eq!(full.lost_tokens, 0.0);
    // TP 4 prefills and decodes faster than one replica.
    let dp = option(&d, BindMode::Dp);
    assert!(
        full.ttft_ms < dp.ttft_ms / 2.0 && full.tpot_ms < dp.tpot_ms,
        "{d:?}"
    );
    assert!(d.gain > MIN_GAIN);
}

#[test]
fn a_busy_block_binds_the_prompt_only_when_dp_misses_the_ttft() {
    // A long prompt behind 64-sequence batches: TP 1 takes too long for a 150 ms TTFT, and
    // the tier is worth ten of the replicas' requests.
    let mut q = query(4, 8192, Some(150.0), vec![busy(64); 4]);
    q.weight = 10.0;
    let d = model().decide(&q).unwrap();
    let (dp, pre, full) = (
        option(&d, BindMode::Dp),
        option(&d, BindMode::Prefill),
        option(&d, BindMode::Full),
    );
    assert!(dp.meets < 0.25 && pre.meets > 0.9, "{d:?}");
    // Decoding bound would pause 256 sequences for 127 steps: far worse than the prompt.
    assert!(full.lost_tokens > 4.0 * pre.lost_tokens, "{d:?}");
    assert_eq!(d.mode, BindMode::Prefill, "{d:?}");
}

#[test]
fn a_busy_block_stays_dp_when_dp_meets_the_target_or_there_is_none() {
    let m = model();
    let easy = m
        .decide(&query(4, 256, Some(2000.0), vec![busy(64); 4]))
        .unwrap();
    assert_eq!(easy.mode, BindMode::Dp, "{easy:?}");
    assert!(option(&easy, BindMode::Dp).meets > 0.99);
    let mut q = query(4, 8192, None, vec![busy(64); 4]);
    q.tpot_ms = None;
    let none = m.decide(&q).unwrap();
    assert_eq!(none.mode, BindMode::Dp, "{none:?}");
    assert_eq!(none.gain, 0.0);
}

#[test]
fn dp_goes_to_the_replica_that_starts_it_first() {
    let d = model()
        .decide(&query(2, 512, Some(400.0), vec![busy(64), busy(4)]))
        .unwrap();
    assert_eq!(d.replica, 1, "{d:?}");
}

#[test]
fn the_marginal_cost_counts_the_prompt_dp_would_run_anyway() {
    // The same busy block: the prompt's own time delays the DP replica's batch too, so the
    // prefill option loses more tokens than DP only by its extra device time.
    let d = model()
        .decide(&query(2, 2048, Some(300.0), vec![busy(32), busy(32)]))
        .unwrap();
    let (dp, pre) = (option(&d, BindMode::Dp), option(&d, BindMode::Prefill));
    assert!(dp.lost_tokens > 0.0);
    assert!(pre.lost_tokens < 2.5 * dp.lost_tokens, "{d:?}");
}

#[test]
fn a_prefilled_request_decodes_bound_only_while_the_block_is_idle() {
    let m = model();
    // A 5 ms TPOT: one replica decodes in 6.5, TP 4 in 2.5.
    let mut q = query(4, 0, Some(300.0), vec![busy(0); 4]);
    q.context_tokens = 4096;
    q.output_tokens = 100;
    q.tpot_ms = Some(5.0);
    assert_eq!(m.decide(&q).unwrap().mode, BindMode::Full);
    q.replicas = vec![busy(64); 4];
    let d = m.decide(&q).unwrap();
    assert_eq!(d.mode, BindMode::Dp, "{d:?}");
    assert!(d.options.iter().all(|o| o.mode != BindMode::Prefill));
}

#[test]
fn a_level_the_profile_lacks_is_an_error() {
    let e = model()
        .decide(&query(3, 64, Some(100.0), vec![busy(0)]))
        .unwrap_err();
    assert!(format!("{e}").contains("no TP level 3"), "{e}");
}

#[test]
fn json_in_json_out() {
    let m = model();
    let q = query(4, 4096, Some(100.0), vec![busy(0); 4]);
    let text = m.decide_json(&serde_json::to_string(&q).unwrap()).unwrap();
    let (back, direct): (BindDecision, _) = (serde_json::from_str(&text).unwrap(), m.decide(&q));
    let direct = direct.unwrap();
    assert_eq!((back.mode, back.replica), (direct.mode, direct.replica));
    assert!((back.gain - direct.gain).abs() < 1e-9);
    let minimal = r#"{"level": 2, "prompt_tokens": 64, "output_tokens": 8, "replicas": [{}, {}]}"#;
    let d: serde_json::Value = serde_json::from_str(&m.decide_json(minimal).unwrap()).unwrap();
    assert_eq!(d["mode"], "dp"); // no targets: nothing to gain, even on an idle block
    assert!(m
        .decide_json("{}")
        .unwrap_err()
        .to_string()
        .contains("invalid query"));
}

#[test]
fn measured_slowdowns_scale_the_estimates() {
    let m = model();
    // Replicas twice as slow as profiled (a shared machine): DP's first token comes twice
    // as late, its lost tokens stay (the batch is slower too); the bound forward as profiled.
    let q = query(2, 2048, Some(300.0), vec![busy(32), busy(32)]);
    let base = m.decide(&q).unwrap();
    let mut slow = q.clone();
    for r in &mut slow.replicas {
        r.slowdown = 2.0;
    }
    let d = m.decide(&slow).unwrap();
    let (dp0, dp1) = (option(&base, BindMode::Dp), option(&d, BindMode::Dp));
    assert!(
        (dp1.ttft_ms - 2.0 * dp0.ttft_ms).abs() < 1e-6,
        "{base:?} {d:?}"
    );
    assert!((dp1.lost_tokens - dp0.lost_tokens).abs() < 1e-6);
    let (pre0, pre1) = (
        option(&base, BindMode::Prefill),
        option(&d, BindMode::Prefill),
    );
    assert_eq!(pre0.ttft_ms, pre1.ttft_ms);
    // The paused batches produce less anyway.
    assert!(pre1.lost_tokens < pre0.lost_tokens);
    // The bound group slower instead: its TTFT scales.
    let mut bound_slow = q.clone();
    bound_slow.bound_slowdown = 3.0;
    let b = m.decide(&bound_slow).unwrap();
    let pre3 = option(&b, BindMode::Prefill);
    assert!((pre3.ttft_ms - 3.0 * pre0.ttft_ms).abs() < 1e-6);
    // What the worker compares its measurements with: the profiled iteration.
    assert!((m.iteration_ms(&busy(32), 0) * 2.0 - dp1.ttft_ms).abs() > 0.0);
}

#[test]
fn a_bound_option_waits_for_the_block_to_be_free() {
    // An idle block binds a 4k prompt under a 100 ms TTFT in full; if the block is free only
    // in 80 ms (a long iteration or another binding before it), TP 4 can no longer meet
    // the target sooner than DP does, and DP (where nothing pauses) wins.
    let m = model();
    let mut q = query(4, 4096, Some(100.0), vec![busy(0); 4]);
    let now = m.decide(&q).unwrap();
    q.wait_ms = 80.0;
    let later = m.decide(&q).unwrap();
    let (a, b) = (option(&now, BindMode::Full), option(&later, BindMode::Full));
    assert!((b.ttft_ms - a.ttft_ms - 80.0).abs() < 1e-9, "{a:?} {b:?}");
    assert_eq!(a.lost_tokens, b.lost_tokens);
    assert_eq!(now.mode, BindMode::Full);
    assert_eq!(later.mode, BindMode::Dp, "{later:?}");
    // A query without it (older callers) waits for nothing.
    let mut v = serde_json::to_value(&q).unwrap();
    v.as_object_mut().unwrap().remove("wait_ms");
    let old: BindQuery = serde_json::from_value(v).unwrap();
    assert_eq!(old.wait_ms, 0.0);
}
