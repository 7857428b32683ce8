//! The request engine: worker registry, current plan, dispatcher and the table of in-flight
//! requests. Transport and HTTP handlers call into it; it never awaits.
//!
//! NOTE (DESIGN §7): every accepted request ends in exactly one final event on its channel:
//! `Event::Tokens` with a finish reason, or `Event::Error`. The entry leaves `inflight`
//! exactly when that event is sent (or when the client goes away), and the dispatcher charge
//! is released at the same point, so accounting and delivery cannot diverge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::config::RouterConfig;
use crate::dispatch::{Class, DispatchRequest, Dispatcher};
use crate::fasthash::IntMap;
use crate::metrics::{Completion, Metrics};
use crate::plan::{GroupPlan, Plan, Role};
use crate::protocols::worker::{self as wire, Incoming, Sampling, PROTOCOL_VERSION};
use crate::registry::{Registry, WorkerInfo};

/// A message for the transport to send to one worker.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub identity: Bytes,
    pub payload: Bytes,
}

/// Why generation finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a request's receiver gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New token ids; the last event of a request carries a finish reason.
    Tokens {
        ids: Vec<u32>,
        finish: Option<FinishReason>,
    },
    /// The request failed; nothing follows.
    Error(String),
}

/// A request ready for dispatch (already tokenized and validated).
#[derive(Debug, Clone)]
pub struct Submit {
    pub input_ids: Vec<u32>,
    pub sampling: Sampling,
    /// Index into the config's tiers.
    pub tier: usize,
}

/// Why a request left before its worker finished it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyEnd {
    /// The router matched a stop string: a normal completion.
    StopString,
    /// The client disconnected.
    Cancelled,
}

struct Inflight {
    tx: mpsc::UnboundedSender<Event>,
    req: Arc<Submit>,
    leader: u32,
    decode: Option<u32>,
    streamed: bool,
    retries: u32,
    start: Instant,
    first: Option<Instant>,
    tokens: u64,
}

#[derive(Default)]
struct State {
    registry: Registry,
    plan: Plan,
    /// Groups set by the control loop (`set_plan`); `None` = static plan or default plan.
    planned: Option<Vec<GroupPlan>>,
    dispatcher: Dispatcher,
    inflight: IntMap<u64, Inflight>,
}

/// Per-group numbers for `/metrics`.
#[derive(Debug, Clone)]
pub struct GroupSnapshot {
    pub group: GroupPlan,
    pub assigned: u32,
    pub running: u64,
    pub waiting: u64,
}

/// Router state shared by the transport, the HTTP handlers and the heartbeat monitor.
pub struct Engine {
    pub cfg: Arc<RouterConfig>,
    pub metrics: Metrics,
    state: Mutex<State>,
    out: mpsc::UnboundedSender<Outbound>,
    next_id: AtomicU64,
}

mod handle;
mod workers;
pub use handle::RequestHandle;

impl Engine {
    /// A new engine and the receiver of its outbound messages (for the transport).
    pub fn new(cfg: Arc<RouterConfig>) -> (Arc<Self>, mpsc::UnboundedReceiver<Outbound>) {
        let (out, rx) = mpsc::unbounded_channel();
        let engine = Engine {
            metrics: Metrics::new(&cfg.tiers),
            cfg,
            state: Mutex::new(State::default()),
            out,
            next_id: AtomicU64::new(1),
        };
        (Arc::new(engine), rx)
    }
}

