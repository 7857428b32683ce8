//! Decoding a worker → router message: the shared envelope, then the typed body its `type`
//! names.

use serde::Deserialize;

use super::frame::PROTOCOL_VERSION;
use super::handshake::{Hello, Register};
use super::liveness::{DeviceLost, Heartbeat};
use super::reconfigure::Reconfigured;
use super::tokens::Tokens;
use crate::ids::WorkerId;
use crate::protocols::worker_stats::Stats;

/// Any worker → router message: the envelope every type shares (`v`, `worker_id`) and its
/// typed body. Unknown keys are ignored (forward compatible).
#[derive(Debug)]
pub struct Incoming {
    pub v: u32,
    /// The `worker_id` the message names (checked against its connection's binding).
    pub worker_id: Option<WorkerId>,
    pub body: Body,
}

/// A worker message's body, by its `type`.
#[derive(Debug, PartialEq)]
pub enum Body {
    Hello(Hello),
    Register(Register),
    Heartbeat(Heartbeat),
    /// A host worker's device process died: out of the plan at once, like a missed heartbeat.
    DeviceLost(DeviceLost),
    Tokens(Tokens),
    Reconfigured(Reconfigured),
    /// Counters and gauges for `/metrics` (boxed: it is the largest body by far).
    Stats(Box<Stats>),
    /// A type this router does not know (dropped with a warning).
    Unknown(String),
}

impl Body {
    /// The message's `type`, for logs.
    pub fn kind(&self) -> &str {
        match self {
            Body::Hello(_) => "hello",
            Body::Register(_) => "register",
            Body::Heartbeat(_) => "heartbeat",
            Body::DeviceLost(_) => "device_lost",
            Body::Tokens(_) => "tokens",
            Body::Reconfigured(_) => "reconfigured",
            Body::Stats(_) => "stats",
            Body::Unknown(ty) => ty,
        }
    }
}

/// What every worker message has.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope {
    v: u32,
    #[serde(rename = "type")]
    ty: String,
    worker_id: Option<WorkerId>,
}

/// Decode a worker message: the envelope, then the body its `type` names.
/// NOTE: a message of another protocol version keeps its body undecoded (`Unknown`): the
/// caller refuses it by its version, whatever shape its fields have there.
pub fn decode_incoming(bytes: &[u8]) -> Result<Incoming, rmp_serde::decode::Error> {
    let env: Envelope = rmp_serde::from_slice(bytes)?;
    if env.v != PROTOCOL_VERSION {
        return Ok(Incoming {
            v: env.v,
            worker_id: env.worker_id,
            body: Body::Unknown(env.ty),
        });
    }
    let body = match env.ty.as_str() {
        "hello" => Body::Hello(rmp_serde::from_slice(bytes)?),
        "register" => Body::Register(rmp_serde::from_slice(bytes)?),
        "heartbeat" => Body::Heartbeat(rmp_serde::from_slice(bytes)?),
        "device_lost" => Body::DeviceLost(rmp_serde::from_slice(bytes)?),
        "tokens" => Body::Tokens(rmp_serde::from_slice(bytes)?),
        "reconfigured" => Body::Reconfigured(rmp_serde::from_slice(bytes)?),
        "stats" => Body::Stats(Box::new(rmp_serde::from_slice(bytes)?)),
        _ => Body::Unknown(env.ty),
    };
    Ok(Incoming {
        v: env.v,
        worker_id: env.worker_id,
        body,
    })
}
