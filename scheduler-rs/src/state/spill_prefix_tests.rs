//! Best-effort requests follow their prefix (issue 40 item 3): on a plan whose groups serve no
//! tier yet (a default server's first), a conversation's next turn and a repeated prompt go to
//! the group that holds their KV, not to the next group in round-robin order.

use std::sync::Arc;

use super::tests::{drain_raw, register, submit, tokens};
use super::{Event, RequestHandle, RouterState, Submit};
use crate::config::RouterConfig;
use crate::dispatch::Class;
use crate::plan::{GroupPlan, Role};

fn untiered(device: u32) -> GroupPlan {
    GroupPlan {
        members: vec![device],
        tp: 1,
        pp: 1,
        role: Role::Mixed,
        tiers: Vec::new(),
        accepts_background: true,
        max_rps: 0.0,
        max_inflight: 0.0,
    }
}

#[tokio::test]
async fn the_next_turn_and_a_repeat_spill_to_the_group_with_their_prefix() {
    let (engine, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    register(&engine, 0);
    register(&engine, 1);
    engine.set_plan(vec![untiered(0), untiered(1)]);
    drain_raw(&mut rx);
    let with_prompt = |ids: Vec<u32>| Submit {
        input_ids: ids,
        ..submit()
    };
    // The worker each request was sent to, and its class on the wire.
    let sent = |h: &RequestHandle, rx: &mut _| -> (String, String) {
        let id = engine.wire_id(h.id());
        let out = drain_raw(rx);
        let (to, v) = out
            .iter()
            .find(|(_, v)| v["request_id"] == id.as_str())
            .expect("a generate for the request");
        (
            to.clone(),
            v["contract"]["class"].as_str().unwrap().to_string(),
        )
    };
    let spilled_to = |w: &str| (w.to_string(), "best_effort".to_string());
    // Turn 1 (150 tokens) goes to the first group, and answers 100 tokens.
    let prompt: Vec<u32> = (0..150).collect();
    let answer: Vec<u32> = (1000..1100).collect();
    let mut turn1 = engine.submit(with_prompt(prompt.clone())).unwrap();
    assert_eq!(turn1.class(), Class::BestEffort);
    assert_eq!(sent(&turn1, &mut rx), spilled_to("0"));
    tokens(&engine, 0, turn1.id(), &answer, Some("length"));
    assert!(matches!(turn1.recv().await, Some(Event::Tokens { .. })));
    // Turn 2 = turn 1's prompt + answer + a new message: where that KV is (round-robin: "1").
    let mut turn2 = prompt.clone();
    turn2.extend(&answer);
    turn2.extend(2000..2020);
    let next = engine.submit(with_prompt(turn2)).unwrap();
    assert_eq!(sent(&next, &mut rx), spilled_to("0"));
    // An unrelated prompt still takes the next group in turn.
    let other = engine.submit(with_prompt((7000..7200).collect())).unwrap();
    assert_eq!(sent(&other, &mut rx), spilled_to("1"));
    // Turn 1's prompt again: where it went (round-robin: "1").
    let again = engine.submit(with_prompt(prompt)).unwrap();
    assert_eq!(sent(&again, &mut rx), spilled_to("0"));
}
