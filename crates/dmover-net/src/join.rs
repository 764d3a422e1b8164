//! Joining data streams to a session (see [`dmover_proto::data`]): the dialer's side
//! ([`Dialer`]: connect, preamble, challenge, then hello and proof, early data behind
//! it or not) and the acceptor's ([`JoinTable`]: challenge, proof checked against the
//! sessions it knows, status and server proof, then the stream handed to its session).
//! What comes out either way is a [`DataIo`], the engine's [`crate::transport::DataLink`];
//! the engine names neither TCP nor the join proofs. The dialer's side is the
//! [`Dial`] trait (a transport's way to open and join a session's streams): [`Dialer`]
//! over TCP, [`crate::memnet::MemDial`] over in-memory pipes; the acceptor's
//! [`JoinTable`] takes streams of any byte-stream type.
//!
//! The caller keeps the policy: which sessions exist, their keys (from the control
//! connection), how many streams each may join, and the time limits.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use dmover_proto::PROTOCOL_VERSION;
use dmover_proto::auth::{self, Role};
use dmover_proto::control::DataProtection;
use dmover_proto::data::{DataHello, HELLO_LEN, JOIN_PROOF_LEN, JoinStatus};
use dmover_proto::preamble::{ConnKind, Preamble};
use parking_lot::Mutex;
use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::NetError;
use crate::control::write_preamble;
use crate::stream::{DataIo, EARLY_BYTES, JoinFailed};
use crate::tcp::{self, SocketOptions};
use crate::transport::DataLink;

/// How a dialer opens and joins a session's data streams on one transport, toward one
/// server: connections opened ahead of the session ([`Dial::dial_ahead`]: they need
/// the server, not the session), then each stream joined with the session's key
/// ([`Dial::join`]). [`Dialer`] is TCP's; [`crate::memnet::MemDial`] joins in-memory
/// pipes to an in-process [`JoinTable`], for tests of the engine.
pub trait Dial: Clone + Send + Sync + 'static {
    /// A joined data stream.
    type Link: DataLink;
    /// A connection opened for one stream before its session was known.
    type Early: Send + 'static;

    /// The server dialed, as messages name it.
    fn server(&self) -> &str;

    /// Starts opening `n` connections ahead of the session, one per stream index.
    fn dial_ahead(&self, n: u16) -> Ahead<Self::Early>;

    /// Joins data stream `stream` of session `session` (key `key`) on the connection
    /// opened ahead for it (`early`), or on a new one; within the handshake limit.
    /// With [`JoinWait::Pipelined`] the stream comes back before the server answered.
    fn join(
        &self,
        early: Option<Self::Early>,
        session: u64,
        stream: u16,
        key: &[u8; 32],
        mode: LinkMode,
        wait: JoinWait,
    ) -> impl Future<Output = Result<Self::Link, JoinError>> + Send;
}

/// What a [`NetError::Timeout`] of a data stream join says it waited for.
pub const JOIN_WAIT: &str = "data stream join";

/// How a joined stream carries its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkMode {
    /// Plain, authenticated or encrypted records.
    pub protection: DataProtection,
    /// How long a read or write may wait without progress.
    pub idle: Duration,
}

/// How a data stream's join waits for the server's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinWait {
    /// Before the stream is handed over (pull, memory test).
    Answer,
    /// Not at all: the source sends its first chunks right behind the proof, and the
    /// stream reads and checks the answer before anything else it receives
    /// ([`DataIo::awaiting_join`]).
    Pipelined,
}

