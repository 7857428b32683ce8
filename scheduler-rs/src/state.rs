//! The router's state (`RouterState`): worker registry, current plan, dispatcher and the
//! table of in-flight requests. Transport and HTTP handlers call into it; it never awaits.
//!
//! NOTE (architecture §7): every accepted request ends in exactly one final event on its channel:
//! `Event::Tokens` with a finish reason, `Event::Error` or `Event::Invalid`. The entry leaves
//! `inflight` exactly when that event is sent (or when the client goes away), and the dispatcher
//! charge is released at the same point, so accounting and delivery cannot diverge.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::config::RouterConfig;
use crate::dispatch::Dispatcher;
use crate::fasthash::IntMap;
use crate::ids::{TierId, WorkerId};
use crate::metrics::Metrics;
use crate::plan::{GroupPlan, Plan, Role};
use crate::registry::Registry;
use crate::stats::{StatsConfig, WindowStats};

struct Inflight {
    tx: mpsc::UnboundedSender<Event>,
    req: Arc<Submit>,
    /// The worker that got its `generate`: its group's leader (after a plan change, the
    /// leader of the group its worker joined; see `on_tokens`).
    leader: WorkerId,
    /// The decode group's leader when the leader's group only prefills.
    decode: Option<WorkerId>,
    /// Token ids streamed to the client so far: a request whose worker dies resumes on
    /// another worker from `input_ids ‖ generated` (see `orphans.rs`, `orphan`).
    generated: Vec<u32>,
    /// Re-dispatches after a worker died (bounded by `max_retries`).
    retries: u32,
    /// Since when it waits for a worker, on none (`held.rs`); `None`: a worker runs it.
    held_since: Option<Instant>,
    start: Instant,
    first: Option<Instant>,
    /// When its latest tokens arrived (inter-token latency).
    last: Option<Instant>,
    /// Seconds its worker held it before its first scheduled step (`queue_ms`, if sent).
    queue_s: Option<f64>,
}

impl Inflight {
    /// Tokens streamed so far.
    fn tokens(&self) -> u64 {
        self.generated.len() as u64
    }
}

#[derive(Default)]
struct State {
    registry: Registry,
    plan: Plan,
    /// Groups set by the control loop (`set_plan`); `None` = static plan or default plan.
    planned: Option<Vec<GroupPlan>>,
    dispatcher: Dispatcher,
    /// NOTE: entries come and go through `State::hold` / `State::release` only, which keep
    /// `held` (requests per tier, for `Tier::max_inflight`) in step.
    inflight: IntMap<u64, Inflight>,
    /// Requests in flight per tier, indexed by `TierId::index` (grown on demand).
    held: Vec<u32>,
    /// Highest epoch ever issued (plans and control rounds share the sequence).
    last_epoch: u64,
    /// Planner batch caps of the control loop's groups, by members (`max_batch` on the wire).
    max_batch: std::collections::HashMap<Vec<u32>, u32>,
    /// Window statistics fed by the request path (only with the control loop).
    stats: WindowStats,
    /// The control round waiting for `reconfigured` acks.
    pending: Option<rounds::Round>,
    /// Completed requests (arrival s on the engine clock, tier, met their SLOs), for the
    /// lookahead's delivered-vs-predicted check; the control loop drops old ones.
    outcomes: std::collections::VecDeque<(f64, TierId, bool)>,
    /// Control windows planned so far (selection rounds run every `every_windows`).
    windows: u64,
    /// Unix ms when the latest windows were planned (bounded), oldest first.
    planned_at: std::collections::VecDeque<u64>,
    /// Unix ms when this router last took the lease (0: never).
    leading_since_ms: u64,
    /// The control loop's last strategy choice (shown in `/admin/plan`).
    choice: Option<crate::sim::choice::Choice>,
    /// Recent control decisions, oldest first (bounded).
    history: std::collections::VecDeque<plan_record::PlanRecord>,
    /// Which connection serves which worker id, and pending handshake challenges.
    sessions: crate::worker_auth::Sessions,
    /// Which group last got each prompt prefix (cache-aware dispatch).
    prefixes: crate::prefix_index::PrefixIndex,
    /// This router's part in planning (several routers: `leadership.rs`).
    role: leadership::RouterRole,
    /// Routers that share each group's SLO bandwidth (1: this one alone).
    share: u32,
    /// A follower: (term, sent_ms) of the last plan it took from a leader.
    adopted: (u64, u64),
    /// A leader: the followers it hears from, by router index.
    peers: std::collections::BTreeMap<u32, peer_window::PeerView>,
    /// A follower: window events not yet forwarded to the leader.
    forward: peer_window::Forward,
    /// A follower: the leader term it last wrote to (its first message to a term carries
    /// its whole window history).
    forwarded_term: u64,
}

/// At most this many requests are held at once (state/held.rs); beyond it a request with no
/// live group ends at once (a new one gets 503), so a long outage cannot pile up unbounded
/// state.
const MAX_HELD: usize = 4096;

/// Router state shared by the transport, the HTTP handlers and the heartbeat monitor.
pub struct RouterState {
    pub cfg: Arc<RouterConfig>,
    pub metrics: Metrics,
    state: Mutex<State>,
    out: mpsc::UnboundedSender<Outbound>,
    next_id: AtomicU64,
    /// Wire form of request ids (unguessable, per router process).
    ids: crate::worker_auth::RequestIds,
    /// The sealed channel of each authenticated connection (worker_auth/channel.rs).
    channels: crate::worker_auth::Channels,
    /// Time origin of the window statistics.
    clock: Instant,
    /// Whether the control loop runs (a profile is configured): the request path feeds stats.
    control: bool,
    /// Shutting down: new requests are refused (`RouterState::start_draining`).
    draining: std::sync::atomic::AtomicBool,
    /// Notified when this router takes the lease: the control loop plans at once.
    pub leading: tokio::sync::Notify,
}

