//! Router configuration: a JSON config file (all fields optional) overridden by CLI flags.
//!
//! See `docs/router.md` for the file format.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::Deserialize;

use crate::ids::TierId;
use crate::plan::{GroupPlan, NamedGroupPlan, Role};
use crate::planner::PlannerConfig;
use crate::sim::lookahead::LookaheadConfig;
use crate::tiers::Tier;
use crate::worker_auth::{WorkerSecret, SECRET_ENV};

/// `nitsum-router` command line. Flags override the config file.
#[derive(Debug, Parser, Default)]
#[command(
    name = "nitsum-router",
    version,
    about = "Nitsum OpenAI-compatible router"
)]
pub struct Cli {
    /// JSON config file (tiers, API keys, static plan, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// HTTP listen address.
    #[arg(long)]
    pub listen: Option<String>,
    /// ZeroMQ ROUTER bind address for device workers.
    #[arg(long)]
    pub worker_addr: Option<String>,
    /// HF-format model directory (tokenizer.json, tokenizer_config.json, config.json, ...).
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    /// Model name served on /v1/models and accepted in `model`.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Another name the model answers to (listed on /v1/models too); repeatable.
    #[arg(long = "model-alias")]
    pub model_aliases: Vec<String>,
    /// A Jinja chat template file used instead of the model directory's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Devices per TP group: the planner's lowest TP level with the control loop, else the
    /// fixed level of the default plan (aligned groups of registered workers).
    #[arg(long)]
    pub tensor_parallel_size: Option<u32>,
    /// A worker silent for this long is suspect: no new work, its requests held.
    #[arg(long)]
    pub heartbeat_timeout_ms: Option<u64>,
    /// A worker silent for this long is gone: its requests resume elsewhere.
    #[arg(long)]
    pub worker_gone_ms: Option<u64>,
    /// How long a request no live worker can take is held for one that can.
    #[arg(long)]
    pub retry_window_ms: Option<u64>,
    /// Control window length.
    #[arg(long)]
    pub control_window_ms: Option<u64>,
    /// Offline profile JSON (docs/profile-schema.md): enables the control loop (planner every
    /// control window). Without it the plan is static.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Start N in-process mock workers (instant echo replies) for development and benchmarks.
    #[arg(long, default_value_t = 0)]
    pub mock_workers: u32,
    /// Send `shutdown` to every registered worker when the router exits.
    #[arg(long)]
    pub shutdown_workers_on_exit: bool,
    /// Run without a worker secret (no worker authentication): only on a loopback worker
    /// endpoint, for local development (docs/security.md). The secret itself is never a flag:
    /// set NITSUM_WORKER_SECRET or `worker_secret` in the config.
    #[arg(long)]
    pub insecure_worker_plane: bool,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

/// Environment variable with API keys, one a line (`nitsum serve --api-key`): kept off the
/// command line that `ps` shows. Each may use every tier, like a config key without `tiers`.
pub const API_KEYS_ENV: &str = "NITSUM_API_KEYS";

/// The keys of `NITSUM_API_KEYS` (blank lines skipped).
pub fn env_api_keys(text: &str) -> Result<Vec<ApiKey>> {
    text.lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        // NOTE: through serde, so that every other field takes its config-file default.
        .map(|k| serde_json::from_value(serde_json::json!({ "key": k })).context(API_KEYS_ENV))
        .collect()
}

/// An API key, the tiers it may use and its quotas (absent: unlimited).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub key: String,
    /// Tiers this key may request; empty = all tiers.
    #[serde(default)]
    pub tiers: Vec<String>,
    /// Tier used when the request names none; default: the key's first allowed tier.
    #[serde(default)]
    pub default_tier: Option<String>,
    /// May read `/admin/*` (and `/metrics` with `restrict_metrics`).
    #[serde(default)]
    pub admin: bool,
    /// Most requests of this key in flight at once (api/quota.rs); more get 429.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// Sustained request rate of this key (a token bucket refilled at this rate).
    #[serde(default)]
    pub requests_per_minute: Option<f64>,
    /// The bucket's size: requests the key may send at once after a quiet spell
    /// (default: one second's worth of `requests_per_minute`, at least 1).
    #[serde(default)]
    pub burst: Option<u32>,
}

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
}