/// Why a dialer's join failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Connecting, the preamble, the challenge or the write of hello and proof failed,
    /// or the whole join took longer than its limit ([`NetError::Timeout`] waiting for
    /// [`JOIN_WAIT`]).
    #[error(transparent)]
    Net(NetError),
    /// The server's answer failed: the error [`DataIo::finish_join`] returned, a
    /// [`JoinFailed`] inside it when the answer came and was bad.
    #[error("reading from {peer}: {source}")]
    Answer {
        /// The server.
        peer: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

impl JoinError {
    /// Whether the connection failed rather than the join (worth one fresh try): a
    /// closed connection or a refusal, a bad proof or no answer in time, is the
    /// server's answer.
    pub fn connection(&self) -> bool {
        match self {
            JoinError::Net(_) => true,
            JoinError::Answer { source, .. } => match JoinFailed::of(source) {
                Some(JoinFailed::Broken { kind, .. }) => *kind != io::ErrorKind::UnexpectedEof,
                Some(_) => false,
                None => source.kind() != io::ErrorKind::UnexpectedEof,
            },
        }
    }
}

/// Where and how a client dials its data connections.
#[derive(Debug, Clone)]
pub struct Dialer {
    server: String,
    socket: SocketOptions,
    connect_timeout: Duration,
    handshake: Duration,
}

impl Dialer {
    /// Data connections to `server` (`host:port`) with `socket`'s settings, each
    /// address tried for `connect_timeout`; `handshake` bounds the wait for the
    /// challenge, for the join's answer and for a whole join.
    pub fn new(
        server: impl Into<String>,
        socket: SocketOptions,
        connect_timeout: Duration,
        handshake: Duration,
    ) -> Self {
        Dialer {
            server: server.into(),
            socket,
            connect_timeout,
            handshake,
        }
    }

    /// The server dialed.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Connects a data connection and reads the server's join challenge.
    pub async fn connect(&self) -> Result<Dialed, NetError> {
        let server = self.server.as_str();
        // The preamble is written first: it rides the SYN under TCP Fast Open.
        let mut io = tcp::connect_fast_open(server, &self.socket, self.connect_timeout).await?;
        let pre = Preamble {
            kind: ConnKind::Data,
            version: PROTOCOL_VERSION,
            busy: None,
        };
        write_preamble(&mut io, pre, server).await?;
        let challenge = read_challenge(&mut io, server, self.handshake).await?;
        Ok(Dialed::new(
            io,
            challenge,
            self.server.clone(),
            self.handshake,
        ))
    }

    /// Starts dialing `n` data connections in the background, before the session is
    /// known (they need the server, not the session).
    pub fn dial_ahead(&self, n: u16) -> Dials {
        Ahead::new(
            (0..n)
                .map(|_| {
                    let me = self.clone();
                    Early(Some(tokio::spawn(async move { me.connect().await })))
                })
                .collect(),
        )
    }

    /// Joins data stream `stream` of session `session` (key `key`) on the connection
    /// dialed ahead for it (`early`), or on a new one if that failed; all within the
    /// handshake limit. With [`JoinWait::Pipelined`] the stream comes back before the
    /// server answered; an early connection is then only replaced when it is seen
    /// closed, or the write of its hello and proof fails, before any record went out:
    /// once a stream may have carried records, no other connection ever takes its index
    /// (its record keys and nonces would repeat).
    pub async fn join(
        &self,
        early: Option<Early>,
        session: u64,
        stream: u16,
        key: &[u8; 32],
        mode: LinkMode,
        wait: JoinWait,
    ) -> Result<DataIo, JoinError> {
        let hello = DataHello {
            session,
            stream,
            nonce: rand::random(),
        };
        let joined = async {
            if let Some(early) = early {
                let first = match early.dialed(&self.server).await {
                    Ok(d) if wait == JoinWait::Pipelined && !d.still_open() => {
                        Err(JoinError::Net(NetError::Closed {
                            peer: self.server.clone(),
                        }))
                    }
                    Ok(d) => d.join(&hello, key, mode, wait).await,
                    Err(e) => Err(JoinError::Net(e)),
                };
                match first {
                    Ok(io) => return Ok(io),
                    Err(e) if !e.connection() => return Err(e),
                    Err(e) => tracing::debug!(
                        "data stream {stream}: early connection failed ({e}); dialing again"
                    ),
                }
            }
            // A server under load answers a data connection busy (before its
            // challenge): dialed again, after a short wait, within the join's limit.
            let d = loop {
                match self.connect().await {
                    Ok(d) => break d,
                    Err(e) => match busy_of(&e) {
                        Some(after) => {
                            let wait = after
                                .min(DATA_BUSY_WAIT)
                                .mul_f64(0.5 + rand::random::<f64>());
                            tracing::debug!(
                                "data stream {stream}: the server is busy; dialing again in \
                                 {:.2} s",
                                wait.as_secs_f64()
                            );
                            tokio::time::sleep(wait).await;
                        }
                        None => return Err(JoinError::Net(e)),
                    },
                }
            };
            d.join(&hello, key, mode, wait).await
        };
        tokio::time::timeout(self.handshake, joined)
            .await
            .map_err(|_| {
                JoinError::Net(NetError::Timeout {
                    peer: self.server.clone(),
                    what: JOIN_WAIT,
                    secs: self.handshake.as_secs(),
                })
            })?
    }
}

impl Dial for Dialer {
    type Link = DataIo;
    type Early = Early;

    fn server(&self) -> &str {
        Dialer::server(self)
    }

    fn dial_ahead(&self, n: u16) -> Dials {
        Dialer::dial_ahead(self, n)
    }

    fn join(
        &self,
        early: Option<Early>,
        session: u64,
        stream: u16,
        key: &[u8; 32],
        mode: LinkMode,
        wait: JoinWait,
    ) -> impl Future<Output = Result<DataIo, JoinError>> + Send {
        Dialer::join(self, early, session, stream, key, mode, wait)
    }
}

/// The longest a data connection answered busy waits before it is dialed again (the
/// server's "retry after" is meant for control connections; a join has its limit).
const DATA_BUSY_WAIT: Duration = Duration::from_millis(500);

/// The server's "busy, retry after" in `e`: a data connection answered with the busy
/// preamble instead of its challenge (a server refusing connections under load answers
/// every kind so), or a control connection's [`crate::control::Busy`].
pub fn busy_of(e: &NetError) -> Option<Duration> {
    match e {
        NetError::Io { source, .. } | NetError::Tls { source, .. } => {
            crate::control::Busy::of(source).map(|b| b.retry_after)
        }
        _ => None,
    }
}

/// Reads exactly `buf` from `io`; at an early end, the error says "busy" if what came
/// first is the busy preamble.
async fn read_challenge_bytes<S: AsyncRead + Unpin>(io: &mut S, buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // The busy answer then the end, or a reset (the server closed before all the
        // client sent came in).
        let end = match io.read(&mut buf[got..]).await {
            Ok(0) => io::ErrorKind::UnexpectedEof.into(),
            Ok(n) => {
                got += n;
                continue;
            }
            Err(e) => e,
        };
        let busy = (got >= dmover_proto::preamble::LEN)
            .then(|| Preamble::decode(buf[..8].try_into().expect("8 bytes")).ok())
            .flatten()
            .and_then(|p| p.busy);
        return Err(match busy {
            Some(n) => io::Error::new(
                io::ErrorKind::ConnectionRefused,
                crate::control::Busy {
                    retry_after: Duration::from_secs(n.get().into()),
                },
            ),
            None => end,
        });
    }
    Ok(())
}

