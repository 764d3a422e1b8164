//! The control channel: preamble exchange and length-prefixed control frames.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use dmover_proto::control::{Control, LEN_PREFIX};
use dmover_proto::preamble::{self, ConnKind, Preamble};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::NetError;

/// The server's answer to a control preamble named no version this side speaks (or was
/// not a control preamble): the error inside the `io::Error` a [`ControlTcp`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server answered with protocol version {0}, which this side does not speak")]
pub struct VersionRefused(pub u16);

/// The server answered a control preamble with "busy, connect again after
/// `retry_after`" ([`Preamble::busy`]): the error inside the `io::Error` a
/// [`ControlTcp`] returns. The server closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server is busy (too many connections in set-up); retry after {} s", retry_after.as_secs())]
pub struct Busy {
    /// How long the server asked the client to wait before connecting again.
    pub retry_after: Duration,
}

impl Busy {
    /// The [`Busy`] inside `e`, if that is what it is.
    pub fn of(e: &io::Error) -> Option<Busy> {
        e.get_ref().and_then(|e| e.downcast_ref::<Busy>()).copied()
    }
}

/// The control connection's TCP stream. A client starts TLS right behind its preamble
/// ([`ControlTcp::awaiting_answer`]) instead of waiting a round trip for the server's
/// answer: the preamble goes out with the TLS ClientHello, and the first read takes
/// the answer's 8 bytes off the stream and checks them before any TLS byte is passed
/// on.
#[derive(Debug)]
pub struct ControlTcp {
    tcp: TcpStream,
    answer: [u8; preamble::LEN],
    /// Bytes of the answer read so far; `preamble::LEN` once checked (or none due).
    got: usize,
    /// The client's preamble, written with the first bytes written after it.
    preamble: [u8; preamble::LEN],
    /// Bytes of the preamble written so far; `preamble::LEN` once all (or none due).
    sent: usize,
}

impl ControlTcp {
    /// A stream with no preamble answer to read (the server side, or after it was read).
    pub fn new(tcp: TcpStream) -> Self {
        ControlTcp {
            tcp,
            answer: [0; preamble::LEN],
            got: preamble::LEN,
            preamble: [0; preamble::LEN],
            sent: preamble::LEN,
        }
    }

    /// A client's stream that is yet to send its control preamble `pre` and read the
    /// server's answer. The preamble goes out in one write with the first bytes
    /// written to the stream (TLS's ClientHello), so that a connection opened with
    /// TCP Fast Open ([`crate::tcp::connect_fast_open`]) carries both in its SYN,
    /// and the server answers the ClientHello a round trip sooner.
    pub fn awaiting_answer(tcp: TcpStream, pre: Preamble) -> Self {
        ControlTcp {
            tcp,
            answer: [0; preamble::LEN],
            got: 0,
            preamble: pre.encode(),
            sent: 0,
        }
    }

    /// Writes what is left of the preamble, with `bufs` behind it in the same write;
    /// `Ready(Ok(n))`: the preamble is out, and so are `n` bytes of `bufs`.
    fn poll_write_behind_preamble(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        while self.sent < preamble::LEN {
            let left = preamble::LEN - self.sent;
            let mut all = Vec::with_capacity(bufs.len() + 1);
            all.push(io::IoSlice::new(&self.preamble[self.sent..]));
            all.extend(bufs.iter().map(|b| io::IoSlice::new(b)));
            let n = ready!(Pin::new(&mut self.tcp).poll_write_vectored(cx, &all))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n.min(left);
            if n > left {
                return Poll::Ready(Ok(n - left));
            }
        }
        Poll::Ready(Ok(0))
    }

    /// The TCP stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.tcp
    }

    /// The smallest round trip the connection has seen (`None`: none yet, or the
    /// kernel does not tell): once TLS is up, its handshake's and TLS's.
    pub fn min_rtt(&self) -> Option<Duration> {
        crate::tcpinfo::min_rtt(&self.tcp)
    }

    /// This end's address: on a server, the address the client reached it at.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp.local_addr()
    }

    fn check_answer(&self) -> io::Result<()> {
        let p = Preamble::decode(&self.answer)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if let Some(n) = p.busy {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                Busy {
                    retry_after: Duration::from_secs(n.get().into()),
                },
            ));
        }
        if p.kind != ConnKind::Control
            || p.version < dmover_proto::MIN_PROTOCOL_VERSION
            || p.version > dmover_proto::PROTOCOL_VERSION
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                VersionRefused(p.version),
            ));
        }
        Ok(())
    }
}

impl From<TcpStream> for ControlTcp {
    fn from(tcp: TcpStream) -> Self {
        ControlTcp::new(tcp)
    }
}

