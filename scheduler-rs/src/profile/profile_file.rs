//! The profile file as `nitsum profile` writes it (`docs/profile-schema.md`): its schema tag
//! and measured points, before validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Schema tag every profile must carry.
pub const SCHEMA: &str = "nitsum-profile/1";

/// One prefill measurement: a forward over `tokens` prompt tokens took `ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefillPoint {
    pub tokens: f64,
    pub ms: f64,
}

/// One decode measurement: a step of `batch` sequences at `context` tokens each took `ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DecodePoint {
    pub batch: f64,
    pub context: f64,
    pub ms: f64,
}

/// The profile file as written by `nitsum profile` (unknown fields are ignored).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileFile {
    pub schema: String,
    pub device: String,
    pub model: String,
    #[serde(default)]
    pub dtype: String,
    #[serde(default)]
    pub analytic: bool,
    #[serde(default)]
    pub date: String,
    #[serde(default)]
    pub max_context: Option<f64>,
    pub tp_levels: Vec<u32>,
    pub prefill: BTreeMap<String, Vec<PrefillPoint>>,
    pub decode: BTreeMap<String, Vec<DecodePoint>>,
    /// The same points with the group run as sequence parallelism (levels ≥ 2, optional):
    /// a group shifts to SP when it batches many tokens, so its latency at a point is the
    /// better of the two modes (Shift Parallelism; `python/nitsum/parallel/shift.py`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sp_prefill: BTreeMap<String, Vec<PrefillPoint>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sp_decode: BTreeMap<String, Vec<DecodePoint>>,
    /// Batched tokens above which the runtime runs a group of that size as SP (`null`: TP
    /// only). With it, each point takes the mode the runtime picks there; without it, the
    /// faster of the two.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shift_threshold: BTreeMap<String, Option<f64>>,
    /// Pipelines measured (`"TPxPP"`: PP stages of TP devices), with their points keyed so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pipelines: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pp_prefill: BTreeMap<String, Vec<PrefillPoint>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pp_decode: BTreeMap<String, Vec<DecodePoint>>,
}
