//! The planning lease of several routers in front of one pool (architecture §4 "Several
//! routers"): whoever holds it is the leader, the one router that plans. It comes from an
//! existing store: an `flock` on a shared file on one host (`file.rs`), an etcd lease across
//! hosts (`etcd.rs`). Its holder publishes where followers reach it (`LeaderInfo`) and gets a
//! term that only grows from one holder to the next: plans are numbered by it (the epoch's
//! high 32 bits), so workers, which refuse an epoch older than theirs, refuse a deposed
//! leader's plans.

mod etcd;
mod http;
mod lock_file;

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

pub use etcd::EtcdLease;
pub use lock_file::FileLease;

/// The etcd key of the lease when `--lease etcd:URL` names none.
pub const DEFAULT_ETCD_KEY: &str = "/nitsum/leader";

/// Where the lease lives (`--lease`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseSpec {
    /// `file:PATH`: an flock on PATH (one host).
    File(PathBuf),
    /// `etcd:http://HOST:PORT[/KEY]`: a key under an etcd lease (across hosts).
    Etcd { endpoint: String, key: String },
}

impl LeaseSpec {
    /// Parse `file:PATH` or `etcd:http://HOST:PORT[/KEY]`.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(path) = s.strip_prefix("file:") {
            if path.is_empty() {
                bail!("--lease file:PATH needs a path");
            }
            return Ok(LeaseSpec::File(PathBuf::from(path)));
        }
        if let Some(url) = s.strip_prefix("etcd:") {
            let Some(rest) = url.strip_prefix("http://") else {
                bail!(
                    "--lease etcd:URL: the URL must be http://HOST:PORT[/KEY] (etcd's client URL)"
                );
            };
            let (host, key) = match rest.find('/') {
                Some(i) if i + 1 < rest.len() => (&rest[..i], rest[i..].to_string()),
                Some(i) => (&rest[..i], DEFAULT_ETCD_KEY.to_string()),
                None => (rest, DEFAULT_ETCD_KEY.to_string()),
            };
            if host.is_empty() {
                bail!("--lease etcd:URL needs a HOST:PORT");
            }
            return Ok(LeaseSpec::Etcd {
                endpoint: format!("http://{host}"),
                key,
            });
        }
        bail!("--lease {s:?}: expected file:PATH or etcd:http://HOST:PORT[/KEY]")
    }
}

/// What the lease holder publishes: who leads, where its followers reach it, under which
/// term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// The leader's router index (`--router-index`).
    pub index: u32,
    /// Its worker endpoint, where followers send their statistics (`--peer-addr`).
    pub addr: String,
    /// The holder's term (etcd: the key's create revision, not stored in the value).
    #[serde(default)]
    pub term: u64,
}

/// A router that may take the lease.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub index: u32,
    pub addr: String,
}

impl Candidate {
    /// What it publishes under `term`.
    pub fn info(&self, term: u64) -> LeaderInfo {
        LeaderInfo {
            index: self.index,
            addr: self.addr.clone(),
            term,
        }
    }
}

/// An open lease of either store.
#[derive(Debug)]
pub enum Lease {
    File(FileLease),
    Etcd(EtcdLease),
}

impl Lease {
    /// The lease `spec` names; an etcd lease lives `ttl_s` seconds without renewal.
    pub fn open(spec: &LeaseSpec, ttl_s: u64) -> Self {
        match spec {
            LeaseSpec::File(path) => Lease::File(FileLease::new(path)),
            LeaseSpec::Etcd { endpoint, key } => Lease::Etcd(EtcdLease::new(endpoint, key, ttl_s)),
        }
    }

    /// Take the lease if nobody holds it, publishing `me`: `Some(term)` when we hold it.
    pub async fn try_acquire(&mut self, me: &Candidate) -> Result<Option<u64>> {
        match self {
            Lease::File(l) => l.try_acquire(me),
            Lease::Etcd(l) => l.try_acquire(me).await,
        }
    }

    /// As the holder: keep the lease; false once it is lost (never true again until a new
    /// `try_acquire`).
    pub async fn keep(&mut self) -> bool {
        match self {
            Lease::File(l) => l.keep(),
            Lease::Etcd(l) => l.keep().await,
        }
    }

    /// Who holds the lease now, as published; `None` when nobody does.
    pub async fn leader(&mut self) -> Result<Option<LeaderInfo>> {
        match self {
            Lease::File(l) => l.leader(),
            Lease::Etcd(l) => l.leader().await,
        }
    }

    /// Give the lease up now (a clean shutdown: followers need not wait for it to expire).
    pub async fn release(&mut self) {
        match self {
            Lease::File(l) => l.release(),
            Lease::Etcd(l) => l.release().await,
        }
    }
}

#[cfg(test)]
mod tests;
