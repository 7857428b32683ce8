//! `reconfigure` (router → every worker): the whole new plan, and its ack `reconfigured`
//! (worker → router).

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::frame::{encode, PROTOCOL_VERSION};
use crate::plan::{GroupPlan, Plan, Role};
use crate::tiers::Tier;

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn one() -> u32 {
    1
}

/// One group of a `reconfigure` message.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct WireGroup<'a> {
    pub members: Cow<'a, [u32]>,
    pub tp: u32,
    /// Pipeline stages of `tp` devices (members stage-major); absent: 1, a TP group.
    #[serde(skip_serializing_if = "is_one", default = "one")]
    pub pp: u32,
    pub role: Role,
    pub tiers: Cow<'a, [String]>,
    pub accepts_background: bool,
    /// Local batch cap from the planner (TPOT bound); absent = the worker's own limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<u32>,
}

/// `reconfigure` (router → every worker): the whole new plan.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Reconfigure<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub epoch: u64,
    pub groups: Vec<WireGroup<'a>>,
}

/// Encode `reconfigure` for a whole plan, its tiers named from `tiers` (the list its ids
/// index); `max_batch` gives each group's optional batch cap.
pub fn encode_reconfigure(
    plan: &Plan,
    tiers: &[Tier],
    max_batch: impl Fn(&GroupPlan) -> Option<u32>,
) -> Vec<u8> {
    encode(&Reconfigure {
        v: PROTOCOL_VERSION,
        ty: "reconfigure",
        epoch: plan.epoch,
        groups: plan
            .groups
            .iter()
            .map(|g| WireGroup {
                members: Cow::Borrowed(&g.members),
                tp: g.tp,
                pp: g.pp,
                role: g.role,
                tiers: Cow::Owned(
                    g.tiers
                        .iter()
                        .map(|id| tiers[id.index()].name.clone())
                        .collect(),
                ),
                accepts_background: g.accepts_background,
                max_batch: max_batch(g),
            })
            .collect(),
    })
}

/// `reconfigured`: the ack of a `reconfigure`.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reconfigured {
    pub epoch: Option<u64>,
    pub ok: Option<bool>,
    pub error: Option<String>,
    pub timings_ms: Option<HashMap<String, f64>>,
}
