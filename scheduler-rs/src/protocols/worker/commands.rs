//! Router → worker commands without a reply: `abort`, `flush_cache`, `shutdown` and
//! `reregister`.

use serde::{Deserialize, Serialize};

use super::frame::{encode, Bare, PROTOCOL_VERSION};

/// `abort` (router → worker): end the request (a no-op when unknown or finished).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Abort<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub request_id: &'a str,
}

/// Encode `abort`.
pub fn encode_abort(request_id: &str) -> Vec<u8> {
    encode(&Abort {
        v: PROTOCOL_VERSION,
        ty: "abort",
        request_id,
    })
}

/// Encode `flush_cache`: drop the prefix caches' pages no running request holds
/// (`/flush_cache`, `/reset_prefix_cache`).
pub fn encode_flush_cache() -> Vec<u8> {
    encode(&Bare {
        v: PROTOCOL_VERSION,
        ty: "flush_cache",
    })
}

/// Encode `shutdown`.
pub fn encode_shutdown() -> Vec<u8> {
    encode(&Bare {
        v: PROTOCOL_VERSION,
        ty: "shutdown",
    })
}

/// Encode `reregister`: the answer to a heartbeat from a worker the router does not know
/// (declared dead, or registered with a previous router process).
pub fn encode_reregister() -> Vec<u8> {
    encode(&Bare {
        v: PROTOCOL_VERSION,
        ty: "reregister",
    })
}
