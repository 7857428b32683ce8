//! The `nitsum-router` command line, and the configuration it resolves to (flags override
//! the config file).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;

use super::api_key::{env_api_keys, API_KEYS_ENV};
use super::config_file::{load_file, model_name_of, FileConfig};
use super::router::{RouterConfig, TlsFiles};
use crate::lease::LeaseSpec;
use crate::tokenize::GenerationSource;
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
    /// Several routers in front of one pool: this router's number (0, 1, ...); the
    /// lowest-numbered live one leads.
    #[arg(long)]
    pub router_index: Option<u32>,
    /// Several routers: the planning lease they share, `file:PATH` (one host) or
    /// `etcd:http://HOST:PORT[/KEY]` (across hosts). Without it this router plans alone.
    #[arg(long)]
    pub lease: Option<String>,
    /// Several routers: how long an etcd lease lives without renewal (whole seconds).
    #[arg(long)]
    pub lease_ttl_ms: Option<u64>,
    /// Several routers: where the others reach this router when it leads (default: its
    /// worker endpoint, which must then not be a wildcard address).
    #[arg(long)]
    pub peer_addr: Option<String>,
    /// Read reasoning out of replies into `reasoning_content`: deepseek_r1 or qwen3.
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// The format of tool calls the model chooses to make: hermes, llama3_json, mistral or
    /// pythonic.
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Serve `tool_choice: "auto"` (needs --tool-call-parser), as vLLM's flag.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    #[command(flatten)]
    pub launch: LaunchFlags,
}

/// vLLM's HTTP-side launch flags (`nitsum serve` passes them on under these names).
#[derive(Debug, clap::Args, Default)]
pub struct LaunchFlags {
    /// A URL prefix a proxy in front adds (`/api`): stripped from request paths.
    #[arg(long)]
    pub root_path: Option<String>,
    /// PEM certificate chain: serve HTTPS (with --ssl-keyfile).
    #[arg(long)]
    pub ssl_certfile: Option<PathBuf>,
    /// PEM private key of --ssl-certfile.
    #[arg(long)]
    pub ssl_keyfile: Option<PathBuf>,
    /// No log line per request.
    #[arg(long)]
    pub disable_log_requests: bool,
    /// A directory whose tokenizer.json, tokenizer_config.json and chat template are used
    /// instead of the model directory's.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Default sampling values: auto (the model's generation_config.json), vllm (none) or a
    /// directory holding generation_config.json.
    #[arg(long)]
    pub generation_config: Option<String>,
}

impl LaunchFlags {
    /// Set what these flags ask for on `cfg`.
    fn apply(&self, cfg: &mut RouterConfig) -> Result<()> {
        if let Some(root) = &self.root_path {
            let root = root.trim_end_matches('/');
            if !root.starts_with('/') {
                bail!("--root-path {root}: must start with /");
            }
            cfg.root_path = (!root.is_empty()).then(|| root.to_string());
        }
        cfg.tls = match (&self.ssl_certfile, &self.ssl_keyfile) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            _ => bail!("--ssl-certfile and --ssl-keyfile go together"),
        };
        cfg.log_requests &= !self.disable_log_requests;
        if self.tokenizer.is_some() {
            cfg.tokenizer_dir = self.tokenizer.clone();
        }
        if let Some(gen) = &self.generation_config {
            cfg.generation = GenerationSource::parse(gen)?;
        }
        Ok(())
    }
}

/// The largest TP level `--tensor-parallel-size` lets the planner consider.
const MAX_TP_LEVEL: u32 = 1024;

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
        cfg.router_index = cli.router_index.unwrap_or(cfg.router_index);
        if let Some(spec) = &cli.lease {
            cfg.lease = Some(LeaseSpec::parse(spec)?);
        }
        cfg.lease_ttl_ms = cli.lease_ttl_ms.or(cfg.lease_ttl_ms);
        if cli.peer_addr.is_some() {
            cfg.peer_addr = cli.peer_addr.clone();
        }
        cfg.mock_workers = cli.mock_workers;
        cfg.shutdown_workers_on_exit = cli.shutdown_workers_on_exit;
        cfg.insecure_worker_plane |= cli.insecure_worker_plane;
        cli.launch.apply(&mut cfg)?;
        if let Some(secret) = std::env::var_os(SECRET_ENV).filter(|s| !s.is_empty()) {
            let secret = secret
                .to_str()
                .context("NITSUM_WORKER_SECRET is not UTF-8")?;
            cfg.worker_secret = Some(WorkerSecret::new(secret).context(SECRET_ENV)?);
        }
        let (reasoning, tools) = (&cli.reasoning_parser, &cli.tool_call_parser);
        let auto = cli.enable_auto_tool_choice;
        cfg.parsers
            .set(reasoning.as_deref(), tools.as_deref(), auto)?;
        cfg.validate()?;
        Ok(cfg)
    }
}
