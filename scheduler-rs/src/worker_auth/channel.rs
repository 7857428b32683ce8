//! Sealed worker-plane frames (handshake version 3, docs/protocol.md "Sealed frames").
//!
//! After an accepted `register`, every frame between router and worker, both ways, is
//! `0xc1 ‖ seq (u64 big-endian) ‖ AES-256-GCM(msgpack) ‖ tag`, with the 9-byte header as
//! associated data and the GCM nonce `0⁴ ‖ seq`. Each direction has its own key, from
//! HKDF-SHA256 with salt = worker nonce ‖ router nonce, IKM = the shared secret and info =
//! the direction's label ‖ SHA-256(hello ‖ challenge ‖ register) (the exact frames: a relay
//! that changed any of them leaves both sides with different keys).
//!
//! NOTE (invariants): a key seals in one direction only and its `seq` strictly increases from
//! 0, so no (key, nonce) pair is ever used twice; a receiver accepts only the next `seq`, so a
//! replayed, reordered or dropped frame fails exactly like a forged one. `0xc1` is the one
//! byte msgpack never uses: a sealed frame is never taken for a clear message.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce as GcmNonce, Tag};
use hkdf::Hkdf;
use sha2::{Digest, Sha256};

use super::sessions::{ConnId, HandshakeNonces};
use super::WorkerSecret;

/// The first byte of a sealed frame (msgpack "never used").
pub const SEALED: u8 = 0xc1;
/// Marker and sequence number: the associated data.
pub const HEADER_BYTES: usize = 9;
/// The GCM tag at the end of a sealed frame.
pub const TAG_BYTES: usize = 16;
/// HKDF info labels, one per direction. NOTE: same length, different.
const TO_ROUTER_LABEL: &[u8] = b"nitsum-channel-v3 worker->router";
const TO_WORKER_LABEL: &[u8] = b"nitsum-channel-v3 router->worker";

/// Whether `frame` is sealed (else it is a clear msgpack message).
pub fn is_sealed(frame: &[u8]) -> bool {
    frame.first() == Some(&SEALED)
}

/// SHA-256 of the exact `hello`, `challenge` and `register` frames, in that order.
pub fn transcript_hash(hello: &[u8], challenge: &[u8], register: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(hello);
    h.update(challenge);
    h.update(register);
    h.finalize().into()
}

/// The two keys of one handshake.
#[derive(Clone, PartialEq, Eq)]
pub struct ChannelKeys {
    pub to_router: [u8; 32],
    pub to_worker: [u8; 32],
}

impl std::fmt::Debug for ChannelKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelKeys(<redacted>)")
    }
}

impl ChannelKeys {
    /// Derive both directions' keys (module docs).
    pub fn derive(secret: &WorkerSecret, n: &HandshakeNonces, transcript: &[u8; 32]) -> Self {
        let mut salt = [0u8; 64];
        salt[..32].copy_from_slice(n.worker.as_bytes());
        salt[32..].copy_from_slice(n.router.as_bytes());
        let hk = Hkdf::<Sha256>::new(Some(&salt), secret.bytes());
        let key = |label: &[u8]| {
            let mut out = [0u8; 32];
            // NOTE: 32 bytes is far below HKDF-SHA256's limit (255 × 32): cannot fail.
            hk.expand_multi_info(&[label, &transcript[..]], &mut out)
                .expect("32 bytes of HKDF output");
            out
        };
        ChannelKeys {
            to_router: key(TO_ROUTER_LABEL),
            to_worker: key(TO_WORKER_LABEL),
        }
    }
}

fn gcm_nonce(seq: u64) -> GcmNonce<aes_gcm::aead::consts::U12> {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    n.into()
}

/// One direction's sending half.
pub struct Sealer {
    cipher: Aes256Gcm,
    next: u64,
}

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Self {
        Sealer {
            cipher: Aes256Gcm::new(key.into()),
            next: 0,
        }
    }

    /// `plaintext` sealed as the next frame.
    pub fn seal(&mut self, plaintext: &[u8]) -> Vec<u8> {
        let seq = self.next;
        // NOTE: 2^64 frames would take centuries; a wrap would reuse a nonce, so never allow it.
        self.next = seq.checked_add(1).expect("sealed frame sequence exhausted");
        let mut out = Vec::with_capacity(HEADER_BYTES + plaintext.len() + TAG_BYTES);
        out.push(SEALED);
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(plaintext);
        let (header, body) = out.split_at_mut(HEADER_BYTES);
        let tag = self
            .cipher
            .encrypt_in_place_detached(&gcm_nonce(seq), header, body)
            .expect("AES-GCM seals any frame under 64 GiB");
        out.extend_from_slice(&tag);
        out
    }
}

