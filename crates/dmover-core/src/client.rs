//! The client: connects to a server, authenticates, and pushes or pulls a dataset.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use dmover_net::control::{ControlChannel, write_preamble};
use dmover_net::stream::DataIo;
use dmover_net::tcp;
use dmover_net::tls::TlsConnector;
use dmover_net::{ControlStream, NetError};
use dmover_proto::auth::{self, Role};
use dmover_proto::control::{
    Auth, AuthMethod, Control, Credential, DataProtection, ErrorCode, FailedFile, Hello, Op, Open,
    SessionInfo, Summary,
};
use dmover_proto::data::{DataHello, HELLO_LEN, JOIN_PROOF_LEN};
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::preamble::{ConnKind, Preamble};
use dmover_proto::{PROTOCOL_VERSION, control};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use dmover_store::paths::{self, Base};
use dmover_store::sink::{SinkOptions, prepare_sink};
use dmover_store::source::{FileSource, SourceOptions};
use dmover_store::walk;

use crate::diskpool::DiskPool;
use crate::engine::{self, DataStream, Run};
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::session::{
    self, HANDSHAKE_TIMEOUT, Heartbeat, TransferOptions, resume_sink, resume_source, unexpected,
};

pub use crate::session::SOFTWARE;

/// What a finished transfer reports.
#[derive(Debug, Clone)]
pub struct Report {
    /// What the destination did in the last attempt.
    pub summary: Summary,
    /// What the source's manifest held (the dataset).
    pub totals: Totals,
    /// Data streams used.
    pub streams: u16,
    /// Chunk size used.
    pub chunk_size: u32,
    /// Entries the source walk skipped (special files, vanished files).
    pub skipped: u64,
    /// Bytes of file data the destination already held when the last attempt began
    /// (left by an earlier attempt: resumed, not sent again).
    pub held_bytes: u64,
    /// Files the destination already held whole when the last attempt began.
    pub held_files: u64,
    /// Payload bytes that crossed the data streams in this run, all attempts.
    pub bytes_sent: u64,
    /// Chunks sent again in the last attempt because their data stream broke.
    pub chunks_resent: u64,
    /// Data streams that broke in the last attempt.
    pub streams_lost: u32,
    /// Sessions this run started (1 without retries).
    pub attempts: u32,
    /// Files the source could not read (with `continue_on_error`), as `path: why`.
    pub failed: Vec<String>,
}

/// A client with its own disk threads.
#[derive(Debug)]
pub struct Client {
    disk: Arc<DiskPool>,
    pub(crate) opts: TransferOptions,
}

pub(crate) struct Connected {
    pub(crate) ch: ControlChannel<ControlStream>,
    pub(crate) session: SessionInfo,
    /// The session key (see [`dmover_proto::auth::session_key`]).
    pub(crate) key: [u8; 32],
    /// The data connections, dialed while the control connection was set up.
    pub(crate) dials: Dials,
}

/// A control connection whose first flight (`Hello`, `Auth`, `Open`) has gone out; the
/// caller may send more (`Options`, a push's manifest) before taking the server's
/// answers with [`Opening::accepted`].
pub(crate) struct Opening {
    pub(crate) ch: ControlChannel<ControlStream>,
    /// Exported for the session key.
    master: [u8; 32],
    transcript: [u8; 32],
    /// The token's keys when the credential sent was a token proof.
    token: Option<auth::TokenKeys>,
    /// No credential was sent (the client has none).
    anonymous: bool,
    dials: Dials,
}

