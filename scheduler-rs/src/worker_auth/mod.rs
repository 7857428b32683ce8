//! Worker-plane authentication (docs/security.md, docs/protocol.md "Handshake").
//!
//! The `zeromq` crate has no CURVE, so router and worker prove knowledge of a shared secret to
//! each other with a challenge–response over two nonces (handshake version
//! [`HANDSHAKE_VERSION`]): the worker opens with `hello` carrying its nonce; the router answers
//! `challenge` with its own nonce and `proof = HMAC(secret, "router" label ‖ worker nonce ‖
//! router nonce ‖ worker_id)`; the worker checks that proof before it sends anything else and
//! answers `register` with `auth = HMAC(secret, "worker" label ‖ worker nonce ‖ router nonce ‖
//! worker_id ‖ model)`. The labels differ, so neither side's proof passes for the other's; both
//! nonces are in both, so a proof made for one handshake passes in no other.
//! A router nonce is bound to the connection it was issued to and used at most once.
//!
//! The handshake ends in a sealed channel ([`channel`]): keys per direction derived from the
//! secret, both nonces and the exact handshake frames; every later frame is AES-256-GCM.
//!
//! This module holds the secret, the MACs and the startup policy; [`sessions`] tracks which
//! connection is bound to which worker id, [`request_ids`] makes the request ids sent to
//! workers unguessable, [`refusal_log`] keeps refused registers from flooding the log.

use anyhow::{bail, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ids::WorkerId;

pub mod channel;
pub mod metrics;
pub mod refusal_log;
pub mod request_ids;
pub mod sessions;

pub use channel::{ChannelKeys, Channels, Opened};
pub use metrics::{PlaneMetrics, Rejection};
pub use request_ids::RequestIds;
pub use sessions::{HandshakeNonces, Nonce, Sessions};

/// The handshake version `hello` and `challenge` carry (docs/protocol.md "Handshake").
pub const HANDSHAKE_VERSION: u32 = 3;
/// What the router's proof starts with. NOTE: both labels have the same length and differ,
/// so a proof made by one side never verifies as the other's. (Version 3 kept version 2's
/// proofs; it added the sealed channel, [`channel`].)
const ROUTER_LABEL: &[u8] = b"nitsum-handshake-v2 router";
/// What the worker's proof starts with.
const WORKER_LABEL: &[u8] = b"nitsum-handshake-v2 worker";

/// Environment variable holding the shared worker secret (router and workers).
pub const SECRET_ENV: &str = "NITSUM_WORKER_SECRET";
/// A configured secret shorter than this is refused (a guessable secret is no secret).
pub const MIN_SECRET_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// The shared secret workers prove they know. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerSecret(Vec<u8>);

impl std::fmt::Debug for WorkerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerSecret(<redacted>)")
    }
}

impl WorkerSecret {
    /// A configured secret (its UTF-8 bytes are the HMAC key); at least [`MIN_SECRET_BYTES`].
    pub fn new(secret: &str) -> Result<Self> {
        let secret = secret.trim();
        if secret.len() < MIN_SECRET_BYTES {
            bail!(
                "the worker secret must be at least {MIN_SECRET_BYTES} bytes \
                 (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
            );
        }
        Ok(WorkerSecret(secret.as_bytes().to_vec()))
    }

    /// A fresh random secret (64 hex characters), e.g. for in-process mock workers.
    pub fn generate() -> Self {
        let bytes = random_bytes::<32>();
        WorkerSecret(hex(&bytes).into_bytes())
    }

