//! A follower's link to the leader: one DEALER on the leader's worker endpoint; statistics go
//! out on it, the leader's plan comes back on it and is taken at once.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::lease::LeaderInfo;
use crate::protocols::peer::{self, PeerMessage};
use crate::state::RouterState;

/// How long connecting to a leader may take before the next poll tries again.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A live link to the leader `leader` (closed on drop).
pub struct LeaderLink {
    pub leader: LeaderInfo,
    out: mpsc::Sender<Vec<u8>>,
    task: JoinHandle<()>,
}

impl Drop for LeaderLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaderLink {
    /// Connect to `leader`'s endpoint; its plans go to `engine` as they arrive.
    pub async fn connect(leader: LeaderInfo, engine: Arc<RouterState>) -> Result<Self> {
        let mut sock = DealerSocket::new();
        tokio::time::timeout(CONNECT_TIMEOUT, sock.connect(&leader.addr))
            .await
            .context("timed out")?
            .with_context(|| format!("connecting to the leader at {}", leader.addr))?;
        let (mut tx, mut rx) = sock.split();
        // NOTE: a short queue: a leader that does not read gets the latest, not a backlog.
        let (out, mut queue) = mpsc::channel::<Vec<u8>>(4);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    msg = queue.recv() => match msg {
                        Some(payload) => {
                            if tx.send(ZmqMessage::from(payload)).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    },
                    got = rx.recv() => match got {
                        Ok(frames) => {
                            let Some(payload) = frames.into_vec().pop() else { continue };
                            let secret = engine.cfg.worker_secret.as_ref();
                            match peer::decode_peer(&payload, secret) {
                                Ok((_, PeerMessage::Plan(p))) => {
                                    engine.adopt_plan(p);
                                }
                                Ok(_) => {}
                                Err(e) => tracing::warn!(?e, "dropped a message from the leader"),
                            }
                        }
                        Err(_) => return,
                    },
                }
            }
        });
        Ok(LeaderLink { leader, out, task })
    }

    /// Whether a message can be queued now (a leader that stopped reading fills the queue:
    /// the follower then keeps its events rather than losing them in a full queue).
    pub fn ready(&self) -> bool {
        self.out.capacity() > 0
    }

    /// Queue a message for the leader (call when [`Self::ready`]).
    pub fn send(&self, payload: Vec<u8>) {
        if self.out.try_send(payload).is_err() {
            tracing::warn!("the link to the leader is backed up; a message was dropped");
        }
    }
}
