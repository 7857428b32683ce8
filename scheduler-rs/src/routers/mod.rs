//! Several routers in front of one pool (architecture §4 "Several routers"): the lease loop.
//! Every poll a router either keeps the lease it holds (and leads), or reads who holds it and
//! follows: it forwards its window statistics to the leader four times a window and routes by
//! the plan the leader answers with (`link.rs`). When nobody holds the lease, router `i` takes
//! it after `i` free polls (so the lowest-numbered live router normally leads), then plans at
//! once (`RouterState::promote`).

mod link;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::DEFAULT_LEASE_TTL_MS;
use crate::lease::{Candidate, LeaderInfo, Lease};
use crate::protocols::peer::{self, PeerMessage};
use crate::state::{forward_period, RouterRole, RouterState};
use link::LeaderLink;

/// How often the lease is polled (and a leader's renewed).
pub const LEASE_POLL: Duration = Duration::from_millis(100);

/// The running lease loop; [`Routers::release`] gives the lease up on a clean shutdown.
pub struct Routers {
    task: JoinHandle<()>,
    stop: Option<oneshot::Sender<oneshot::Sender<()>>>,
}

impl Routers {
    /// Stop the loop and give the lease up (so another router need not wait for it to
    /// expire); bounded by one second.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let (done, released) = oneshot::channel();
            if stop.send(done).is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(1), released).await;
            }
        }
        self.task.abort();
    }

    /// Stop the loop at once (the lease goes with the process, or expires).
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// Where the other routers reach this one: `--peer-addr`, else its worker endpoint (which
/// must then name an address they can dial).
fn peer_addr(engine: &RouterState, worker_endpoint: &str) -> Result<String> {
    if let Some(addr) = &engine.cfg.peer_addr {
        return Ok(addr.clone());
    }
    let wildcard = ["//0.0.0.0:", "//[::]:", "//*:"];
    if wildcard.iter().any(|w| worker_endpoint.contains(w)) {
        bail!(
            "the worker endpoint {worker_endpoint} is a wildcard address other routers cannot \
             dial: set --peer-addr"
        );
    }
    Ok(worker_endpoint.to_string())
}

/// Start the lease loop when a lease is configured.
pub fn spawn(engine: Arc<RouterState>, worker_endpoint: &str) -> Result<Option<Routers>> {
    let Some(spec) = engine.cfg.lease.clone() else {
        return Ok(None);
    };
    let me = Candidate {
        index: engine.cfg.router_index,
        addr: peer_addr(&engine, worker_endpoint)?,
    };
    let ttl_ms = engine.cfg.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS);
    let lease = Lease::open(&spec, ttl_ms.div_ceil(1000));
    let (stop, stopped) = oneshot::channel();
    tracing::info!(index = me.index, addr = %me.addr, lease = ?spec, "several routers: lease loop on");
    let task = tokio::spawn(run(engine, me, lease, stopped));
    Ok(Some(Routers {
        task,
        stop: Some(stop),
    }))
}

/// What the loop knows between polls.
struct Poll {
    me: Candidate,
    lease: Lease,
    /// Consecutive polls that found the lease free.
    free_polls: u32,
    link: Option<LeaderLink>,
    next_forward: Instant,
    /// When a lease error was last logged (one line a few seconds, not one a poll).
    logged: Option<Instant>,
}

async fn run(
    engine: Arc<RouterState>,
    me: Candidate,
    lease: Lease,
    mut stopped: oneshot::Receiver<oneshot::Sender<()>>,
) {
    let mut p = Poll {
        me,
        lease,
        free_polls: 0,
        link: None,
        next_forward: Instant::now(),
        logged: None,
    };
    let mut tick = tokio::time::interval(LEASE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            done = &mut stopped => {
                p.lease.release().await;
                if let Ok(done) = done {
                    let _ = done.send(());
                }
                return;
            }
            _ = tick.tick() => {}
        }
        if matches!(engine.role(), RouterRole::Leader { .. }) {
            if !p.lease.keep().await {
                engine.follow(None);
            } else {
                engine.refresh_peers();
            }
            continue;
        }
        follow_or_take(&engine, &mut p).await;
    }
}

/// One poll of a router that does not lead: follow the holder, or take a free lease.
async fn follow_or_take(engine: &Arc<RouterState>, p: &mut Poll) {
    let holder = match p.lease.leader().await {
        Ok(h) => h,
        Err(e) => {
            if p.logged
                .is_none_or(|t| t.elapsed() > Duration::from_secs(5))
            {
                tracing::warn!("lease: cannot read who leads: {e:#}");
                p.logged = Some(Instant::now());
            }
            return;
        }
    };
    match holder {
        // NOTE: a record naming us that we do not hold is our former life's (an etcd lease
        // of a process that died, until it expires): nobody to follow yet, nothing to take.
        Some(info) if info.index == p.me.index && info.addr == p.me.addr => p.free_polls = 0,
        Some(info) => {
            p.free_polls = 0;
            engine.follow(Some(info.clone()));
            forward(engine, p, info).await;
        }
        None => {
            p.free_polls += 1;
            p.link = None;
            if p.free_polls > p.me.index {
                match p.lease.try_acquire(&p.me).await {
                    Ok(Some(term)) => engine.promote(term),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("lease: cannot take it: {e:#}"),
                }
            }
        }
    }
}

/// Send the leader our statistics when due (connecting first to a new leader).
async fn forward(engine: &Arc<RouterState>, p: &mut Poll, leader: LeaderInfo) {
    if p.link.as_ref().is_none_or(|l| l.leader != leader) {
        p.link = None;
        match LeaderLink::connect(leader.clone(), engine.clone()).await {
            Ok(l) => p.link = Some(l),
            Err(e) => {
                tracing::warn!("cannot reach the leader: {e:#}");
                return;
            }
        }
        p.next_forward = Instant::now();
    }
    let Some(link) = p.link.as_ref().filter(|l| l.ready()) else {
        return;
    };
    if Instant::now() < p.next_forward {
        return;
    }
    p.next_forward = Instant::now() + forward_period(engine.cfg.control_window_ms);
    let stats = engine.peer_stats(leader.term);
    let payload = peer::encode_peer(
        &PeerMessage::Stats(stats),
        p.me.index,
        engine.cfg.worker_secret.as_ref(),
    );
    link.send(payload);
}