impl Opening {
    /// Takes the server's `Welcome`, `AuthOk` and `Session`, checking its token proof.
    pub(crate) async fn accepted(mut self, server: &str) -> Result<Connected> {
        let ch = &mut self.ch;
        let welcome = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "welcome").await {
            Ok(Control::Welcome(w)) => w,
            Ok(other) => return Err(unexpected(server, other, "Welcome")),
            Err(e) => return Err(e.into()),
        };
        if self.anonymous && welcome.auth == AuthMethod::Required {
            return Err(Error::refused(
                ErrorCode::Auth,
                format!(
                    "{server} requires authentication: pass --key FILE (or DMOVER_KEY) or \
                     --token-file FILE (or DMOVER_TOKEN), and --user NAME if it has several users"
                ),
            ));
        }
        match ch.recv_timeout(HANDSHAKE_TIMEOUT, "authentication").await? {
            Control::AuthOk(ok) => {
                // A server without authentication ignores the credential and proves
                // nothing (as when the client had none to send).
                if let (AuthMethod::Required, Some(t)) = (welcome.auth, &self.token) {
                    let want = auth::server_token_proof(&t.verifier, &self.transcript);
                    if !ok.proof.is_some_and(|p| auth::proofs_equal(&p, &want)) {
                        return Err(Error::refused(
                            ErrorCode::Auth,
                            format!(
                                "{server} could not prove it knows the token; refusing to talk to it"
                            ),
                        ));
                    }
                }
            }
            other => return Err(unexpected(server, other, "AuthOk")),
        }
        let session = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "session").await? {
            Control::Session(s) => s,
            other => return Err(unexpected(server, other, "Session")),
        };
        if session.streams == 0 {
            return Err(Error::protocol(server, "session with zero streams"));
        }
        dmover_proto::layout::validate_chunk_size(session.chunk_size)
            .map_err(|e| Error::Net(NetError::proto(server, e)))?;
        let key = auth::session_key(&self.master, session.id, &session.salt);
        Ok(Connected {
            ch: self.ch,
            session,
            key,
            dials: self.dials,
        })
    }

    /// Sends `msg` behind the first flight. A server that refused the session closes
    /// the connection, so a failed send is explained by its `Error` when one came.
    pub(crate) async fn send(&mut self, msg: &Control) -> Result<()> {
        match self.ch.send(msg).await {
            Ok(()) => Ok(()),
            Err(e) => Err(crate::session::peer_report(&mut self.ch, Error::Net(e)).await),
        }
    }
}

/// A data connection made before its session was known: connected, preamble sent,
/// the server's challenge read.
pub(crate) struct Dialed {
    io: TcpStream,
    challenge: [u8; JOIN_PROOF_LEN],
}

/// Data connections being dialed in the background (aborted when dropped).
#[derive(Default)]
pub(crate) struct Dials(Vec<tokio::task::JoinHandle<Result<Dialed>>>);

impl Drop for Dials {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// Connects a data connection and reads the server's join challenge.
async fn dial(
    server: &str,
    socket: &tcp::SocketOptions,
    timeout: std::time::Duration,
) -> Result<Dialed> {
    let mut io = tcp::connect(server, socket, timeout).await?;
    let pre = Preamble {
        kind: ConnKind::Data,
        version: PROTOCOL_VERSION,
    };
    write_preamble(&mut io, pre, server).await?;
    let mut challenge = [0u8; JOIN_PROOF_LEN];
    tokio::time::timeout(HANDSHAKE_TIMEOUT, io.read_exact(&mut challenge))
        .await
        .map_err(|_| NetError::Timeout {
            peer: server.into(),
            what: "data stream challenge",
            secs: HANDSHAKE_TIMEOUT.as_secs(),
        })?
        .map_err(|e| NetError::io("reading from", server, e))?;
    Ok(Dialed { io, challenge })
}

/// Why a join failed: the connection (worth one fresh try) or the server's answer.
enum JoinError {
    Connection(Error),
    Refused(Error),
}

/// How a data stream's join waits for the server's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinWait {
    /// Before the stream is handed over (pull, memory test).
    Answer,
    /// Not at all: the source sends its first chunks right behind the proof, and the
    /// stream reads and checks the answer before anything else it receives
    /// ([`DataIo::awaiting_join`]).
    Pipelined,
}

/// Whether a dialed connection still looks open, found without waiting: the server
/// closes a data connection whose join does not come within its set-up limit.
fn still_open(io: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    let mut rb = tokio::io::ReadBuf::new(&mut b);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    io.poll_peek(&mut cx, &mut rb).is_pending()
}