/// The resolved router configuration.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub listen: String,
    pub worker_addr: String,
    pub model_dir: Option<PathBuf>,
    pub served_model_name: String,
    /// Other names the model answers to (`--model-alias`, `nitsum serve --served-model-name
    /// a b`): accepted as `model` and listed on /v1/models.
    pub model_aliases: Vec<String>,
    /// Chat template file overriding the model directory's (`--chat-template`).
    pub chat_template: Option<PathBuf>,
    /// `--tensor-parallel-size`: the default plan's TP level (without the control loop;
    /// with it the planner's `tp_levels` start there). 1: every worker its own group.
    pub default_tp: u32,
    /// NOTE: non-empty, names unique, at least one non-background tier (checked by `validate`).
    pub tiers: Vec<Tier>,
    pub api_keys: Vec<ApiKey>,
    pub static_plan: Option<Vec<GroupPlan>>,
    /// A worker silent for this long is suspect (slow, maybe gone): no new work goes to it,
    /// its requests are held where they are (docs/serving.md "Stalls and deaths").
    pub heartbeat_timeout_ms: u64,
    /// A worker silent for this long is gone: its requests resume elsewhere from their tokens.
    /// NOTE: at least `heartbeat_timeout_ms` (checked by `validate`).
    pub worker_gone_ms: u64,
    /// How long a request that no live worker can take (its worker gone, none left) is held
    /// for one that can (a worker that returns or a replacement that registers).
    pub retry_window_ms: u64,
    pub control_window_ms: u64,
    /// How often a request is re-dispatched after its worker died (one that had streamed
    /// tokens resumes from them).
    pub max_retries: u32,
    /// Offline profile; `Some` enables the control loop.
    pub profile: Option<PathBuf>,
    pub planner: PlannerConfig,
    pub lookahead: LookaheadConfig,
    pub reconfigure_timeout_ms: u64,
    /// On SIGTERM/SIGINT: new requests get 503, in-flight ones get this long to finish, the
    /// rest end with an explicit error.
    pub drain_timeout_ms: u64,
    /// A request still generating this long after submission ends with 408 (streaming: an
    /// SSE error event and `[DONE]`) and is aborted on its worker; 0: no limit.
    pub request_timeout_ms: u64,
    /// A client that has not sent its headers, or then its whole body, within this long gets
    /// 408 and its connection closed (slow-client protection).
    pub client_read_timeout_ms: u64,
    /// With API keys configured, `/metrics` needs an admin key (`/admin/*` always does).
    pub restrict_metrics: bool,
    /// Most prompts one `/v1/completions` (`prompt: [..]`) or `/generate` (`text: [..]`)
    /// request may batch; more is a 400 naming the prompt field.
    pub max_batch_prompts: usize,
    pub mock_workers: u32,
    pub shutdown_workers_on_exit: bool,
    /// Secret workers must prove they know (docs/security.md); `None` needs
    /// `insecure_worker_plane` on a loopback endpoint (checked when the router starts).
    pub worker_secret: Option<WorkerSecret>,
    pub insecure_worker_plane: bool,
}

/// The largest TP level `--tensor-parallel-size` lets the planner consider.
const MAX_TP_LEVEL: u32 = 1024;

/// Prompts one request may batch by default (lm-eval's `--batch_size` stays far below).
pub const DEFAULT_MAX_BATCH_PROMPTS: usize = 256;

/// Requests each default tier holds at once before new ones get 429 (`Tier::max_inflight`).
pub const DEFAULT_TIER_MAX_INFLIGHT: u32 = 1024;

