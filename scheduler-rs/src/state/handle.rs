//! The caller's side of one request: its event stream, and a drop guard that aborts the
//! request on the worker when the caller goes away early (e.g. an HTTP client disconnects).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{EarlyEnd, Event, RouterState};
use crate::dispatch::Class;

/// One dispatched request.
pub struct RequestHandle {
    id: u64,
    class: Class,
    rx: mpsc::UnboundedReceiver<Event>,
    router: Arc<RouterState>,
    /// The final event was received or the request was ended early.
    done: bool,
}

impl RequestHandle {
    pub(super) fn new(
        id: u64,
        class: Class,
        rx: mpsc::UnboundedReceiver<Event>,
        router: Arc<RouterState>,
    ) -> Self {
        RequestHandle {
            id,
            class,
            rx,
            router,
            done: false,
        }
    }

    /// Router-unique request id (also the wire `request_id`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Feasibility class chosen at dispatch.
    pub fn class(&self) -> Class {
        self.class
    }

    /// Next event; `None` after the final one.
    pub async fn recv(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        // NOTE: the engine keeps the sender until it sends the final event, so `None` here
        // would be an engine bug; report it as an error rather than hang or lose it.
        let ev = self
            .rx
            .recv()
            .await
            .unwrap_or_else(|| Event::Error("request lost by the router".into()));
        if matches!(
            ev,
            Event::Error(_)
                | Event::Invalid { .. }
                | Event::Tokens {
                    finish: Some(_),
                    ..
                }
        ) {
            self.done = true;
        }
        Some(ev)
    }

    /// The request ran out of time: end it now and abort the worker's generation.
    pub fn time_out(mut self) {
        if !self.done {
            self.done = true;
            self.router.end_early(self.id, EarlyEnd::TimedOut);
        }
    }

    /// The router matched a stop string: finish now and abort the worker's generation.
    pub fn stop(mut self) {
        if !self.done {
            self.done = true;
            self.router.end_early(self.id, EarlyEnd::StopString);
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.done {
            self.router.end_early(self.id, EarlyEnd::Cancelled);
        }
    }
}
