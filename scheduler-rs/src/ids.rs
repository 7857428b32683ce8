//! Typed identifiers of the router's state: [`WorkerId`] (a device worker) and [`TierId`] (a
//! configured SLO tier, by position). Both were bare integers, and the router also handles
//! other bare integers of the same widths (plan device numbers, token ids, counts); the
//! newtypes make passing one where another is expected a compile error.
//!
//! NOTE: both serialize as the bare number (`#[serde(transparent)]`), so the worker protocol
//! (msgpack), `/admin/plan` JSON and metrics labels are byte-identical to the untyped form.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The id of one device worker: the `worker_id` it sends in every message of the worker
/// protocol (docs/protocol.md), under which the router registers it, binds its connection
/// and tracks the requests it serves.
///
/// Where it comes from: the worker chooses it (`nitsum serve` numbers its device workers
/// `0..n`; mock workers use `0..n` too) and states it in `register`; the handshake admits at
/// most one live connection per id.
///
/// NOTE (invariant): worker `n` drives plan device `n`. Plans ([`crate::plan::GroupPlan`]
/// members and leaders) and the dispatcher number devices with bare `u32`s, shared with the
/// planner and the simulator, which know nothing of workers. The router crosses between the
/// two only through [`WorkerId::of_device`] and [`WorkerId::device`], so a worker id never
/// flows into device arithmetic (TP alignment, group membership) unnoticed, nor the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// The worker that drives plan device `device` (a group member or leader).
    pub const fn of_device(device: u32) -> Self {
        WorkerId(device)
    }

    /// The plan device this worker drives (to find it among a group's members).
    pub const fn device(self) -> u32 {
        self.0
    }
}

impl fmt::Display for WorkerId {
    /// The bare number, as on the wire and in log and error messages ("worker 3 died").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A configured SLO tier, as its position in the config's tier list
/// ([`crate::config::RouterConfig::tiers`]): the key of per-tier router state (a request's
/// tier, in-flight bounds, metrics, completion outcomes).
///
/// Where it comes from: [`crate::auth::Auth::resolve_tier`] resolves a request's tier name to
/// it ([`crate::config::RouterConfig::tier_index`] does the same without auth), and
/// [`crate::config::RouterConfig::tier`] looks the tier up. The planner's greedy units
/// (`planner::greedy::Unit`) and the simulator's requests (`sim`'s `Req`, resolved from the
/// trace's tier names) take positions in the tier list they are given the same way.
///
/// NOTE (invariant): a `TierId` indexes the tier list it was resolved against. The router's
/// tier list is fixed for the process's life (config), so every `TierId` it holds is in
/// range for `RouterConfig::tiers` and `Metrics::tiers`, which are built in the same order.
/// Plans ([`crate::plan::GroupPlan::tiers`]) hold `TierId`s too and are named only where they
/// are serialized ([`crate::plan::Plan::named`], [`crate::plan::NamedPlan::resolve`]). Window
/// statistics and demand (`stats::TierDemand`) and trace requests (`sim::TraceRequest`)
/// still name tiers by `Tier::name`; the lookahead's `InFlight` takes the bare index
/// ([`TierId::index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TierId(pub usize);

impl TierId {
    /// The position in the config's tier list (to index it, or for code that takes indices).
    pub const fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for TierId {
    /// The bare index.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_serialize_as_bare_numbers() {
        // The worker protocol is msgpack with named fields: the id must encode exactly like
        // the `u32` it replaced, in both directions.
        let typed = rmp_serde::to_vec_named(&Some(WorkerId(300))).unwrap();
        assert_eq!(typed, rmp_serde::to_vec_named(&Some(300u32)).unwrap());
        assert_eq!(
            rmp_serde::from_slice::<WorkerId>(&rmp_serde::to_vec(&7u32).unwrap()).unwrap(),
            WorkerId(7)
        );
        assert_eq!(serde_json::to_string(&WorkerId(3)).unwrap(), "3");
        assert_eq!(serde_json::to_string(&TierId(2)).unwrap(), "2");
        assert_eq!(
            serde_json::from_str::<TierId>("1").unwrap().index(),
            TierId(1).index()
        );
    }

    #[test]
    fn display_is_the_bare_number_and_devices_map_one_to_one() {
        assert_eq!(format!("worker {}", WorkerId(12)), "worker 12");
        assert_eq!(TierId(4).to_string(), "4");
        assert_eq!(WorkerId::of_device(5).device(), 5);
        assert_eq!(WorkerId::of_device(5), WorkerId(5));
    }
}
