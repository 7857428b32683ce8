//! ZeroMQ transport: one ROUTER socket bound for all device workers (docs/protocol.md), and
//! the other routers' followers (several routers, `protocols/peer.rs`).
//!
//! Two tasks: the receive loop decodes msgpack and hands each message to the engine; the
//! send loop drains the engine's outbound queue. Each worker's DEALER identity addresses it.

use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::state::{Outbound, RouterState};
use crate::worker_auth::Rejection;

/// Running transport tasks.
pub struct Transport {
    /// The address actually bound (resolves port 0).
    pub endpoint: String,
    pub recv_task: JoinHandle<()>,
    pub send_task: JoinHandle<()>,
}

impl Transport {
    /// Stop both loops (the socket closes when they are dropped).
    pub fn abort(&self) {
        self.recv_task.abort();
        self.send_task.abort();
    }
}

/// Bind the ROUTER socket at `addr` and start the loops.
pub async fn start(
    addr: &str,
    router: Arc<RouterState>,
    mut outbound: mpsc::UnboundedReceiver<Outbound>,
) -> Result<Transport> {
    let mut socket = RouterSocket::new();
    let endpoint = socket
        .bind(addr)
        .await
        .with_context(|| format!("binding the worker socket at {addr}"))?
        .to_string();
    let (mut tx, mut rx) = socket.split();
    let recv_task = tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(msg) => handle_frames(&router, msg),
                Err(e) => {
                    tracing::error!("worker socket receive failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    });
    let send_task = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(256);
        // NOTE: draining in batches keeps the queue short under load without reordering.
        while outbound.recv_many(&mut batch, 256).await > 0 {
            for out in batch.drain(..) {
                let mut msg = ZmqMessage::from(out.payload);
                msg.push_front(out.identity);
                if let Err(e) = tx.send(msg).await {
                    // A vanished peer: its heartbeats stop and the reaper handles it.
                    tracing::debug!("send to worker failed: {e}");
                }
            }
        }
    });
    Ok(Transport {
        endpoint,
        recv_task,
        send_task,
    })
}

/// `[identity, payload]` (an empty delimiter frame in between is tolerated).
fn handle_frames(engine: &RouterState, msg: ZmqMessage) {
    let mut frames = msg.into_vec();
    if frames.len() < 2 {
        engine.metrics.plane.count(Rejection::Undecodable);
        return;
    }
    let payload = frames.pop().expect("len >= 2");
    let identity: Bytes = frames.swap_remove(0);
    engine.on_frame(identity, &payload);
}