    /// The secret's bytes (the HKDF input keying material of [`channel::ChannelKeys`]).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, label: &[u8], n: &HandshakeNonces, worker: WorkerId, model: &str) -> HmacSha256 {
        // NOTE: HMAC accepts keys of any length; `new_from_slice` cannot fail for HMAC.
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(label);
        mac.update(n.worker.as_bytes());
        mac.update(n.router.as_bytes());
        // NOTE: the proof covers the id as the u32 the wire carries (Python: `to_bytes(4, "big")`).
        mac.update(&worker.0.to_be_bytes());
        mac.update(model.as_bytes());
        mac
    }

    /// The router's proof in `challenge.proof` (64 lowercase hex characters).
    pub fn router_proof(&self, n: &HandshakeNonces, worker: WorkerId) -> String {
        hex(&self
            .mac(ROUTER_LABEL, n, worker, "")
            .finalize()
            .into_bytes())
    }

    /// Whether `proof` (hex) is the router's proof for this handshake (what a worker checks).
    /// NOTE: compared in constant time.
    pub fn verify_router_proof(&self, n: &HandshakeNonces, worker: WorkerId, proof: &str) -> bool {
        let mac = self.mac(ROUTER_LABEL, n, worker, "");
        unhex(proof).is_some_and(|bytes| mac.verify_slice(&bytes).is_ok())
    }

    /// The worker's proof in `register.auth` (64 lowercase hex characters).
    pub fn worker_proof(&self, n: &HandshakeNonces, worker: WorkerId, model: &str) -> String {
        hex(&self
            .mac(WORKER_LABEL, n, worker, model)
            .finalize()
            .into_bytes())
    }

    /// Whether `proof` (hex) is the worker's proof for this handshake, id and model.
    /// NOTE: compared in constant time.
    pub fn verify_worker_proof(
        &self,
        n: &HandshakeNonces,
        worker: WorkerId,
        model: &str,
        proof: &str,
    ) -> bool {
        let mac = self.mac(WORKER_LABEL, n, worker, model);
        unhex(proof).is_some_and(|bytes| mac.verify_slice(&bytes).is_ok())
    }
}

impl WorkerSecret {
    /// The hex HMAC-SHA256 of `data` (router ↔ router messages, `protocols/peer.rs`).
    pub fn mac_hex(&self, data: &[u8]) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(data);
        hex(&mac.finalize().into_bytes())
    }

    /// Whether `mac` (hex) is [`Self::mac_hex`] of `data`. NOTE: compared in constant time.
    pub fn verify_mac_hex(&self, data: &[u8], mac: &str) -> bool {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(data);
        unhex(mac).is_some_and(|bytes| m.verify_slice(&bytes).is_ok())
    }
}

