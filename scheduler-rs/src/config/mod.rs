//! Router configuration: a JSON config file (all fields optional) overridden by CLI flags.
//!
//! See `docs/router.md` for the file format. One concept a file: the command line (cli.rs),
//! the config file (file.rs), API keys (api_key.rs), reply parsers (parsers.rs), the resolved configuration and its
//! defaults (router.rs) and what it must satisfy (validate.rs).

mod api_key;
mod cli;
mod config_file;
mod parsers;
mod router;
#[cfg(test)]
mod tests;
mod validate;

pub use api_key::{env_api_keys, ApiKey, API_KEYS_ENV};
pub use cli::Cli;
pub use config_file::{FileConfig, StaticGroup};
pub use parsers::OutputParsers;
pub use router::{
    default_tiers, RouterConfig, TlsFiles, DEFAULT_LEASE_TTL_MS, DEFAULT_MAX_BATCH_PROMPTS,
    DEFAULT_TIER_MAX_INFLIGHT,
};
