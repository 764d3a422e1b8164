//! An in-memory transport, for tests of the engine: data streams are in-process pipes
//! (`tokio::io::duplex`) that join a session through a real [`JoinTable`], with the
//! real challenge, hello and proofs, so a driver test runs the same joins, records
//! and frames a TCP session does, without sockets.
//!
//! [`MemNet`] is the acceptor's side (its table; open sessions on it as a server
//! does) and [`MemDial`] the dialer's, implementing [`Dial`]. The pipes have no
//! latency of their own unless made with one ([`MemNet::with_latency`], [`pipe`]);
//! wrap the links ([`crate::fault::Faulty`], [`crate::pace::Paced`]) for cuts and
//! rates.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::DuplexStream;

use crate::NetError;
use crate::join::{Ahead, Dial, Dialed, JoinError, JoinTable, JoinWait, LinkMode, read_challenge};
use crate::stream::DataIo;

/// Bytes each direction of a pipe holds before a writer waits: a socket buffer's worth.
pub const PIPE_BYTES: usize = 1 << 20;

/// What goes wrong with one data stream below its records (tests of what a session
/// does about it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFault {
    /// The stream never connects: the dialer's join waits for ever.
    NoJoin,
    /// One byte is flipped once this many bytes went one way (`from_dialer`: from the
    /// dialer to the acceptor), as a broken middlebox would: the records' check finds it.
    Flip {
        /// Bytes that pass untouched.
        after: u64,
        /// The way that is corrupted.
        from_dialer: bool,
    },
}

/// Each data stream's fault, by its number in the session.
pub type WireFaults = Arc<dyn Fn(u16) -> Option<WireFault> + Send + Sync>;

/// How a pipe carries bytes, each way: how late, how fast, and which byte it flips.
#[derive(Debug, Clone, Copy, Default)]
struct Shape {
    latency: Duration,
    /// Bytes per second (`None`: no limit).
    rate: Option<u64>,
    /// The byte flipped (its offset), from the near end and from the far end.
    flip: [Option<u64>; 2],
}

/// The acceptor's side of an in-memory transport: the sessions its data streams may
/// join.
#[derive(Clone)]
pub struct MemNet {
    table: Arc<JoinTable<DuplexStream>>,
    latency: Duration,
    rate: Option<u64>,
    faults: Option<WireFaults>,
}

impl std::fmt::Debug for MemNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemNet")
            .field("latency", &self.latency)
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl MemNet {
    /// A transport whose joined streams wait at most `idle` without progress, and
    /// whose joins wait up to `park` for a session not open yet.
    pub fn new(idle: Duration, park: Duration) -> Self {
        MemNet {
            table: Arc::new(JoinTable::new(idle, park)),
            latency: Duration::ZERO,
            rate: None,
            faults: None,
        }
    }

    /// The same, each byte arriving `latency` after it was written, both ways (a link
    /// of twice that round-trip time and no bandwidth limit).
    pub fn with_latency(self, latency: Duration) -> Self {
        MemNet { latency, ..self }
    }

    /// The same, each data stream carrying at most `bytes_per_sec` each way (what is
    /// written queues, as behind a slow link).
    pub fn with_rate(self, bytes_per_sec: u64) -> Self {
        MemNet {
            rate: Some(bytes_per_sec.max(1)),
            ..self
        }
    }

    /// The same, data streams going wrong as `faults` says.
    pub fn with_faults(self, faults: WireFaults) -> Self {
        MemNet {
            faults: Some(faults),
            ..self
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
            latency: self.latency,
            rate: self.rate,
            faults: self.faults.clone(),
        }
    }
}

/// Two connected ends of an in-memory pipe whose bytes arrive `latency` after they
/// were written (none: a plain [`tokio::io::duplex`]), both ways, each way holding
/// [`PIPE_BYTES`] before a writer waits (and, with a latency, what is in flight
/// besides). Closing one end is seen at the other after the bytes written before it.
/// Must be called within a tokio runtime (its relays are tasks).
pub fn pipe(latency: Duration) -> (DuplexStream, DuplexStream) {
    shaped(Shape {
        latency,
        ..Shape::default()
    })
}

