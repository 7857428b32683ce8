//! What the router sends, by its own encoders, for each router → worker fixture, and the
//! sampling, tiers and plan those messages carry.

use std::borrow::Cow;

use super::{RID, RID2};
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, NamedGroupPlan, NamedPlan, Plan, Role};
use crate::protocols::structured::{Grammar, GrammarKind};
use crate::protocols::worker::*;
use crate::tiers::Tier;

fn golden_sampling() -> Sampling {
    Sampling {
        temperature: 0.5,
        top_p: 0.75,
        top_k: 40,
        seed: Some(1234),
        presence_penalty: 0.25,
        frequency_penalty: -0.5,
        repetition_penalty: 1.25,
        logit_bias: vec![(7, 2.5)],
        min_p: 0.125,
        allowed_token_ids: vec![5, 9, 27],
        bad_words: vec![vec![13], vec![15, 27]],
        no_repeat_ngram_size: 3,
    }
}

fn golden_stop() -> Stop {
    Stop {
        max_tokens: 32,
        min_tokens: 3,
        stop_token_ids: vec![2, 13],
        ignore_eos: false,
    }
}

/// The tier list the golden plan's tier ids index.
fn golden_tiers() -> Vec<Tier> {
    vec![Tier::with_name("gold"), Tier::with_name("silver")]
}

fn golden_plan() -> Plan {
    let group = |members: Vec<u32>, tp, pp, role, tiers: &[&str], background| NamedGroupPlan {
        members,
        tp,
        pp,
        role,
        tiers: tiers.iter().map(|t| t.to_string()).collect(),
        accepts_background: background,
        max_rps: 0.0,
        max_inflight: 0.0,
    };
    NamedPlan {
        epoch: 9,
        groups: vec![
            group(
                vec![0, 1, 2, 3],
                2,
                2,
                Role::Decode,
                &["gold", "silver"],
                false,
            ),
            group(vec![4], 1, 1, Role::Prefill, &[], true),
        ],
    }
    .resolve(&golden_tiers())
    .expect("golden tiers are listed")
}

/// What the router sends, by its own encoders, for each router → worker fixture.
pub(super) fn router_messages() -> Vec<(&'static str, Vec<u8>)> {
    let sampling = golden_sampling();
    let grammar = Grammar {
        kind: GrammarKind::JsonSchema,
        schema: Some(r#"{"type":"object"}"#.into()),
        replay: 1,
    };
    let (stop, output) = (
        golden_stop(),
        Output {
            logprobs: Some(2),
            prompt_logprobs: Some(1),
        },
    );
    let generate = Generate {
        v: PROTOCOL_VERSION,
        ty: "generate",
        request_id: RID,
        input_ids: Cow::Borrowed(&[1, 15, 27, 3]),
        resumed_tokens: 1,
        sampling: Cow::Borrowed(&sampling),
        stop: Cow::Borrowed(&stop),
        output: Cow::Borrowed(&output),
        contract: Contract {
            tier: "gold",
            class: Class::Feasible,
            ttft_ms: Some(250.0),
            tpot_ms: Some(40.0),
            weight: 2.5,
            priority: -1,
            preempt: false,
            bind_tp: Some(2),
        },
        routing: Routing {
            fork_of: Some(RID2),
            decode_target: Some(WorkerId(2)),
            cache_salt: Some("tenant-a"),
        },
        truncate_prompt_tokens: Some(3),
        grammar: Some(Cow::Borrowed(&grammar)),
    };
    let caps = |g: &GroupPlan| (g.pp == 2).then_some(8);
    vec![
        ("generate", encode_generate(&generate)),
        (
            "challenge",
            encode_challenge(WorkerId(3), &"cd".repeat(32), &"12".repeat(32)),
        ),
        (
            "refused",
            encode_refused(WorkerId(3), "model 'other' is not the served model 'tiny'"),
        ),
        ("registered", encode_registered(WorkerId(3), 9)),
        ("reregister", encode_reregister()),
        ("abort", encode_abort(RID)),
        (
            "reconfigure",
            encode_reconfigure(&golden_plan(), &golden_tiers(), caps),
        ),
        ("flush_cache", encode_flush_cache()),
        ("shutdown", encode_shutdown()),
    ]
}
