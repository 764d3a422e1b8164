//! The server: one listener for control and data connections, sessions for any number
//! of clients at once over fixed disk threads and a fixed network runtime, and a memory
//! budget shared by all sessions' buffer pools.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dmover_net::control::{ControlChannel, read_preamble, write_preamble};
use dmover_net::tcp::{self, SocketOptions};
use dmover_proto::control::{
    AuthMethod, AuthOk, Control, ErrorCode, Op, Open, SendReport, SessionInfo, SessionOptions,
    Welcome,
};
use dmover_proto::data::{DataHello, HELLO_LEN, JoinStatus};
use dmover_proto::preamble::{ConnKind, Preamble};
use dmover_proto::{PROTOCOL_VERSION, auth, control, negotiate_version};
use parking_lot::Mutex;
use rustix::fs::OFlags;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::client::{SOFTWARE, prepare_sink, resume_sink, resume_source};
use crate::diskpool::DiskPool;
use crate::engine::{self, DataStream, Run};
use crate::error::{Error, Result};
use crate::paths::{self, Base};
use crate::pool::Pool;
use crate::session::{self, HANDSHAKE_TIMEOUT, Heartbeat, MAX_STREAMS, unexpected};
use crate::sink::SinkOptions;
use crate::source::{Source, SourceOptions};
use crate::walk;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The directory served; every path is relative to it and confined below it.
    pub root: PathBuf,
    /// Refuse pushes.
    pub read_only: bool,
    /// Shared token clients must prove; `None` allows anyone (loopback only).
    pub token: Option<Vec<u8>>,
    /// Disk threads shared by all sessions.
    pub io_threads: usize,
    /// Sessions running at once; more are refused as busy.
    pub max_sessions: usize,
    /// Bytes of chunk buffers all sessions may hold together.
    pub memory_budget: u64,
    /// Socket settings for accepted connections.
    pub socket: SocketOptions,
    /// Most manifest entries accepted per session.
    pub max_entries: u64,
    /// Test hook: delay every chunk this server reads or writes.
    pub chunk_delay: Option<Duration>,
}

impl ServerConfig {
    /// Defaults for serving `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ServerConfig {
            root: root.into(),
            read_only: false,
            token: None,
            io_threads: 8,
            max_sessions: 64,
            memory_budget: 2 << 30,
            socket: SocketOptions::default(),
            max_entries: session::MAX_ENTRIES,
            chunk_delay: None,
        }
    }
}

/// Budget unit for buffer memory.
const MIB: u64 = 1 << 20;

struct Slot {
    secret: [u8; 32],
    joined: Vec<bool>,
    tx: mpsc::Sender<(u16, DataStream<TcpStream>)>,
}

/// A running server.
pub struct Server {
    cfg: ServerConfig,
    root: Arc<OwnedFd>,
    root_name: Vec<u8>,
    disk: Arc<DiskPool>,
    sessions: Mutex<HashMap<u64, Slot>>,
    active: AtomicUsize,
    memory: Arc<Semaphore>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("cfg", &self.cfg).finish()
    }
}

/// Removes a session's slot when its handler ends, however it ends.
struct SlotGuard<'a>(&'a Server, u64);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.sessions.lock().remove(&self.1);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Server {
    /// Opens the root and starts the disk threads.
    pub fn new(cfg: ServerConfig) -> Result<Arc<Self>> {
        let shown = cfg.root.display().to_string();
        let root = crate::sys::open_local(
            std::os::unix::ffi::OsStrExt::as_bytes(cfg.root.as_os_str()),
            OFlags::PATH | OFlags::DIRECTORY,
        )
        .map_err(|e| Error::io("opening the root", &shown, e))?;
        let root_name = std::fs::canonicalize(&cfg.root)
            .ok()
            .and_then(|p| {
                p.file_name()
                    .map(|n| std::os::unix::ffi::OsStrExt::as_bytes(n).to_vec())
            })
            .unwrap_or_else(|| b"root".to_vec());
        let units = (cfg.memory_budget / MIB).clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        Ok(Arc::new(Server {
            disk: Arc::new(DiskPool::new(cfg.io_threads, "dmover-disk")),
            root: Arc::new(root),
            root_name,
            sessions: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            memory: Arc::new(Semaphore::new(units)),
            cfg,
        }))
    }