/// A pipe shaped as `shape` says, each way.
fn shaped(shape: Shape) -> (DuplexStream, DuplexStream) {
    let (near, a) = tokio::io::duplex(PIPE_BYTES);
    if shape.latency.is_zero() && shape.rate.is_none() && shape.flip == [None, None] {
        return (near, a);
    }
    let (b, far) = tokio::io::duplex(PIPE_BYTES);
    let (a_rx, a_tx) = tokio::io::split(a);
    let (b_rx, b_tx) = tokio::io::split(b);
    tokio::spawn(delay(a_rx, b_tx, shape, shape.flip[0]));
    tokio::spawn(delay(b_rx, a_tx, shape, shape.flip[1]));
    (near, far)
}

/// Copies `from` to `to`, each read's bytes written `latency` after they were read
/// (and, at a rate, after the bytes before them had their time on the link); flips the
/// byte at offset `flip`; shuts `to` down once `from` ends.
async fn delay<R, W>(mut from: R, mut to: W, shape: Shape, mut flip: Option<u64>)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 << 10];
    let (mut passed, mut free) = (0u64, tokio::time::Instant::now());
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let now = tokio::time::Instant::now();
        let mut at = now + shape.latency;
        if let Some(rate) = shape.rate {
            let took = Duration::from_nanos((n as u64).saturating_mul(1_000_000_000) / rate);
            free = free.max(now) + took;
            at = free + shape.latency;
        }
        if let Some(i) = flip.filter(|&f| f >= passed && f < passed + n as u64) {
            buf[(i - passed) as usize] ^= 0x5a;
            flip = None;
        }
        passed += n as u64;
        if tx.send((at, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// The dialer's side of an in-memory transport ([`MemNet::dialer`]).
#[derive(Clone)]
pub struct MemDial {
    table: Arc<JoinTable<DuplexStream>>,
    server: String,
    handshake: Duration,
    latency: Duration,
    rate: Option<u64>,
    faults: Option<WireFaults>,
}

impl std::fmt::Debug for MemDial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDial")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl MemDial {
    /// A pipe for data stream `stream` whose far end the acceptor's table takes, and
    /// its challenge.
    async fn connect(&self, stream: u16) -> Result<Dialed<DuplexStream>, NetError> {
        let mut shape = Shape {
            latency: self.latency,
            rate: self.rate,
            flip: [None, None],
        };
        match self.faults.as_ref().and_then(|f| f(stream)) {
            Some(WireFault::Flip { after, from_dialer }) => {
                shape.flip[usize::from(!from_dialer)] = Some(after);
            }
            Some(WireFault::NoJoin) | None => {}
        }
        let (mut near, far) = shaped(shape);
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
        if let Some(WireFault::NoJoin) = self.faults.as_ref().and_then(|f| f(stream)) {
            std::future::pending::<()>().await;
        }
        let hello = dmover_proto::data::DataHello {
            session,
            stream,
            nonce: rand::random(),
        };
        let joined = async {
            let d = self.connect(stream).await.map_err(JoinError::Net)?;
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

    /// A pipe with a latency delivers every byte, in order, that long after it was
    /// written, both ways, and its end after them.
    #[tokio::test(start_paused = true)]
    async fn a_latent_pipe_delays_each_way() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut a, mut b) = pipe(Duration::from_millis(50));
        let t0 = tokio::time::Instant::now();
        a.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!((&got, t0.elapsed()), (b"ping", Duration::from_millis(50)));
        b.write_all(b"pong").await.unwrap();
        a.read_exact(&mut got).await.unwrap();
        assert_eq!((&got, t0.elapsed()), (b"pong", Duration::from_millis(100)));
        drop(a);
        assert_eq!(b.read(&mut got).await.unwrap(), 0, "the end arrives");
    }
    /// A pipe with a rate takes each write's time on the link, one after the other,
    /// and flips the byte it was told to, once.
    #[tokio::test(start_paused = true)]
    async fn a_shaped_pipe_keeps_its_rate_and_flips_one_byte() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut a, mut b) = shaped(Shape {
            latency: Duration::from_millis(10),
            rate: Some(64 << 10),
            flip: [Some(70_000), None],
        });
        let t0 = tokio::time::Instant::now();
        let sent = vec![7u8; 128 << 10];
        let writing = async move {
            a.write_all(&sent).await.unwrap();
            a
        };
        let reading = async {
            let mut got = vec![0u8; 128 << 10];
            b.read_exact(&mut got).await.unwrap();
            got
        };
        let (_a, got) = tokio::join!(writing, reading);
        // Two seconds on the link, and the latency.
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(2010) && took < Duration::from_millis(2100),
            "{took:?}"
        );
        let flipped: Vec<usize> = (0..got.len()).filter(|&i| got[i] != 7).collect();
        assert_eq!(flipped, vec![70_000]);
    }

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
