//! Per-request TP binding decisions end to end: a worker's `stats` (binding counters and
//! `last_bind`, as the cost model returned it) reach `/admin/plan` (each worker's `binding`)
//! and `/metrics` (`nitsum_bind_decisions_total{worker,mode}` and `nitsum_worker_stat`).

mod common;

use std::time::{Duration, Instant};

use common::{call, paced, start, Router};
use nitsum_scheduler::binding::{BindQuery, BindingModel, ReplicaLoad};
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};

const H100: &str = include_str!("../../profiles/h100-llama3-8b-analytic.json");

/// A real decision: an idle TP-2 block, a long prompt with a tight TTFT.
fn decision() -> Value {
    let q = BindQuery {
        level: 2,
        prompt_tokens: 4096,
        output_tokens: 64,
        context_tokens: 0,
        ttft_ms: Some(150.0),
        tpot_ms: Some(50.0),
        weight: 1.0,
        replicas: vec![
            ReplicaLoad {
                tp: 1,
                ..ReplicaLoad::default()
            };
            2
        ],
        token_budget: 2048,
        handoff_ms_per_token: 0.0,
        bound_slowdown: 1.0,
        replica_output_tokens: 128.0,
        replica_weight: 1.0,
        wait_ms: 0.0,
    };
    let d = BindingModel::from_json(H100).unwrap().decide(&q).unwrap();
    serde_json::to_value(d).unwrap()
}

fn binding_worker(last: &Value) -> MockOptions {
    let extra = json!({"tp_binds": 3, "bind_decisions_dp": 11, "bind_decisions_prefill": 2,
                       "bind_decisions_full": 1, "bind_handbacks": 1, "bind_soft_yields": 6,
                       "last_bind": last});
    MockOptions {
        report_stats: true,
        stats_extra: extra.as_object().unwrap().clone(),
        ..paced(5)
    }
}

async fn plan(r: &Router) -> Value {
    let resp = call(r, "GET", "/admin/plan", &[], "").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    resp.json()
}

/// `/admin/plan` once worker `id` has a `binding` (stats come with heartbeats), up to 5 s.
async fn plan_with_binding(r: &Router, id: u64) -> Value {
    let t0 = Instant::now();
    loop {
        let p = plan(r).await;
        let found = p["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["id"] == id && !w["binding"].is_null());
        if found || t0.elapsed() > Duration::from_secs(5) {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `a == b` but for numbers' last bit (serde_json parses floats to the nearest but one).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn worker(plan: &Value, id: u64) -> &Value {
    let workers = plan["workers"].as_array().unwrap();
    workers.iter().find(|w| w["id"] == id).expect("listed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_plan_and_metrics_show_each_workers_binding_decisions() {
    let last = decision();
    assert_eq!(last["mode"], "full", "an idle block binds: {last}");
    // Worker 0 binds; worker 1 reports stats without binding; neither hides the other.
    let plain = MockOptions {
        report_stats: true,
        ..paced(5)
    };
    let r = start(common::config(), &[binding_worker(&last), plain]).await;
    let p = plan_with_binding(&r, 0).await;
    let binding = &worker(&p, 0)["binding"];
    assert_eq!(
        binding["counters"],
        json!({"tp_binds": 3, "bind_decisions_dp": 11, "bind_decisions_prefill": 2,
               "bind_decisions_full": 1, "bind_handbacks": 1, "bind_soft_yields": 6})
    );
    // The decision as the cost model returned it: every option with its estimates.
    assert!(
        same(&binding["last"], &last),
        "{} != {last}",
        binding["last"]
    );
    let modes: Vec<_> = binding["last"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["dp", "prefill", "full"]);
    assert!(binding["last"]["options"][2]["ttft_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(worker(&p, 1)["binding"], Value::Null);

    let text = call(&r, "GET", "/metrics", &[], "").await.body;
    let samples: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with("nitsum_bind_decisions_total{"))
        .collect();
    assert_eq!(
        samples,
        [
            "nitsum_bind_decisions_total{worker=\"0\",mode=\"dp\"} 11",
            "nitsum_bind_decisions_total{worker=\"0\",mode=\"prefill\"} 2",
            "nitsum_bind_decisions_total{worker=\"0\",mode=\"full\"} 1",
        ]
    );
    assert!(text.contains("# TYPE nitsum_bind_decisions_total counter"));
    for (name, v) in [
        ("bind_handbacks", 1),
        ("bind_soft_yields", 6),
        ("tp_binds", 3),
    ] {
        let line = format!("nitsum_worker_stat{{worker=\"0\",name=\"{name}\"}} {v}\n");
        assert!(text.contains(&line), "no {line} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_binding_stats_nothing_about_binding_shows() {
    let plain = MockOptions {
        report_stats: true,
        ..paced(5)
    };
    let r = start(common::config(), &[plain]).await;
    // Wait for a stats message to have arrived (its gauge shows), then look.
    let t0 = Instant::now();
    let text = loop {
        let text = call(&r, "GET", "/metrics", &[], "").await.body;
        if text.contains("name=\"kv_cache_usage_perc\"") || t0.elapsed() > Duration::from_secs(5) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(text.contains("name=\"kv_cache_usage_perc\""), "{text}");
    assert!(!text.contains("nitsum_bind_decisions_total"), "{text}");
    assert_eq!(worker(&plan(&r).await, 0)["binding"], Value::Null);
}
