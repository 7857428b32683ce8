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
    // Request shape: per request its output tokens, n and max_tokens; per worker message
    // its tokens; cached prompt tokens are the prefix cache's hits.
    assert_eq!(
        delta(format!("vllm:request_max_num_generation_tokens_sum{{{M}}}")),
        11.0
    );
    assert_eq!(
        delta(format!(
            "vllm:request_max_num_generation_tokens_count{{{M}}}"
        )),
        3.0
    );
    assert_eq!(delta(format!("vllm:request_params_n_sum{{{M}}}")), 3.0);
    assert_eq!(
        delta(format!("vllm:request_params_max_tokens_sum{{{M}}}")),
        4.0 + 4.0 + 8.0
    );
    assert_eq!(
        delta(format!("vllm:iteration_tokens_total_sum{{{M}}}")),
        11.0
    );
    assert_eq!(
        delta(format!("vllm:prompt_tokens_cached_total{{{M}}}")),
        4.0
    );
    assert_eq!(
        get(
            &after,
            &format!("vllm:num_requests_waiting_by_reason{{{M},reason=\"capacity\"}}")
        ),
        0.0
    );
    assert_eq!(
        get(&after, &format!("vllm:admission_rejections_total{{{M}}}")),
        0.0
    );
    assert!(after
        .lines()
        .any(|l| l.starts_with(&format!("vllm:cache_config_info{{{M},")) && l.ends_with(" 1")));
    // SGLang's names carry the same numbers.
    for h in [
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
    ] {
        assert_eq!(delta(format!("{h}_count{{{M}}}")), 3.0, "{h}");
    }
    assert_eq!(get(&after, &format!("sglang:num_running_reqs{{{M}}}")), 0.0);
    assert_eq!(get(&after, &format!("sglang:num_queue_reqs{{{M}}}")), 0.0);
    let hits = get(&after, &format!("vllm:prefix_cache_hits_total{{{M}}}"));
    let queries = get(&after, &format!("vllm:prefix_cache_queries_total{{{M}}}"));
    assert!(close(
        get(&after, &format!("sglang:cache_hit_rate{{{M}}}")),
        hits / queries
    ));
    assert!(get(&after, &format!("sglang:gen_throughput{{{M}}}")) >= 0.0);
    // Nitsum's own metrics stay beside them.
    assert_eq!(
        get(&after, "nitsum_requests_finished_total{tier=\"strict\"}"),
        3.0
    );
    // Tiers that finished nothing have no attainment (NaN), not a perfect 1.
    assert!(get(&after, "nitsum_slo_attainment{tier=\"relaxed\"}").is_nan());
    // Every metric the repository's dashboards query has samples: Nitsum's own, and those of
    // vLLM's and SGLang's stock dashboards (vendored in dashboards/vllm and dashboards/sglang,
    // dashboards/SOURCES.md), the engines' families with this model's `model_name` label.
    check_dashboards(&after);
}

/// Metric names (`nitsum_*`, `vllm:*`, `sglang:*`) in a PromQL expression.
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
        if ["nitsum_", "vllm:", "sglang:"]
            .iter()
            .any(|p| cur.starts_with(p))
        {
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

/// The dashboard files under `dir` and its subfolders.
fn dashboard_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            dashboard_files(&path, out);
        } else if path.extension().and_then(|e| e.to_str()) == Some("json") {
            out.push(path);
        }
    }
}

fn check_dashboards(metrics: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards");
    let mut files = Vec::new();
    dashboard_files(&dir, &mut files);
    let mut names = BTreeSet::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
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
    // nitsum.json, vLLM's three and SGLang's one.
    assert!(
        files.len() >= 5,
        "dashboards missing in {}: {files:?}",
        dir.display()
    );
    // NOTE: a sample line, with this model's label for the engines' families (the stock
    // dashboards filter on `model_name`): a declared family without samples is no data.
    let exists = |n: &str| {
        metrics.lines().any(|l| {
            l.strip_prefix(n).is_some_and(|rest| {
                if n.starts_with("nitsum_") {
                    rest.starts_with('{') || rest.starts_with(' ')
                } else {
                    rest.starts_with(&format!("{{{M}"))
                }
            })
        })
    };
    let missing: Vec<&String> = names.iter().filter(|n| !exists(n)).collect();
    assert!(
        missing.is_empty(),
        "dashboard metrics without samples in /metrics: {missing:?}"
    );
    // The two panels vLLM's stock dashboards left empty, and SGLang's core names.
    for n in [
        "vllm:request_max_num_generation_tokens_sum",
        "vllm:iteration_tokens_total_count",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:num_running_reqs",
        "sglang:cache_hit_rate",
    ] {
        assert!(
            names.contains(n),
            "{n} is not queried by the vendored dashboards"
        );
    }
    assert!(names.len() >= 30, "suspiciously few metrics: {names:?}");
}

#[test]
fn metric_names_skip_label_values_and_functions() {
    let e = r#"histogram_quantile(0.9, sum by (le, tier) (rate(nitsum_ttft_seconds_bucket{tier=~"nitsum_x"}[5m]))) / vllm:num_requests_running"#;
    assert_eq!(
        metric_names(e),
        ["nitsum_ttft_seconds_bucket", "vllm:num_requests_running"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rejections_count_requests_refused_at_admission() {
    // No worker: every request is refused with 503 and counted once.
    let r = start(common::config(), &[]).await;
    for _ in 0..2 {
        let body = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2});
        assert_eq!(post(&r, "/v1/completions", body).await.status, 503);
    }
    let text = scrape(&r).await;
    assert_eq!(
        get(&text, &format!("vllm:admission_rejections_total{{{M}}}")),
        2.0
    );
    // No worker reports lookups: no hit rate rather than a made-up 0.
    assert!(value(&text, &format!("sglang:cache_hit_rate{{{M}}}")).is_none());
}