    /// Accepts connections until `shutdown` is cancelled.
    pub async fn serve(self: &Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off rather than spin.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            tcp::tune_stream(&stream, &self.cfg.socket);
            let me = self.clone();
            tokio::spawn(async move { me.connection(stream, peer).await });
        }
    }

    async fn connection(self: Arc<Self>, mut stream: TcpStream, peer: SocketAddr) {
        let p = peer.to_string();
        let pre =
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_preamble(&mut stream, &p)).await {
                Ok(Ok(pre)) => pre,
                Ok(Err(e)) => {
                    tracing::info!("refused {p}: {e}");
                    return;
                }
                Err(_) => {
                    tracing::info!(
                        "refused {p}: no greeting within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    );
                    return;
                }
            };
        match pre.kind {
            ConnKind::Data => self.data_connection(stream, p).await,
            ConnKind::Control => {
                if let Err(e) = self.control_connection(stream, &p, pre).await {
                    tracing::info!("session with {p} failed: {e:#}");
                }
            }
        }
    }

    async fn data_connection(&self, mut stream: TcpStream, peer: String) {
        let mut b = [0u8; HELLO_LEN];
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut b)).await {
            Ok(Ok(_)) => {}
            _ => {
                tracing::info!("refused data connection from {peer}: no join request");
                return;
            }
        }
        let hello = match DataHello::decode(&b) {
            Ok(h) => h,
            Err(e) => {
                tracing::info!("refused data connection from {peer}: {e}");
                return;
            }
        };
        let (status, tx) = {
            let mut sessions = self.sessions.lock();
            match sessions.get_mut(&hello.session) {
                None => (JoinStatus::UnknownSession, None),
                Some(slot) if !auth::proofs_equal(&slot.secret, &hello.secret) => {
                    (JoinStatus::BadSecret, None)
                }
                Some(slot) => match slot.joined.get_mut(hello.stream as usize) {
                    Some(j) if !*j => {
                        *j = true;
                        (JoinStatus::Accepted, Some(slot.tx.clone()))
                    }
                    _ => (JoinStatus::BadStream, None),
                },
            }
        };
        if stream.write_all(&[status as u8]).await.is_err() {
            return;
        }
        match tx {
            Some(tx) => {
                let _ = tx
                    .send((hello.stream, DataStream { io: stream, peer }))
                    .await;
            }
            None => tracing::info!("refused data connection from {peer}: {status:?}"),
        }
    }

    async fn control_connection(
        &self,
        mut stream: TcpStream,
        peer: &str,
        pre: Preamble,
    ) -> Result<()> {
        let version = negotiate_version(PROTOCOL_VERSION, pre.version).unwrap_or(0);
        write_preamble(
            &mut stream,
            Preamble {
                kind: ConnKind::Control,
                version,
            },
            peer,
        )
        .await?;
        if version == 0 {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!(
                    "client speaks protocol version {}, we need {}..={PROTOCOL_VERSION}",
                    pre.version,
                    dmover_proto::MIN_PROTOCOL_VERSION
                ),
            ));
        }
        let mut ch = ControlChannel::new(stream, peer, control::MAX_FRAME);
        let result = self.handshake_and_run(&mut ch).await;
        if let Err(e) = &result {
            // Tell the client why, unless the connection is what failed.
            if !matches!(e, Error::Net(_) | Error::Remote { .. }) {
                let _ = ch.send(&Control::Error(e.to_msg())).await;
            }
        }
        result
    }

    async fn handshake_and_run(&self, ch: &mut ControlChannel<TcpStream>) -> Result<()> {
        let peer = ch.peer().to_string();
        let hello = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "hello").await? {
            Control::Hello(h) => h,
            other => return Err(unexpected(&peer, other, "Hello")),
        };
        let nonce: [u8; 32] = rand::random();
        let key = self.cfg.token.as_deref().map(auth::token_key);
        ch.send(&Control::Welcome(Welcome {
            software: SOFTWARE.into(),
            nonce,
            auth: if key.is_some() {
                AuthMethod::Token
            } else {
                AuthMethod::None
            },
        }))
        .await?;
        let proof = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "authentication").await? {
            Control::Auth(a) => a.proof,
            other => return Err(unexpected(&peer, other, "Auth")),
        };
        let server_proof = match &key {
            None => None,
            Some(k) => {
                let want = auth::client_proof(k, &hello.nonce, &nonce);
                if !proof.is_some_and(|p| auth::proofs_equal(&p, &want)) {
                    tracing::warn!("authentication failed for {peer} ({})", hello.software);
                    return Err(Error::refused(
                        ErrorCode::Auth,
                        "authentication failed: wrong or missing token",
                    ));
                }
                Some(auth::server_proof(k, &hello.nonce, &nonce))
            }
        };
        ch.send(&Control::AuthOk(AuthOk {
            proof: server_proof,
        }))
        .await?;
        let open = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "open").await? {
            Control::Open(o) => o,
            other => return Err(unexpected(&peer, other, "Open")),
        };
        self.run_session(ch, open, &peer).await
    }

    async fn run_session(
        &self,
        ch: &mut ControlChannel<TcpStream>,
        open: Open,
        peer: &str,
    ) -> Result<()> {
        if open.streams == 0 {
            return Err(Error::refused(
                ErrorCode::Protocol,
                "zero data streams requested",
            ));
        }
        if self.cfg.read_only && matches!(open.op, Op::Push { .. }) {
            return Err(Error::refused(
                ErrorCode::ReadOnly,
                "this server is read-only",
            ));
        }
        let streams = open.streams.min(MAX_STREAMS);
        // A pull's source is here: walk it first, so an automatic chunk size can fit
        // the dataset and a bad path is refused before any session exists.
        let walked = match &open.op {
            Op::Pull { sources } => {
                let (base, root_name, sources) = (
                    Base::Export(self.root.clone()),
                    self.root_name.clone(),
                    sources.clone(),
                );
                let walked = self
                    .disk
                    .run(move || {
                        let roots = sources
                            .iter()
                            .map(|p| paths::source_root(&base, p, &root_name))
                            .collect::<Result<Vec<_>>>()?;
                        walk::walk(roots)
                    })
                    .await
                    .ok_or(Error::Aborted)??;
                Some(walked)
            }
            Op::Push { .. } => None,
        };
        let chunk = match (open.chunk_size, &walked) {
            (0, Some(w)) => session::auto_chunk(w.tree.entries()),
            (c, _) => c,
        };
        dmover_proto::layout::validate_chunk_size(chunk)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        if self.active.fetch_add(1, Ordering::AcqRel) >= self.cfg.max_sessions {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::refused(
                ErrorCode::Busy,
                format!("server busy: {} sessions running", self.cfg.max_sessions),
            ));
        }
        let id: u64 = rand::random();
        let secret: [u8; 32] = rand::random();
        let (tx, mut rx) = mpsc::channel(streams as usize);
        self.sessions.lock().insert(
            id,
            Slot {
                secret,
                joined: vec![false; streams as usize],
                tx,
            },
        );
        let _slot = SlotGuard(self, id);

        // Buffers: what the session wants if the budget has room now, else the
        // minimum it needs (waiting for that much, within limits).
        let minimum = session::default_buffers(streams, self.disk.threads());
        let want = match &walked {
            Some(w) => {
                session::source_buffers(w.tree.entries(), chunk, streams, self.disk.threads())
            }
            None => minimum,
        };
        let per_buf = u64::from(chunk).div_ceil(MIB) as u32;
        let budget_bufs = (self.cfg.memory_budget / (u64::from(per_buf) * MIB)) as usize;
        let minimum = minimum.min(budget_bufs);
        if minimum < 2 {
            return Err(Error::refused(
                ErrorCode::Busy,
                "chunk size exceeds the server's memory budget",
            ));
        }
        let want = want.min(budget_bufs);
        let (count, _memory) = match self
            .memory
            .clone()
            .try_acquire_many_owned(per_buf * want as u32)
        {
            Ok(permit) => (want, permit),
            Err(_) => {
                let permit = tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    self.memory
                        .clone()
                        .acquire_many_owned(per_buf * minimum as u32),
                )
                .await
                .map_err(|_| Error::refused(ErrorCode::Busy, "server busy: memory budget in use"))?
                .map_err(|_| Error::Aborted)?;
                (minimum, permit)
            }
        };

        ch.send(&Control::Session(SessionInfo {
            id,
            secret,
            streams,
            chunk_size: chunk,
        }))
        .await?;
        let started = Instant::now();
        let run = Run::new();
        let what;
        let bytes;
        match open.op {
            Op::Push { dest } => {
                what = format!("push to {:?}", String::from_utf8_lossy(&dest));
                let (so, first) = next_options(ch).await?;
                let hb = Heartbeat::from_ms(so.heartbeat_ms);
                let entries = session::recv_manifest(ch, self.cfg.max_entries, first).await?;
                let base = Base::Export(self.root.clone());
                let opts = SinkOptions {
                    checksum: open.checksum,
                    direct_io: open.direct_io,
                    fsync: so.fsync,
                    verify: so.verify && open.checksum,
                    journal: so.journal,
                    resume: so.resume,
                    chunk_delay: self.cfg.chunk_delay,
                };
                let disk = self.disk.clone();
                let sink = session::keep_alive(ch, hb, async move {
                    disk.run(move || prepare_sink(&base, &dest, entries, chunk, opts))
                        .await
                        .ok_or(Error::Aborted)?
                })
                .await?;
                let sink = resume_sink(&self.disk, ch, hb, sink, so.resume).await?;
                let sink = Arc::new(sink);
                ch.send(&Control::Go).await?;
                let streams = collect_streams(&mut rx, streams, peer).await?;
                let pool = Pool::new(count, chunk as usize);
                let result = session::watch_control(
                    ch,
                    &run,
                    hb,
                    engine::receive(&self.disk, sink, pool, streams, run.clone()),
                )
                .await;
                let ((summary, stats), _) = result?;
                if stats.streams_lost > 0 {
                    tracing::info!(
                        "{peer}: {} data streams broke; {} chunks arrived twice",
                        stats.streams_lost,
                        stats.duplicates
                    );
                }
                bytes = summary.bytes;
                ch.send(&Control::Done(summary)).await?;
            }
            Op::Pull { sources } => {
                what = format!("pull of {} path(s)", sources.len());
                let walked = walked.expect("walked above");
                let mut source = Source::new(
                    walked.tree,
                    chunk,
                    SourceOptions {
                        checksum: open.checksum,
                        direct_io: open.direct_io,
                        continue_on_error: false,
                        chunk_delay: self.cfg.chunk_delay,
                    },
                )?;
                session::send_manifest(ch, source.tree().entries()).await?;
                let (so, first) = next_options(ch).await?;
                let hb = Heartbeat::from_ms(so.heartbeat_ms);
                source.set_continue_on_error(so.continue_on_error);
                let mut msg = match first {
                    Some(m) => m,
                    None => session::recv_live(ch, hb).await?,
                };
                if matches!(msg, Control::Have(_)) {
                    let parts = session::recv_have(ch, hb, msg).await?;
                    let (checked, _, plan) =
                        resume_source(&self.disk, ch, hb, source, &parts).await?;
                    source = checked;
                    ch.send(&Control::Plan(plan)).await?;
                    msg = session::recv_live(ch, hb).await?;
                }
                match msg {
                    Control::Go => {}
                    other => return Err(unexpected(peer, other, "Go")),
                }
                let source = Arc::new(source);
                let streams = collect_streams(&mut rx, streams, peer).await?;
                let pool = Pool::new(count, chunk as usize);
                let (stats, early) = session::watch_control(
                    ch,
                    &run,
                    hb,
                    engine::send(&self.disk, source.clone(), pool, streams, run.clone()),
                )
                .await?;
                ch.send(&Control::SendReport(SendReport {
                    chunks_resent: stats.chunks_resent,
                    streams_lost: stats.streams_lost,
                    failed: source.failed(),
                }))
                .await?;
                let done = match early.into_iter().next() {
                    Some(m) => m,
                    None => session::recv_live(ch, hb).await?,
                };
                match done {
                    Control::Done(summary) => bytes = summary.bytes,
                    other => return Err(unexpected(peer, other, "Done")),
                }
            }
        }
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(
            "{peer}: {what}: {bytes} bytes in {secs:.2} s ({:.2} Gbit/s)",
            bytes as f64 * 8.0 / secs.max(1e-9) / 1e9
        );
        Ok(())
    }
}

