//! Request ids on the worker wire: unguessable, and unique across router restarts.
//!
//! Inside the router a request is a counter value (`u64`, from 1). On the wire it is 32
//! lowercase hex characters: a 64-bit tag, then the counter. The tag is the first 8 bytes of
//! HMAC-SHA256(key, counter as u64 big-endian) under a random key drawn at every router start,
//! so a peer that saw some ids cannot forge another one, and ids of an earlier router process
//! do not decode in a later one (docs/protocol.md, docs/security.md).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::random_bytes;

/// Length of a wire request id.
pub const WIRE_LEN: usize = 32;

/// Encodes and checks wire request ids with this router process's key.
#[derive(Clone)]
pub struct RequestIds {
    key: [u8; 32],
}

impl std::fmt::Debug for RequestIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestIds(<key redacted>)")
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::new()
    }
}

impl RequestIds {
    /// A fresh random key.
    pub fn new() -> Self {
        RequestIds {
            key: random_bytes(),
        }
    }

    fn mac(&self, id: u64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        mac.update(&id.to_be_bytes());
        mac
    }

    /// The wire form of request `id`.
    pub fn encode(&self, id: u64) -> String {
        let tag = self.mac(id).finalize().into_bytes();
        let tag = u64::from_be_bytes(tag[..8].try_into().expect("8 bytes"));
        format!("{tag:016x}{id:016x}")
    }

    /// The request a wire id names; `None` for anything this router did not issue.
    pub fn decode(&self, wire: &str) -> Option<u64> {
        if wire.len() != WIRE_LEN || !wire.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let tag = u64::from_str_radix(&wire[..16], 16).ok()?;
        let id = u64::from_str_radix(&wire[16..], 16).ok()?;
        // NOTE: constant-time comparison of the tag.
        self.mac(id)
            .verify_truncated_left(&tag.to_be_bytes())
            .is_ok()
            .then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_forgeries_fail() {
        let ids = RequestIds::new();
        let w = ids.encode(1);
        assert_eq!(w.len(), WIRE_LEN);
        assert_eq!(ids.decode(&w), Some(1));
        assert_eq!(ids.decode(&w.to_uppercase()), Some(1));
        // Another counter with the same tag, a guessed counter, garbage: refused.
        assert_eq!(ids.decode(&format!("{}{:016x}", &w[..16], 2)), None);
        for bad in ["1", "2", "", &w[..31], &format!("{w}0"), &"g".repeat(32)] {
            assert_eq!(ids.decode(bad), None, "{bad:?}");
        }
        // Another router process (another key) issues other ids and refuses these.
        let restarted = RequestIds::new();
        assert_ne!(restarted.encode(1), w);
        assert_eq!(restarted.decode(&w), None);
    }
}