/// Whether a worker endpoint (`tcp://HOST:PORT`, `ipc://…`) is reachable only from this host.
pub fn is_local_endpoint(addr: &str) -> bool {
    if addr.starts_with("ipc://") || addr.starts_with("inproc://") {
        return true;
    }
    let Some(rest) = addr.strip_prefix("tcp://") else {
        return false;
    };
    let host = match rest.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => rest,
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The startup policy (docs/security.md): with a secret, workers authenticate. Without one the
/// router refuses to start, unless `insecure` was asked for explicitly and the endpoint is
/// loopback-only (then it logs a loud warning). Returns whether workers must authenticate.
pub fn check_policy(secret: Option<&WorkerSecret>, insecure: bool, addr: &str) -> Result<bool> {
    match (secret, insecure) {
        (Some(_), _) => Ok(true),
        (None, true) if is_local_endpoint(addr) => {
            tracing::warn!(
                endpoint = addr,
                "INSECURE: worker authentication is OFF (--insecure-worker-plane). Any local \
                 process can register as a worker, read prompts and answer them. Set \
                 {SECRET_ENV} instead (docs/security.md)."
            );
            Ok(false)
        }
        (None, true) => bail!(
            "refusing --insecure-worker-plane on {addr}: it is not a loopback endpoint; set \
             {SECRET_ENV} (or `worker_secret` in the config) for the router and its workers"
        ),
        (None, false) => bail!(
            "no worker secret: set {SECRET_ENV} (or `worker_secret` in the config) for the \
             router and its workers (`nitsum serve` does this for its own workers); for local \
             development on a loopback endpoint only, --insecure-worker-plane turns \
             authentication off (docs/security.md)"
        ),
    }
}

/// `N` bytes from the operating system's CSPRNG.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // NOTE: without OS randomness the router cannot authenticate anyone: fail loudly.
    getrandom::fill(&mut b).expect("the operating system's random number generator failed");
    b
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Bytes of a hex string (either case); `None` when it is not hex of whole bytes.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 1024 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonces() -> HandshakeNonces {
        HandshakeNonces {
            worker: Nonce::random(),
            router: Nonce::random(),
        }
    }

    #[test]
    fn proofs_verify_only_for_their_side_nonces_worker_model_and_secret() {
        let s = WorkerSecret::new("0123456789abcdef-secret").unwrap();
        let n = nonces();
        let (w3, w4) = (WorkerId(3), WorkerId(4));
        let p = s.worker_proof(&n, w3, "tiny");
        assert_eq!(p.len(), 64);
        assert!(s.verify_worker_proof(&n, w3, "tiny", &p));
        assert!(s.verify_worker_proof(&n, w3, "tiny", &p.to_uppercase()));
        assert!(
            !s.verify_worker_proof(&n, w4, "tiny", &p),
            "another worker id"
        );
        assert!(!s.verify_worker_proof(&n, w3, "other", &p), "another model");
        let other_worker_nonce = HandshakeNonces {
            worker: Nonce::random(),
            ..n
        };
        let other_router_nonce = HandshakeNonces {
            router: Nonce::random(),
            ..n
        };
        assert!(!s.verify_worker_proof(&other_worker_nonce, w3, "tiny", &p));
        assert!(!s.verify_worker_proof(&other_router_nonce, w3, "tiny", &p));
        let other = WorkerSecret::new("another-secret-of-16+").unwrap();
        assert!(
            !other.verify_worker_proof(&n, w3, "tiny", &p),
            "another secret"
        );
        for bad in ["", "zz", &p[..63], &p[..62], "00"] {
            assert!(!s.verify_worker_proof(&n, w3, "tiny", bad), "{bad:?}");
        }
        // The router's proof: its own label, so neither side's proof passes for the other's.
        let r = s.router_proof(&n, w3);
        assert!(s.verify_router_proof(&n, w3, &r));
        assert!(!s.verify_router_proof(&other_worker_nonce, w3, &r));
        assert!(!s.verify_router_proof(&n, w4, &r));
        assert!(!other.verify_router_proof(&n, w3, &r));
        assert!(
            !s.verify_worker_proof(&n, w3, "", &r),
            "a router proof is no worker proof"
        );
        assert!(!s.verify_router_proof(&n, w3, &s.worker_proof(&n, w3, "")));
    }

    #[test]
    fn proofs_match_known_vectors() {
        // The same vectors are checked by the Python worker's tests (tests/test_worker_protocol.py).
        let s = WorkerSecret::new("nitsum-test-secret-0001").unwrap();
        let n = HandshakeNonces {
            worker: Nonce::from_hex(&"ab".repeat(32)).unwrap(),
            router: Nonce::from_hex(&"cd".repeat(32)).unwrap(),
        };
        assert_eq!(s.router_proof(&n, WorkerId(7)), ROUTER_VECTOR);
        assert_eq!(s.worker_proof(&n, WorkerId(7), "tiny"), WORKER_VECTOR);
    }

    const ROUTER_VECTOR: &str = "f4f77be8f6514f3a2f624bbee5db92b568ad5f0517369f85321b1d18ca245db8";
    const WORKER_VECTOR: &str = "e26dc0e8e309d10a1db7e74eb7774853d021734b33642178f1d4e2d488e03f15";

    #[test]
    fn short_secrets_are_refused_and_debug_redacts() {
        assert!(WorkerSecret::new("short").is_err());
        let s = WorkerSecret::generate();
        assert!(!format!("{s:?}").contains(&String::from_utf8_lossy(&s.0).to_string()));
        assert_ne!(WorkerSecret::generate(), s);
    }

    #[test]
    fn policy_requires_a_secret_off_loopback() {
        let s = WorkerSecret::generate();
        assert!(check_policy(Some(&s), false, "tcp://0.0.0.0:5557").unwrap());
        assert!(check_policy(None, false, "tcp://127.0.0.1:5557").is_err());
        assert!(!check_policy(None, true, "tcp://127.0.0.1:5557").unwrap());
        assert!(!check_policy(None, true, "tcp://[::1]:5557").unwrap());
        assert!(!check_policy(None, true, "tcp://localhost:0").unwrap());
        assert!(check_policy(None, true, "tcp://0.0.0.0:5557").is_err());
        assert!(check_policy(None, true, "tcp://10.0.0.5:5557").is_err());
        assert!(check_policy(None, true, "tcp://*:5557").is_err());
    }
}
