//! Server-sent events for streaming responses: one JSON object per `data:` line, an error
//! object if the request fails mid-stream, and always a final `data: [DONE]`.
//!
//! NOTE: the `TextStream` lives inside the response body stream; when a client disconnects,
//! axum drops the body, which drops the `RequestHandle` and aborts the request on its worker.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::Value;

use super::output::{Piece, TextStream};

/// The final `stream_options.include_usage` chunk of an OpenAI stream (no choices, usage only);
/// empty when the client did not ask for it.
pub fn usage_chunk(
    include_usage: bool,
    id: &str,
    object: &str,
    created: u64,
    model: &str,
    ts: &TextStream,
) -> Vec<Value> {
    if !include_usage {
        return Vec::new();
    }
    vec![
        serde_json::json!({"id": id, "object": object, "created": created, "model": model,
                             "choices": [], "usage": ts.usage()}),
    ]
}

/// Endpoint-specific chunk formatting.
pub trait ChunkFormat: Send + 'static {
    /// Chunks sent before any output (e.g. the assistant role).
    fn start(&mut self, _ts: &TextStream) -> Vec<Value> {
        Vec::new()
    }
    /// Chunks for one piece (may be none, e.g. for an empty delta).
    fn piece(&mut self, ts: &TextStream, p: &Piece) -> Vec<Value>;
    /// Chunks after the final piece (e.g. usage).
    fn end(&mut self, _ts: &TextStream) -> Vec<Value> {
        Vec::new()
    }
}

struct State<F> {
    ts: TextStream,
    fmt: F,
    queue: VecDeque<String>,
    started: bool,
    finished: bool,
}

/// Stream `ts` as SSE with the chunk format `fmt`.
pub fn respond<F: ChunkFormat>(ts: TextStream, fmt: F) -> Response {
    let st = State {
        ts,
        fmt,
        queue: VecDeque::new(),
        started: false,
        finished: false,
    };
    let s = stream::unfold(st, |mut st| async move {
        loop {
            if let Some(line) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(Event::default().data(line)), st));
            }
            if st.finished {
                return None;
            }
            if !st.started {
                st.started = true;
                let chunks = st.fmt.start(&st.ts);
                st.queue.extend(chunks.iter().map(Value::to_string));
                continue;
            }
            match st.ts.next().await {
                Some(Ok(p)) => {
                    let chunks = st.fmt.piece(&st.ts, &p);
                    st.queue.extend(chunks.iter().map(Value::to_string));
                    if p.finish.is_some() {
                        let end = st.fmt.end(&st.ts);
                        st.queue.extend(end.iter().map(Value::to_string));
                        st.queue.push_back("[DONE]".into());
                        st.finished = true;
                    }
                }
                Some(Err(e)) => {
                    st.queue.push_back(e.body().to_string());
                    st.queue.push_back("[DONE]".into());
                    st.finished = true;
                }
                None => {
                    st.queue.push_back("[DONE]".into());
                    st.finished = true;
                }
            }
        }
    });
    Sse::new(s).into_response()
}