/// Reads the client's session options, which come first after `Session` (defaults,
/// and the message, if an older client sent something else).
async fn next_options(
    ch: &mut ControlChannel<TcpStream>,
) -> Result<(SessionOptions, Option<Control>)> {
    match ch
        .recv_timeout(HANDSHAKE_TIMEOUT, "session options")
        .await?
    {
        Control::Options(o) => Ok((o, None)),
        other => Ok((
            SessionOptions {
                resume: false,
                journal: true,
                fsync: false,
                verify: false,
                continue_on_error: false,
                heartbeat_ms: 0,
            },
            Some(other),
        )),
    }
}

/// Waits for all `n` data streams of a session to join.
async fn collect_streams(
    rx: &mut mpsc::Receiver<(u16, DataStream<TcpStream>)>,
    n: u16,
    peer: &str,
) -> Result<Vec<DataStream<TcpStream>>> {
    let mut got: Vec<(u16, DataStream<TcpStream>)> = Vec::with_capacity(n as usize);
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    while got.len() < n as usize {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(s)) => got.push(s),
            _ => {
                return Err(Error::refused(
                    ErrorCode::Protocol,
                    format!("{peer} opened {} of {n} data streams in time", got.len()),
                ));
            }
        }
    }
    got.sort_by_key(|(i, _)| *i);
    Ok(got.into_iter().map(|(_, s)| s).collect())
}
