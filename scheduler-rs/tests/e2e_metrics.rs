//! `/metrics` end to end: the vLLM-compatible families exist with `model_name` and move by
//! exactly what real requests did; every metric the Grafana dashboards query exists.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{call, paced, post, start, Router};
use nitsum_scheduler::mock_worker::MockOptions;
use nitsum_scheduler::testutil::IM_START_ID;
use serde_json::{json, Value};

const M: &str = "model_name=\"tiny\"";

/// The value of the sample `series` (name and labels exactly as rendered), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(series)?.strip_prefix(' ')?;
        Some(if v == "NaN" {
            f64::NAN
        } else {
            v.parse().unwrap()
        })
    })
}

fn get(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

async fn scrape(r: &Router) -> String {
    let resp = call(r, "GET", "/metrics", &[], "").await;
    assert_eq!(resp.status, 200);
    resp.body
}

/// Scrape until `series` reaches `want` (worker stats arrive with heartbeats), for up to 5 s.
async fn scrape_until(r: &Router, series: &str, want: f64) -> String {
    let t0 = Instant::now();
    loop {
        let text = scrape(r).await;
        if value(&text, series) == Some(want) || t0.elapsed() > Duration::from_secs(5) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn mock() -> MockOptions {
    MockOptions {
        queue_ms: Some(2.0),
        report_stats: true,
        ..paced(10)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_metrics_exist_with_model_name_and_move_by_what_requests_did() {
    let r = start(common::config(), &[mock()]).await;
    let before = scrape_until(&r, &format!("vllm:kv_cache_usage_perc{{{M}}}"), 0.25).await;
    // Two requests end on length (4 tokens each), one on its stop token 105 (3 tokens: the
    // mock echoes the prompt); prompts are 3, 3 and 5 tokens.
    let reqs = [
        json!({"input_ids": [IM_START_ID, 104, 105], "sampling_params": {"max_new_tokens": 4}}),
        json!({"input_ids": [IM_START_ID, 106, 107], "sampling_params": {"max_new_tokens": 4}}),
        json!({"input_ids": [IM_START_ID, 104, 105, 106, 107],
               "sampling_params": {"max_new_tokens": 8, "stop_token_ids": [105]}}),
    ];
    let mut generated = 0;
    for body in reqs {
        let v = post(&r, "/generate", body).await.json();
        generated += v["meta_info"]["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(generated, 4 + 4 + 3);
    let after = scrape_until(&r, &format!("vllm:prefix_cache_queries_total{{{M}}}"), 11.0).await;
    let delta = |series: String| get(&after, &series) - get(&before, &series);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    // Token counters: exactly the prompts' and outputs' token counts.
    assert_eq!(delta(format!("vllm:prompt_tokens_total{{{M}}}")), 11.0);
    assert_eq!(delta(format!("vllm:generation_tokens_total{{{M}}}")), 11.0);
    assert_eq!(
        delta(format!("vllm:request_prompt_tokens_sum{{{M}}}")),
        11.0
    );
    assert_eq!(
        delta(format!("vllm:request_generation_tokens_sum{{{M}}}")),
        11.0
    );
    let ok = |reason: &str| {
        delta(format!(
            "vllm:request_success_total{{{M},finished_reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(
        (ok("stop"), ok("length"), ok("abort"), ok("error")),
        (1.0, 2.0, 0.0, 0.0)
    );
    // One observation per request; inter-token latency one per token after each first.
    for h in [
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ] {
        assert_eq!(delta(format!("{h}_count{{{M}}}")), 3.0, "{h}");
        assert_eq!(delta(format!("{h}_bucket{{{M},le=\"+Inf\"}}")), 3.0, "{h}");
    }
    for h in [
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ] {
        assert_eq!(delta(format!("{h}_count{{{M}}}")), 11.0 - 3.0, "{h}");
    }
    // The worker's 2 ms queue time per request; the mock paces each token 10 ms, so every TTFT
    // is longer than its queue time and prefill = TTFT − queue exactly.
    assert!(close(
        delta(format!("vllm:request_queue_time_seconds_sum{{{M}}}")),
        0.006
    ));
    let ttft = delta(format!("vllm:time_to_first_token_seconds_sum{{{M}}}"));
    let prefill = delta(format!("vllm:request_prefill_time_seconds_sum{{{M}}}"));
    assert!(
        // NOTE: sums are kept in whole microseconds per observation: 1 µs slack each.
        ttft >= 0.03 && (prefill - (ttft - 0.006)).abs() < 4e-6,
        "{ttft} {prefill}"
    );
    let itl = delta(format!("vllm:inter_token_latency_seconds_sum{{{M}}}"));
    assert!(itl >= 8.0 * 0.009, "{itl}");
    // Engine-level numbers from the worker's `stats`: 11 prompt tokens looked up, 1 + 1 + 2
    // found, one preemption per request, 25% KV usage.
    assert_eq!(
        delta(format!("vllm:prefix_cache_queries_total{{{M}}}")),
        11.0
    );
    assert_eq!(delta(format!("vllm:prefix_cache_hits_total{{{M}}}")), 4.0);
    assert_eq!(delta(format!("vllm:num_preemptions_total{{{M}}}")), 3.0);
    assert_eq!(
        get(&after, &format!("vllm:kv_cache_usage_perc{{{M}}}")),
        0.25
    );
    assert_eq!(
        get(&after, &format!("vllm:gpu_cache_usage_perc{{{M}}}")),
        0.25
    );
    assert_eq!(
        get(&after, &format!("vllm:num_requests_running{{{M}}}")),
        0.0
    );
    assert_eq!(
        get(&after, &format!("vllm:num_requests_waiting{{{M}}}")),
        0.0
    );
    // Nitsum's own metrics stay beside them.
    assert_eq!(
        get(&after, "nitsum_requests_finished_total{tier=\"strict\"}"),
        3.0
    );
    // Tiers that finished nothing have no attainment (NaN), not a perfect 1.
    assert!(get(&after, "nitsum_slo_attainment{tier=\"relaxed\"}").is_nan());
    // Every name vLLM's shipped Grafana dashboard queries (vLLM's
    // examples/online_serving/prometheus_grafana/grafana.json) has samples.
    for name in [
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:request_prompt_tokens_bucket",
        "vllm:request_generation_tokens_bucket",
        "vllm:request_success_total",
        "vllm:request_queue_time_seconds_sum",
        "vllm:request_prefill_time_seconds_sum",
        "vllm:request_decode_time_seconds_sum",
    ] {
        assert!(
            after
                .lines()
                .any(|l| l.starts_with(&format!("{name}{{{M}"))),
            "{name} has no sample with {M}"
        );
    }
    // ... and so does every metric the repository's dashboards query.
    check_dashboards(&after);
}

/// Metric names (`nitsum_*`, `vllm:*`) in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    // NOTE: label values and strings are skipped: a `"…"` span never holds a metric name.
    let mut quoted = false;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c == '"' {
            quoted = !quoted;
        }
        if !quoted && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            cur.push(c);
            continue;
        }
        if cur.starts_with("nitsum_") || cur.starts_with("vllm:") {
            out.push(cur.clone());
        }
        cur.clear();
    }
    out
}

/// Every `expr` string in a Grafana dashboard JSON.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

fn check_dashboards(metrics: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards");
    let mut files = 0;
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        let mut ex = Vec::new();
        exprs(&v, &mut ex);
        assert!(!ex.is_empty(), "{}: no PromQL", path.display());
        for e in &ex {
            let found = metric_names(e);
            assert!(!found.is_empty(), "{}: no metric in {e}", path.display());
            names.extend(found);
        }
    }
    assert!(files >= 1, "no dashboards in {}", dir.display());
    // NOTE: a sample line, or a declared family (a gauge no worker reported yet has none).
    let exists = |n: &str| {
        metrics.lines().any(|l| {
            l.strip_prefix(n)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
    };
    let missing: Vec<&String> = names.iter().filter(|n| !exists(n)).collect();
    assert!(
        missing.is_empty(),
        "dashboard metrics missing from /metrics: {missing:?}"
    );
    assert!(names.len() >= 10, "suspiciously few metrics: {names:?}");
}

#[test]
fn metric_names_skip_label_values_and_functions() {
    let e = r#"histogram_quantile(0.9, sum by (le, tier) (rate(nitsum_ttft_seconds_bucket{tier=~"nitsum_x"}[5m]))) / vllm:num_requests_running"#;
    assert_eq!(
        metric_names(e),
        ["nitsum_ttft_seconds_bucket", "vllm:num_requests_running"]
    );
}
