//! A worker's liveness messages (worker → router): `heartbeat`, and `device_lost` when one
//! of a host worker's device processes died.

use serde::{Deserialize, Serialize};

/// `heartbeat`: liveness and load.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Heartbeat {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub free_pages: Option<u64>,
    pub epoch: Option<u64>,
}

/// `device_lost`: the worker id's device process died (a host worker serves several ids);
/// the router treats it as dead now rather than after the heartbeat timeout. The id comes
/// back with a `register` once its host worker restarted the device.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceLost {
    /// Why, for the log (e.g. the exit code).
    pub reason: Option<String>,
}
