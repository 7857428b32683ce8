//! Router ↔ worker messages (docs/protocol.md, v1): one msgpack map per ZeroMQ frame with
//! keys `v` and `type`. Encoded with named fields (`rmp_serde::to_vec_named`).
//!
//! Every message type both encodes and decodes, so the golden fixtures of
//! `tests/golden/wire/` (shared with the Python worker's dataclasses) pin both directions
//! (`protocols/wire_golden/`). Router → worker messages borrow what they send (`Cow`), so
//! encoding copies nothing.
//!
//! One message family a file; this module re-exports them all, so `protocols::worker::X`
//! names every wire type.

mod commands;
mod frame;
mod generate;
mod handshake;
mod incoming;
mod liveness;
mod reconfigure;
#[cfg(test)]
mod tests;
mod tokens;

pub use super::worker_stats::Stats;
pub use commands::{encode_abort, encode_flush_cache, encode_reregister, encode_shutdown, Abort};
pub use frame::{Bare, PROTOCOL_VERSION};
pub use generate::{encode_generate, Class, Contract, Generate, Output, Routing, Sampling, Stop};
pub use handshake::{
    encode_challenge, encode_refused, encode_registered, Challenge, Hello, Refused, Register,
    Registered,
};
pub use incoming::{decode_incoming, Body, Incoming};
pub use liveness::{DeviceLost, Heartbeat};
pub use reconfigure::{encode_reconfigure, Reconfigure, Reconfigured, WireGroup};
pub use tokens::{TokenLogprob, Tokens};