/// Default tiers: strict 250/25 ms, relaxed 2000/100 ms, background; each holds at most
/// `DEFAULT_TIER_MAX_INFLIGHT` requests.
pub fn default_tiers() -> Vec<Tier> {
    let tier = |name: &str, ttft_ms, tpot_ms, background| Tier {
        name: name.into(),
        ttft_ms,
        tpot_ms,
        weight: 1.0,
        background,
        max_inflight: Some(DEFAULT_TIER_MAX_INFLIGHT),
        max_tokens: None,
        reject_unattainable: false,
        preempt: true,
        bind_tp: None,
    };
    vec![
        tier("strict", 250.0, 25.0, false),
        tier("relaxed", 2000.0, 100.0, false),
        tier("background", f64::INFINITY, f64::INFINITY, true),
    ]
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            listen: "127.0.0.1:8000".into(),
            worker_addr: "tcp://127.0.0.1:5557".into(),
            model_dir: None,
            served_model_name: "nitsum".into(),
            model_aliases: Vec::new(),
            chat_template: None,
            default_tp: 1,
            tiers: default_tiers(),
            api_keys: Vec::new(),
            static_plan: None,
            heartbeat_timeout_ms: 10_000,
            worker_gone_ms: 30_000,
            retry_window_ms: 60_000,
            control_window_ms: 1000,
            max_retries: 3,
            profile: None,
            planner: PlannerConfig::default(),
            lookahead: LookaheadConfig::default(),
            reconfigure_timeout_ms: 5000,
            drain_timeout_ms: 30_000,
            request_timeout_ms: 600_000,
            client_read_timeout_ms: 10_000,
            restrict_metrics: false,
            max_batch_prompts: DEFAULT_MAX_BATCH_PROMPTS,
            mock_workers: 0,
            shutdown_workers_on_exit: false,
            worker_secret: None,
            insecure_worker_plane: false,
        }
    }
}