impl AsyncRead for ControlTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        while me.got < preamble::LEN {
            let mut rb = ReadBuf::new(&mut me.answer[me.got..]);
            ready!(Pin::new(&mut me.tcp).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection before answering the preamble",
                )));
            }
            me.got += n;
            if me.got == preamble::LEN {
                me.check_answer()?;
            }
        }
        Pin::new(&mut me.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for ControlTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.sent < preamble::LEN {
            let n = ready!(me.poll_write_behind_preamble(cx, bufs))?;
            if n > 0 || bufs.iter().all(|b| b.is_empty()) {
                return Poll::Ready(Ok(n));
            }
        }
        Pin::new(&mut me.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_write_behind_preamble(cx, &[]))?;
        Pin::new(&mut me.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_write_behind_preamble(cx, &[]))?;
        Pin::new(&mut me.tcp).poll_shutdown(cx)
    }
}

/// Reads and writes control frames on one connection.
#[derive(Debug)]
pub struct ControlChannel<S> {
    stream: S,
    peer: String,
    max_frame: usize,
    /// Packed frames are read (not from a client before it authenticated).
    packed: bool,
    buf: Vec<u8>,
    /// Bytes received and not yet decoded (a partial frame survives a cancelled
    /// [`ControlChannel::recv`]).
    rbuf: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ControlChannel<S> {
    /// Wraps a connected stream whose preambles have been exchanged, to a peer that
    /// has proved who it is (a server, by its TLS key): frame bodies up to `max_frame`,
    /// packed or not.
    pub fn new(stream: S, peer: impl Into<String>, max_frame: usize) -> Self {
        ControlChannel {
            stream,
            peer: peer.into(),
            max_frame,
            packed: true,
            buf: Vec::new(),
            rbuf: Vec::new(),
        }
    }

    /// Wraps a connection from a client that has not authenticated yet: frame bodies
    /// up to `max_frame`, and no packed frames (nothing is unpacked for a peer nobody
    /// knows), until [`ControlChannel::authenticated`].
    pub fn unauthenticated(stream: S, peer: impl Into<String>, max_frame: usize) -> Self {
        ControlChannel {
            packed: false,
            ..Self::new(stream, peer, max_frame)
        }
    }

    /// The client's credential was verified: frame bodies up to
    /// [`dmover_proto::control::MAX_FRAME`], packed or not.
    pub fn authenticated(&mut self) {
        self.max_frame = dmover_proto::control::MAX_FRAME;
        self.packed = true;
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The underlying stream, mutably (to write raw bytes, e.g. in tests).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The peer's name, for messages.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Sends one message.
    pub async fn send(&mut self, msg: &Control) -> Result<(), NetError> {
        self.send_all(std::slice::from_ref(msg)).await
    }

    /// Sends `msgs` in order with one write (large ones packed, see
    /// [`Control::encode_packed`]): TLS makes as few records of them as it can and TCP
    /// as few segments, so a first flight of small messages and a manifest part is
    /// not cut into a packet each (a new connection's first round trip carries ten).
    pub async fn send_all(&mut self, msgs: &[Control]) -> Result<(), NetError> {
        self.buf.clear();
        for msg in msgs {
            msg.encode_packed(&mut self.buf)
                .map_err(|e| NetError::proto(&self.peer, e))?;
        }
        self.stream
            .write_all(&self.buf)
            .await
            .map_err(|e| NetError::io("writing to", &self.peer, e))?;
        self.stream
            .flush()
            .await
            .map_err(|e| NetError::io("writing to", &self.peer, e))
    }

    /// Receives one message. The body size is checked against the limit before any
    /// buffer is sized for it.
    ///
    /// Cancel-safe: dropping the future keeps whatever part of a frame has arrived, so
    /// it can run in a `select!` beside timers (heartbeats) without losing bytes.
    pub async fn recv(&mut self) -> Result<Control, NetError> {
        loop {
            if let Some(prefix) = self.rbuf.first_chunk::<LEN_PREFIX>() {
                let head = Control::frame_head(*prefix, self.max_frame)
                    .map_err(|e| NetError::proto(&self.peer, e))?;
                if head.packed && !self.packed {
                    return Err(NetError::proto(
                        &self.peer,
                        dmover_proto::Error::Violation(
                            "a packed control frame before authentication".into(),
                        ),
                    ));
                }
                let n = head.len;
                if self.rbuf.len() >= LEN_PREFIX + n {
                    let body = &self.rbuf[LEN_PREFIX..LEN_PREFIX + n];
                    let msg = if head.packed {
                        Control::decode_packed(body, self.max_frame)
                    } else {
                        Control::decode_body(body)
                    }
                    .map_err(|e| NetError::proto(&self.peer, e));
                    self.rbuf.drain(..LEN_PREFIX + n);
                    return msg;
                }
                // Room for the rest of this frame only: never more than the limit.
                self.rbuf.reserve(LEN_PREFIX + n - self.rbuf.len());
            } else {
                self.rbuf.reserve(LEN_PREFIX);
            }
            let got = self
                .stream
                .read_buf(&mut self.rbuf)
                .await
                .map_err(|e| NetError::io("reading from", &self.peer, e))?;
            if got == 0 {
                return Err(NetError::Closed {
                    peer: self.peer.clone(),
                });
            }
        }
    }

    /// Receives one message within `limit`.
    pub async fn recv_timeout(
        &mut self,
        limit: Duration,
        what: &'static str,
    ) -> Result<Control, NetError> {
        match tokio::time::timeout(limit, self.recv()).await {
            Ok(r) => r,
            Err(_) => Err(NetError::Timeout {
                peer: self.peer.clone(),
                what,
                secs: limit.as_secs(),
            }),
        }
    }

    /// Gives the stream back.
    pub fn into_inner(self) -> S {
        self.stream
    }
}

/// Connects `server`'s control connection (`host:port`), each address tried for
/// `timeout`: TCP with Fast Open where it can, the control preamble written with the
/// first bytes after it (TLS's ClientHello) and the server's answer read and checked
/// before the first TLS byte ([`ControlTcp::awaiting_answer`]). A server that is not
/// there may show only at the handshake's first read ([`never_connected`]).
pub async fn connect(server: &str, timeout: Duration) -> Result<ControlTcp, NetError> {
    let tcp =
        crate::tcp::connect_fast_open(server, &crate::link::SocketOptions::default(), timeout)
            .await?;
    Ok(ControlTcp::awaiting_answer(
        tcp,
        Preamble {
            kind: ConnKind::Control,
            version: dmover_proto::PROTOCOL_VERSION,
            busy: None,
        },
    ))
}

/// Whether a connection failed before it was ever made: one opened with TCP Fast
/// Open is made at its first write, so a server that is not there shows at the first
/// read (as `ENOTCONN` or a refused connection), to be said as a failed connect.
pub fn never_connected(e: &io::Error) -> bool {
    crate::tcp::never_connected(e)
}

/// Writes a preamble.
pub async fn write_preamble<S: AsyncWrite + Unpin>(
    s: &mut S,
    p: Preamble,
    peer: &str,
) -> Result<(), NetError> {
    s.write_all(&p.encode())
        .await
        .map_err(|e| NetError::io("writing to", peer, e))
}

/// Reads a preamble.
pub async fn read_preamble<S: AsyncRead + Unpin>(
    s: &mut S,
    peer: &str,
) -> Result<Preamble, NetError> {
    let mut b = [0u8; preamble::LEN];
    s.read_exact(&mut b)
        .await
        .map_err(|e| NetError::io("reading from", peer, e))?;
    Preamble::decode(&b).map_err(|e| NetError::proto(peer, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A client that starts TLS right behind its preamble learns of a server that
    /// answers with a version it does not speak from the answer, not from a TLS error.
    #[tokio::test]
    async fn a_refused_version_stops_the_pipelined_tls_handshake() {
        let dir = tempfile::tempdir().unwrap();
        for answer in [0u16, 2, dmover_proto::PROTOCOL_VERSION + 1] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let server = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let p = read_preamble(&mut s, "client").await.unwrap();
                assert_eq!(p.kind, ConnKind::Control);
                let reply = Preamble {
                    kind: ConnKind::Control,
                    version: answer,
                    busy: None,
                };
                write_preamble(&mut s, reply, "client").await.unwrap();
                // The ClientHello arrived behind the preamble, unanswered.
                let mut b = [0u8; 5];
                s.read_exact(&mut b).await.unwrap();
                assert_eq!(b[0], 0x16, "a TLS handshake record");
            });
            let tcp = TcpStream::connect(&addr).await.unwrap();
            let pre = Preamble {
                kind: ConnKind::Control,
                version: dmover_proto::PROTOCOL_VERSION,
                busy: None,
            };
            let c = crate::tls::TlsConnector::new(crate::tls::Trust::KnownHosts(
                dir.path().join("known_hosts"),
            ))
            .unwrap();
            let r = tokio::time::timeout(
                Duration::from_secs(30),
                c.connect(ControlTcp::awaiting_answer(tcp, pre), &addr),
            )
            .await
            .expect("the handshake ends");
            match r {
                Err(NetError::Tls { source, .. }) => {
                    let refused = source
                        .get_ref()
                        .and_then(|e| e.downcast_ref::<VersionRefused>());
                    assert_eq!(refused, Some(&VersionRefused(answer)), "{source}");
                }
                Err(e) => panic!("answer {answer}: {e}"),
                Ok(_) => panic!("answer {answer}: TLS went on"),
            }
            server.await.unwrap();
        }
    }

    /// A busy answer stops the pipelined TLS handshake with [`Busy`] and the time the
    /// server asked for.
    #[tokio::test]
    async fn a_busy_answer_is_its_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_preamble(&mut s, "client").await.unwrap();
            let busy = Preamble::busy(std::num::NonZeroU8::new(3).unwrap());
            write_preamble(&mut s, busy, "client").await.unwrap();
            s.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        });
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let pre = Preamble::new(ConnKind::Control, dmover_proto::PROTOCOL_VERSION);
        let c = crate::tls::TlsConnector::new(crate::tls::Trust::KnownHosts(
            dir.path().join("known_hosts"),
        ))
        .unwrap();
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            c.connect(ControlTcp::awaiting_answer(tcp, pre), &addr),
        )
        .await
        .expect("the handshake ends");
        match r {
            Err(NetError::Tls { source, .. }) => assert_eq!(
                Busy::of(&source),
                Some(Busy {
                    retry_after: Duration::from_secs(3)
                }),
                "{source}"
            ),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("TLS went on"),
        }
        server.await.unwrap();
    }

    /// A manifest big enough to pack, as a client's first flight carries one.
    fn first_flight() -> Vec<Control> {
        use dmover_proto::control::{Auth, Credential, Hello, ManifestPart};
        use dmover_proto::manifest::{Entry, EntryKind, Mtime};
        let entries = (0..512u32)
            .map(|i| Entry {
                parent: 0,
                name: format!("file_{i:05}.dat").into_bytes(),
                kind: EntryKind::File { size: 8192 },
                mode: 0o644,
                mtime: Mtime {
                    sec: 1_790_000_000,
                    nsec: 1000 * i,
                },
            })
            .collect();
        vec![
            Control::Hello(Hello {
                software: "dmover test".into(),
                nonce: [7; 32],
            }),
            Control::Auth(Auth {
                user: "u".into(),
                credential: Credential::None,
            }),
            Control::Manifest(ManifestPart { entries }),
            Control::Ping,
        ]
    }

    /// `send_all` packs only what is large and not `Hello` or `Auth`; the reader takes
    /// the messages in order.
    #[tokio::test]
    async fn send_all_packs_the_manifest_and_keeps_the_order() {
        let msgs = first_flight();
        let raw: usize = msgs.iter().map(|m| m.to_frame().unwrap().len()).sum();
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut tx = ControlChannel::new(a, "b", dmover_proto::control::MAX_FRAME);
        tx.send_all(&msgs).await.unwrap();
        drop(tx);
        let mut wire = Vec::new();
        b.read_to_end(&mut wire).await.unwrap();
        assert!(wire.len() * 4 < raw, "{} bytes of {raw}", wire.len());
        // Hello and Auth lead as they were, unpacked.
        let head: Vec<u8> = msgs[..2]
            .iter()
            .flat_map(|m| m.to_frame().unwrap())
            .collect();
        assert_eq!(wire[..head.len()], head[..]);
        let packed = Control::frame_head(
            wire[head.len()..head.len() + 4].try_into().unwrap(),
            usize::MAX,
        )
        .unwrap();
        assert!(packed.packed);
        let read = tokio::io::join(&wire[..], tokio::io::sink());
        let mut rx = ControlChannel::new(read, "a", dmover_proto::control::MAX_FRAME);
        for m in &msgs {
            assert_eq!(&rx.recv().await.unwrap(), m);
        }
    }

    /// A server does not unpack for a client that has not authenticated: a packed frame
    /// then is a protocol error; after `authenticated` it is read.
    #[tokio::test]
    async fn packed_frames_wait_for_authentication() {
        let msgs = first_flight();
        for authenticate in [false, true] {
            let (a, b) = tokio::io::duplex(1 << 20);
            let mut tx = ControlChannel::new(a, "server", dmover_proto::control::MAX_FRAME);
            let mut rx = ControlChannel::unauthenticated(b, "client", 64 << 10);
            tx.send_all(&msgs[..3]).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), msgs[0]);
            assert_eq!(rx.recv().await.unwrap(), msgs[1]);
            if authenticate {
                rx.authenticated();
                assert_eq!(rx.recv().await.unwrap(), msgs[2]);
            } else {
                let e = rx.recv().await.unwrap_err();
                assert!(
                    e.to_string()
                        .contains("packed control frame before authentication"),
                    "{e}"
                );
            }
        }
    }
}
