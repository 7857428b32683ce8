//! RouterState invariants without a network: routing, never mixing outputs between workers,
//! retry, resume or completion when a worker dies, and charge release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;

use super::{Event, FinishReason, Outbound, RouterState, Submit};
use crate::config::RouterConfig;
use crate::ids::{TierId, WorkerId};
use crate::protocols::worker::{Sampling, Stop};

/// Deliver `v` from worker `worker`'s connection (named by the id).
/// NOTE: these helpers play the remote worker, so `worker` is the bare number it writes on the
/// wire (as the Python worker does); router-side values are compared as `WorkerId`s.
pub(super) fn msg(engine: &RouterState, worker: u32, v: serde_json::Value) {
    let bytes = rmp_serde::to_vec_named(&v).unwrap();
    engine.on_frame(Bytes::from(worker.to_string()), &bytes);
}

pub(super) fn register(engine: &RouterState, worker: u32) {
    msg(
        engine,
        worker,
        json!({"v": 1, "type": "register", "worker_id": worker, "device": "cpu",
            "model": "nitsum"}),
    );
}

pub(super) fn tokens(
    engine: &RouterState,
    worker: u32,
    id: u64,
    ids: &[u32],
    finish: Option<&str>,
) {
    msg(
        engine,
        worker,
        json!({"v": 1, "type": "tokens", "worker_id": worker,
        "request_id": engine.wire_id(id), "token_ids": ids, "finish_reason": finish}),
    );
}

/// (identity, decoded message) of every queued outbound message.
pub(super) fn drain_raw(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Outbound>,
) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        let v: serde_json::Value = rmp_serde::from_slice(&o.payload).unwrap();
        out.push((String::from_utf8(o.identity.to_vec()).unwrap(), v));
    }
    out
}

/// (identity, type, request_id) of every queued outbound message.
fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Outbound>) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        let v: serde_json::Value = rmp_serde::from_slice(&o.payload).unwrap();
        let rid = v["request_id"].as_str().unwrap_or("").to_string();
        out.push((
            String::from_utf8(o.identity.to_vec()).unwrap(),
            v["type"].as_str().unwrap().into(),
            rid,
        ));
    }
    out
}

pub(super) fn submit() -> Submit {
    Submit {
        input_ids: vec![1, 2],
        resumed_tokens: 0,
        sampling: Sampling::default(),
        stop: Stop::default(),
        output: Default::default(),
        tier: TierId(0),
        priority: 0,
        fork_of: None,
        grammar: None,
        cache: Default::default(),
    }
}

