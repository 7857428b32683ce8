//! The resolved router configuration, its defaults and its tiers.

use std::path::PathBuf;

use super::api_key::ApiKey;
use super::parsers::OutputParsers;
use crate::ids::TierId;
use crate::lease::LeaseSpec;
use crate::plan::GroupPlan;
use crate::planner::PlannerConfig;
use crate::sim::lookahead::LookaheadConfig;
use crate::tiers::Tier;
use crate::tokenize::GenerationSource;
use crate::worker_auth::WorkerSecret;

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
    /// Several routers in front of one pool (architecture §4): this router's number; at start
    /// router `i` lets the lease stand free for `i` polls before it takes it, so the
    /// lowest-numbered live router leads.
    pub router_index: u32,
    /// The planning lease (`None`: this router is the only one and plans).
    pub lease: Option<LeaseSpec>,
    /// How long an etcd lease lives without renewal (rounded up to whole seconds; etcd
    /// raises it to its own minimum, 1.5 election timeouts); `None`: [`DEFAULT_LEASE_TTL_MS`].
    /// A file lease has none: it ends with its holder's process.
    pub lease_ttl_ms: Option<u64>,
    /// Where the other routers reach this one when it leads (default: its worker endpoint).
    pub peer_addr: Option<String>,
    /// `--root-path`: the URL prefix a proxy in front adds (`/api`); stripped from a request
    /// path that starts with it (paths without it are served too).
    pub root_path: Option<String>,
    /// `--ssl-certfile` / `--ssl-keyfile`: serve HTTPS only (api/tls.rs).
    pub tls: Option<TlsFiles>,
    /// One log line per request that names its `request_id` (`--disable-log-requests`: off).
    pub log_requests: bool,
    /// `--tokenizer`: the tokenizer files and chat template come from here, not the model
    /// directory.
    pub tokenizer_dir: Option<PathBuf>,
    /// `--generation-config`: where the default sampling values come from.
    pub generation: GenerationSource,
    /// How replies are read for reasoning and tool calls (config/parsers.rs).
    pub parsers: OutputParsers,
}

/// A PEM certificate chain and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// An etcd lease's time to live by default: a dead leader's lease is gone within about a
/// control window (etcd must allow it: election timeout at most 666 ms).
pub const DEFAULT_LEASE_TTL_MS: u64 = 1000;

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
            router_index: 0,
            lease: None,
            lease_ttl_ms: None,
            peer_addr: None,
            root_path: None,
            tls: None,
            log_requests: true,
            tokenizer_dir: None,
            generation: GenerationSource::Model,
            parsers: OutputParsers::default(),
        }
    }
}

impl RouterConfig {
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
