//! The simulator's binding vocabulary (issue 32): the policy switch, the decision counts and
//! log of a run, and the shadows' verdict of binding on vs off. Types only (a leaf module:
//! the report, the choice and the shadows name them without reaching the cluster).

use serde::{Deserialize, Serialize};

use crate::binding::{BindDecision, BindMode, BindQuery};

/// How the simulator treats tiers with `bind_tp`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindPolicy {
    /// The cost model decides (the worker's `--bind-policy cost`).
    #[default]
    Cost,
    /// `bind_tp` ignored: the request runs on the group it is dispatched to.
    Off,
    /// Forced full binding (Flying Serving as it was; `--bind-policy always`).
    Always,
}

/// Decisions taken, by chosen mode, and full bindings handed back mid-decode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindCounts {
    pub dp: u64,
    pub prefill: u64,
    pub full: u64,
    pub handbacks: u64,
}

impl BindCounts {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Bindings taken (prefill-only or full).
    pub fn bound(&self) -> u64 {
        self.prefill + self.full
    }
}

/// One decision of the run: the request, when, the query and the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindRecord {
    pub id: usize,
    pub t_s: f64,
    pub query: BindQuery,
    pub decision: BindDecision,
}

/// A binding in force: its request holds the block's groups until its first token
/// (`prefill`) or its end (`full`, unless handed back).
#[derive(Debug, Clone)]
pub(super) struct Binding {
    pub id: u64,
    pub req: usize,
    pub mode: BindMode,
    /// Leaders of the block's groups.
    pub leaders: Vec<u32>,
    /// The group that decodes after a prefill binding or a hand-back.
    pub replica: u32,
    /// First token (s).
    pub first: f64,
    /// When the groups are free again (s): the first token for `prefill`, the last for `full`.
    pub end: f64,
    /// Per output token at TP k (ms), for `full`.
    pub tpot_ms: f64,
    pub handoff_s: f64,
}

/// Binding on vs off for the strategy in force, over the shadows' recent requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingVerdict {
    /// The strategy whose shadow and twin are compared.
    pub strategy: String,
    /// The shadow's binding policy (`cost` or `always`); the twin's is `off`.
    pub policy: BindPolicy,
    /// Discounted share of the judged SLO requests each met.
    pub on_attainment: f64,
    pub off_attainment: f64,
    /// (met by on only − met by off only) in standard deviations of a sign test.
    pub lead_sd: f64,
    /// "on", "off" (one met significantly more, at the choice's confidence) or "tie".
    pub better: String,
    /// Decisions the shadow took since the bank was made.
    pub decisions: BindCounts,
}