/// Reads the server's join challenge from a data connection, within `handshake`.
pub(crate) async fn read_challenge<S: AsyncRead + Unpin>(
    io: &mut S,
    server: &str,
    handshake: Duration,
) -> Result<[u8; JOIN_PROOF_LEN], NetError> {
    let mut challenge = [0u8; JOIN_PROOF_LEN];
    tokio::time::timeout(handshake, read_challenge_bytes(io, &mut challenge))
        .await
        .map_err(|_| NetError::Timeout {
            peer: server.into(),
            what: "data stream challenge",
            secs: handshake.as_secs(),
        })?
        .map_err(|e| {
            // Made at its first write under TCP Fast Open: see `tcp::connect_fast_open`.
            let what = if tcp::never_connected(&e) {
                "connecting to"
            } else {
                "reading from"
            };
            NetError::io(what, server, e)
        })?;
    Ok(challenge)
}

/// A data connection made before its session was known: connected, preamble sent,
/// the server's challenge read.
#[derive(Debug)]
pub struct Dialed<S = TcpStream> {
    io: S,
    challenge: [u8; JOIN_PROOF_LEN],
    server: String,
    handshake: Duration,
}

impl Dialed {
    /// Whether the connection still looks open, found without waiting: the server
    /// closes a data connection whose join does not come within its set-up limit.
    pub fn still_open(&self) -> bool {
        let mut b = [0u8; 1];
        let mut rb = tokio::io::ReadBuf::new(&mut b);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        self.io.poll_peek(&mut cx, &mut rb).is_pending()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Dialed<S> {
    /// A connection whose challenge was read (`io`, from `server`).
    pub(crate) fn new(
        io: S,
        challenge: [u8; JOIN_PROOF_LEN],
        server: String,
        handshake: Duration,
    ) -> Self {
        Dialed {
            io,
            challenge,
            server,
            handshake,
        }
    }

    /// The connection's side of the join: hello and proof in one write, then (with
    /// [`JoinWait::Answer`]) the server's status and proof.
    pub async fn join(
        self,
        hello: &DataHello,
        key: &[u8; 32],
        mode: LinkMode,
        wait: JoinWait,
    ) -> Result<DataIo<S>, JoinError> {
        let Dialed {
            mut io,
            challenge,
            server,
            handshake,
        } = self;
        let proof = auth::join_proof(
            key,
            Role::Client,
            hello.session,
            hello.stream,
            &hello.nonce,
            &challenge,
        );
        let mut first = Vec::with_capacity(HELLO_LEN + JOIN_PROOF_LEN);
        first.extend_from_slice(&hello.encode());
        first.extend_from_slice(&proof);
        io.write_all(&first)
            .await
            .map_err(|e| JoinError::Net(NetError::io("writing to", &server, e)))?;
        let want = auth::join_proof(
            key,
            Role::Server,
            hello.session,
            hello.stream,
            &hello.nonce,
            &challenge,
        );
        let mut io = DataIo::new(
            io,
            mode.protection,
            key,
            hello.stream,
            Role::Client,
            Some(mode.idle),
        )
        .awaiting_join(hello.stream, want, handshake);
        if wait == JoinWait::Answer {
            if let Err(source) = io.finish_join().await {
                return Err(JoinError::Answer {
                    peer: server,
                    source,
                });
            }
        }
        Ok(io)
    }
}

/// Connections opened ahead, one per stream index (those not taken are closed when
/// this is dropped).
#[derive(Debug)]
pub struct Ahead<E>(Vec<Option<E>>);

impl<E> Default for Ahead<E> {
    fn default() -> Self {
        Ahead(Vec::new())
    }
}

impl<E> Ahead<E> {
    /// The connections opened, the one for stream `i` at `i`.
    pub fn new(opened: Vec<E>) -> Self {
        Ahead(opened.into_iter().map(Some).collect())
    }

    /// The connection opened ahead for stream `stream`, if there is one left.
    pub fn take(&mut self, stream: u16) -> Option<E> {
        self.0.get_mut(stream as usize).and_then(Option::take)
    }

    /// Closes the connections of streams `streams..` (the session granted fewer
    /// streams than were opened).
    pub fn keep(&mut self, streams: u16) {
        let keep = (streams as usize).min(self.0.len());
        self.0.truncate(keep);
    }
}

/// TCP data connections dialed ahead.
pub type Dials = Ahead<Early>;

/// A TCP connection dialed ahead for one stream, perhaps still connecting (the dial
/// is aborted when this is dropped untaken).
#[derive(Debug)]
pub struct Early(Option<JoinHandle<Result<Dialed, NetError>>>);

impl Early {
    /// The dial's outcome.
    async fn dialed(mut self, server: &str) -> Result<Dialed, NetError> {
        let h = self.0.take().expect("awaited once");
        match h.await {
            Ok(r) => r,
            // The dialing task failed (panicked or was aborted).
            Err(e) => Err(NetError::io("dialing", server, e.into())),
        }
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

/// A data stream an acceptor joined to a session.
#[derive(Debug)]
pub struct Joined<S = TcpStream> {
    /// The stream's index.
    pub stream: u16,
    /// The stream.
    pub io: DataIo<S>,
    /// Who dialed it.
    pub peer: String,
}

/// Why an acceptor refused or lost a data connection.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The connection failed, or the hello broke the protocol.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The join was refused with `status` (its answer sent).
    #[error("{status:?} (session {session:016x}, stream {stream})")]
    Refused {
        /// The status sent.
        status: JoinStatus,
        /// The session the hello named.
        session: u64,
        /// The stream it named.
        stream: u16,
    },
}

struct Slot<S> {
    key: [u8; 32],
    protection: DataProtection,
    joined: Vec<bool>,
    tx: mpsc::Sender<Joined<S>>,
}

/// Sessions remembered as over, so that a late join is refused at once instead of
/// waiting for a session that will not come.
const CLOSED_KEPT: usize = 1024;

/// The sessions data connections may join, and the acceptor's side of each join, for
/// connections of type `S` (TCP streams; in-memory pipes for tests).
pub struct JoinTable<S = TcpStream> {
    sessions: Mutex<HashMap<u64, Slot<S>>>,
    /// The last [`CLOSED_KEPT`] sessions closed.
    closed: Mutex<std::collections::VecDeque<u64>>,
    /// Told of every session opened or closed (joins wait for theirs).
    changed: tokio::sync::Notify,
    idle: Duration,
    park: Duration,
}

impl<S> std::fmt::Debug for JoinTable<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinTable")
            .field("sessions", &self.sessions.lock().len())
            .finish()
    }
}

/// What the table said of a join.
type Checked<S> = (
    JoinStatus,
    Option<(mpsc::Sender<Joined<S>>, [u8; 32], DataProtection)>,
);

impl<S: AsyncRead + AsyncWrite + Unpin + Send> JoinTable<S> {
    /// No sessions yet; joined streams wait at most `idle` without progress. A join
    /// for a session not open yet waits up to `park` for it (protocol version 8: a
    /// client's data streams join as its control connection's first flight goes out,
    /// before the session it names is open here).
    pub fn new(idle: Duration, park: Duration) -> Self {
        JoinTable {
            sessions: Mutex::new(HashMap::new()),
            closed: Mutex::new(std::collections::VecDeque::new()),
            changed: tokio::sync::Notify::new(),
            idle,
            park,
        }
    }

