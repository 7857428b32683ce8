//! The golden wire fixtures (`tests/golden/wire/`, written from the Python worker's message
//! dataclasses by `scripts/regen_wire_fixtures.py`) against the router's types: each fixture
//! decodes into its Rust type and re-encodes to the same message, and the message the router
//! builds (its `encode_*` functions) or expects is the fixture. `tests/test_wire_golden.py`
//! checks the Python side against the same files, so neither side can drift alone.
//!
//! NOTE: messages are compared as values: maps unordered, every number as an f64. Python's
//! msgpack and rmp_serde pick different widths (an f32 field re-encodes as float32, a Python
//! float is a float64); the fixtures' floats are exact in f32, so nothing is lost.
//!
//! The values each fixture holds are built in `worker_side.rs` (worker → router) and
//! `router_side.rs` (router → worker).

mod router_side;
mod worker_side;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use super::worker::*;
use crate::ids::WorkerId;
use router_side::router_messages;
use worker_side::{worker_messages, STAT_NAMES};

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