/// Why a sealed frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Not a sealed frame, or too short to be one.
    Malformed,
    /// Not the next sequence number (replayed, reordered, or one was dropped).
    Sequence { expected: u64, got: u64 },
    /// The tag does not verify (forged or modified).
    Forged,
}

/// One direction's receiving half.
pub struct Opener {
    cipher: Aes256Gcm,
    next: u64,
}

impl Opener {
    pub fn new(key: &[u8; 32]) -> Self {
        Opener {
            cipher: Aes256Gcm::new(key.into()),
            next: 0,
        }
    }

    /// The plaintext of `frame` if it is the next frame of this direction, sealed with its key.
    pub fn open(&mut self, frame: &[u8]) -> Result<Vec<u8>, FrameError> {
        if !is_sealed(frame) || frame.len() < HEADER_BYTES + TAG_BYTES {
            return Err(FrameError::Malformed);
        }
        let seq = u64::from_be_bytes(frame[1..HEADER_BYTES].try_into().expect("8 bytes"));
        if seq != self.next {
            let expected = self.next;
            return Err(FrameError::Sequence { expected, got: seq });
        }
        let (header, rest) = frame.split_at(HEADER_BYTES);
        let (body, tag) = rest.split_at(rest.len() - TAG_BYTES);
        let mut plain = body.to_vec();
        self.cipher
            .decrypt_in_place_detached(&gcm_nonce(seq), header, &mut plain, Tag::from_slice(tag))
            .map_err(|_| FrameError::Forged)?;
        self.next += 1;
        Ok(plain)
    }
}

/// What [`Channels::open`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    Plain(Vec<u8>),
    /// The connection has no channel (never sealed, or closed).
    NoChannel,
    Failed(FrameError),
}

/// The router's sealed channels, by connection.
///
/// NOTE: the send half is locked while a frame is sealed and queued ([`Self::seal_with`]), so
/// frames leave in `seq` order whichever thread sends them.
#[derive(Default)]
pub struct Channels {
    send: Mutex<HashMap<ConnId, Sealer>>,
    recv: Mutex<HashMap<ConnId, Opener>>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Channels({})", lock(&self.recv).len())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Channels {
    /// Start `conn`'s channel (the router's side: seals to the worker, opens from it),
    /// replacing one it had.
    pub fn install(&self, conn: &ConnId, keys: &ChannelKeys) {
        lock(&self.send).insert(conn.clone(), Sealer::new(&keys.to_worker));
        lock(&self.recv).insert(conn.clone(), Opener::new(&keys.to_router));
    }

    /// Close `conn`'s channel; returns whether it had one.
    pub fn close(&self, conn: &ConnId) -> bool {
        let sent = lock(&self.send).remove(conn).is_some();
        lock(&self.recv).remove(conn).is_some() || sent
    }

    /// Whether `conn` has a channel.
    pub fn has(&self, conn: &ConnId) -> bool {
        lock(&self.recv).contains_key(conn)
    }

    /// Seal `plaintext` for `conn` and hand it to `push` under the lock; returns false (and
    /// calls nothing) when `conn` has no channel.
    pub fn seal_with(&self, conn: &ConnId, plaintext: &[u8], push: impl FnOnce(Vec<u8>)) -> bool {
        let mut send = lock(&self.send);
        let Some(sealer) = send.get_mut(conn) else {
            return false;
        };
        push(sealer.seal(plaintext));
        true
    }

    /// Open a sealed frame from `conn`. NOTE: a failure leaves the channel as it was; the
    /// caller closes it.
    pub fn open(&self, conn: &ConnId, frame: &[u8]) -> Opened {
        match lock(&self.recv).get_mut(conn) {
            None => Opened::NoChannel,
            Some(opener) => match opener.open(frame) {
                Ok(p) => Opened::Plain(p),
                Err(e) => Opened::Failed(e),
            },
        }
    }
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod tests;