impl RouterConfig {
    /// Merge the config file (if any) and the CLI flags over the defaults, then validate.
    pub fn from_cli(cli: &Cli) -> Result<Self> {
        let file = match &cli.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        let mut cfg = RouterConfig::from_file(file)?;
        let or = |flag: &Option<String>, val: &mut String| {
            if let Some(f) = flag {
                *val = f.clone();
            }
        };
        or(&cli.listen, &mut cfg.listen);
        or(&cli.worker_addr, &mut cfg.worker_addr);
        or(&cli.served_model_name, &mut cfg.served_model_name);
        if let Some(dir) = &cli.model_dir {
            cfg.model_dir = Some(dir.clone());
            if cli.served_model_name.is_none() {
                cfg.served_model_name = model_name_of(dir);
            }
        }
        cfg.model_aliases = cli.model_aliases.clone();
        if cli.chat_template.is_some() {
            cfg.chat_template = cli.chat_template.clone();
        }
        if let Some(tp) = cli.tensor_parallel_size {
            if tp == 0 {
                bail!("--tensor-parallel-size must be >= 1");
            }
            cfg.default_tp = tp;
            // NOTE: a floor for the planner: the levels it may pick are those >= tp (the
            // pool's registered levels intersect them, PlannerConfig::for_pool).
            let allowed: Vec<u32> = match cfg.planner.tp_levels.take() {
                Some(levels) => levels.into_iter().filter(|&l| l >= tp).collect(),
                None => (tp..=MAX_TP_LEVEL).collect(),
            };
            cfg.planner.tp_levels = Some(allowed);
        }
        if let Some(keys) = std::env::var_os(API_KEYS_ENV) {
            let keys = keys.to_str().context("NITSUM_API_KEYS is not UTF-8")?;
            cfg.api_keys.extend(env_api_keys(keys)?);
        }
        cfg.heartbeat_timeout_ms = cli.heartbeat_timeout_ms.unwrap_or(cfg.heartbeat_timeout_ms);
        cfg.worker_gone_ms = cli.worker_gone_ms.unwrap_or(cfg.worker_gone_ms);
        cfg.retry_window_ms = cli.retry_window_ms.unwrap_or(cfg.retry_window_ms);
        cfg.control_window_ms = cli.control_window_ms.unwrap_or(cfg.control_window_ms);
        if cli.profile.is_some() {
            cfg.profile = cli.profile.clone();
        }
        cfg.mock_workers = cli.mock_workers;
        cfg.shutdown_workers_on_exit = cli.shutdown_workers_on_exit;
        cfg.insecure_worker_plane |= cli.insecure_worker_plane;
        if let Some(secret) = std::env::var_os(SECRET_ENV).filter(|s| !s.is_empty()) {
            let secret = secret
                .to_str()
                .context("NITSUM_WORKER_SECRET is not UTF-8")?;
            cfg.worker_secret = Some(WorkerSecret::new(secret).context(SECRET_ENV)?);
        }
        cfg.validate()?;
        Ok(cfg)
    }

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
        let cfg = RouterConfig {
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
            ..d
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reject configs the router cannot serve with.
    pub fn validate(&self) -> Result<()> {
        if self.max_batch_prompts == 0 {
            bail!("config: max_batch_prompts must be at least 1");
        }
        if self.tiers.is_empty() || self.tiers.iter().all(|t| t.background) {
            bail!("config: at least one non-background tier is required");
        }
        for (i, t) in self.tiers.iter().enumerate() {
            if self.tiers[..i].iter().any(|o| o.name == t.name) {
                bail!("config: duplicate tier {:?}", t.name);
            }
            if t.bind_tp == Some(0) {
                bail!("config: tier {:?}: bind_tp must be at least 1", t.name);
            }
        }
        let known = |name: &str| self.tiers.iter().any(|t| t.name == name);
        for k in &self.api_keys {
            for t in k.tiers.iter().chain(&k.default_tier) {
                if !known(t) {
                    bail!("config: API key uses unknown tier {t:?}");
                }
            }
            if let Some(d) = &k.default_tier {
                if !k.tiers.is_empty() && !k.tiers.contains(d) {
                    bail!("config: API key default tier {d:?} is not among its tiers");
                }
            }
            if k.max_inflight == Some(0) || k.burst == Some(0) {
                bail!("config: an API key's max_inflight and burst must be at least 1");
            }
            if k.requests_per_minute
                .is_some_and(|r| !r.is_finite() || r <= 0.0)
            {
                bail!("config: an API key's requests_per_minute must be a positive number");
            }
        }
        for g in self.static_plan.iter().flatten() {
            if g.members.is_empty() {
                bail!("config: plan group without members");
            }
            // NOTE: its tier names were resolved (unknown ones refused) by `from_file`.
        }
        if self.heartbeat_timeout_ms == 0
            || self.control_window_ms == 0
            || self.reconfigure_timeout_ms == 0
            || self.client_read_timeout_ms == 0
        {
            bail!("config: heartbeat_timeout_ms, control_window_ms, reconfigure_timeout_ms and client_read_timeout_ms must be > 0");
        }
        if self.worker_gone_ms < self.heartbeat_timeout_ms {
            bail!(
                "config: worker_gone_ms ({}) must be at least heartbeat_timeout_ms ({}): a worker is suspect before it is gone",
                self.worker_gone_ms,
                self.heartbeat_timeout_ms
            );
        }
        Ok(())
    }

    /// Index of the tier named `name`.
    pub fn tier_index(&self, name: &str) -> Option<TierId> {
        self.tiers.iter().position(|t| t.name == name).map(TierId)
    }

    /// The tier `id` names. NOTE: panics on an id resolved against another tier list (a bug:
    /// the router resolves every `TierId` it holds against this one).
    pub fn tier(&self, id: TierId) -> &Tier {
        &self.tiers[id.index()]
    }
}

fn load_file(path: &Path) -> Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn model_name_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "nitsum".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_config_merges_over_defaults_and_validates() {
        let file: FileConfig = serde_json::from_str(
            r#"{"tiers": [{"name": "gold", "ttft_ms": 100, "tpot_ms": 10},
                          {"name": "bg", "ttft_ms": 0, "tpot_ms": 0, "background": true}],
                "api_keys": [{"key": "k1", "tiers": ["gold"], "default_tier": "gold"}],
                "plan": [{"members": [0, 1], "role": "prefill"}],
                "model_dir": "/models/tiny-llama"}"#,
        )
        .unwrap();
        let cfg = RouterConfig::from_file(file).unwrap();
        assert_eq!(cfg.served_model_name, "tiny-llama");
        assert_eq!(cfg.tier_index("bg"), Some(TierId(1)));
        let plan = cfg.static_plan.unwrap();
        assert_eq!((plan[0].tp, plan[0].role), (2, Role::Prefill));
        assert_eq!(plan[0].tiers, [TierId(0)]);
        assert_eq!(cfg.heartbeat_timeout_ms, 10_000);
    }

    #[test]
    fn tensor_parallel_size_sets_the_default_level_and_the_planners_floor() {
        let cli = Cli::parse_from(["nitsum-router", "--tensor-parallel-size", "2"]);
        let cfg = RouterConfig::from_cli(&cli).unwrap();
        assert_eq!(cfg.default_tp, 2);
        let allowed = cfg.planner.for_pool(&[1, 2, 4], false).tp_levels.unwrap();
        assert_eq!(allowed, [2, 4]);
        let cli = Cli::parse_from(["nitsum-router", "--tensor-parallel-size", "0"]);
        assert!(RouterConfig::from_cli(&cli).is_err());
        assert_eq!(RouterConfig::default().default_tp, 1);
    }

    #[test]
    fn env_api_keys_are_one_a_line_and_may_use_every_tier() {
        let keys = env_api_keys("k1\n\n  k2 \n").unwrap();
        assert_eq!(
            keys.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
            ["k1", "k2"]
        );
        assert!(keys.iter().all(|k| k.tiers.is_empty() && !k.admin));
        assert!(env_api_keys("").unwrap().is_empty());
    }

    #[test]
    fn bad_configs_are_refused() {
        for bad in [
            r#"{"tiers": []}"#,
            r#"{"tiers": [{"name": "b", "ttft_ms": 1, "tpot_ms": 1, "background": true}]}"#,
            r#"{"api_keys": [{"key": "k", "tiers": ["nope"]}]}"#,
            r#"{"api_keys": [{"key": "k", "tiers": ["strict"], "default_tier": "relaxed"}]}"#,
            r#"{"plan": [{"members": [0], "tiers": ["gold"]}]}"#,
            r#"{"api_keys": [{"key": "k", "max_inflight": 0}]}"#,
            r#"{"api_keys": [{"key": "k", "requests_per_minute": 0}]}"#,
            r#"{"api_keys": [{"key": "k", "requests_per_minute": -1.5}]}"#,
            r#"{"api_keys": [{"key": "k", "requests_per_minute": 60, "burst": 0}]}"#,
        ] {
            let file: FileConfig = serde_json::from_str(bad).unwrap();
            assert!(RouterConfig::from_file(file).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<FileConfig>(r#"{"listn": "x"}"#).is_err());
    }

    #[test]
    fn control_loop_settings() {
        let d = RouterConfig::default();
        assert_eq!(
            (d.profile.is_none(), d.reconfigure_timeout_ms),
            (true, 5000)
        );
        let file: FileConfig = serde_json::from_str(
            r#"{"profile": "p.json", "planner": {"tp_levels": [1, 2]},
                "reconfigure_timeout_ms": 700}"#,
        )
        .unwrap();
        let cfg = RouterConfig::from_file(file).unwrap();
        assert_eq!(cfg.profile.as_deref(), Some(Path::new("p.json")));
        assert_eq!(cfg.planner.tp_levels, Some(vec![1, 2]));
        assert_eq!(cfg.planner.keep_utilization, 0.9);
        assert_eq!(cfg.reconfigure_timeout_ms, 700);
        let cli = Cli::try_parse_from(["r", "--profile", "q.json"]).unwrap();
        let cfg = RouterConfig::from_cli(&cli).unwrap();
        assert_eq!(cfg.profile.as_deref(), Some(Path::new("q.json")));
        let file: FileConfig = serde_json::from_str(r#"{"reconfigure_timeout_ms": 0}"#).unwrap();
        assert!(RouterConfig::from_file(file).is_err());
    }
}
