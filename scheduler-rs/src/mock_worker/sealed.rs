//! The mock worker's end of the sealed channel (worker_auth/channel.rs): its socket, the
//! exact `hello` it sent, and once registered the keys of both directions.

use bytes::Bytes;
use zeromq::{DealerSocket, SocketSend, ZmqMessage};

use crate::worker_auth::channel::{is_sealed, transcript_hash, Opener, Sealer};
use crate::worker_auth::{ChannelKeys, HandshakeNonces, WorkerSecret};

/// A mock worker's socket, sealing once its channel is up.
pub(super) struct MockLink {
    pub sock: DealerSocket,
    channel: Option<(Sealer, Opener)>,
    hello: Vec<u8>,
}

impl MockLink {
    pub fn new(sock: DealerSocket) -> Self {
        MockLink {
            sock,
            channel: None,
            hello: Vec::new(),
        }
    }

    /// Open a handshake: send `hello` in clear and drop the old channel.
    pub async fn hello(&mut self, hello: Vec<u8>) {
        self.channel = None;
        self.hello = hello.clone();
        let _ = self.sock.send(ZmqMessage::from(hello)).await;
    }

    /// Answer `challenge` with `register` in clear, then seal everything with the new keys.
    pub async fn register(
        &mut self,
        secret: &WorkerSecret,
        n: &HandshakeNonces,
        challenge: &[u8],
        register: Vec<u8>,
    ) {
        let t = transcript_hash(&self.hello, challenge, &register);
        let keys = ChannelKeys::derive(secret, n, &t);
        let _ = self.sock.send(ZmqMessage::from(register)).await;
        self.channel = Some((Sealer::new(&keys.to_router), Opener::new(&keys.to_worker)));
    }

    /// Send a one-frame message: sealed when the channel is up.
    pub async fn send(&mut self, msg: ZmqMessage) {
        let frame: Bytes = msg.into_vec().pop().unwrap_or_default();
        let frame = match &mut self.channel {
            Some((sealer, _)) => Bytes::from(sealer.seal(&frame)),
            None => frame,
        };
        let _ = self.sock.send(ZmqMessage::from(frame)).await;
    }

    /// The message in a received frame: opened when sealed (`None` when it fails to, which
    /// drops the channel), as it is when clear (the handshake).
    pub fn open(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        if !is_sealed(frame) {
            return Some(frame.to_vec());
        }
        let (_, opener) = self.channel.as_mut()?;
        let opened = opener.open(frame).ok();
        if opened.is_none() {
            self.channel = None;
        }
        opened
    }
}