#[tokio::test]
async fn tokens_only_count_from_the_serving_worker() {
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    register(&engine, 1);
    let sent = drain(&mut rx);
    assert_eq!(sent.iter().filter(|m| m.1 == "registered").count(), 2);
    // Worker 0 registered alone first (1 reconfigure), then both got the 2-group plan.
    assert_eq!(sent.iter().filter(|m| m.1 == "reconfigure").count(), 3);
    assert_eq!(engine.plan().epoch, 2);

    let mut h = engine.submit(submit()).unwrap();
    let id = h.id();
    assert_eq!(
        drain(&mut rx),
        [("0".into(), "generate".into(), engine.wire_id(id))]
    );
    tokens(&engine, 1, id, &[9], Some("length")); // not its worker: ignored
    tokens(&engine, 0, id, &[5], None);
    tokens(&engine, 0, id, &[6], Some("stop"));
    tokens(&engine, 0, id, &[7], Some("stop")); // after the end: ignored
    assert_eq!(
        h.recv().await,
        Some(Event::Tokens {
            ids: vec![5],
            finish: None,
            logprobs: None
        })
    );
    assert_eq!(
        h.recv().await,
        Some(Event::Tokens {
            ids: vec![6],
            finish: Some(FinishReason::Stop),
            logprobs: None
        })
    );
    assert_eq!(h.recv().await, None);
    assert_eq!(engine.inflight(), 0);
    assert!(engine.groups().iter().all(|g| g.assigned == 0));
    assert_eq!(
        engine
            .metrics
            .tier(TierId(0))
            .finished
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn dead_worker_requests_are_retried_resumed_or_completed() {
    let cfg = RouterConfig {
        heartbeat_timeout_ms: 100,
        worker_gone_ms: 100,
        ..RouterConfig::default()
    };
    let (engine, mut rx) = RouterState::new(Arc::new(cfg));
    register(&engine, 0);
    let seeded = Submit {
        sampling: Sampling {
            seed: Some(7),
            ..Sampling::default()
        },
        ..submit()
    };
    let mut streamed = engine.submit(seeded).unwrap();
    let mut waiting = engine.submit(submit()).unwrap();
    let one = Submit {
        stop: Stop {
            max_tokens: 1,
            ..Stop::default()
        },
        ..submit()
    };
    let mut owed_nothing = engine.submit(one).unwrap();
    tokens(&engine, 0, streamed.id(), &[3], None);
    tokens(&engine, 0, owed_nothing.id(), &[5], None); // its `length` died with worker 0
    register(&engine, 1);
    drain(&mut rx);
    // Worker 1 keeps beating; worker 0 falls silent.
    let later = Instant::now() + Duration::from_millis(150);
    msg(
        &engine,
        1,
        json!({"v": 1, "type": "heartbeat", "worker_id": 1, "running": 0}),
    );
    assert!(engine.reap_dead(Instant::now()).is_empty());
    // Make worker 1 look fresh at `later` by beating just before reaping.
    std::thread::sleep(Duration::from_millis(120));
    msg(
        &engine,
        1,
        json!({"v": 1, "type": "heartbeat", "worker_id": 1}),
    );
    assert_eq!(engine.reap_dead(later), [WorkerId(0)]);
    // Both went to worker 1: the unstreamed request as it was, the streaming one resumed
    // from its token (prompt extended, one token fewer owed, its seed advanced).
    let generates: Vec<serde_json::Value> = drain_raw(&mut rx)
        .into_iter()
        .filter(|(to, v)| to == "1" && v["type"] == "generate")
        .map(|(_, v)| v)
        .collect();
    let to_one = |h: &super::RequestHandle| {
        generates
            .iter()
            .find(|v| v["request_id"] == engine.wire_id(h.id()).as_str())
            .unwrap_or_else(|| panic!("{generates:?}"))
    };
    let g = to_one(&waiting);
    assert_eq!(
        (g["input_ids"].clone(), g["stop"]["max_tokens"].clone()),
        (json!([1, 2]), json!(16))
    );
    let g = to_one(&streamed);
    assert_eq!(g["input_ids"], json!([1, 2, 3]));
    assert_eq!(g["stop"]["max_tokens"], json!(15));
    assert_eq!(g["sampling"]["seed"], json!(8));
    assert_eq!(generates.len(), 2, "{generates:?}");
    assert_eq!(
        owed_nothing.recv().await,
        Some(Event::Tokens {
            ids: vec![5],
            finish: None,
            logprobs: None
        })
    );
    assert_eq!(
        owed_nothing.recv().await,
        Some(Event::Tokens {
            ids: vec![],
            finish: Some(FinishReason::Length),
            logprobs: None
        })
    );
    tokens(&engine, 1, streamed.id(), &[4], Some("length"));
    tokens(&engine, 1, waiting.id(), &[4], Some("length"));
    for (h, want) in [
        (&mut streamed, vec![vec![3], vec![4]]),
        (&mut waiting, vec![vec![4]]),
    ] {
        for (i, ids) in want.iter().enumerate() {
            let finish = (i + 1 == want.len()).then_some(FinishReason::Length);
            assert_eq!(
                h.recv().await,
                Some(Event::Tokens {
                    ids: ids.clone(),
                    finish,
                    logprobs: None
                })
            );
        }
    }
    assert_eq!(engine.inflight(), 0);
    assert_eq!(engine.plan().groups.len(), 1);
    let tm = engine.metrics.tier(TierId(0));
    let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((n(&tm.retries), n(&tm.resumed), n(&tm.finished)), (2, 1, 3));
}

#[tokio::test]
async fn dropping_a_handle_aborts_and_releases() {
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    let h = engine.submit(submit()).unwrap();
    let id = engine.wire_id(h.id());
    drop(h);
    let sent = drain(&mut rx);
    assert_eq!(
        sent.last().unwrap(),
        &("0".to_string(), "abort".to_string(), id)
    );
    assert_eq!(engine.inflight(), 0);
    assert_eq!(engine.groups()[0].assigned, 0);
    // A version-2 message is refused; an unknown worker's heartbeat changes nothing.
    msg(
        &engine,
        5,
        json!({"v": 2, "type": "register", "worker_id": 5}),
    );
    msg(
        &engine,
        6,
        json!({"v": 1, "type": "heartbeat", "worker_id": 6}),
    );
    assert_eq!(engine.workers().len(), 1);
}

#[tokio::test]
async fn generate_carries_the_priority_and_the_tiers_preempt_and_bind_tp() {
    let mut cfg = RouterConfig::default();
    cfg.tiers[0].preempt = false;
    cfg.tiers[0].bind_tp = Some(2);
    let (engine, mut rx) = RouterState::new(Arc::new(cfg));
    register(&engine, 0);
    drain(&mut rx);
    for (tier, priority, preempt) in [(0, 7, false), (1, -2, true)] {
        let req = Submit {
            tier: TierId(tier),
            priority,
            ..submit()
        };
        let _h = engine.submit(req).unwrap();
        let sent = drain_raw(&mut rx);
        let g = &sent
            .iter()
            .find(|(_, v)| v["type"] == "generate")
            .unwrap()
            .1;
        assert_eq!(
            (
                g["contract"]["priority"].clone(),
                g["contract"]["preempt"].clone()
            ),
            (json!(priority), json!(preempt))
        );
        // Absent unless the tier binds (the default tiers do not).
        let bind = if tier == 0 { json!(2) } else { json!(null) };
        assert_eq!(
            g["contract"].get("bind_tp").cloned().unwrap_or(json!(null)),
            bind
        );
    }
}

#[tokio::test]
async fn tensor_parallel_size_groups_aligned_blocks_of_registered_workers() {
    let cfg = RouterConfig {
        default_tp: 2,
        ..RouterConfig::default()
    };
    let (engine, _rx) = RouterState::new(Arc::new(cfg));
    let shape = |e: &RouterState| -> Vec<(Vec<u32>, u32)> {
        e.plan()
            .groups
            .iter()
            .map(|g| (g.members.clone(), g.tp))
            .collect()
    };
    register(&engine, 0);
    assert_eq!(shape(&engine), [(vec![0], 1)]); // a block not yet whole serves as TP 1
    register(&engine, 1);
    register(&engine, 2);
    assert_eq!(shape(&engine), [(vec![0, 1], 2), (vec![2], 1)]);
    register(&engine, 3);
    assert_eq!(shape(&engine), [(vec![0, 1], 2), (vec![2, 3], 2)]);
}

#[tokio::test]
async fn the_next_turn_follows_the_answer_to_the_group_that_generated_it() {
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    register(&engine, 1);
    drain(&mut rx);
    let with_prompt = |ids: Vec<u32>| Submit {
        input_ids: ids,
        ..submit()
    };
    let to = |h: &super::RequestHandle, rx: &mut _| -> String {
        let sent = drain_raw(rx);
        let id = engine.wire_id(h.id());
        let (to, _) = sent
            .iter()
            .find(|(_, v)| v["request_id"] == id.as_str())
            .unwrap();
        to.clone()
    };
    // Turn 1: a prompt shorter than a block (nothing to index), a long answer from worker 0.
    let prompt: Vec<u32> = (0..40).collect();
    let answer: Vec<u32> = (1000..1100).collect();
    let mut turn1 = engine.submit(with_prompt(prompt.clone())).unwrap();
    assert_eq!(to(&turn1, &mut rx), "0");
    tokens(&engine, 0, turn1.id(), &answer, Some("length"));
    assert!(matches!(turn1.recv().await, Some(Event::Tokens { .. })));
    // Another conversation now keeps worker 0 busier than worker 1.
    let _other = engine.submit(with_prompt((5000..5010).collect())).unwrap();
    // Turn 2 = turn 1's prompt + its answer + a new message: back to worker 0, where that KV is.
    let mut turn2 = prompt.clone();
    turn2.extend(&answer);
    turn2.extend(2000..2020);
    let next = engine.submit(with_prompt(turn2)).unwrap();
    assert_eq!(to(&next, &mut rx), "0");
    // An unrelated prompt still balances to the idle worker.
    let fresh = engine.submit(with_prompt((7000..7200).collect())).unwrap();
    assert_eq!(to(&fresh, &mut rx), "1");
}

#[tokio::test]
async fn a_prompt_goes_where_its_prefix_went_unless_that_group_is_much_busier() {
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    register(&engine, 1);
    drain(&mut rx);
    let with_prompt = |ids: Vec<u32>| Submit {
        input_ids: ids,
        ..submit()
    };
    let history: Vec<u32> = (0..150).collect();
    let target = |h: &super::RequestHandle, rx: &mut _| {
        let sent = drain_raw(rx);
        let (to, _) = sent
            .iter()
            .find(|(_, v)| v["request_id"] == engine.wire_id(h.id()).as_str())
            .unwrap();
        to.clone()
    };
    let a = engine.submit(with_prompt(history.clone())).unwrap();
    assert_eq!(target(&a, &mut rx), "0"); // a tie: the first group
                                          // The next turn (the history and more): worker 1 is less loaded, worker 0 has its prefix.
    let mut turn2 = history.clone();
    turn2.extend(500..600);
    let b = engine.submit(with_prompt(turn2.clone())).unwrap();
    assert_eq!(target(&b, &mut rx), "0");
    // An unrelated prompt balances as before.
    let c = engine.submit(with_prompt((1000..1200).collect())).unwrap();
    assert_eq!(target(&c, &mut rx), "1");
    // Worker 0 more than 4 requests busier than worker 1: the prefix gives way to balance.
    let _held: Vec<_> = (0..4)
        .map(|i| {
            engine
                .submit(with_prompt(history[..64 + i].to_vec()))
                .unwrap()
        })
        .collect();
    let d = engine.submit(with_prompt(turn2)).unwrap();
    assert_eq!(
        engine
            .groups()
            .iter()
            .map(|g| g.assigned)
            .collect::<Vec<_>>(),
        [6, 2]
    );
    assert_eq!(target(&d, &mut rx), "1");
}

#[test]
fn a_resumed_request_replays_its_generated_tokens_into_its_grammar_and_penalties() {
    use crate::protocols::structured::Grammar;
    let req = Arc::new(Submit {
        stop: Stop {
            max_tokens: 10,
            min_tokens: 4,
            ..Stop::default()
        },
        grammar: Some(Grammar::json_object()),
        ..submit()
    });
    let once = super::orphans::resumed(&req, &[7, 8, 9]).unwrap();
    assert_eq!(once.input_ids, [1, 2, 7, 8, 9]);
    assert_eq!(once.grammar.as_ref().map(|g| g.replay), Some(3));
    let s = &once.stop;
    assert_eq!((s.max_tokens, s.min_tokens, once.resumed_tokens), (7, 1, 3));
    // A second resume starts again from the original request with all the output so far.
    let twice = super::orphans::resumed(&req, &[7, 8, 9, 5, 6]).unwrap();
    assert_eq!(twice.input_ids, [1, 2, 7, 8, 9, 5, 6]);
    let s = &twice.stop;
    assert_eq!(
        (s.max_tokens, s.min_tokens, twice.resumed_tokens),
        (5, 0, 5)
    );
    assert_eq!(
        super::orphans::resumed(&Arc::new(submit()), &[7])
            .unwrap()
            .grammar,
        None
    );
}

#[tokio::test]
async fn a_refused_input_is_invalid_unless_output_was_already_streamed() {
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    drain(&mut rx);
    let why = "response_format: invalid JSON schema: unsupported";
    let refuse = |id: u64, param: Option<&str>| {
        msg(
            &engine,
            0,
            json!({"v": 1, "type": "tokens", "worker_id": 0, "request_id": engine.wire_id(id),
                "token_ids": [], "finish_reason": "error", "error": why, "error_param": param}),
        )
    };
    let mut h = engine.submit(submit()).unwrap();
    refuse(h.id(), Some("response_format"));
    let invalid = Event::Invalid {
        param: "response_format".into(),
        message: why.into(),
    };
    assert_eq!(h.recv().await, Some(invalid));
    assert_eq!(h.recv().await, None);
    // Without a field named, the worker failed: a server error.
    let mut h = engine.submit(submit()).unwrap();
    refuse(h.id(), None);
    assert_eq!(h.recv().await, Some(Event::Error(why.into())));
    // A refusal after output was streamed (a resume the new worker refused) is ours too.
    let mut h = engine.submit(submit()).unwrap();
    tokens(&engine, 0, h.id(), &[5], None);
    refuse(h.id(), Some("response_format"));
    assert!(matches!(
        h.recv().await,
        Some(Event::Tokens { finish: None, .. })
    ));
    assert_eq!(h.recv().await, Some(Event::Error(why.into())));
    assert_eq!(engine.inflight(), 0);
    let errors = &engine.metrics.tier(TierId(0)).errors;
    assert_eq!(errors.load(std::sync::atomic::Ordering::Relaxed), 3);
}

#[tokio::test]
async fn a_prompt_cache_key_steers_to_its_group_and_a_cache_salt_isolates_prefixes() {
    use crate::state::CacheHints;
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    register(&engine, 1);
    drain(&mut rx);
    let with = |ids: Vec<u32>, salt: Option<&str>, key: Option<&str>| Submit {
        input_ids: ids,
        cache: CacheHints {
            salt: salt.map(str::to_string),
            key: key.map(str::to_string),
        },
        ..submit()
    };
    let sent_to = |h: &super::RequestHandle, rx: &mut _| {
        let sent = drain_raw(rx);
        let (to, msg) = sent
            .iter()
            .find(|(_, v)| v["request_id"] == engine.wire_id(h.id()).as_str())
            .unwrap();
        (to.clone(), msg["routing"].get("cache_salt").cloned())
    };
    let history: Vec<u32> = (0..150).collect();
    let a = engine
        .submit(with(history.clone(), None, Some("user-7")))
        .unwrap();
    assert_eq!(sent_to(&a, &mut rx), ("0".into(), None));
    // Another prompt with the same key: its group, though worker 1 is idle.
    let other: Vec<u32> = (5000..5150).collect();
    let b = engine.submit(with(other, None, Some("user-7"))).unwrap();
    assert_eq!(sent_to(&b, &mut rx).0, "0");
    // The same prompt under a salt shares no prefix with the unsalted one: it balances, and
    // the worker is told the salt.
    let c = engine
        .submit(with(history.clone(), Some("tenant-b"), None))
        .unwrap();
    assert_eq!(sent_to(&c, &mut rx), ("1".into(), Some(json!("tenant-b"))));
    // Its next turn under the same salt follows it.
    let mut turn2 = history;
    turn2.extend(600..700);
    let d = engine.submit(with(turn2, Some("tenant-b"), None)).unwrap();
    assert_eq!(sent_to(&d, &mut rx).0, "1");
}
