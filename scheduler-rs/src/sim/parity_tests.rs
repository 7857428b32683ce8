//! Parity of the simulator's local scheduler with the worker's: each scenario of
//! `tests/golden/scheduler/` runs through one [`GroupSim`] and its step trace must equal the
//! golden `.trace` file, which `tests/test_scheduler_parity.py` checks the worker's
//! scheduler (python/nitsum/engine/scheduler.py) against too. The format, and what the two
//! agree on, are in tests/golden/scheduler/README.md and tests/scheduler_parity.py.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::group::GroupSim;
use super::reqs::{Req, Reqs};
use crate::dispatch::Class;
use crate::ids::TierId;
use crate::plan::{GroupPlan, Role};
use crate::profile::{Profile, ProfileFile};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/scheduler")
}

/// Any profile: without deadlines the schedule does not depend on iteration times.
fn profile() -> Profile {
    let file: ProfileFile = serde_json::from_str(
        r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1],
        "prefill": {"1": [{"tokens": 10, "ms": 10}, {"tokens": 20, "ms": 20}]},
        "decode": {"1": [{"batch": 1, "context": 1, "ms": 5}, {"batch": 64, "context": 1, "ms": 5}]}}"#,
    )
    .unwrap();
    Profile::from_file(file).unwrap()
}

fn mixed_group() -> GroupPlan {
    GroupPlan {
        members: vec![0],
        tp: 1,
        pp: 1,
        role: Role::Mixed,
        tiers: vec![crate::ids::TierId(0)], // "t", the configs' only tier
        accepts_background: true,
        max_rps: 0.0,
        max_inflight: 0.0,
    }
}

fn class_of(name: &str) -> Class {
    match name {
        "feasible" => Class::Feasible,
        "best_effort" => Class::BestEffort,
        "background" => Class::Background,
        other => panic!("unknown class {other}"),
    }
}

/// A request arriving with nothing done. NOTE: no TTFT deadline (infinite), as in the
/// scenarios' Python run: no demotion, and long prompts spare half a budget.
fn arriving(input: u32, output: u32, class: Class, arrival: f64) -> Req {
    Req {
        arrival,
        input,
        output,
        tier: TierId(0),
        class,
        prefilled: 0,
        generated: 0,
        first_token: None,
        finish: None,
        decode_leader: None,
        dropped: false,
        deadline: f64::INFINITY,
        stint: None,
        leftover: false,
    }
}

fn listed(ids: Vec<String>) -> String {
    if ids.is_empty() {
        "-".into()
    } else {
        ids.join(" ")
    }
}

/// The step trace of the scenario at `path` through the simulator's group engine.
fn run(path: &Path) -> Vec<String> {
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let budget = raw["budget"].as_u64().unwrap() as u32;
    let batch_cap = raw["max_batch"].as_u64().unwrap() as usize;
    let max_steps = raw.get("max_steps").and_then(Value::as_u64).unwrap_or(200);
    let specs = raw["requests"].as_array().unwrap();
    let ids: Vec<String> = specs
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    let field = |r: &Value, k: &str| r[k].as_u64().unwrap();
    let mut reqs = Reqs::from(
        specs
            .iter()
            .map(|r| {
                let class = class_of(r["class"].as_str().unwrap());
                let step = field(r, "arrival_step") as f64;
                let (input, output) = (field(r, "prompt") as u32, field(r, "output") as u32);
                arriving(input, output, class, step)
            })
            .collect::<Vec<_>>(),
    );
    let profile = profile();
    let mut e = GroupSim::new(mixed_group(), batch_cap, budget, 0.0, 1);
    e.demote_late = true; // Nitsum's local scheduler (overtaking on); no deadline is ever due
    let mut trace = Vec::new();
    let mut done = 0;
    for step in 0..max_steps {
        for (r, spec) in specs.iter().enumerate() {
            if field(spec, "arrival_step") == step {
                e.push_prefill(r, reqs[r].class);
            }
        }
        let before: Vec<(u32, u32, bool)> = (0..ids.len())
            .map(|r| {
                (
                    reqs[r].prefilled,
                    reqs[r].generated,
                    reqs[r].first_token.is_some(),
                )
            })
            .collect();
        let now = step as f64;
        let Some(latency) = e.start(&mut reqs, &profile, now) else {
            continue;
        };
        let out = e.finish(&mut reqs, now + latency);
        e.sync(&mut reqs);
        done += out.finished.len();
        let (mut prefill, mut decode, mut first, mut finished) = (vec![], vec![], vec![], vec![]);
        for (r, id) in ids.iter().enumerate() {
            let (prefilled, generated, had_first) = before[r];
            let q = &reqs[r];
            if q.prefilled > prefilled {
                prefill.push(format!("{id}:{}", q.prefilled - prefilled));
            }
            if had_first && q.generated > generated {
                decode.push(id.clone());
            }
            if !had_first && q.first_token.is_some() {
                first.push(id.clone());
            }
            if out.finished.contains(&r) {
                finished.push(id.clone());
            }
        }
        trace.push(format!(
            "step {step}: prefill {}; decode {}; first {}; finished {}",
            listed(prefill),
            listed(decode),
            listed(first),
            listed(finished)
        ));
        if done == ids.len() {
            break;
        }
    }
    trace
}

#[test]
fn the_simulated_local_scheduler_follows_the_golden_traces() {
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 3, "scenarios in {:?}", golden_dir());
    for path in scenarios {
        let golden = std::fs::read_to_string(path.with_extension("trace")).unwrap();
        let got = run(&path);
        let want: Vec<&str> = golden.lines().collect();
        assert_eq!(got, want, "{}", path.display());
    }
}
