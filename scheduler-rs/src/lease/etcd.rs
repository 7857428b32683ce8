//! The lease across hosts: an etcd v3 lease with a TTL, and a key created under it only if it
//! does not exist (a transaction on its create revision); through etcd's v3 JSON gateway
//! (`POST /v3/lease/grant`, `/v3/kv/txn`, `/v3/kv/range`, `/v3/lease/keepalive`,
//! `/v3/lease/revoke`), which every etcd server since 3.3 answers on its client URL.
//!
//! NOTE (invariants): the leader is whoever created the key; its term is the key's create
//! revision, which etcd raises with every write of the cluster, so a later leader always has a
//! larger term. The key lives as long as its lease: a leader that stops renewing it (dead,
//! paused, cut off) loses the key within the TTL, and counts itself deposed as soon as a
//! renewal fails or finds the lease gone, or the TTL passed since its last renewal.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use super::http::post_json;
use super::{Candidate, LeaderInfo};

/// An etcd lease on `key` at `endpoint` (`http://HOST:PORT`).
#[derive(Debug)]
pub struct EtcdLease {
    endpoint: String,
    key: String,
    ttl_s: u64,
    /// Our lease id and its last successful renewal while we hold the key.
    held: Option<(i64, Instant)>,
}

/// An int64 of etcd's JSON (a string, or a number in hand-written JSON); 0 when absent.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        v => v.as_i64().unwrap_or(0),
    }
}

impl EtcdLease {
    /// A lease on `key` with a TTL of `ttl_s` seconds (etcd raises a TTL below its minimum,
    /// 1.5 election timeouts, to that minimum).
    pub fn new(endpoint: &str, key: &str, ttl_s: u64) -> Self {
        EtcdLease {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            key: key.to_string(),
            ttl_s: ttl_s.max(1),
            held: None,
        }
    }

    fn timeout(&self) -> Duration {
        // NOTE: a call that takes longer than a third of the TTL cannot keep the lease anyway.
        Duration::from_millis(self.ttl_s * 1000 / 3).max(Duration::from_millis(200))
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value> {
        let answer = post_json(&self.endpoint, path, &body, self.timeout()).await?;
        if let Some(error) = answer.get("error").or_else(|| answer.get("message")) {
            bail!("etcd {path}: {error}");
        }
        Ok(answer)
    }

    /// Create the key under a fresh lease if nobody holds it; the term is its create revision.
    pub async fn try_acquire(&mut self, me: &Candidate) -> Result<Option<u64>> {
        if self.held.is_some() {
            return Ok(self.leader().await?.map(|l| l.term));
        }
        let grant = self
            .call("/v3/lease/grant", json!({"TTL": self.ttl_s}))
            .await?;
        let id = int(&grant["ID"]);
        if id == 0 {
            bail!("etcd granted no lease: {grant}");
        }
        let key = B64.encode(&self.key);
        let value = B64.encode(serde_json::to_vec(&me.info(0))?);
        let txn = json!({
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": value, "lease": id.to_string()}}],
        });
        let answer = self.call("/v3/kv/txn", txn).await?;
        if answer["succeeded"].as_bool() != Some(true) {
            let _ = self
                .call("/v3/lease/revoke", json!({"ID": id.to_string()}))
                .await;
            return Ok(None);
        }
        self.held = Some((id, Instant::now()));
        let term = int(&answer["header"]["revision"]);
        Ok(Some(u64::try_from(term).context("etcd revision")?))
    }

    /// As the holder: renew the lease; false once it is lost (gone, or not renewed for a TTL).
    pub async fn keep(&mut self) -> bool {
        let Some((id, renewed)) = self.held else {
            return false;
        };
        let answer = self
            .call("/v3/lease/keepalive", json!({"ID": id.to_string()}))
            .await;
        match answer {
            Ok(a) if int(&a["result"]["TTL"]) > 0 => {
                self.held = Some((id, Instant::now()));
                true
            }
            Ok(_) => {
                self.held = None;
                false
            }
            Err(e) => {
                // NOTE: etcd unreachable: the lease may still stand, but past its TTL it does
                // not, and another router may lead; stop before that.
                let alive = renewed.elapsed() < Duration::from_secs(self.ttl_s);
                tracing::warn!("lease: renewing failed ({e:#}); still leading: {alive}");
                if !alive {
                    self.held = None;
                }
                alive
            }
        }
    }

    /// The leader the key names, with its create revision as the term.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let answer = self
            .call("/v3/kv/range", json!({"key": B64.encode(&self.key)}))
            .await?;
        let Some(kv) = answer["kvs"].as_array().and_then(|kvs| kvs.first()) else {
            return Ok(None);
        };
        let value = B64
            .decode(kv["value"].as_str().unwrap_or_default())
            .context("etcd value")?;
        let mut info: LeaderInfo = serde_json::from_slice(&value).context("leader record")?;
        info.term = u64::try_from(int(&kv["create_revision"])).context("create revision")?;
        Ok(Some(info))
    }

    /// Give the lease up at once (the key goes with it), e.g. on a clean shutdown.
    pub async fn release(&mut self) {
        if let Some((id, _)) = self.held.take() {
            let _ = self
                .call("/v3/lease/revoke", json!({"ID": id.to_string()}))
                .await;
        }
    }
}