impl Engine {
    fn lock(&self) -> MutexGuard<'_, State> {
        // NOTE: nothing panics while holding the lock except a bug; keep serving anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, identity: Bytes, payload: Vec<u8>) {
        // The receiver lives as long as the transport; a send after shutdown is moot.
        let _ = self.out.send(Outbound {
            identity,
            payload: Bytes::from(payload),
        });
    }

    /// Dispatch a request. `Err` when no group can take it (the caller answers 503).
    pub fn submit(self: &Arc<Self>, req: Submit) -> Result<RequestHandle, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let req = Arc::new(req);
        let (tx, rx) = mpsc::unbounded_channel();
        let tier = &self.cfg.tiers[req.tier];
        let tm = self.metrics.tier(req.tier);
        let placed = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let placed = Self::place(st, id, &tier.name, tier.background);
            if let Some((_, d)) = &placed {
                st.inflight.insert(
                    id,
                    Inflight {
                        tx,
                        req: req.clone(),
                        leader: d.prefill_leader,
                        decode: d.decode_leader,
                        streamed: false,
                        retries: 0,
                        start: Instant::now(),
                        first: None,
                        tokens: 0,
                    },
                );
            }
            placed
        };
        let Some((identity, decision)) = placed else {
            tm.rejected.fetch_add(1, Ordering::Relaxed);
            return Err("no worker available for this request".into());
        };
        match decision.class {
            Class::Feasible => &tm.feasible,
            Class::BestEffort => &tm.best_effort,
            Class::Background => &tm.background,
        }
        .fetch_add(1, Ordering::Relaxed);
        self.send_generate(id, &req, identity, decision);
        Ok(RequestHandle::new(id, decision.class, rx, self.clone()))
    }

    /// Ask the dispatcher for a group and resolve its leader's identity.
    fn place(
        st: &mut State,
        id: u64,
        tier: &str,
        background: bool,
    ) -> Option<(Bytes, crate::dispatch::Decision)> {
        let d = st
            .dispatcher
            .dispatch(id, &DispatchRequest { tier, background })?;
        match st.registry.get(d.prefill_leader) {
            Some(w) => Some((w.identity.clone(), d)),
            None => {
                // NOTE: plans only hold live workers; this is a race with a reap.
                st.dispatcher.complete(id);
                None
            }
        }
    }

    fn send_generate(&self, id: u64, req: &Submit, identity: Bytes, d: crate::dispatch::Decision) {
        let rid = id.to_string();
        let payload = wire::encode_generate(&wire::Generate {
            v: PROTOCOL_VERSION,
            ty: "generate",
            request_id: &rid,
            input_ids: &req.input_ids,
            sampling: &req.sampling,
            tier: &self.cfg.tiers[req.tier].name,
            class: d.class.as_str(),
            decode_target: d.decode_leader,
        });
        self.send(identity, payload);
    }

    /// A `tokens` message from a worker.
    fn on_tokens(&self, worker: u32, m: Incoming) {
        let Some(id) = m.request_id.as_deref().and_then(|s| s.parse::<u64>().ok()) else {
            tracing::warn!(worker, "tokens message without a valid request_id");
            return;
        };
        let ids = m.token_ids.unwrap_or_default();
        let now = Instant::now();
        let mut st = self.lock();
        let Some(e) = st.inflight.get_mut(&id) else {
            return; // finished, cancelled or retried elsewhere: a normal race
        };
        if worker != e.leader && Some(worker) != e.decode {
            // NOTE: never mix outputs: only the worker currently serving the request counts.
            return;
        }
        if !ids.is_empty() {
            e.streamed = true;
            e.first.get_or_insert(now);
            e.tokens += ids.len() as u64;
        }
        let event = match m.finish_reason.as_deref() {
            None => {
                let _ = e.tx.send(Event::Tokens { ids, finish: None });
                return;
            }
            Some("stop") => Event::Tokens {
                ids,
                finish: Some(FinishReason::Stop),
            },
            Some("length") => Event::Tokens {
                ids,
                finish: Some(FinishReason::Length),
            },
            Some(other) => {
                let why = m
                    .error
                    .unwrap_or_else(|| format!("worker ended the request ({other})"));
                Event::Error(why)
            }
        };
        let e = st.inflight.remove(&id).expect("entry present");
        st.dispatcher.complete(id);
        drop(st);
        self.finish(e, event, now);
    }

    /// Deliver the final event of a request that already left `inflight` and record it.
    fn finish(&self, e: Inflight, event: Event, now: Instant) {
        match &event {
            Event::Tokens { .. } => self.record(e.req.tier, &e, now),
            Event::Error(_) => {
                self.metrics
                    .tier(e.req.tier)
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = e.tx.send(event);
    }

    fn record(&self, tier: usize, e: &Inflight, now: Instant) {
        let c = Completion {
            ttft_s: e.first.map(|f| (f - e.start).as_secs_f64()),
            e2e_s: (now - e.start).as_secs_f64(),
            tokens: e.tokens,
        };
        self.metrics
            .record_completion(tier, &self.cfg.tiers[tier], c);
    }

    /// The client side ended a request before the worker did: abort it on the worker.
    pub(crate) fn end_early(&self, id: u64, why: EarlyEnd) {
        let mut st = self.lock();
        let Some(e) = st.inflight.remove(&id) else {
            return;
        };
        st.dispatcher.complete(id);
        let identity = st.registry.get(e.leader).map(|w| w.identity.clone());
        let decode = e
            .decode
            .and_then(|d| st.registry.get(d).map(|w| w.identity.clone()));
        drop(st);
        let payload = wire::encode_abort(&id.to_string());
        for ident in identity.into_iter().chain(decode) {
            self.send(ident, payload.clone());
        }
        match why {
            EarlyEnd::StopString => self.record(e.req.tier, &e, Instant::now()),
            EarlyEnd::Cancelled => {
                self.metrics
                    .tier(e.req.tier)
                    .cancelled
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The current plan.
    pub fn plan(&self) -> Plan {
        self.lock().plan.clone()
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.lock().inflight.len()
    }

    /// Live workers: (id, info).
    pub fn workers(&self) -> Vec<(u32, WorkerInfo)> {
        self.lock()
            .registry
            .iter()
            .map(|(id, w)| (*id, w.info.clone()))
            .collect()
    }

    /// Per-group load for `/metrics`.
    pub fn groups(&self) -> Vec<GroupSnapshot> {
        let st = self.lock();
        st.plan
            .groups
            .iter()
            .map(|g| {
                let (running, waiting) = g
                    .members
                    .iter()
                    .filter_map(|m| st.registry.get(*m))
                    .fold((0, 0), |(r, w), e| (r + e.running, w + e.waiting));
                GroupSnapshot {
                    group: g.clone(),
                    assigned: st.dispatcher.assigned(g.leader()),
                    running,
                    waiting,
                }
            })
            .collect()
    }

    /// Worker-reported `stats` fields: (worker, name, value).
    pub fn worker_stats(&self) -> Vec<(u32, String, f64)> {
        let st = self.lock();
        st.registry
            .iter()
            .flat_map(|(id, w)| w.stats.iter().map(move |(k, v)| (*id, k.clone(), *v)))
            .collect()
    }

    /// Heartbeat timeout from the config.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.heartbeat_timeout_ms)
    }

    /// Default groups when no plan is configured: each live worker is a TP-1 mixed group
    /// serving every non-background tier and accepting background work.
    fn default_group(&self, worker: u32) -> GroupPlan {
        GroupPlan {
            members: vec![worker],
            tp: 1,
            role: Role::Mixed,
            tiers: self
                .cfg
                .tiers
                .iter()
                .filter(|t| !t.background)
                .map(|t| t.name.clone())
                .collect(),
            accepts_background: true,
            max_rps: 0.0,
            max_inflight: 0.0,
        }
    }
}