/// A dialed data connection's side of the join: hello and proof in one write, then
/// (with [`JoinWait::Answer`]) the server's status and proof.
async fn join(
    d: Dialed,
    server: &str,
    hello: &DataHello,
    key: &[u8; 32],
    mode: (DataProtection, std::time::Duration),
    wait: JoinWait,
) -> std::result::Result<DataIo, JoinError> {
    let Dialed { mut io, challenge } = d;
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
        .map_err(|e| JoinError::Connection(Error::Net(NetError::io("writing to", server, e))))?;
    let want = auth::join_proof(
        key,
        Role::Server,
        hello.session,
        hello.stream,
        &hello.nonce,
        &challenge,
    );
    let (protection, idle) = mode;
    let mut io = DataIo::new(io, protection, key, hello.stream, Role::Client, Some(idle))
        .awaiting_join(hello.stream, want, HANDSHAKE_TIMEOUT);
    if wait == JoinWait::Answer {
        if let Err(e) = io.finish_join().await {
            let err = Error::data("reading from", server, e);
            return Err(match err {
                Error::Net(NetError::Io { .. }) => JoinError::Connection(err),
                _ => JoinError::Refused(err),
            });
        }
    }
    Ok(io)
}

impl Client {
    /// A client with `io_threads` disk threads.
    pub fn new(opts: TransferOptions, io_threads: usize) -> Self {
        Client {
            disk: Arc::new(DiskPool::new(io_threads, "dmover-disk")),
            opts,
        }
    }

    fn buffers(&self, streams: u16) -> usize {
        self.opts
            .buffers
            .unwrap_or_else(|| session::default_buffers(streams, self.disk.threads()))
    }

    fn source_buffers(&self, source: &FileSource, s: &SessionInfo) -> usize {
        self.opts.buffers.unwrap_or_else(|| {
            session::source_buffers(
                source.tree().entries(),
                s.chunk_size,
                s.streams,
                self.disk.threads(),
            )
        })
    }

    /// The TLS settings for connecting.
    fn connector(&self) -> Result<TlsConnector> {
        // The caller resolves the default known-hosts file (it knows the home directory).
        let trust = self.opts.trust.clone().ok_or_else(|| {
            Error::refused(
                ErrorCode::Unsupported,
                "no home directory for the known-hosts file: set DMOVER_KNOWN_HOSTS or pass --known-hosts",
            )
        })?;
        Ok(TlsConnector::new(trust)?)
    }

    /// Starts dialing `n` data connections in the background.
    fn dial(&self, server: &str, n: u16) -> Dials {
        Dials(
            (0..n.min(session::MAX_STREAMS))
                .map(|_| {
                    let (server, socket, timeout) = (
                        server.to_string(),
                        self.opts.socket.clone(),
                        self.opts.connect_timeout,
                    );
                    tokio::spawn(async move { dial(&server, &socket, timeout).await })
                })
                .collect(),
        )
    }

