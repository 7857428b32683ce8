//! What every router ↔ worker frame shares: the protocol version `v`, the msgpack encoding
//! (a named map, `rmp_serde::to_vec_named`), and the field-less message.

use serde::{Deserialize, Serialize};

/// Protocol version carried in every message as `v`.
pub const PROTOCOL_VERSION: u32 = 1;

/// A message without fields: `shutdown`, `reregister`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Bare<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
}

pub(super) fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // NOTE: serializing these plain structs into a Vec cannot fail.
    rmp_serde::to_vec_named(msg).expect("msgpack encode")
}
