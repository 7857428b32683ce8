//! A test worker's end of the worker plane: it speaks the handshake and seals and opens
//! frames on its side of each connection's channel, so state tests drive the router through
//! the bytes a real worker sends (`RouterState::on_frame`).

use std::cell::RefCell;
use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{Outbound, RouterState};
use crate::ids::WorkerId;
use crate::worker_auth::channel::{is_sealed, transcript_hash, Opener, Sealer};
use crate::worker_auth::{ChannelKeys, HandshakeNonces, Nonce, WorkerSecret};

pub(super) type Rx = UnboundedReceiver<Outbound>;

thread_local! {
    /// The worker side of each connection's channel (seals to the router, opens from it).
    static CHANNELS: RefCell<HashMap<String, (Sealer, Opener)>> = RefCell::new(HashMap::new());
}

/// Deliver `v` from connection `conn`: sealed when that connection has a channel, except the
/// handshake.
pub(super) fn send(engine: &RouterState, conn: &str, v: Value) {
    let bytes = rmp_serde::to_vec_named(&v).unwrap();
    let clear = v["type"] == "hello" || v["type"] == "register";
    let frame = CHANNELS.with_borrow_mut(|c| match c.get_mut(conn) {
        Some((sealer, _)) if !clear => sealer.seal(&bytes),
        _ => bytes,
    });
    send_raw(engine, conn, &frame);
}

/// Deliver the exact bytes `frame` from `conn`.
pub(super) fn send_raw(engine: &RouterState, conn: &str, frame: &[u8]) {
    engine.on_frame(Bytes::copy_from_slice(conn.as_bytes()), frame);
}

/// Seal `v` on `conn`'s channel without sending it (to replay or tamper with it).
pub(super) fn seal(conn: &str, v: &Value) -> Vec<u8> {
    let bytes = rmp_serde::to_vec_named(v).unwrap();
    CHANNELS.with_borrow_mut(|c| c.get_mut(conn).expect("a channel").0.seal(&bytes))
}

/// (identity, raw frame, decoded message) of every queued outbound frame; a sealed one is
/// opened on its connection's channel (it must open).
pub(super) fn drain_frames(rx: &mut Rx) -> Vec<(String, Vec<u8>, Value)> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        let to = String::from_utf8(o.identity.to_vec()).unwrap();
        let plain = if is_sealed(&o.payload) {
            CHANNELS.with_borrow_mut(|c| {
                let (_, opener) = c.get_mut(&to).expect("a sealed frame to a channel");
                opener.open(&o.payload).expect("the router's frame opens")
            })
        } else {
            o.payload.to_vec()
        };
        let v: Value = rmp_serde::from_slice(&plain).unwrap();
        out.push((to, o.payload.to_vec(), v));
    }
    out
}

/// (identity, decoded message) of every queued outbound frame.
pub(super) fn drain_raw(rx: &mut Rx) -> Vec<(String, Value)> {
    drain_frames(rx)
        .into_iter()
        .map(|(to, _, v)| (to, v))
        .collect()
}

pub(super) fn register_msg(worker: u32, model: &str, auth: Option<String>) -> Value {
    json!({"v": 1, "type": "register", "worker_id": worker, "model": model, "auth": auth})
}

pub(super) fn hello_msg(worker: u32, nonce: &Nonce) -> Value {
    json!({"v": 1, "type": "hello", "worker_id": worker, "handshake": 3, "nonce": nonce.to_hex()})
}

/// One handshake's state on the worker side after the router's challenge.
pub(super) struct Challenged {
    pub nonces: HandshakeNonces,
    hello: Vec<u8>,
    challenge: Vec<u8>,
}

/// Send `hello` for `worker` on `conn`; the challenge that answers it, after checking the
/// router's proof in it against `secret`.
pub(super) fn hello(
    engine: &RouterState,
    rx: &mut Rx,
    conn: &str,
    worker: u32,
    secret: &WorkerSecret,
) -> Challenged {
    let ours = Nonce::random();
    let hello = rmp_serde::to_vec_named(&hello_msg(worker, &ours)).unwrap();
    // NOTE: a new handshake drops the connection's channel (as the Python worker does).
    CHANNELS.with_borrow_mut(|c| c.remove(conn));
    send_raw(engine, conn, &hello);
    let sent = drain_frames(rx);
    let (_, raw, challenge) = sent
        .into_iter()
        .find(|(to, _, m)| to == conn && m["type"] == "challenge")
        .expect("a challenge");
    assert_eq!(challenge["handshake"], 3);
    assert_eq!(challenge["worker_id"], worker);
    let nonces = HandshakeNonces {
        worker: ours,
        router: Nonce::from_hex(challenge["nonce"].as_str().unwrap()).unwrap(),
    };
    let proof = challenge["proof"].as_str().unwrap();
    assert!(secret.verify_router_proof(&nonces, WorkerId(worker), proof));
    Challenged {
        nonces,
        hello,
        challenge: raw,
    }
}

/// Answer `c` with `register`, proving `key`, and start the worker side of the channel.
pub(super) fn register(
    engine: &RouterState,
    conn: &str,
    c: &Challenged,
    worker: u32,
    model: &str,
    key: &WorkerSecret,
) {
    let auth = key.worker_proof(&c.nonces, WorkerId(worker), model);
    let register = rmp_serde::to_vec_named(&register_msg(worker, model, Some(auth))).unwrap();
    let keys = ChannelKeys::derive(
        key,
        &c.nonces,
        &transcript_hash(&c.hello, &c.challenge, &register),
    );
    let ends = (Sealer::new(&keys.to_router), Opener::new(&keys.to_worker));
    CHANNELS.with_borrow_mut(|ch| ch.insert(conn.to_string(), ends));
    send_raw(engine, conn, &register);
}

/// Register `worker` on `conn`, proving `key`; the type of the router's last answer to `conn`.
pub(super) fn handshake(
    engine: &RouterState,
    rx: &mut Rx,
    conn: &str,
    worker: u32,
    model: &str,
    key: &WorkerSecret,
) -> String {
    let secret = engine
        .cfg
        .worker_secret
        .clone()
        .expect("a router with a secret");
    let c = hello(engine, rx, conn, worker, &secret);
    register(engine, conn, &c, worker, model, key);
    let sent = drain_raw(rx);
    let last = sent
        .iter()
        // NOTE: a held request may resume on the new connection (`generate`): not an answer.
        .rfind(|(to, m)| to == conn && m["type"] != "reconfigure" && m["type"] != "generate");
    let answer = last
        .map(|(_, m)| m["type"].as_str().unwrap().to_string())
        .unwrap_or_default();
    if answer != "registered" {
        CHANNELS.with_borrow_mut(|ch| ch.remove(conn));
    }
    answer
}
