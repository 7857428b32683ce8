//! Encoding and decoding of the router ↔ worker messages beyond the golden fixtures.

use std::borrow::Cow;

use serde::Serialize;

use super::*;
use crate::ids::WorkerId;

#[test]
fn generate_is_a_named_map_and_round_trips() {
    let stop = Stop {
        max_tokens: 4,
        ..Stop::default()
    };
    let sampling = Sampling {
        seed: Some(7),
        ..Sampling::default()
    };
    let bytes = encode_generate(&Generate {
        v: 1,
        ty: "generate",
        request_id: "42",
        input_ids: Cow::Borrowed(&[1, 2, 3]),
        resumed_tokens: 0,
        sampling: Cow::Borrowed(&sampling),
        stop: Cow::Borrowed(&stop),
        output: Cow::Owned(Output::default()),
        contract: Contract {
            tier: "strict",
            class: Class::BestEffort,
            ttft_ms: None,
            tpot_ms: None,
            weight: 1.0,
            priority: -3,
            preempt: false,
            bind_tp: Some(2),
        },
        routing: Routing::default(),
        truncate_prompt_tokens: Some(5),
        grammar: None,
    });
    // Generic decode: keys are strings (a map, not an array).
    let v: serde_json::Value = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(v["type"], "generate");
    assert_eq!(v["sampling"]["top_k"], -1);
    assert_eq!(v["sampling"]["seed"], 7);
    assert_eq!(v["stop"]["max_tokens"], 4);
    assert!(v["routing"]["decode_target"].is_null());
    assert_eq!(v["input_ids"], serde_json::json!([1, 2, 3]));
    assert_eq!(v["contract"]["class"], "best_effort");
    assert_eq!(v["contract"]["priority"], -3);
    assert_eq!(v["contract"]["preempt"], false);
    assert_eq!(v["contract"]["bind_tp"], 2);
    assert!(v["contract"].get("ttft_ms").is_none());
    assert_eq!(v["truncate_prompt_tokens"], 5);
}

#[test]
fn worker_ids_encode_as_the_bare_u32_they_replaced() {
    // The wire form before `WorkerId`: the same struct with a plain `u32`.
    #[derive(Serialize)]
    struct Untyped {
        v: u32,
        #[serde(rename = "type")]
        ty: &'static str,
        worker_id: u32,
        epoch: u64,
    }
    let untyped = Untyped {
        v: PROTOCOL_VERSION,
        ty: "registered",
        worker_id: 70_000,
        epoch: 9,
    };
    assert_eq!(
        encode_registered(WorkerId(70_000), 9),
        rmp_serde::to_vec_named(&untyped).unwrap()
    );
    let m = decode_incoming(&rmp_serde::to_vec_named(&untyped).unwrap()).unwrap();
    assert_eq!(m.worker_id, Some(WorkerId(70_000)));
}

#[test]
fn incoming_ignores_unknown_keys_and_reads_stats() {
    let tokens = serde_json::json!({"v": 1, "type": "tokens", "worker_id": 3,
        "request_id": "9", "token_ids": [5, 6], "finish_reason": null, "error": null,
        "prompt_tokens": 2, "future_field": {"x": 1}});
    let bytes = rmp_serde::to_vec_named(&tokens).unwrap();
    let m = decode_incoming(&bytes).unwrap();
    assert_eq!((m.body.kind(), m.worker_id), ("tokens", Some(WorkerId(3))));
    let Body::Tokens(t) = m.body else {
        panic!("{:?}", m.body)
    };
    assert_eq!(t.token_ids, Some(vec![5, 6]));
    assert_eq!(t.finish_reason, None);
    // Stats: known fields typed, unknown ones (a newer worker's) ignored.
    let stats = serde_json::json!({"v": 1, "type": "stats", "worker_id": 3, "util": 0.5,
        "kv_handoffs": 2, "kv_cache_usage_perc": 37});
    let m = decode_incoming(&rmp_serde::to_vec_named(&stats).unwrap()).unwrap();
    let Body::Stats(s) = m.body else {
        panic!("{:?}", m.body)
    };
    let want = Stats {
        kv_handoffs: Some(2),
        kv_cache_usage_perc: Some(37.0),
        ..Stats::default()
    };
    assert_eq!(*s, want);
    assert_eq!(
        s.fields(),
        vec![("kv_handoffs", 2.0), ("kv_cache_usage_perc", 37.0)]
    );
    // A known stat of the wrong type is undecodable (a counter is an unsigned integer).
    let bad = serde_json::json!({"v": 1, "type": "stats", "kv_handoffs": -1});
    assert!(decode_incoming(&rmp_serde::to_vec_named(&bad).unwrap()).is_err());
    // A known type whose field has the wrong type is undecodable; an unknown type is not.
    let bad = serde_json::json!({"v": 1, "type": "heartbeat", "running": "many"});
    assert!(decode_incoming(&rmp_serde::to_vec_named(&bad).unwrap()).is_err());
    let new = serde_json::json!({"v": 1, "type": "telemetry", "worker_id": 3});
    let m = decode_incoming(&rmp_serde::to_vec_named(&new).unwrap()).unwrap();
    assert!(matches!(m.body, Body::Unknown(ref t) if t == "telemetry"));
}