    /// Lets session `session` (key `key`, data protected as `protection`) take
    /// `streams` data streams, each joined once; they come from the receiver (`None`:
    /// a session of that id is open already).
    pub fn open(
        &self,
        session: u64,
        key: [u8; 32],
        protection: DataProtection,
        streams: u16,
    ) -> Option<mpsc::Receiver<Joined<S>>> {
        let (tx, rx) = mpsc::channel((streams as usize).max(1));
        {
            let mut sessions = self.sessions.lock();
            if sessions.contains_key(&session) {
                return None;
            }
            sessions.insert(
                session,
                Slot {
                    key,
                    protection,
                    joined: vec![false; streams as usize],
                    tx,
                },
            );
        }
        self.closed.lock().retain(|&c| c != session);
        self.changed.notify_waiters();
        Some(rx)
    }

    /// Session `session` is over, or will never open (its control connection failed
    /// before): no more joins, and those waiting for it are refused now.
    pub fn close(&self, session: u64) {
        self.sessions.lock().remove(&session);
        {
            let mut closed = self.closed.lock();
            if !closed.contains(&session) {
                if closed.len() >= CLOSED_KEPT {
                    closed.pop_front();
                }
                closed.push_back(session);
            }
        }
        self.changed.notify_waiters();
    }

    /// The join's status, and where an accepted stream goes.
    fn check(
        &self,
        hello: &DataHello,
        proof: &[u8; JOIN_PROOF_LEN],
        nonce: &[u8; 32],
    ) -> Checked<S> {
        let mut sessions = self.sessions.lock();
        let Some(slot) = sessions.get_mut(&hello.session) else {
            return (JoinStatus::UnknownSession, None);
        };
        let want = auth::join_proof(
            &slot.key,
            Role::Client,
            hello.session,
            hello.stream,
            &hello.nonce,
            nonce,
        );
        if !auth::proofs_equal(&want, proof) {
            return (JoinStatus::BadProof, None);
        }
        match slot.joined.get_mut(hello.stream as usize) {
            Some(j) if !*j => {
                *j = true;
                (
                    JoinStatus::Accepted,
                    Some((slot.tx.clone(), slot.key, slot.protection)),
                )
            }
            _ => (JoinStatus::BadStream, None),
        }
    }

