//! What a configuration must satisfy for the router to serve with it.

use anyhow::{bail, Result};

use super::router::RouterConfig;
use crate::lease::LeaseSpec;

impl RouterConfig {
    /// Reject configs the router cannot serve with.
    pub fn validate(&self) -> Result<()> {
        self.parsers.check()?;
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
        if self.lease.is_none()
            && (self.router_index != 0 || self.peer_addr.is_some() || self.lease_ttl_ms.is_some())
        {
            bail!("config: router_index, peer_addr and lease_ttl_ms are for several routers: set a lease (--lease file:PATH or etcd:URL)");
        }
        if self.lease.is_some() && self.shutdown_workers_on_exit {
            bail!("config: shutdown_workers_on_exit with a lease would stop the pool the other routers serve");
        }
        if let Some(ttl) = self.lease_ttl_ms {
            if ttl == 0 {
                bail!("config: lease_ttl_ms must be > 0");
            }
            if matches!(self.lease, Some(LeaseSpec::File(_))) {
                bail!("config: lease_ttl_ms applies to an etcd lease; a file lease ends with its holder's process");
            }
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
}
