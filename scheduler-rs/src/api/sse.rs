//! Server-sent events for streaming responses: one JSON object per `data:` line, an error
//! object if the request fails mid-stream, and always a final `data: [DONE]`. With n > 1
//! choices, each choice's chunks go out as its pieces arrive, interleaved, told apart by
//! their `index`.
//!
//! NOTE: the `TextStream`s live inside the response body stream; when a client disconnects,
//! axum drops the body, which drops the `RequestHandle`s and aborts the requests on their
//! workers.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::future::select_all;
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
    all: &[TextStream],
) -> Vec<Value> {
    if !include_usage {
        return Vec::new();
    }
    vec![
        serde_json::json!({"id": id, "object": object, "created": created, "model": model,
                             "choices": [], "usage": super::output::usage(all)}),
    ]
}

/// Endpoint-specific chunk formatting; `index` is the choice's.
pub trait ChunkFormat: Send + 'static {
    /// Chunks sent for a choice before any output (e.g. the assistant role).
    fn start(&mut self, _index: usize, _ts: &TextStream) -> Vec<Value> {
        Vec::new()
    }
    /// Chunks for one piece of a choice (may be none, e.g. for an empty delta).
    fn piece(&mut self, index: usize, ts: &TextStream, p: &Piece) -> Vec<Value>;
    /// Chunks after every choice's final piece (e.g. usage).
    fn end(&mut self, _all: &[TextStream]) -> Vec<Value> {
        Vec::new()
    }
}

struct State<F> {
    streams: Vec<TextStream>,
    /// Which choices sent their final piece.
    done: Vec<bool>,
    fmt: F,
    queue: VecDeque<String>,
    started: bool,
    finished: bool,
}

/// The next piece of any unfinished choice, with its index (cancel-safe: every
/// `TextStream::next` it drops has taken nothing yet).
async fn next_piece(
    streams: &mut [TextStream],
    done: &[bool],
) -> (usize, Option<Result<Piece, crate::errors::ApiError>>) {
    let pending = streams
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| !done[*i])
        .map(|(i, ts)| Box::pin(async move { (i, ts.next().await) }));
    let (got, _, rest) = select_all(pending).await;
    drop(rest);
    got
}

/// Stream the choices `streams` as SSE with the chunk format `fmt`.
pub fn respond<F: ChunkFormat>(streams: Vec<TextStream>, fmt: F) -> Response {
    let st = State {
        done: vec![false; streams.len()],
        streams,
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
                for (i, ts) in st.streams.iter().enumerate() {
                    let chunks = st.fmt.start(i, ts);
                    st.queue.extend(chunks.iter().map(Value::to_string));
                }
                continue;
            }
            let (i, next) = next_piece(&mut st.streams, &st.done).await;
            match next {
                Some(Ok(p)) => {
                    let chunks = st.fmt.piece(i, &st.streams[i], &p);
                    st.queue.extend(chunks.iter().map(Value::to_string));
                    st.done[i] = p.finish.is_some();
                }
                Some(Err(e)) => {
                    // NOTE: one failed choice ends the response; the others are aborted
                    // when their streams drop with it.
                    st.queue.push_back(e.body().to_string());
                    st.queue.push_back("[DONE]".into());
                    st.finished = true;
                    continue;
                }
                None => st.done[i] = true,
            }
            if st.done.iter().all(|&d| d) {
                let end = st.fmt.end(&st.streams);
                st.queue.extend(end.iter().map(Value::to_string));
                st.queue.push_back("[DONE]".into());
                st.finished = true;
            }
        }
    });
    Sse::new(s).into_response()
}