    /// [`JoinTable::check`], waiting up to the park limit for a session not open yet
    /// (not for one that was and closed).
    async fn check_parked(
        &self,
        hello: &DataHello,
        proof: &[u8; JOIN_PROOF_LEN],
        nonce: &[u8; 32],
    ) -> Checked<S> {
        let until = tokio::time::Instant::now() + self.park;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so an opening in between is not missed.
            changed.as_mut().enable();
            let checked = self.check(hello, proof, nonce);
            if checked.0 != JoinStatus::UnknownSession
                || self.closed.lock().contains(&hello.session)
                || tokio::time::timeout_at(until, changed).await.is_err()
            {
                return checked;
            }
        }
    }

    /// A data connection's join, after its preamble: the challenge, the client's hello
    /// and proof, the answer, and the stream handed to its session. A connection that
    /// cannot prove the session key never takes a stream's place. A join for a session
    /// not open yet waits for it, up to the park limit ([`JoinTable::new`]), and reads
    /// nothing more meanwhile. The caller bounds the time it takes.
    pub async fn accept(&self, mut stream: S, peer: &str) -> Result<(), AcceptError> {
        let io = |e| NetError::io("reading from", peer, e);
        // The challenge goes out at once: the client may have connected before it
        // knows its session, and sends hello and proof together when it does.
        let nonce: [u8; 32] = rand::random();
        stream
            .write_all(&nonce)
            .await
            .map_err(|e| NetError::io("writing to", peer, e))?;
        let mut b = [0u8; HELLO_LEN + JOIN_PROOF_LEN];
        stream.read_exact(&mut b).await.map_err(io)?;
        let hello = DataHello::decode(&b[..HELLO_LEN]).map_err(|e| NetError::proto(peer, e))?;
        let mut proof = [0u8; JOIN_PROOF_LEN];
        proof.copy_from_slice(&b[HELLO_LEN..]);
        let (status, accepted) = self.check_parked(&hello, &proof, &nonce).await;
        let Some((tx, key, protection)) = accepted else {
            let _ = stream.write_all(&[status as u8]).await;
            let _ = stream.shutdown().await;
            // A client sends its first chunks right behind its proof: closing with them
            // unread would reset the connection and could cost it our answer (it would
            // see a broken pipe, not the refusal). Read until it closes, briefly and at
            // most what a client sends before an answer.
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                let mut sink = [0u8; 16 << 10];
                let mut left = 2 * EARLY_BYTES;
                while left > 0 {
                    match stream.read(&mut sink).await {
                        Ok(n) if n > 0 => left = left.saturating_sub(n),
                        _ => break,
                    }
                }
            })
            .await;
            return Err(AcceptError::Refused {
                status,
                session: hello.session,
                stream: hello.stream,
            });
        };
        let mut answer = [0u8; 1 + JOIN_PROOF_LEN];
        answer[0] = status as u8;
        answer[1..].copy_from_slice(&auth::join_proof(
            &key,
            Role::Server,
            hello.session,
            hello.stream,
            &hello.nonce,
            &nonce,
        ));
        stream
            .write_all(&answer)
            .await
            .map_err(|e| NetError::io("writing to", peer, e))?;
        let io = DataIo::new(
            stream,
            protection,
            &key,
            hello.stream,
            Role::Server,
            Some(self.idle),
        );
        let _ = tx
            .send(Joined {
                stream: hello.stream,
                io,
                peer: peer.to_string(),
            })
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::read_preamble;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const KEY: [u8; 32] = [7; 32];
    const LIMIT: Duration = Duration::from_secs(5);
    const PARK: Duration = Duration::from_millis(300);

    fn mode(protection: DataProtection) -> LinkMode {
        LinkMode {
            protection,
            idle: LIMIT,
        }
    }

    /// A join listener on loopback: every data connection goes to `table` (after
    /// `hang_up` connections are closed right behind their challenge); outcomes are
    /// reported on the receiver.
    async fn listener(
        table: Arc<JoinTable>,
        hang_up: usize,
    ) -> (Dialer, mpsc::UnboundedReceiver<Result<(), AcceptError>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut n = 0;
            loop {
                let (mut s, peer) = l.accept().await.unwrap();
                let p = peer.to_string();
                let pre = read_preamble(&mut s, &p).await.unwrap();
                assert_eq!((pre.kind, pre.version), (ConnKind::Data, PROTOCOL_VERSION));
                n += 1;
                if n <= hang_up {
                    s.write_all(&[0; JOIN_PROOF_LEN]).await.unwrap();
                    drop(s);
                    continue;
                }
                let (table, tx) = (table.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = tx.send(table.accept(s, &p).await);
                });
            }
        });
        (
            Dialer::new(addr, SocketOptions::default(), LIMIT, LIMIT),
            rx,
        )
    }

    /// A server under load answers data connections busy (issue 46, item 12): the
    /// connection dialed ahead and the next two get the busy preamble and an orderly
    /// close; the join dials again after a short wait each time, and joins. (It dialed
    /// once more only, and failed, before.)
    #[tokio::test]
    async fn a_join_answered_busy_dials_again() {
        let table = Arc::new(JoinTable::new(LIMIT, PARK));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = table.clone();
        tokio::spawn(async move {
            let mut n = 0;
            loop {
                let (mut s, peer) = l.accept().await.unwrap();
                n += 1;
                if n <= 3 {
                    let busy = Preamble::busy(std::num::NonZeroU8::new(5).unwrap());
                    s.write_all(&busy.encode()).await.unwrap();
                    s.shutdown().await.unwrap();
                    let mut sink = Vec::new();
                    let _ = s.read_to_end(&mut sink).await;
                    continue;
                }
                let p = peer.to_string();
                read_preamble(&mut s, &p).await.unwrap();
                let t = t.clone();
                tokio::spawn(async move { t.accept(s, &p).await });
            }
        });
        let dialer = Dialer::new(addr, SocketOptions::default(), LIMIT, LIMIT);
        let mut joined = table.open(42, KEY, DataProtection::Plain, 1).unwrap();
        let mut dials = dialer.dial_ahead(1);
        let early = dials.take(0);
        let started = std::time::Instant::now();
        let mut io = dialer
            .join(
                early,
                42,
                0,
                &KEY,
                mode(DataProtection::Plain),
                JoinWait::Answer,
            )
            .await
            .expect("joined after the busy answers");
        assert!(started.elapsed() < LIMIT, "{:?}", started.elapsed());
        io.write_all(b"hi").await.unwrap();
        io.flush().await.unwrap();
        let mut j = joined.recv().await.unwrap();
        let mut b = [0u8; 2];
        j.io.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hi");
        // The busy answer is told apart from a connection that just closed.
        let mut busy: &[u8] = &Preamble::busy(std::num::NonZeroU8::MIN).encode();
        let e = read_challenge(&mut busy, "srv", LIMIT).await.unwrap_err();
        assert_eq!(busy_of(&e), Some(Duration::from_secs(1)), "{e}");
        let mut short: &[u8] = &[1u8; 12];
        let e = read_challenge(&mut short, "srv", LIMIT).await.unwrap_err();
        assert!(matches!(e, NetError::Closed { .. }), "{e}");
    }

    /// Both sides of a join, waiting for the answer or sending right behind the proof,
    /// end with a stream that carries bytes both ways, for every protection.
    #[tokio::test]
    async fn a_join_hands_both_sides_a_working_stream() {
        for p in [
            DataProtection::Plain,
            DataProtection::Authenticated,
            DataProtection::Encrypted,
        ] {
            for wait in [JoinWait::Answer, JoinWait::Pipelined] {
                let table = Arc::new(JoinTable::new(LIMIT, PARK));
                let (dialer, mut outcomes) = listener(table.clone(), 0).await;
                let mut joined = table.open(42, KEY, p, 2).unwrap();
                let mut dials = dialer.dial_ahead(3);
                dials.keep(2);
                assert!(dials.take(2).is_none());
                let early = dials.take(1);
                assert!(early.is_some());
                let mut io = dialer
                    .join(early, 42, 1, &KEY, mode(p), wait)
                    .await
                    .unwrap();
                assert_eq!(io.join_pending(), wait == JoinWait::Pipelined);
                io.write_all(b"hello").await.unwrap();
                io.flush().await.unwrap();
                let mut j = joined.recv().await.unwrap();
                assert!(outcomes.recv().await.unwrap().is_ok());
                assert_eq!(j.stream, 1);
                let mut b = [0u8; 5];
                j.io.read_exact(&mut b).await.unwrap();
                assert_eq!(&b, b"hello");
                j.io.write_all(b"back").await.unwrap();
                j.io.flush().await.unwrap();
                let mut b = [0u8; 4];
                io.read_exact(&mut b).await.unwrap();
                assert_eq!(&b, b"back");
                assert!(!io.join_pending());
            }
        }
    }

    /// A wrong key, an unknown session and a stream joined twice are refused with
    /// their status, the dialer's error is the server's answer (no second try), and the
    /// acceptor reports what it refused.
    #[tokio::test]
    async fn refused_joins_are_answers_not_connection_failures() {
        let table = Arc::new(JoinTable::new(LIMIT, PARK));
        let (dialer, mut outcomes) = listener(table.clone(), 0).await;
        let _joined = table.open(5, KEY, DataProtection::Plain, 1).unwrap();
        // One session per id.
        assert!(table.open(5, KEY, DataProtection::Plain, 1).is_none());
        let m = mode(DataProtection::Plain);
        let cases = [
            (5, 0, [8u8; 32], JoinStatus::BadProof),
            (6, 0, KEY, JoinStatus::UnknownSession),
            (5, 0, KEY, JoinStatus::Accepted),
            (5, 0, KEY, JoinStatus::BadStream),
            (5, 1, KEY, JoinStatus::BadStream),
        ];
        for (session, stream, key, want) in cases {
            let r = dialer
                .join(None, session, stream, &key, m, JoinWait::Answer)
                .await;
            let outcome = outcomes.recv().await.unwrap();
            if want == JoinStatus::Accepted {
                assert!(r.is_ok() && outcome.is_ok());
                continue;
            }
            let e = r.unwrap_err();
            assert!(!e.connection(), "{e}");
            let JoinError::Answer { source, .. } = &e else {
                panic!("{e}")
            };
            assert_eq!(
                JoinFailed::of(source),
                Some(&JoinFailed::Refused {
                    stream,
                    status: want
                })
            );
            match outcome {
                Err(AcceptError::Refused { status, .. }) => assert_eq!(status, want),
                other => panic!("{other:?}"),
            }
        }
        // The log line the server writes.
        let e = AcceptError::Refused {
            status: JoinStatus::BadProof,
            session: 0xab,
            stream: 3,
        };
        assert_eq!(
            e.to_string(),
            "BadProof (session 00000000000000ab, stream 3)"
        );
        // Once the session is over, its streams are unknown.
        table.close(5);
        let e = dialer
            .join(None, 5, 0, &KEY, m, JoinWait::Answer)
            .await
            .unwrap_err();
        assert_unknown_session(&e);
    }

    /// The dialer's error is the server's refusal of an unknown session.
    fn assert_unknown_session(e: &JoinError) {
        let JoinError::Answer { source, .. } = e else {
            panic!("{e}")
        };
        assert!(matches!(
            JoinFailed::of(source),
            Some(JoinFailed::Refused {
                status: JoinStatus::UnknownSession,
                ..
            })
        ));
    }

    /// A join that comes before its session opens (protocol version 8) waits for it,
    /// its early bytes unread meanwhile, and is accepted once the session opens; one
    /// whose session never opens is refused at the park limit.
    #[tokio::test]
    async fn a_join_before_its_session_waits_for_it() {
        let table = Arc::new(JoinTable::new(LIMIT, PARK));
        let (dialer, mut outcomes) = listener(table.clone(), 0).await;
        let m = mode(DataProtection::Authenticated);
        let mut io = dialer
            .join(None, 77, 0, &KEY, m, JoinWait::Pipelined)
            .await
            .unwrap();
        io.write_all(b"early").await.unwrap();
        io.flush().await.unwrap();
        tokio::time::sleep(PARK / 3).await;
        assert!(outcomes.try_recv().is_err(), "answered before the session");
        let mut joined = table
            .open(77, KEY, DataProtection::Authenticated, 1)
            .unwrap();
        let mut j = joined.recv().await.unwrap();
        assert!(outcomes.recv().await.unwrap().is_ok());
        let mut b = [0u8; 5];
        j.io.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"early");
        io.finish_join().await.unwrap();
        // Closed before it opened (its control connection failed): refused at once.
        let t = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let dialer = dialer.clone();
            async move { dialer.join(None, 79, 0, &KEY, m, JoinWait::Answer).await }
        });
        tokio::time::sleep(PARK / 6).await;
        table.close(79);
        assert!(waiting.await.unwrap().is_err());
        assert!(t.elapsed() < PARK, "{:?}", t.elapsed());
        assert!(outcomes.recv().await.unwrap().is_err());
        // Never opened: refused after the park limit, not at once.
        let t = tokio::time::Instant::now();
        let e = dialer
            .join(None, 78, 0, &KEY, m, JoinWait::Answer)
            .await
            .unwrap_err();
        assert!(t.elapsed() >= PARK, "{:?}", t.elapsed());
        assert_unknown_session(&e);
        assert!(outcomes.recv().await.unwrap().is_err());
    }

    /// A connection dialed ahead that the server closed (its set-up limit passed) is
    /// seen closed before a stream that sends right behind its proof uses it, and a
    /// fresh one takes its place.
    #[tokio::test]
    async fn a_closed_early_connection_is_dialed_again() {
        let table = Arc::new(JoinTable::new(LIMIT, PARK));
        let (dialer, mut outcomes) = listener(table.clone(), 1).await;
        let mut joined = table.open(1, KEY, DataProtection::Encrypted, 1).unwrap();
        let mut dials = dialer.dial_ahead(1);
        let early = dials.take(0).unwrap();
        // Let the server's close arrive.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let m = mode(DataProtection::Encrypted);
        let mut io = dialer
            .join(Some(early), 1, 0, &KEY, m, JoinWait::Pipelined)
            .await
            .unwrap();
        // Had the closed connection been used, the answer would be missing.
        io.finish_join().await.unwrap();
        assert!(outcomes.recv().await.unwrap().is_ok());
        assert_eq!(joined.recv().await.unwrap().stream, 0);
    }

    /// A join that cannot even connect fails as a connection failure.
    #[tokio::test]
    async fn nothing_listening_is_a_connection_failure() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let dialer = Dialer::new(addr, SocketOptions::default(), LIMIT, LIMIT);
        let e = dialer
            .join(
                None,
                1,
                0,
                &KEY,
                mode(DataProtection::Plain),
                JoinWait::Answer,
            )
            .await
            .unwrap_err();
        assert!(matches!(e, JoinError::Net(NetError::Io { .. })), "{e}");
        assert!(e.connection());
    }
}
