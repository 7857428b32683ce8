use std::path::PathBuf;

use bytes::Bytes;
use serde_json::Value;

use super::*;
use crate::worker_auth::{hex, unhex, Nonce};

fn keys() -> ChannelKeys {
    let s = WorkerSecret::new("0123456789abcdef-secret").unwrap();
    let n = HandshakeNonces {
        worker: Nonce::random(),
        router: Nonce::random(),
    };
    ChannelKeys::derive(&s, &n, &transcript_hash(b"h", b"c", b"r"))
}

#[test]
fn frames_open_once_in_order_and_only_unmodified() {
    let k = keys();
    assert_ne!(k.to_router, k.to_worker, "one key per direction");
    let (mut tx, mut rx) = (Sealer::new(&k.to_router), Opener::new(&k.to_router));
    let f0 = tx.seal(b"first");
    let f1 = tx.seal(b"second");
    let f2 = tx.seal(b"third");
    assert!(is_sealed(&f0) && f0.len() == HEADER_BYTES + 5 + TAG_BYTES);
    assert!(!f0.windows(5).any(|w| w == b"first"), "encrypted");
    // A dropped frame: f1 is missing, so f2 is refused.
    assert_eq!(
        rx.open(&f2),
        Err(FrameError::Sequence {
            expected: 0,
            got: 2
        })
    );
    assert_eq!(rx.open(&f0).unwrap(), b"first");
    assert!(
        matches!(rx.open(&f0), Err(FrameError::Sequence { .. })),
        "replay"
    );
    for i in [0, 5, HEADER_BYTES, f1.len() - 1] {
        let mut bad = f1.clone();
        bad[i] ^= 1;
        assert!(rx.open(&bad).is_err(), "byte {i} flipped");
    }
    assert_eq!(rx.open(&f1[..HEADER_BYTES + 3]), Err(FrameError::Malformed));
    assert_eq!(rx.open(&f1).unwrap(), b"second");
    assert_eq!(rx.open(&f2).unwrap(), b"third");
    // The other direction's key opens nothing of this one.
    let mut other = Opener::new(&k.to_worker);
    assert_eq!(
        other.open(&Sealer::new(&k.to_router).seal(b"x")),
        Err(FrameError::Forged)
    );
}

#[test]
fn keys_bind_the_secret_nonces_and_transcript() {
    let s = WorkerSecret::new("0123456789abcdef-secret").unwrap();
    let n = HandshakeNonces {
        worker: Nonce::random(),
        router: Nonce::random(),
    };
    let t = transcript_hash(b"hello", b"challenge", b"register");
    let k = ChannelKeys::derive(&s, &n, &t);
    assert_eq!(k, ChannelKeys::derive(&s, &n, &t));
    let other = WorkerSecret::new("another-secret-of-16+").unwrap();
    assert_ne!(k, ChannelKeys::derive(&other, &n, &t));
    let n2 = HandshakeNonces {
        router: Nonce::random(),
        ..n
    };
    assert_ne!(k, ChannelKeys::derive(&s, &n2, &t));
    let t2 = transcript_hash(b"hello", b"challenge", b"registeR");
    assert_ne!(k, ChannelKeys::derive(&s, &n, &t2));
}

#[test]
fn the_table_seals_in_order_and_closes() {
    let (c, k) = (Bytes::from_static(b"conn"), keys());
    let t = Channels::default();
    assert!(!t.seal_with(&c, b"x", |_| panic!("no channel")));
    assert_eq!(t.open(&c, b"\xc1"), Opened::NoChannel);
    t.install(&c, &k);
    let mut frames = Vec::new();
    assert!(t.seal_with(&c, b"a", |f| frames.push(f)));
    assert!(t.seal_with(&c, b"b", |f| frames.push(f)));
    let mut worker_rx = Opener::new(&k.to_worker);
    assert_eq!(worker_rx.open(&frames[0]).unwrap(), b"a");
    assert_eq!(worker_rx.open(&frames[1]).unwrap(), b"b");
    let mut worker_tx = Sealer::new(&k.to_router);
    assert_eq!(
        t.open(&c, &worker_tx.seal(b"up")),
        Opened::Plain(b"up".to_vec())
    );
    assert!(t.close(&c) && !t.has(&c) && !t.close(&c));
}

fn field(v: &Value, name: &str) -> Vec<u8> {
    unhex(v[name].as_str().unwrap_or_else(|| panic!("{name}"))).unwrap()
}

/// The vectors the Python worker's tests check too (tests/test_worker_channel.py).
#[test]
fn matches_the_shared_vectors() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/channel_v3.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let s = WorkerSecret::new(v["secret"].as_str().unwrap()).unwrap();
    let n = HandshakeNonces {
        worker: Nonce::from_hex(v["worker_nonce"].as_str().unwrap()).unwrap(),
        router: Nonce::from_hex(v["router_nonce"].as_str().unwrap()).unwrap(),
    };
    let t = transcript_hash(
        &field(&v, "hello"),
        &field(&v, "challenge"),
        &field(&v, "register"),
    );
    assert_eq!(hex(&t), v["transcript"].as_str().unwrap());
    let k = ChannelKeys::derive(&s, &n, &t);
    assert_eq!(hex(&k.to_router), v["to_router_key"].as_str().unwrap());
    assert_eq!(hex(&k.to_worker), v["to_worker_key"].as_str().unwrap());
    for (dir, key) in [("to_router", k.to_router), ("to_worker", k.to_worker)] {
        let (mut tx, mut rx) = (Sealer::new(&key), Opener::new(&key));
        for f in v[dir].as_array().unwrap() {
            let (plain, sealed) = (field(f, "plain"), field(f, "sealed"));
            assert_eq!(tx.seal(&plain), sealed, "{dir}");
            assert_eq!(rx.open(&sealed).unwrap(), plain, "{dir}");
        }
    }
}
