use super::engine::EngineGauges;
use super::*;
use crate::config::default_tiers;
use crate::ids::WorkerId;
use crate::protocols::worker::Stats;

fn completion(ttft_s: f64, e2e_s: f64, tokens: u64) -> Completion {
    Completion {
        ttft_s: Some(ttft_s),
        e2e_s,
        tokens,
        prompt_tokens: 7,
        queue_s: None,
    }
}

/// The value of the sample line `series` (exact name and labels) in `text`.
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')
            .map(str::to_string)
    })
}

#[test]
fn slo_attainment_counts_ttft_and_tpot() {
    let tiers = default_tiers();
    let m = Metrics::new(&tiers, "tiny");
    // strict: 250 ms TTFT, 25 ms TPOT.
    let ok = completion(0.1, 0.1 + 9.0 * 0.02, 10);
    let slow_tpot = completion(0.1, 0.1 + 9.0 * 0.05, 10);
    let slow_ttft = completion(0.3, 0.3, 1);
    let strict = TierId(0);
    for c in [ok, slow_tpot, slow_ttft] {
        m.record_completion(strict, &tiers[0], c, FinishedReason::Length);
    }
    assert_eq!(m.tier(strict).finished.load(Ordering::Relaxed), 3);
    assert_eq!(m.tier(strict).slo_met.load(Ordering::Relaxed), 1);
    assert_eq!(m.tier(strict).ttft.count(), 3);
    assert_eq!(m.tier(strict).tpot.count(), 2);
    let mut out = String::new();
    m.render(&mut out);
    assert!(out.contains("nitsum_ttft_seconds_bucket{tier=\"strict\",le=\"0.1\"} 2"));
    assert!(out.contains("nitsum_ttft_seconds_count{tier=\"strict\"} 3"));
    assert!(out.contains("nitsum_requests_slo_met_total{tier=\"strict\"} 1"));
    assert!(out.contains("nitsum_slo_attainment{tier=\"strict\"} 0.3333"));
}

#[test]
fn attainment_of_a_tier_with_no_finished_request_is_nan_not_one() {
    let tiers = default_tiers();
    let m = Metrics::new(&tiers, "tiny");
    // A relaxed request that failed and one cancelled: nothing finished, nothing attained.
    m.tier(TierId(1)).errors.fetch_add(1, Ordering::Relaxed);
    m.tier(TierId(1)).cancelled.fetch_add(1, Ordering::Relaxed);
    m.record_completion(
        TierId(0),
        &tiers[0],
        completion(0.1, 0.12, 2), // 100 ms TTFT, 20 ms TPOT: meets strict
        FinishedReason::Stop,
    );
    assert_eq!(m.tier(TierId(1)).attainment(), None);
    assert_eq!(m.tier(TierId(0)).attainment(), Some(1.0));
    let mut out = String::new();
    m.render(&mut out);
    assert_eq!(
        sample(&out, "nitsum_slo_attainment{tier=\"relaxed\"}").as_deref(),
        Some("NaN")
    );
    assert_eq!(
        sample(&out, "nitsum_slo_attainment{tier=\"strict\"}").as_deref(),
        Some("1")
    );
}

#[test]
fn vllm_histograms_split_a_request_into_queue_prefill_and_decode() {
    let tiers = default_tiers();
    let m = Metrics::new(&tiers, "my \"model\"");
    let c = Completion {
        queue_s: Some(0.5),
        ..completion(2.0, 6.0, 5)
    };
    m.record_completion(TierId(0), &tiers[0], c, FinishedReason::Stop);
    m.vllm.on_prefilled(7, Some(3));
    m.vllm.on_tokens(1, None);
    m.vllm.on_tokens(2, Some(0.5));
    m.vllm.count(FinishedReason::Abort);
    let v = &m.vllm;
    assert_eq!((v.queue.sum(), v.prefill.sum()), (0.5, 1.5));
    assert_eq!((v.decode.sum(), v.inference.sum()), (4.0, 5.5));
    assert_eq!(v.request_tpot.sum(), 1.0); // (6 - 2) / (5 - 1)
    assert_eq!((v.itl.count(), v.itl.sum()), (2, 0.5));
    v.on_prefilled(0, None); // a worker that does not report its cache hits: no sample
    assert_eq!(v.prefill_computed.count(), 1);
    let mut out = String::new();
    v.render(&mut out, &EngineGauges::default());
    let l = "model_name=\"my \\\"model\\\"\"";
    for (series, want) in [
        (
            format!("vllm:e2e_request_latency_seconds_bucket{{{l},le=\"5\"}}"),
            "0",
        ),
        (
            format!("vllm:e2e_request_latency_seconds_bucket{{{l},le=\"10\"}}"),
            "1",
        ),
        (
            format!("vllm:request_prefill_time_seconds_sum{{{l}}}"),
            "1.5",
        ),
        (format!("vllm:request_prompt_tokens_sum{{{l}}}"), "7"),
        (
            format!("vllm:request_generation_tokens_bucket{{{l},le=\"5\"}}"),
            "1",
        ),
        (format!("vllm:prompt_tokens_total{{{l}}}"), "7"),
        // 7 prompt tokens, 3 of them found in the prefix cache
        (
            format!("vllm:request_prefill_kv_computed_tokens_sum{{{l}}}"),
            "4",
        ),
        (format!("vllm:generation_tokens_total{{{l}}}"), "3"),
        (
            format!("vllm:time_per_output_token_seconds_count{{{l}}}"),
            "2",
        ),
        (
            format!("vllm:request_success_total{{{l},finished_reason=\"stop\"}}"),
            "1",
        ),
        (
            format!("vllm:request_success_total{{{l},finished_reason=\"abort\"}}"),
            "1",
        ),
        (
            format!("vllm:request_success_total{{{l},finished_reason=\"length\"}}"),
            "0",
        ),
    ] {
        assert_eq!(
            sample(&out, &series).as_deref(),
            Some(want),
            "{series} in\n{out}"
        );
    }
    // No worker reported KV usage: the family is declared, without a made-up sample.
    assert!(out.contains("# TYPE vllm:kv_cache_usage_perc gauge"));
    assert!(!out.contains("vllm:kv_cache_usage_perc{"));
}

#[test]
fn engine_gauges_sum_worker_stats_and_average_kv_usage_as_a_fraction() {
    let stats = [
        (
            WorkerId(0),
            Stats {
                kv_cache_usage_perc: Some(40.0),
                num_preemptions: Some(3),
                prefix_cache_queries: Some(100),
                prefix_cache_hits: Some(25),
                num_preemptions_swap: Some(9),
                ..Stats::default()
            },
        ),
        (
            WorkerId(2),
            Stats {
                kv_cache_usage_perc: Some(60.0),
                num_preemptions: Some(4),
                ..Stats::default()
            },
        ),
        // A worker that reports nothing counts in no sum and no mean.
        (WorkerId(3), Stats::default()),
    ];
    let g = EngineGauges::of(3, 2, &stats);
    assert_eq!(
        g,
        EngineGauges {
            running: 3,
            waiting: 2,
            kv_usage: Some(0.5),
            preemptions: 7.0,
            prefix_cache_queries: 100.0,
            prefix_cache_hits: 25.0,
            admission_rejections: 0.0,
            kv_tokens: 0,
        }
    );
}
