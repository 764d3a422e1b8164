//! An in-memory transport, for tests of the engine: data streams are in-process pipes
//! (`tokio::io::duplex`) that join a session through a real [`JoinTable`], with the
//! real challenge, hello and proofs, so a driver test runs the same joins, records
//! and frames a TCP session does, without sockets.
//!
//! [`MemNet`] is the acceptor's side (its table; open sessions on it as a server
//! does) and [`MemDial`] the dialer's, implementing [`Dial`]. The pipes have no
//! latency of their own; wrap the links ([`crate::fault::Faulty`],
//! [`crate::pace::Paced`]) for cuts and rates.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::DuplexStream;

use crate::NetError;
use crate::join::{Ahead, Dial, Dialed, JoinError, JoinTable, JoinWait, LinkMode, read_challenge};
use crate::stream::DataIo;

/// Bytes each direction of a pipe holds before a writer waits: a socket buffer's worth.
pub const PIPE_BYTES: usize = 1 << 20;

/// The acceptor's side of an in-memory transport: the sessions its data streams may
/// join.
#[derive(Debug, Clone)]
pub struct MemNet {
    table: Arc<JoinTable<DuplexStream>>,
}

impl MemNet {
    /// A transport whose joined streams wait at most `idle` without progress, and
    /// whose joins wait up to `park` for a session not open yet.
    pub fn new(idle: Duration, park: Duration) -> Self {
        MemNet {
            table: Arc::new(JoinTable::new(idle, park)),
        }
    }

    /// The acceptor's join table: open and close sessions on it.
    pub fn table(&self) -> &JoinTable<DuplexStream> {
        &self.table
    }

    /// A dialer of this transport's sessions, naming the server `server` in messages;
    /// `handshake` bounds a join.
    pub fn dialer(&self, server: &str, handshake: Duration) -> MemDial {
        MemDial {
            table: self.table.clone(),
            server: server.to_string(),
            handshake,
        }
    }
}

/// The dialer's side of an in-memory transport ([`MemNet::dialer`]).
#[derive(Debug, Clone)]
pub struct MemDial {
    table: Arc<JoinTable<DuplexStream>>,
    server: String,
    handshake: Duration,
}

impl MemDial {
    /// A pipe whose far end the acceptor's table takes, and its challenge.
    async fn connect(&self) -> Result<Dialed<DuplexStream>, NetError> {
        let (mut near, far) = tokio::io::duplex(PIPE_BYTES);
        let table = self.table.clone();
        tokio::spawn(async move {
            if let Err(e) = table.accept(far, "memory").await {
                tracing::debug!("in-memory join refused: {e}");
            }
        });
        let challenge = read_challenge(&mut near, &self.server, self.handshake).await?;
        Ok(Dialed::new(
            near,
            challenge,
            self.server.clone(),
            self.handshake,
        ))
    }
}

impl Dial for MemDial {
    type Link = DataIo<DuplexStream>;
    /// Pipes cost nothing to make: none is opened ahead.
    type Early = ();

    fn server(&self) -> &str {
        &self.server
    }

    fn dial_ahead(&self, _n: u16) -> Ahead<()> {
        Ahead::default()
    }

    async fn join(
        &self,
        _early: Option<()>,
        session: u64,
        stream: u16,
        key: &[u8; 32],
        mode: LinkMode,
        wait: JoinWait,
    ) -> Result<DataIo<DuplexStream>, JoinError> {
        let hello = dmover_proto::data::DataHello {
            session,
            stream,
            nonce: rand::random(),
        };
        let joined = async {
            let d = self.connect().await.map_err(JoinError::Net)?;
            d.join(&hello, key, mode, wait).await
        };
        tokio::time::timeout(self.handshake, joined)
            .await
            .map_err(|_| {
                JoinError::Net(NetError::Timeout {
                    peer: self.server.clone(),
                    what: crate::join::JOIN_WAIT,
                    secs: self.handshake.as_secs(),
                })
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{AckRx, ChunkFrame, ChunkTx, DataLink, Received};
    use dmover_proto::control::DataProtection;
    use dmover_proto::data::FrameLimits;

    const KEY: [u8; 32] = [5; 32];
    const LIMIT: Duration = Duration::from_secs(5);

    /// A stream joined in memory carries frames and acknowledgements both ways, with
    /// the real proofs: a wrong key is refused as over TCP.
    #[tokio::test]
    async fn streams_join_in_memory_and_carry_frames() {
        let net = MemNet::new(LIMIT, LIMIT);
        let dial = net.dialer("mem", LIMIT);
        let mut joined = net
            .table()
            .open(3, KEY, DataProtection::Encrypted, 2)
            .unwrap();
        let mode = LinkMode {
            protection: DataProtection::Encrypted,
            idle: LIMIT,
        };
        let link = dial
            .join(None, 3, 1, &KEY, mode, JoinWait::Answer)
            .await
            .unwrap();
        let j = joined.recv().await.unwrap();
        assert_eq!(j.stream, 1);
        let (mut tx, mut acks) = link.into_source();
        let mut buf = vec![9u8; 1000];
        let f = ChunkFrame {
            chunk: 7,
            crc: Some(1),
            digests: &[],
            segments: &[(0, 1000)],
            zeros: false,
            part: None,
        };
        tx.send_chunk(f, &mut buf).await.unwrap();
        let mut rx = j.io;
        let limits = FrameLimits {
            max_payload: 4096,
            max_digests: 4,
        };
        let Received::Chunk(head) = rx.recv_frame(limits, |_, _| Ok(())).await.unwrap() else {
            panic!("a chunk");
        };
        assert_eq!((head.header.chunk, head.header.payload_len), (7, 1000));
        let mut got = vec![0u8; 1000];
        rx.recv_into(&mut got).await.unwrap();
        assert_eq!(got, vec![9u8; 1000]);
        rx.send_ack(1).await.unwrap();
        assert_eq!(acks.recv_ack().await.unwrap(), 1);
        // The wrong key: refused, an answer, not a connection failure.
        let e = dial
            .join(None, 3, 0, &[6; 32], mode, JoinWait::Answer)
            .await
            .unwrap_err();
        assert!(!e.connection(), "{e}");
    }
}
