//! Worker-plane authentication (docs/security.md, docs/protocol.md "Handshake").
//!
//! The `zeromq` crate has no CURVE, so workers prove knowledge of a shared secret with a
//! challenge–response: the router answers a `register` without proof by a `challenge`
//! holding a fresh random nonce; the worker repeats `register` with
//! `auth = hex(HMAC-SHA256(secret, nonce ‖ worker_id as u32 big-endian ‖ model as UTF-8))`.
//! A nonce is bound to the connection it was issued to and used at most once.
//!
//! This module holds the secret, the MAC and the startup policy; [`sessions`] tracks which
//! connection is bound to which worker id, [`request_ids`] makes the request ids sent to
//! workers unguessable.

use anyhow::{bail, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ids::WorkerId;

pub mod metrics;
pub mod request_ids;
pub mod sessions;

pub use metrics::{PlaneMetrics, Rejection};
pub use request_ids::RequestIds;
pub use sessions::{Nonce, Sessions};

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

    fn mac(&self, nonce: &Nonce, worker: WorkerId, model: &str) -> HmacSha256 {
        // NOTE: HMAC accepts keys of any length; `new_from_slice` cannot fail for HMAC.
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(nonce.as_bytes());
        // NOTE: the proof covers the id as the u32 the wire carries (Python: `to_bytes(4, "big")`).
        mac.update(&worker.0.to_be_bytes());
        mac.update(model.as_bytes());
        mac
    }

    /// The proof a worker sends in `register.auth` (64 lowercase hex characters).
    pub fn proof(&self, nonce: &Nonce, worker: WorkerId, model: &str) -> String {
        hex(&self.mac(nonce, worker, model).finalize().into_bytes())
    }

    /// Whether `proof` (hex) is the right proof. NOTE: compared in constant time.
    pub fn verify(&self, nonce: &Nonce, worker: WorkerId, model: &str, proof: &str) -> bool {
        match unhex(proof) {
            Some(bytes) => self.mac(nonce, worker, model).verify_slice(&bytes).is_ok(),
            None => false,
        }
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

    #[test]
    fn proof_verifies_only_for_its_nonce_worker_model_and_secret() {
        let s = WorkerSecret::new("0123456789abcdef-secret").unwrap();
        let n = Nonce::random();
        let (w3, w4) = (WorkerId(3), WorkerId(4));
        let p = s.proof(&n, w3, "tiny");
        assert_eq!(p.len(), 64);
        assert!(s.verify(&n, w3, "tiny", &p));
        assert!(s.verify(&n, w3, "tiny", &p.to_uppercase()));
        assert!(!s.verify(&n, w4, "tiny", &p), "another worker id");
        assert!(!s.verify(&n, w3, "other", &p), "another model");
        assert!(!s.verify(&Nonce::random(), w3, "tiny", &p), "another nonce");
        let other = WorkerSecret::new("another-secret-of-16+").unwrap();
        assert!(!other.verify(&n, w3, "tiny", &p), "another secret");
        for bad in ["", "zz", &p[..63], &p[..62], "00"] {
            assert!(!s.verify(&n, w3, "tiny", bad), "{bad:?}");
        }
    }

    #[test]
    fn proof_matches_a_known_vector() {
        // The same vector is checked by the Python worker's tests (tests/test_worker_auth.py).
        let s = WorkerSecret::new("nitsum-test-secret-0001").unwrap();
        let n = Nonce::from_hex(&"ab".repeat(32)).unwrap();
        assert_eq!(
            s.proof(&n, WorkerId(7), "tiny"),
            "946c70f6dbefeb483b9ddb5eba200027107e6991d29f1336966db503d5aba95e"
        );
    }

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