mod control_view;
#[cfg(test)]
mod device_lost_tests;
mod events;
mod handle;
#[cfg(test)]
mod handoff_tests;
mod held;
#[cfg(test)]
mod held_tests;
mod inbound_frames;
#[cfg(test)]
mod inbound_frames_tests;
mod leadership;
#[cfg(test)]
mod leadership_tests;
mod live_plan;
mod orphans;
mod outputs;
mod peer_window;
mod plan_record;
#[cfg(test)]
mod plane_peer;
mod requests;
mod rounds;
#[cfg(test)]
mod rounds_tests;
#[cfg(test)]
mod spill_prefix_tests;
mod submit;
mod submit_error;
#[cfg(test)]
mod tests;
mod views;
mod worker_gate;
#[cfg(test)]
mod worker_gate_tests;
mod workers;
pub use control_view::PlanningView;
pub use events::{EarlyEnd, Event, FinishReason, Outbound};
pub use handle::RequestHandle;
pub use leadership::RouterRole;
pub use peer_window::forward_period;
pub use plan_record::{PlanRecord, PlanResult, Refusal};
pub use rounds::RoundOutcome;
pub use submit::{CacheHints, Fork, Submit};
pub use submit_error::SubmitError;
pub use views::GroupSnapshot;

impl RouterState {
    /// A new engine and the receiver of its outbound messages (for the transport).
    pub fn new(cfg: Arc<RouterConfig>) -> (Arc<Self>, mpsc::UnboundedReceiver<Outbound>) {
        let (out, rx) = mpsc::unbounded_channel();
        let stats = WindowStats::new(StatsConfig {
            rate_window_s: cfg.control_window_ms as f64 / 1000.0,
            prior_output_tokens: cfg.planner.prior_lengths.1,
            ..StatsConfig::default()
        });
        // NOTE: with a lease a router starts as a follower until it holds it.
        let role = if cfg.lease.is_some() {
            leadership::RouterRole::Follower { leader: None }
        } else {
            leadership::RouterRole::Alone
        };
        let engine = RouterState {
            metrics: Metrics::new(&cfg.tiers, &cfg.served_model_name),
            control: cfg.profile.is_some(),
            cfg,
            state: Mutex::new(State {
                stats,
                role,
                share: 1,
                ..State::default()
            }),
            out,
            next_id: AtomicU64::new(1),
            ids: crate::worker_auth::RequestIds::new(),
            channels: crate::worker_auth::Channels::default(),
            clock: Instant::now(),
            draining: std::sync::atomic::AtomicBool::new(false),
            leading: tokio::sync::Notify::new(),
        };
        (Arc::new(engine), rx)
    }
}

impl RouterState {
    fn lock(&self) -> MutexGuard<'_, State> {
        // NOTE: nothing panics while holding the lock except a bug; keep serving anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Send a message to a worker: sealed on its channel when the router has a secret.
    /// NOTE: with a secret nothing but the handshake ([`Self::send_clear`]) leaves in clear;
    /// a message for a connection without a channel is dropped.
    fn send(&self, identity: Bytes, payload: Vec<u8>) {
        if self.cfg.worker_secret.is_none() {
            return self.send_clear(identity, payload);
        }
        let out = &self.out;
        let ident = identity.clone();
        let sealed = self.channels.seal_with(&identity, &payload, |frame| {
            let _ = out.send(Outbound {
                identity: ident,
                payload: Bytes::from(frame),
            });
        });
        if !sealed {
            tracing::debug!("dropped a message for a connection without a sealed channel");
        }
    }

    /// Send a message in clear: the handshake, and router ↔ router messages (MACed).
    fn send_clear(&self, identity: Bytes, payload: Vec<u8>) {
        // The receiver lives as long as the transport; a send after shutdown is moot.
        let _ = self.out.send(Outbound {
            identity,
            payload: Bytes::from(payload),
        });
    }

    /// Default groups when no plan is configured: each live worker is a TP-1 mixed group
    /// serving every non-background tier and accepting background work.
    /// The plan without a control round or a static plan: aligned groups of `default_tp`
    /// registered workers (`--tensor-parallel-size`); a block with a member missing serves as
    /// TP-1 groups until it is whole.
    fn default_groups(&self, workers: impl Iterator<Item = WorkerId>) -> Vec<GroupPlan> {
        let mut devices: Vec<u32> = workers.map(|w| w.device()).collect();
        devices.sort_unstable();
        let tp = self.cfg.default_tp.max(1);
        let mut groups = Vec::new();
        for block in devices.chunk_by(|a, b| a / tp == b / tp) {
            let whole = tp > 1 && block.len() == tp as usize;
            if whole {
                groups.push(GroupPlan {
                    members: block.to_vec(),
                    tp,
                    ..self.default_group(WorkerId::of_device(block[0]))
                });
            } else {
                let each = block
                    .iter()
                    .map(|&d| self.default_group(WorkerId::of_device(d)));
                groups.extend(each);
            }
        }
        groups
    }

    fn default_group(&self, worker: WorkerId) -> GroupPlan {
        GroupPlan {
            members: vec![worker.device()],
            tp: 1,
            pp: 1,
            role: Role::Mixed,
            tiers: (0..self.cfg.tiers.len())
                .filter(|&i| !self.cfg.tiers[i].background)
                .map(TierId)
                .collect(),
            accepts_background: true,
            max_rps: 0.0,
            max_inflight: 0.0,
        }
    }
}