    /// Connects, and sends the first flight of a session for `op`: `Hello`, `Auth`
    /// and `Open`, without waiting for answers (the authentication transcript needs
    /// no server nonce). The data connections are dialed meanwhile.
    pub(crate) async fn open(&self, server: &str, op: Op, chunk_size: u32) -> Result<Opening> {
        dmover_net::tls::warm_up();
        let connector = self.connector()?;
        let mut stream = tcp::connect(
            server,
            &tcp::SocketOptions::default(),
            self.opts.connect_timeout,
        )
        .await?;
        // The data connections need the server to be there, not the session: they
        // connect and collect their challenges while the control connection sets up.
        let dials = self.dial(server, self.opts.streams);
        write_preamble(
            &mut stream,
            Preamble {
                kind: ConnKind::Control,
                version: PROTOCOL_VERSION,
            },
            server,
        )
        .await?;
        // TLS starts right behind the preamble; the server's answer is read (and
        // checked) before the first TLS bytes.
        let stream = dmover_net::control::ControlTcp::awaiting_answer(stream);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(stream, server))
            .await
        {
            Err(_) => {
                return Err(Error::Net(NetError::Timeout {
                    peer: server.into(),
                    what: "TLS handshake",
                    secs: HANDSHAKE_TIMEOUT.as_secs(),
                }));
            }
            Ok(Err(NetError::Tls { source, .. }))
                if source
                    .get_ref()
                    .is_some_and(|e| e.is::<dmover_net::control::VersionRefused>()) =>
            {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "{server} speaks no protocol version this client knows (we speak {}..={PROTOCOL_VERSION})",
                        dmover_proto::MIN_PROTOCOL_VERSION
                    ),
                ));
            }
            Ok(r) => r?,
        };
        let tls = ControlStream::Client(tls);
        let binding = dmover_net::tls::export(&tls, auth::AUTH_EXPORTER_LABEL, None)?;
        let master = dmover_net::tls::export(&tls, auth::SESSION_EXPORTER_LABEL, None)?;
        let ch = ControlChannel::new(tls, server, control::MAX_FRAME);
        let nonce: [u8; 32] = rand::random();
        let user = self.opts.user.clone();
        let transcript = auth::transcript(&binding, &user, &nonce);
        let token = self.opts.token.as_deref().map(auth::token_keys);
        // Whatever credential we have goes out at once; a server without
        // authentication ignores it.
        let credential = match (&self.opts.key, &token) {
            (Some(key), _) => Credential::Key {
                public: key.public(),
                signature: key.sign(&auth::key_auth_message(&transcript)),
            },
            (None, Some(t)) => Credential::Token {
                proof: auth::client_token_proof(t, &transcript),
            },
            (None, None) => Credential::None,
        };
        let mut opening = Opening {
            ch,
            master,
            transcript,
            token: token.filter(|_| matches!(credential, Credential::Token { .. })),
            anonymous: matches!(credential, Credential::None),
            dials,
        };
        opening
            .send(&Control::Hello(Hello {
                software: SOFTWARE.into(),
                nonce,
            }))
            .await?;
        opening
            .send(&Control::Auth(Auth { user, credential }))
            .await?;
        opening
            .send(&Control::Open(Open {
                op,
                streams: self.opts.streams,
                chunk_size,
                checksum: self.opts.checksum,
                direct_io: self.opts.direct_io,
                protection: self.opts.protection,
                features: dmover_proto::session::features::SUPPORTED,
            }))
            .await?;
        Ok(opening)
    }

    /// Joins the session's data streams, on the connections dialed during set-up
    /// (each proving it belongs to the session, see [`dmover_proto::data`]); a
    /// connection that failed is dialed again once. With [`JoinWait::Pipelined`] the
    /// streams come back before the server answered their joins; an early connection
    /// is then only replaced when it is seen closed, or the write of its hello and
    /// proof fails, before any record went out: once a stream may have carried
    /// records, no other connection ever takes its index (its record keys and nonces
    /// would repeat).
    pub(crate) async fn open_streams(
        &self,
        server: &str,
        s: &SessionInfo,
        key: [u8; 32],
        mut dials: Dials,
        wait: JoinWait,
    ) -> Result<Vec<DataStream<DataIo>>> {
        let mut set = tokio::task::JoinSet::new();
        let mut early = std::mem::take(&mut dials.0).into_iter();
        for i in 0..s.streams {
            let (server, socket, timeout, key, mode) = (
                server.to_string(),
                self.opts.socket.clone(),
                self.opts.connect_timeout,
                key,
                (self.opts.protection, self.opts.idle_timeout),
            );
            let hello = DataHello {
                session: s.id,
                stream: i,
                nonce: rand::random(),
            };
            let dialed = early.next();
            set.spawn(async move {
                let joined = async {
                    if let Some(h) = dialed {
                        let first = match h.await {
                            Ok(Ok(d)) if wait == JoinWait::Pipelined && !still_open(&d.io) => {
                                Err(JoinError::Connection(Error::Net(NetError::Closed {
                                    peer: server.clone(),
                                })))
                            }
                            Ok(Ok(d)) => join(d, &server, &hello, &key, mode, wait).await,
                            Ok(Err(e)) => Err(JoinError::Connection(e)),
                            Err(e) => Err(JoinError::Connection(Error::refused(
                                ErrorCode::Aborted,
                                format!("stream setup failed: {e}"),
                            ))),
                        };
                        match first {
                            Ok(io) => return Ok(io),
                            Err(JoinError::Refused(e)) => return Err(e),
                            Err(JoinError::Connection(e)) => tracing::debug!(
                                "data stream {i}: early connection failed ({e}); dialing again"
                            ),
                        }
                    }
                    let d = dial(&server, &socket, timeout).await?;
                    match join(d, &server, &hello, &key, mode, wait).await {
                        Ok(io) => Ok(io),
                        Err(JoinError::Connection(e) | JoinError::Refused(e)) => Err(e),
                    }
                };
                let io = tokio::time::timeout(HANDSHAKE_TIMEOUT, joined)
                    .await
                    .map_err(|_| NetError::Timeout {
                        peer: server.clone(),
                        what: crate::error::JOIN_WAIT,
                        secs: HANDSHAKE_TIMEOUT.as_secs(),
                    })??;
                Ok::<_, Error>((i, DataStream { io, peer: server }))
            });
        }
        // Connections the session does not use (it granted fewer streams) close.
        for h in early {
            h.abort();
        }
        let mut streams = Vec::with_capacity(s.streams as usize);
        while let Some(r) = set.join_next().await {
            let r = r.map_err(|e| {
                Error::refused(ErrorCode::Aborted, format!("stream setup failed: {e}"))
            })?;
            streams.push(r?);
        }
        streams.sort_by_key(|(i, _)| *i);
        Ok(streams.into_iter().map(|(_, s)| s).collect())
    }

    /// Runs attempts of a transfer until one succeeds, retrying (and resuming) after
    /// failures that may pass, up to [`TransferOptions::retries`] times.
    async fn with_retries<'a, F, Fut>(&'a self, run: &Arc<Run>, mut once: F) -> Result<Report>
    where
        F: FnMut(Arc<Run>, bool) -> Fut,
        Fut: std::future::Future<Output = Result<Report>> + 'a,
    {
        let mut resume = self.opts.resume;
        let mut attempt = 1;
        loop {
            match once(run.attempt(), resume).await {
                Ok(mut r) => {
                    r.attempts = attempt;
                    r.bytes_sent = run
                        .progress
                        .bytes
                        .load(std::sync::atomic::Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    // The user interrupted: that is the error, and no retry.
                    if let Some(top) = run.take_error() {
                        return Err(top);
                    }
                    if attempt > self.opts.retries || !e.retryable() || run.is_cancelled() {
                        return Err(e);
                    }
                    tracing::warn!(
                        "attempt {attempt} failed: {e}; resuming in {:.1} s ({} retries left)",
                        self.opts.retry_wait.as_secs_f64(),
                        self.opts.retries + 1 - attempt
                    );
                    tokio::select! {
                        _ = run.cancelled() => return Err(run.take_error().unwrap_or(e)),
                        _ = tokio::time::sleep(self.opts.retry_wait) => {}
                    }
                    resume = true;
                    attempt += 1;
                }
            }
        }
    }

    /// Copies local `sources` into `dest` on `server` (`host:port`).
    pub async fn push(
        &self,
        sources: &[Vec<u8>],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        self.with_retries(&run, |r, resume| {
            self.push_once(sources, server, dest, r, resume)
        })
        .await
    }

    /// Copies `sources` on `server` into the local `dest`.
    pub async fn pull(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        self.with_retries(&run, |r, resume| {
            self.pull_once(server, sources, dest, r, resume)
        })
        .await
    }

    async fn push_once(
        &self,
        sources: &[Vec<u8>],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let roots = sources
            .iter()
            .map(|p| paths::source_root(&Base::Local, p, b""))
            .collect::<dmover_store::Result<Vec<_>>>()?;
        let walked = self
            .disk
            .run(move || walk::walk(roots))
            .await
            .ok_or(Error::Aborted)??;
        let skipped = walked.skipped;
        let chunk = match self.opts.chunk_size {
            0 => session::auto_chunk(walked.tree.entries()),
            c => c,
        };
        let mut opening = self
            .open(
                server,
                Op::Push {
                    dest: dest.to_vec(),
                },
                chunk,
            )
            .await?;
        let hb = Heartbeat {
            interval: self.opts.heartbeat,
        };
        // Options and the manifest follow the first flight at once: the server reads
        // them once it has opened the session (with the chunk size we asked for; a
        // server never changes a push's).
        opening
            .send(&Control::Options(self.opts.session_options(resume)))
            .await?;
        let mut source = FileSource::new(
            walked.tree,
            chunk,
            SourceOptions {
                checksum: self.opts.checksum,
                direct_io: self.opts.direct_io,
                continue_on_error: self.opts.continue_on_error,
            },
        )?;
        let totals = Totals::of(source.tree().entries());
        run.progress.total.store(totals.bytes, Relaxed);
        if let Err(e) = session::send_manifest(&mut opening.ch, source.tree().entries()).await {
            return Err(crate::session::peer_report(&mut opening.ch, e).await);
        }
        let mut conn = opening.accepted(server).await?;
        let s = conn.session.clone();
        if s.chunk_size != chunk {
            return Err(Error::protocol(
                server,
                format!(
                    "session chunk size {} differs from the {chunk} asked for",
                    s.chunk_size
                ),
            ));
        }
        let dials = std::mem::take(&mut conn.dials);
        // The first chunks follow the joins' proofs without waiting for the answers
        // (checked by each stream before anything it receives).
        let streams = self
            .open_streams(server, &s, conn.key, dials, JoinWait::Pipelined)
            .await;
        let streams = match streams {
            Ok(s) => s,
            Err(e) => return Err(crate::session::peer_report(&mut conn.ch, e).await),
        };
        let mut msg = session::recv_live(&mut conn.ch, hb).await?;
        if matches!(msg, Control::Have(_)) {
            let parts = session::recv_have(&mut conn.ch, hb, msg).await?;
            let (checked, _, plan) =
                resume_source(&self.disk, &mut conn.ch, hb, source, &parts).await?;
            source = checked;
            conn.ch.send(&Control::Plan(plan)).await?;
            msg = session::recv_live(&mut conn.ch, hb).await?;
        }
        match msg {
            Control::Go => {}
            other => return Err(unexpected(server, other, "Go")),
        }
        run.progress.held.store(source.held_bytes(), Relaxed);
        let source = Arc::new(source);
        let pool = Pool::new(self.source_buffers(&source, &s), s.chunk_size as usize);
        let disk = self.disk.clone();
        let sent = session::watch_control(
            &mut conn.ch,
            &run,
            hb,
            engine::send(
                &disk,
                source.clone(),
                pool,
                streams,
                run.clone(),
                self.opts.idle_timeout,
            ),
        )
        .await;
        let (stats, early) = match sent {
            Ok(x) => x,
            Err(e) => {
                if !matches!(e, Error::Remote { .. }) {
                    let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                }
                return Err(e);
            }
        };
        let done = match early.into_iter().next() {
            Some(m) => m,
            None => session::recv_live(&mut conn.ch, hb).await?,
        };
        let summary = match done {
            Control::Done(summary) => summary,
            other => return Err(unexpected(server, other, "Done")),
        };
        let entries = source.tree().entries();
        Ok(Report {
            summary,
            totals,
            streams: s.streams,
            chunk_size: s.chunk_size,
            skipped,
            held_bytes: source.held_bytes(),
            held_files: source.held_files(),
            bytes_sent: 0,
            chunks_resent: stats.chunks_resent,
            streams_lost: stats.streams_lost,
            attempts: 1,
            failed: source
                .failed()
                .into_iter()
                .map(|f| failed_line(entries, f))
                .collect(),
        })
    }

    async fn pull_once(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        dest: &[u8],
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let mut opening = self
            .open(
                server,
                Op::Pull {
                    sources: sources.to_vec(),
                },
                self.opts.chunk_size,
            )
            .await?;
        let hb = Heartbeat {
            interval: self.opts.heartbeat,
        };
        opening
            .send(&Control::Options(self.opts.session_options(resume)))
            .await?;
        let mut conn = opening.accepted(server).await?;
        let s = conn.session.clone();
        let dials = std::mem::take(&mut conn.dials);
        let (streams, entries) = tokio::join!(
            self.open_streams(server, &s, conn.key, dials, JoinWait::Answer),
            session::recv_manifest(&mut conn.ch, session::MAX_ENTRIES, None)
        );
        let entries = entries?;
        let streams = match streams {
            Ok(s) => s,
            Err(e) => return Err(crate::session::peer_report(&mut conn.ch, e).await),
        };
        let totals = Totals::of(&entries);
        run.progress.total.store(totals.bytes, Relaxed);
        let dest = dest.to_vec();
        let opts = SinkOptions {
            checksum: self.opts.checksum,
            direct_io: self.opts.direct_io,
            fsync: self.opts.fsync,
            verify: self.opts.verify && self.opts.checksum,
            journal: self.opts.journal,
            resume,
        };
        let names = entries.clone();
        let disk = self.disk.clone();
        let prepared = session::keep_alive(&mut conn.ch, hb, async move {
            disk.run(move || prepare_sink(&Base::Local, &dest, entries, s.chunk_size, opts))
                .await
                .ok_or(Error::Aborted)?
                .map_err(Error::from)
        })
        .await;
        let sink = match prepared {
            Ok(sink) => sink,
            Err(e) => {
                let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                return Err(e);
            }
        };
        let sink = match resume_sink(&self.disk, &mut conn.ch, hb, sink, resume).await {
            Ok(sink) => sink,
            Err(e) => {
                if !matches!(e, Error::Remote { .. } | Error::Net(_)) {
                    let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                }
                return Err(e);
            }
        };
        run.progress.held.store(sink.held_bytes(), Relaxed);
        let held_bytes = sink.held_bytes();
        let held_files = names.iter().filter(|e| e.file_size() > 0).count() as u64
            - sink.layout().files().len() as u64;
        conn.ch.send(&Control::Go).await?;
        let sink = Arc::new(sink);
        let pool = Pool::new(self.buffers(s.streams), s.chunk_size as usize);
        let disk = self.disk.clone();
        let result = session::watch_control(
            &mut conn.ch,
            &run,
            hb,
            engine::receive(&disk, sink, pool, streams, run.clone()),
        )
        .await;
        let ((summary, _rstats), early) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                return Err(e);
            }
        };
        conn.ch.send(&Control::Done(summary)).await?;
        let report = match early.into_iter().next() {
            Some(m) => m,
            None => session::recv_live(&mut conn.ch, hb).await?,
        };
        let report = match report {
            Control::SendReport(r) => r,
            other => return Err(unexpected(server, other, "SendReport")),
        };
        Ok(Report {
            summary,
            totals,
            streams: s.streams,
            chunk_size: s.chunk_size,
            skipped: 0,
            held_bytes,
            held_files,
            bytes_sent: 0,
            chunks_resent: report.chunks_resent,
            streams_lost: report.streams_lost,
            attempts: 1,
            failed: report
                .failed
                .into_iter()
                .map(|f| failed_line(&names, f))
                .collect(),
        })
    }
}

/// `path: why` for a file the source could not send.
fn failed_line(entries: &[Entry], f: FailedFile) -> String {
    if (f.entry as usize) < entries.len() {
        format!("{}: {}", session::entry_path(entries, f.entry), f.message)
    } else {
        f.message
    }
}
