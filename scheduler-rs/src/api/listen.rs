//! The HTTP listener: an HTTP/1 accept loop with a header-read timeout, and a middleware that
//! bounds the time a client may take to send a request body.
//!
//! NOTE: `axum::serve` sets no header-read timeout, so a client sending one byte a second
//! (slowloris) holds a connection and a task forever. Here each connection gets
//! `client_read_timeout_ms` to send its headers (also the idle time a kept-alive connection
//! may wait for its next request, like uvicorn's keep-alive timeout), and each request as
//! long again for its body.
//!
//! With `--ssl-certfile` the loop serves HTTPS only (api/tls.rs): the TLS handshake must end
//! within the same header-read timeout. With `--root-path /p` a request for `/p/x` is served
//! as `/x` (a proxy in front forwards the prefix, as vLLM's `--root-path` expects).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::AppState;
use crate::errors::ApiError;

/// Largest request body, as axum's default `DefaultBodyLimit` (2 MiB).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Pending-connection queue asked of the kernel (it caps this at `net.core.somaxconn`).
///
/// NOTE: when a burst of clients connects faster than the accept loop runs, connections past
/// the queue have their SYN dropped and retry only after the 1 s TCP retransmit timeout, so
/// a short queue turns a burst into a one-second stall for everyone, /health included.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Bind the HTTP listener on `addr` (`host:port`) with [`LISTEN_BACKLOG`].
pub async fn bind(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As std's and tokio's own bind: a restarted router may reuse a port in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    }))
}

/// How the accept loop serves each connection.
#[derive(Clone)]
pub struct Listening {
    /// Headers (and with TLS the handshake) must arrive within this.
    pub read_timeout: Duration,
    /// `Some`: HTTPS only.
    pub tls: Option<TlsAcceptor>,
    /// `--root-path`, without a trailing slash.
    pub root_path: Option<Arc<str>>,
}

/// `req` with `root` taken off the front of its path (`/api/v1/models` → `/v1/models`,
/// `/api` → `/`); a path without it is left alone.
pub fn strip_root<B>(mut req: Request<B>, root: &str) -> Request<B> {
    let uri = req.uri();
    let Some(rest) = uri.path().strip_prefix(root) else {
        return req;
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return req; // `/apix` is not under `/api`
    }
    let path = if rest.is_empty() { "/" } else { rest };
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    if let Ok(pq) = path_and_query.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(stripped) = axum::http::Uri::from_parts(parts) {
            *req.uri_mut() = stripped;
        }
    }
    req
}

/// Serve `app` on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, app: Router, how: Listening) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!("HTTP accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let root = how.root_path.clone();
        let service = TowerToHyperService::new(app.clone().map_request(
            move |r: Request<hyper::body::Incoming>| {
                let r = r.map(Body::new);
                match &root {
                    Some(root) => strip_root(r, root),
                    None => r,
                }
            },
        ));
        let how = how.clone();
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(how.read_timeout);
            let result = match &how.tls {
                None => {
                    let conn = http.serve_connection(TokioIo::new(stream), service);
                    conn.with_upgrades().await
                }
                Some(tls) => {
                    // NOTE: a client that never finishes its handshake is dropped like one
                    // that never sends its headers.
                    let stream =
                        match tokio::time::timeout(how.read_timeout, tls.accept(stream)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!("TLS handshake failed: {e}");
                                return;
                            }
                            Err(_) => return,
                        };
                    let conn = http.serve_connection(TokioIo::new(stream), service);
                    conn.with_upgrades().await
                }
            };
            if let Err(e) = result {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
}

/// Middleware: read the whole body within `client_read_timeout_ms` (408 otherwise) and at
/// most [`MAX_BODY_BYTES`] (413), then hand the request on with the body in memory.
///
/// NOTE: a declared `Content-Length` above the limit is refused before a byte of the body is
/// read, so a client announcing gigabytes (with `Expect: 100-continue`: hyper sends `100
/// Continue` only once the body is first read, so it gets the 413 instead) waits for
/// nothing. A body that breaks HTTP framing (a malformed chunk size) is the client's 400, not
/// a 413.
pub async fn read_body_within(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    use axum::http::StatusCode;
    let limit = Duration::from_millis(state.router.cfg.client_read_timeout_ms);
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > MAX_BODY_BYTES as u64) {
        let why = format!(
            "request body: Content-Length {n} is above the limit of {MAX_BODY_BYTES} bytes"
        );
        return ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE, why).into_response();
    }
    let bytes = match tokio::time::timeout(limit, read_at_most(body, MAX_BODY_BYTES)).await {
        Ok(Ok(b)) => b,
        Ok(Err(BodyError::TooLarge)) => {
            let why = format!("request body: longer than the limit of {MAX_BODY_BYTES} bytes");
            return ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE, why).into_response();
        }
        Ok(Err(BodyError::Malformed(e))) => {
            let why = format!("malformed request body: {e}");
            return ApiError::from_status(StatusCode::BAD_REQUEST, why).into_response();
        }
        Err(_) => {
            return ApiError::timeout(format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ))
            .into_response()
        }
    };
    let size = bytes.len();
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    // NOTE: a huge input's parse, render and tokenization buffers are freed by now (a stream
    // keeps only its token ids): give their memory back (heap.rs).
    crate::heap::trim_after(size);
    resp
}

/// Why a body could not be read.
enum BodyError {
    TooLarge,
    /// The connection's framing broke (bad chunk size, cut short): the client's fault.
    Malformed(axum::Error),
}

/// The whole of `body` if it holds at most `max` bytes.
async fn read_at_most(body: Body, max: usize) -> Result<axum::body::Bytes, BodyError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Malformed)?;
        if out.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.into())
}
