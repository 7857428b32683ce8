//! The JSON config file (every field optional, docs/router.md) and its merge over the
//! defaults.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use super::api_key::ApiKey;
use super::router::RouterConfig;
use crate::lease::LeaseSpec;
use crate::plan::{NamedGroupPlan, Role};
use crate::planner::PlannerConfig;
use crate::sim::lookahead::LookaheadConfig;
use crate::tiers::Tier;
use crate::worker_auth::WorkerSecret;

/// One group of the static plan as written in the config (`tp` is `members.len()`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticGroup {
    pub members: Vec<u32>,
    #[serde(default = "default_role")]
    pub role: Role,
    /// Empty: every non-background tier.
    #[serde(default)]
    pub tiers: Vec<String>,
    #[serde(default = "yes")]
    pub accepts_background: bool,
    #[serde(default)]
    pub max_rps: f64,
    /// 0 = unbounded (every request feasible).
    #[serde(default)]
    pub max_inflight: f64,
}

fn default_role() -> Role {
    Role::Mixed
}

fn yes() -> bool {
    true
}

/// The config file. Every field is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub worker_addr: Option<String>,
    pub model_dir: Option<PathBuf>,
    pub served_model_name: Option<String>,
    pub tiers: Option<Vec<Tier>>,
    #[serde(default)]
    pub api_keys: Vec<ApiKey>,
    /// Static plan groups; absent = one TP-1 mixed group per registered worker.
    pub plan: Option<Vec<StaticGroup>>,
    pub heartbeat_timeout_ms: Option<u64>,
    pub worker_gone_ms: Option<u64>,
    pub retry_window_ms: Option<u64>,
    pub control_window_ms: Option<u64>,
    pub max_retries: Option<u32>,
    /// Profile file: enables the control loop.
    pub profile: Option<PathBuf>,
    /// Planner knobs (docs/planner.md); any subset.
    pub planner: Option<PlannerConfig>,
    /// How long the control loop waits for `reconfigured` acks.
    pub reconfigure_timeout_ms: Option<u64>,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish.
    pub drain_timeout_ms: Option<u64>,
    /// How long one request may take from submission to its last token (0: no limit).
    pub request_timeout_ms: Option<u64>,
    /// How long a client may take to send a request's headers, and then its body.
    pub client_read_timeout_ms: Option<u64>,
    /// With API keys: `/metrics` needs an admin key too.
    pub restrict_metrics: Option<bool>,
    /// Most prompts one `/v1/completions` or `/generate` request may batch.
    pub max_batch_prompts: Option<usize>,
    /// Strategy choice by simulated lookahead (docs/planner.md); any subset.
    pub lookahead: Option<LookaheadConfig>,
    /// Shared secret workers authenticate with (NITSUM_WORKER_SECRET overrides it).
    pub worker_secret: Option<String>,
    /// No worker authentication (loopback endpoints only; docs/security.md).
    pub insecure_worker_plane: Option<bool>,
    /// Several routers: this router's number (`--router-index`).
    pub router_index: Option<u32>,
    /// Several routers: the planning lease, `file:PATH` or `etcd:http://HOST:PORT[/KEY]`.
    pub lease: Option<String>,
    /// Several routers: an etcd lease's time to live without renewal.
    pub lease_ttl_ms: Option<u64>,
    /// Several routers: where the others reach this one when it leads.
    pub peer_addr: Option<String>,
    /// `--reasoning-parser`: `deepseek_r1` or `qwen3`.
    pub reasoning_parser: Option<String>,
    /// `--tool-call-parser`: `hermes`, `llama3_json`, `mistral` or `pythonic`.
    pub tool_call_parser: Option<String>,
    /// `--enable-auto-tool-choice`.
    pub enable_auto_tool_choice: Option<bool>,
}

impl RouterConfig {
    /// Apply a parsed config file over the defaults (no CLI).
    pub fn from_file(file: FileConfig) -> Result<Self> {
        let d = RouterConfig::default();
        let tiers = file.tiers.unwrap_or(d.tiers);
        let default_tiers: Vec<String> = tiers
            .iter()
            .filter(|t| !t.background)
            .map(|t| t.name.clone())
            .collect();
        let static_plan = file
            .plan
            .map(|groups| {
                groups
                    .into_iter()
                    .map(|g| {
                        NamedGroupPlan {
                            tp: g.members.len() as u32,
                            pp: 1,
                            members: g.members,
                            role: g.role,
                            tiers: if g.tiers.is_empty() {
                                default_tiers.clone()
                            } else {
                                g.tiers
                            },
                            accepts_background: g.accepts_background,
                            max_rps: g.max_rps,
                            max_inflight: g.max_inflight,
                        }
                        .resolve(&tiers)
                        .context("config")
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?;
        let served_model_name = match (&file.served_model_name, &file.model_dir) {
            (Some(n), _) => n.clone(),
            (None, Some(dir)) => model_name_of(dir),
            (None, None) => d.served_model_name,
        };
        let mut cfg = RouterConfig {
            listen: file.listen.unwrap_or(d.listen),
            worker_addr: file.worker_addr.unwrap_or(d.worker_addr),
            model_dir: file.model_dir,
            served_model_name,
            model_aliases: Vec::new(),
            chat_template: None,
            default_tp: d.default_tp,
            tiers,
            api_keys: file.api_keys,
            static_plan,
            heartbeat_timeout_ms: file.heartbeat_timeout_ms.unwrap_or(d.heartbeat_timeout_ms),
            worker_gone_ms: file.worker_gone_ms.unwrap_or(d.worker_gone_ms),
            retry_window_ms: file.retry_window_ms.unwrap_or(d.retry_window_ms),
            control_window_ms: file.control_window_ms.unwrap_or(d.control_window_ms),
            max_retries: file.max_retries.unwrap_or(d.max_retries),
            profile: file.profile,
            planner: file.planner.unwrap_or_default(),
            lookahead: file.lookahead.unwrap_or_default(),
            reconfigure_timeout_ms: file
                .reconfigure_timeout_ms
                .unwrap_or(d.reconfigure_timeout_ms),
            drain_timeout_ms: file.drain_timeout_ms.unwrap_or(d.drain_timeout_ms),
            request_timeout_ms: file.request_timeout_ms.unwrap_or(d.request_timeout_ms),
            client_read_timeout_ms: file
                .client_read_timeout_ms
                .unwrap_or(d.client_read_timeout_ms),
            restrict_metrics: file.restrict_metrics.unwrap_or(d.restrict_metrics),
            max_batch_prompts: file.max_batch_prompts.unwrap_or(d.max_batch_prompts),
            worker_secret: file
                .worker_secret
                .as_deref()
                .map(WorkerSecret::new)
                .transpose()
                .context("config: worker_secret")?,
            insecure_worker_plane: file.insecure_worker_plane.unwrap_or(false),
            router_index: file.router_index.unwrap_or(d.router_index),
            lease: file
                .lease
                .as_deref()
                .map(LeaseSpec::parse)
                .transpose()
                .context("config: lease")?,
            lease_ttl_ms: file.lease_ttl_ms,
            peer_addr: file.peer_addr,
            ..d
        };
        cfg.parsers.set(
            file.reasoning_parser.as_deref(),
            file.tool_call_parser.as_deref(),
            file.enable_auto_tool_choice.unwrap_or(false),
        )?;
        cfg.validate()?;
        Ok(cfg)
    }
}

pub(super) fn load_file(path: &Path) -> Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

pub(super) fn model_name_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "nitsum".into())
}
