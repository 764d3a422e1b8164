//! The server: one listener for control and data connections, sessions for any number
//! of clients at once over fixed disk threads and a fixed network runtime, and a memory
//! budget shared by all sessions' buffer pools.
//!
//! # Connection setup
//! ```text
//! accept ─ preamble ─┬─ control: preamble answer ─ TLS 1.3 ─ Hello/Welcome ─ Auth/AuthOk ─ Open
//!                    │           (all within the handshake timeout) ─ the session
//!                    └─ data:    challenge ─ DataHello + proof ─ status + server proof
//!                                (within the handshake timeout, [`JoinTable::accept`])
//!                                ─ handed to its session
//! ```
//! Connections still in setup are limited in number ([`ServerConfig::max_handshakes`]):
//! beyond the limit a connection takes an overflow place (at most
//! `max(OVERFLOW_FACTOR × max_handshakes, OVERFLOW_MIN)`), its preamble is read within
//! [`BUSY_PREAMBLE_WAIT`], a control connection is answered busy ([`Preamble::busy`]:
//! retry after 1 to [`MAX_RETRY_AFTER`] s) and closed gracefully, a data connection
//! still joins; one whose preamble does not come in time is answered busy too.
//! Beyond the overflow places a connection is refused by a task of its own (at most
//! [`REFUSING_MAX`] at once, more are closed at once): answered busy at once, whatever
//! its kind, and closed gracefully. Every close before authentication is graceful (our
//! side shut down, what the peer sent read briefly): closing with the peer's bytes
//! unread resets the connection, and the peer could lose the answer written before.
//! Control frames before authentication are limited to [`PRE_AUTH_MAX_FRAME`] bytes
//! and never packed; from the verified credential on (`Open` included), to
//! [`dmover_proto::control::MAX_FRAME`], packed or not.
//! Every refusal is logged with the peer's address.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::NonZeroU8;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dmover_net::control::ControlChannel;
use dmover_net::fault::FaultPlan;
use dmover_net::join::{AcceptError, JoinTable};
use dmover_net::link::SocketOptions;
use dmover_net::listen::{Incoming, Listener};
use dmover_net::tls::ServerIdentity;
use dmover_net::{ControlStream, NetError};
use dmover_proto::auth;
use dmover_proto::control::{
    AuthMethod, AuthOk, Control, Credential, DataProtection, ErrorCode, Op, Open, Welcome,
};
use dmover_proto::preamble::{ConnKind, Preamble};
use dmover_proto::{PROTOCOL_VERSION, negotiate_version};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use dmover_store::paths;

use crate::access::{ExportSpec, Grant, Proven, Rights, User, Users, verify_signature};
use crate::diskpool::DiskPool;
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::policy::{Policy, Reloaded, Use, open_exports};
use crate::session::{self, HANDSHAKE_TIMEOUT, MAX_STREAMS, SOFTWARE};
use dmover_proto::session::Acceptance;
pub use preauth::MAX_UNAUTHENTICATED_PER_ADDRESS;
use preauth::{AddrHold, PerAddress};

mod admit;
mod limits;
mod preauth;
mod prune;
mod rename;
mod run;
mod sums;
mod tpc;

/// Largest control frame accepted before the client has authenticated.
pub const PRE_AUTH_MAX_FRAME: usize = 64 << 10;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The directories served. One export named `""` takes paths relative to it;
    /// otherwise a path's first component names its export.
    pub exports: Vec<ExportSpec>,
    /// Refuse pushes to every export.
    pub read_only: bool,
    /// Users and their credentials; `None`: no authentication (loopback only, the
    /// caller's duty to check).
    pub users: Option<BTreeMap<String, User>>,
    /// The TLS identity; `None`: a key made at start and kept in memory.
    pub identity: Option<ServerIdentity>,
    /// Refuse sessions whose data streams are not encrypted.
    pub require_encryption: bool,
    /// Disk threads shared by all sessions (at the start, when `io_threads_max` is
    /// more).
    pub io_threads: usize,
    /// The most disk threads sessions' disk tuners may grow them to
    /// ([`crate::disktune`]); `io_threads` or less: fixed.
    pub io_threads_max: usize,
    /// Sessions running at once (a control connection takes its place at its
    /// preamble); more are answered busy before TLS.
    pub max_sessions: usize,
    /// Sessions one user may run at once.
    pub max_sessions_per_user: usize,
    /// Connections in setup (before their session or join) at once; more control
    /// connections are answered busy, more data connections still join, up to the
    /// overflow bound (see the module docs).
    pub max_handshakes: usize,
    /// Connections one source address may have before authentication (control) or
    /// before joining (data), at once (0: no limit); beyond it a control connection
    /// is answered busy, a data connection closed. Its unauthenticated control
    /// connections also hold at most half of `max_sessions` places. IPv6 addresses
    /// count per /64. Sites whose clients share one NAT address raise it.
    pub max_unauthenticated_per_address: usize,
    /// Time from accepting a control connection to its open session, and for a data
    /// connection's join (its preamble within [`PREAMBLE_WAIT`] of that).
    pub handshake_timeout: Duration,
    /// Time a data stream may wait without progress.
    pub idle_timeout: Duration,
    /// Bytes of chunk buffers all sessions may hold together.
    pub memory_budget: u64,
    /// Socket settings for accepted connections.
    pub socket: SocketOptions,
    /// Most manifest entries accepted per session.
    pub max_entries: u64,
    /// Most memory a push's or a prune's manifest may take (see
    /// [`session::entry_bytes`]).
    pub max_manifest_bytes: u64,
    /// Most memory the manifest of an op a read-only user can run may take: a pull's
    /// (its walk) and `sync --checksum`'s digests (the client's manifest).
    pub max_manifest_bytes_read: u64,
    /// Memory all sessions' manifests may take together ([`crate::manifests`]).
    pub manifest_memory: u64,
    /// The address other servers dial for third-party copies, the only one named in
    /// the capabilities this server issues; `None`: the address the steering client's
    /// connection reached this server at (docs/third-party.md).
    pub tpc_address: Option<String>,
    /// Key fingerprints of the servers this one may dial for third-party copies (the
    /// issuers of the capabilities it accepts from clients); empty: any server the
    /// steering client pinned (docs/third-party.md, "Trust").
    pub tpc_peers: Vec<String>,
    /// How long a third-party capability this server issues stays valid.
    pub tpc_capability_ttl: Duration,
}

/// Faults a server injects into its sessions, for tests (never set in production):
/// data streams cut ([`dmover_net::fault`]) and slow storage ([`dmover_store::fault`]).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Cuts of data streams.
    pub link: Option<Arc<FaultPlan>>,
    /// Every chunk the server reads or writes takes this long first.
    pub chunk_delay: Option<Duration>,
}

impl ServerConfig {
    /// Defaults for serving `root` (one unnamed export) without authentication.
    pub fn new(root: impl Into<std::path::PathBuf>) -> Self {
        ServerConfig {
            exports: vec![ExportSpec {
                name: String::new(),
                path: root.into(),
                read_only: false,
                third_party: false,
                bwlimit: None,
                preserve_owner: false,
                xattrs_all: false,
            }],
            read_only: false,
            users: None,
            identity: None,
            require_encryption: false,
            io_threads: 8,
            io_threads_max: 8,
            max_sessions: 64,
            max_sessions_per_user: 16,
            max_handshakes: 256,
            max_unauthenticated_per_address: MAX_UNAUTHENTICATED_PER_ADDRESS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            idle_timeout: Duration::from_secs(120),
            memory_budget: 2 << 30,
            socket: SocketOptions::default(),
            max_entries: session::MAX_ENTRIES,
            max_manifest_bytes: session::MAX_MANIFEST_BYTES,
            max_manifest_bytes_read: crate::manifests::MAX_MANIFEST_BYTES_READ,
            manifest_memory: crate::manifests::default_budget(crate::manifests::host_memory()),
            tpc_address: None,
            tpc_peers: Vec::new(),
            tpc_capability_ttl: Duration::from_secs(60),
        }
    }

    /// Requires a shared token for every export (the `--token-file` form): one user
    /// `*` (any name) with read-write rights everywhere.
    pub fn shared_token(&mut self, token: &[u8]) {
        let exports = self
            .exports
            .iter()
            .map(|e| (e.name.clone(), Rights::ReadWrite))
            .collect();
        let user = User {
            name: "*".into(),
            token: Some(auth::token_keys(token).verifier),
            keys: Vec::new(),
            exports,
            bwlimit: None,
            metrics_only: false,
        };
        self.users = Some(BTreeMap::from([("*".to_string(), user)]));
    }
}

/// Connections beyond the set-up limit that may wait for their preamble, as a
/// multiple of [`ServerConfig::max_handshakes`] (and at least [`OVERFLOW_MIN`]).
pub const OVERFLOW_FACTOR: usize = 4;

/// The fewest connections beyond the set-up limit that may wait for their preamble.
pub const OVERFLOW_MIN: usize = 256;

/// How long a connection beyond the set-up limit may take to send its preamble.
pub const BUSY_PREAMBLE_WAIT: Duration = Duration::from_secs(2);

/// The longest "retry after" a busy answer names, in seconds.
pub const MAX_RETRY_AFTER: u8 = 8;

/// How long any connection may take to send its preamble (at most the handshake
/// timeout): a client sends it as soon as it is connected.
pub const PREAMBLE_WAIT: Duration = Duration::from_secs(10);

/// Connections refused at accept (beyond the overflow places, or beyond their
/// address's limit) that may be answered
/// busy and closed in order at once (each for at most the second the close waits for
/// the client's); more are closed at once.
pub const REFUSING_MAX: usize = 4096;

/// Where a new connection stands against the set-up limits.
enum Setup {
    /// Within [`ServerConfig::max_handshakes`].
    Slot(tokio::sync::OwnedSemaphorePermit),
    /// Beyond it, within the overflow bound ([`OVERFLOW_FACTOR`], [`OVERFLOW_MIN`]).
    Overflow(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit),
}

/// Connections that may wait beyond a set-up limit of `max_handshakes`.
fn overflow_limit(max_handshakes: usize) -> usize {
    max_handshakes
        .max(1)
        .saturating_mul(OVERFLOW_FACTOR)
        .clamp(OVERFLOW_MIN, Semaphore::MAX_PERMITS)
}

/// What a connection holds in set-up until it has authenticated: its set-up place and
/// its count against its source address.
struct SetupHeld(
    #[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>,
    #[allow(dead_code)] Option<AddrHold>,
);

/// Budget unit for buffer memory.
const MIB: u64 = 1 << 20;

/// A running server.
pub struct Server {
    cfg: ServerConfig,
    /// The exports and users in force (`cfg`'s at start, then each reload's).
    pub(crate) policy: watch::Sender<Arc<Policy>>,
    identity: ServerIdentity,
    tls: dmover_net::tls::TlsAcceptor,
    disk: Arc<DiskPool>,
    /// The open sessions' data stream joins.
    joins: JoinTable,
    active: AtomicUsize,
    per_user: Mutex<HashMap<String, usize>>,
    /// The congestion control a sending session's data streams use when its client
    /// names none: `ServerConfig::socket`'s, else the system's default.
    send_default: Option<String>,
    handshakes: Arc<Semaphore>,
    /// Connections beyond `handshakes`, waiting for their preamble to be answered busy
    /// (control) or joining (data); more are refused (see [`Server::refuse`]).
    overflow: Arc<Semaphore>,
    /// Connections refused at accept that are being answered and closed in order.
    refusing: Arc<Semaphore>,
    /// Unauthenticated connections per source address.
    per_address: Arc<PerAddress>,
    memory: Arc<Semaphore>,
    /// Faults injected into every session (tests).
    faults: Faults,
    /// Third-party capabilities accepted (single use).
    nonces: tpc::Nonces,
    /// What all sessions' manifests take together.
    manifests: Arc<crate::manifests::ManifestBudget>,
    /// The sessions and counters `dmover serve --metrics` shows.
    monitor: Arc<crate::monitor::Monitor>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("cfg", &self.cfg).finish()
    }
}

/// Closes a session's joins when its handler ends, however it ends.
struct SlotGuard<'a>(&'a Server, u64);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.joins.close(self.1);
    }
}

/// One of the [`ServerConfig::max_sessions`] places, held from a control connection's
/// preamble (or its `Open`, in memory) to the end of its session.
struct SessionPlace<'a>(&'a Server);

impl Drop for SessionPlace<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a session against its user's limit while it lives.
struct UserGuard<'a>(&'a Server, String);

impl Drop for UserGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.0.per_user.lock();
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

fn refused(code: ErrorCode, message: impl Into<String>) -> Error {
    Error::refused(code, message)
}

impl Server {
    /// The room a session's disk tuner has for the buffers of the threads it adds
    /// ([`drive::Env::disk_room`]): what the memory budget has left, each buffer of
    /// `chunk` bytes; the permits taken are held until the session ends.
    fn disk_room(&self, chunk: u32) -> drive::DiskRoom {
        let memory = self.memory.clone();
        let mut held = Vec::new();
        Box::new(move |n: usize| {
            let permits = (n as u64 * u64::from(chunk)).div_ceil(MIB);
            let Ok(permits) = u32::try_from(permits) else {
                return 0;
            };
            match memory.clone().try_acquire_many_owned(permits) {
                Ok(p) => {
                    held.push(p);
                    n
                }
                Err(_) => 0,
            }
        })
    }

    /// Opens the exports and starts the disk threads.
    pub fn new(cfg: ServerConfig) -> Result<Arc<Self>> {
        Self::with_faults(cfg, Faults::default())
    }

    /// [`Server::new`], with faults injected into every session (tests).
    pub fn with_faults(cfg: ServerConfig, faults: Faults) -> Result<Arc<Self>> {
        if cfg.exports.is_empty() {
            return Err(refused(ErrorCode::NotFound, "no export to serve"));
        }
        let policy = Policy {
            exports: open_exports(&cfg.exports, &[])?,
            users: cfg.users.clone(),
        };
        let identity = match &cfg.identity {
            Some(id) => id.clone(),
            None => ServerIdentity::ephemeral()?,
        };
        // Asks for a client certificate, optionally: a server dialing this one for a
        // third-party copy proves its key with one (docs/third-party.md).
        let tls = identity.mutual_acceptor()?;
        let units = (cfg.memory_budget / MIB).clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        // Its journals' commits run on one thread, started now: the server's threads
        // are the same however many sessions it serves.
        dmover_store::journal::start_committer();
        Ok(Arc::new(Server {
            disk: Arc::new(DiskPool::elastic(
                cfg.io_threads,
                cfg.io_threads_max,
                "dmover-disk",
            )),
            policy: watch::Sender::new(Arc::new(policy)),
            identity,
            tls,
            // A join may come before its session opens: it waits up to nine tenths of
            // the handshake limit, so that it is answered within the limit (also of 1 s).
            joins: JoinTable::new(cfg.idle_timeout, cfg.handshake_timeout * 9 / 10),
            active: AtomicUsize::new(0),
            per_user: Mutex::new(HashMap::new()),
            send_default: cfg
                .socket
                .congestion
                .clone()
                .or_else(dmover_net::link::default_congestion),
            handshakes: Arc::new(Semaphore::new(cfg.max_handshakes.max(1))),
            overflow: Arc::new(Semaphore::new(overflow_limit(cfg.max_handshakes))),
            refusing: Arc::new(Semaphore::new(REFUSING_MAX)),
            per_address: PerAddress::new(cfg.max_unauthenticated_per_address, cfg.max_sessions),
            memory: Arc::new(Semaphore::new(units)),
            faults,
            nonces: tpc::Nonces::default(),
            manifests: crate::manifests::ManifestBudget::new(cfg.manifest_memory),
            monitor: Arc::default(),
            cfg,
        }))
    }

    /// The fingerprint of the key clients pin.
    pub fn fingerprint(&self) -> &str {
        self.identity.fingerprint()
    }

    /// Bytes of the server's manifest memory (`manifest_memory`) the running sessions'
    /// manifests hold now ([`crate::manifests`]).
    pub fn manifest_memory_in_use(&self) -> u64 {
        self.manifests.used()
    }

    /// Puts `exports` and `users` in force (the listener and everything else stay):
    /// new connections authenticate against them at once, and each running session
    /// checks them at once and ends with "credential revoked" if its user is gone, the
    /// credential it proved is no longer its user's, or its user may no longer do what
    /// it does on the paths it does it to (see [`crate::policy`]). An export that
    /// cannot be opened fails the reload, and the old policy stays in force.
    pub fn reload(&self, exports: Vec<ExportSpec>, users: Users) -> Result<Reloaded> {
        let old = self.policy.borrow().clone();
        let (policy, changed) = old.replaced(exports, users)?;
        self.policy.send_replace(Arc::new(policy));
        Ok(changed)
    }

    /// Accepts connections until `shutdown` is cancelled.
    pub async fn serve(
        self: &Arc<Self>,
        listener: impl Into<Listener>,
        shutdown: CancellationToken,
    ) {
        let listener = listener.into();
        // Connections start on an unpaced congestion control; each sending session
        // then sets its own (see `limits`).
        if let Err(e) = listener.start_on(limits::UNPACED_START) {
            tracing::debug!(
                "the listening socket keeps its congestion control ({e}): request-driven \
                 sessions may send paced"
            );
        }
        // Congestion control is set per session (`limits`), not at accept.
        let accepted = SocketOptions {
            congestion: None,
            ..self.cfg.socket.clone()
        };
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listener.accept(&accepted) => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off rather than spin.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Some(hold) = self.per_address.take(peer.ip()) else {
                let why = format!(
                    "{} connections from {} already in set-up",
                    self.per_address.cap(),
                    peer.ip()
                );
                self.refuse(stream, peer, why, "max_unauthenticated_per_address");
                continue;
            };
            let setup = match self.handshakes.clone().try_acquire_owned() {
                Ok(p) => Setup::Slot(p),
                Err(_) => match self.overflow.clone().try_acquire_owned() {
                    Ok(p) => Setup::Overflow(p),
                    Err(_) => {
                        let why = format!(
                            "{} connections already wait beyond the set-up limit",
                            self.overflow_limit()
                        );
                        drop(hold);
                        self.refuse(stream, peer, why, "max_handshakes_overflow");
                        continue;
                    }
                },
            };
            let me = self.clone();
            tokio::spawn(async move { me.connection(stream, peer, setup, hold).await });
        }
    }

    /// The live view of the sessions (`dmover serve --metrics`), watching this server's
    /// disk threads and buffer memory.
    pub fn monitor(&self) -> &Arc<crate::monitor::Monitor> {
        let units = (self.cfg.memory_budget / MIB).clamp(1, Semaphore::MAX_PERMITS as u64);
        self.monitor
            .watch(&self.disk, &self.memory, units as usize, MIB);
        &self.monitor
    }

    /// A session place, if one is free.
    fn session_place(&self) -> Option<SessionPlace<'_>> {
        if self.active.fetch_add(1, Ordering::AcqRel) >= self.cfg.max_sessions {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(SessionPlace(self))
    }

    /// Connections beyond [`ServerConfig::max_handshakes`] that may wait for their
    /// preamble (to be answered busy, or, data connections, to join).
    fn overflow_limit(&self) -> usize {
        overflow_limit(self.cfg.max_handshakes)
    }

    /// How long a control connection refused as busy is asked to wait: 1 s when few
    /// connections wait beyond the set-up limit, up to [`MAX_RETRY_AFTER`] as they
    /// near the overflow bound.
    fn retry_after(&self) -> NonZeroU8 {
        let limit = self.overflow_limit();
        let waiting = limit - self.overflow.available_permits().min(limit);
        let extra = (MAX_RETRY_AFTER as usize - 1) * waiting / limit;
        NonZeroU8::new((1 + extra).min(MAX_RETRY_AFTER as usize) as u8).unwrap_or(NonZeroU8::MIN)
    }

    /// A control connection that came beyond the set-up limit: answered "busy, retry
    /// after N s" and closed gracefully (what the client sent behind its preamble is
    /// read and discarded, so the close is no reset).
    /// `reason`: the limit reached, for the metrics (see [`crate::monitor::REFUSALS`]).
    async fn answer_busy(
        &self,
        mut stream: Incoming,
        peer: &str,
        why: String,
        reason: &'static str,
    ) {
        let n = self.retry_after();
        let answer = Preamble::busy(n);
        if stream.write_preamble(answer, peer).await.is_ok() {
            tracing::info!("busy: answered {peer} \"retry after {n} s\": {why}");
        }
        self.monitor.busy_refused();
        self.monitor.refused(reason);
        stream.close_gracefully().await;
    }

    /// A connection refused at accept (`why`; `reason`, for the metrics): answered
    /// busy at once, whatever its kind (its preamble may not have come yet: under load
    /// a client can be slow to send it), and closed in order (no reset, which could
    /// cost the client the answer), by a task of its own; beyond [`REFUSING_MAX`] such
    /// connections at once, closed at once. A data client reads the answer as a
    /// broken connection and dials again; a control client comes back after the time
    /// asked.
    fn refuse(
        self: &Arc<Self>,
        stream: Incoming,
        peer: SocketAddr,
        why: String,
        reason: &'static str,
    ) {
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            // Answered still, then closed at once: a reset if the client's bytes are
            // unread, but what reached the client before it stays readable.
            let answered = stream.try_write_preamble(Preamble::busy(self.retry_after()));
            tracing::info!(
                "busy: closed {peer} at once{} ({why}): {REFUSING_MAX} refused connections \
                 are being closed already",
                if answered {
                    ", answered busy"
                } else {
                    " unanswered"
                }
            );
            self.monitor.busy_refused();
            self.monitor.refused(reason);
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            me.answer_busy(stream, &peer.to_string(), why, reason).await;
        });
    }

    async fn connection(
        self: Arc<Self>,
        mut stream: Incoming,
        peer: SocketAddr,
        setup: Setup,
        mut hold: AddrHold,
    ) {
        let p = peer.to_string();
        // A connection beyond the set-up limit waits for its preamble briefly.
        let wait = match setup {
            Setup::Slot(_) => self.cfg.handshake_timeout.min(PREAMBLE_WAIT),
            Setup::Overflow(_) => self.cfg.handshake_timeout.min(BUSY_PREAMBLE_WAIT),
        };
        let deadline = tokio::time::Instant::now() + self.cfg.handshake_timeout;
        let pre = match tokio::time::timeout(wait, stream.read_preamble(&p)).await {
            Ok(Ok(pre)) => pre,
            Ok(Err(e)) => {
                tracing::warn!("refused {p}: {e}");
                drop((setup, hold));
                stream.close_gracefully().await;
                return;
            }
            Err(_) => {
                // Under load a client can be slow to send it: it is told to come back.
                drop((setup, hold));
                let n = self.retry_after();
                if stream.write_preamble(Preamble::busy(n), &p).await.is_ok() {
                    tracing::warn!(
                        "busy: answered {p} \"retry after {n} s\": no preamble within {} s",
                        wait.as_secs()
                    );
                }
                stream.close_gracefully().await;
                return;
            }
        };
        match pre.kind {
            ConnKind::Data if pre.version < dmover_proto::MIN_PROTOCOL_VERSION => {
                tracing::warn!(
                    "refused data connection from {p}: protocol version {} (we need {}..={PROTOCOL_VERSION})",
                    pre.version,
                    dmover_proto::MIN_PROTOCOL_VERSION
                );
                drop((setup, hold));
                stream.close_gracefully().await;
            }
            // A data connection costs a challenge and one read (no TLS): beyond the
            // set-up limit it still joins, on an overflow slot.
            ConnKind::Data => {
                match tokio::time::timeout_at(deadline, stream.join(&self.joins, &p)).await {
                    Ok(Ok(())) => {}
                    // Its client went away before joining (e.g. answered busy on its
                    // control connection, it dropped the data connections it dialed).
                    Ok(Err(AcceptError::Net(NetError::Closed { .. }))) => {
                        tracing::info!("data connection from {p} closed before joining")
                    }
                    Ok(Err(e)) => tracing::warn!("refused data connection from {p}: {e}"),
                    Err(_) => tracing::warn!(
                        "refused data connection from {p}: no join within {} s",
                        self.cfg.handshake_timeout.as_secs()
                    ),
                }
                drop((setup, hold));
            }
            ConnKind::Control => {
                let permit = match setup {
                    Setup::Slot(permit) => permit,
                    // A slot may have come free while the preamble came.
                    Setup::Overflow(overflow) => {
                        match self.handshakes.clone().try_acquire_owned() {
                            Ok(permit) => {
                                drop(overflow);
                                permit
                            }
                            Err(_) => {
                                let why = format!(
                                    "{} connections already in set-up",
                                    self.cfg.max_handshakes
                                );
                                self.answer_busy(stream, &p, why, "max_handshakes").await;
                                return;
                            }
                        }
                    }
                };
                // One address's unauthenticated connections hold at most half the
                // session places.
                if !hold.take_place() {
                    let why = format!(
                        "unauthenticated connections from {} hold {} session places",
                        hold.ip(),
                        self.per_address.places()
                    );
                    self.answer_busy(stream, &p, why, "max_unauthenticated_per_address")
                        .await;
                    return;
                }
                // The session's place is taken now: a client the server has no room
                // for learns it before TLS, and comes back.
                let Some(place) = self.session_place() else {
                    let why = format!("{} sessions running", self.cfg.max_sessions);
                    self.answer_busy(stream, &p, why, "max_sessions").await;
                    return;
                };
                // A failure is logged once, where it happens: before the session in
                // `control_connection`, after it in the session's own line.
                let held = SetupHeld(Some(permit), Some(hold));
                let _ = self
                    .control_connection(stream, &p, pre, deadline, held, place)
                    .await;
            }
        }
    }

    async fn control_connection(
        &self,
        stream: Incoming,
        peer: &str,
        pre: Preamble,
        deadline: tokio::time::Instant,
        held: SetupHeld,
        place: SessionPlace<'_>,
    ) -> Result<()> {
        let (ch, conn) = match self.control_setup(stream, peer, pre, deadline).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("session with {peer} failed: {e:#}");
                return Err(e);
            }
        };
        self.control_session_in(ch, conn, held, Some(place)).await
    }

    /// The preamble's answer, TLS and the connection's exported secrets.
    async fn control_setup(
        &self,
        mut stream: Incoming,
        peer: &str,
        pre: Preamble,
        deadline: tokio::time::Instant,
    ) -> Result<(ControlChannel<ControlStream>, Conn)> {
        let version = negotiate_version(PROTOCOL_VERSION, pre.version).unwrap_or(0);
        let answer = Preamble {
            kind: ConnKind::Control,
            version,
            busy: None,
        };
        stream.write_preamble(answer, peer).await?;
        if version == 0 {
            // The TLS ClientHello behind the preamble is read, so that the answer is
            // not lost to a reset.
            stream.close_gracefully().await;
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!(
                    "client speaks protocol version {}, we need {}..={PROTOCOL_VERSION}",
                    pre.version,
                    dmover_proto::MIN_PROTOCOL_VERSION
                ),
            ));
        }
        let accepted = self.tls.accept(stream.into_control());
        let (tls, peer_key) = match tokio::time::timeout_at(deadline, accepted).await {
            Ok(Ok(tls)) => {
                let key = dmover_net::tls::peer_fingerprint(&tls);
                (ControlStream::Server(tls), key)
            }
            Ok(Err(source)) => {
                self.monitor.auth_failed("tls");
                return Err(Error::Net(NetError::Tls {
                    peer: peer.to_string(),
                    source,
                }));
            }
            Err(_) => {
                return Err(Error::Net(NetError::Timeout {
                    peer: peer.to_string(),
                    what: "TLS handshake",
                    secs: self.cfg.handshake_timeout.as_secs(),
                }));
            }
        };
        let binding = dmover_net::tls::export(&tls, auth::AUTH_EXPORTER_LABEL, None)?;
        let master = dmover_net::tls::export(&tls, auth::SESSION_EXPORTER_LABEL, None)?;
        let rtt = tls.get_ref().0.min_rtt();
        let local = tls.get_ref().0.local_addr().ok().map(|a| a.to_string());
        let ch = ControlChannel::unauthenticated(tls, peer, PRE_AUTH_MAX_FRAME);
        Ok((
            ch,
            Conn {
                binding,
                master,
                deadline,
                peer_key,
                rtt,
                local,
            },
        ))
    }

    /// Runs a control connection after TLS: authentication, `Open`, the session.
    /// `binding` and `master` are the connection's exported secrets (see
    /// [`dmover_proto::auth`]); `deadline` bounds everything up to the session. Public
    /// so the session logic can be driven in memory (fuzzing, tests) without TLS.
    pub async fn control_session<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: ControlChannel<S>,
        binding: [u8; 32],
        master: [u8; 32],
        deadline: tokio::time::Instant,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<()> {
        let conn = Conn {
            binding,
            master,
            deadline,
            peer_key: None,
            rtt: None,
            local: None,
        };
        self.control_session_in(ch, conn, SetupHeld(permit, None), None)
            .await
    }

    /// [`Server::control_session`], with the session's place if it was taken at the
    /// preamble (else it is taken at `Open`, or the session refused as busy).
    async fn control_session_in<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        mut ch: ControlChannel<S>,
        conn: Conn,
        held: SetupHeld,
        place: Option<SessionPlace<'_>>,
    ) -> Result<()> {
        let Conn {
            binding,
            master,
            deadline,
            peer_key,
            rtt,
            local,
        } = conn;
        let peer = ch.peer().to_string();
        // Errors the machines reported to the client themselves.
        let mut reported = false;
        let result = match self
            .authenticate(&mut ch, &binding, deadline, peer_key.as_deref())
            .await
        {
            Err(e) => {
                tracing::warn!("session with {peer} failed: {e:#}");
                reported = true;
                Err(e)
            }
            Ok((grant, open)) => {
                drop(held);
                ch.authenticated();
                let mut log = SessionLog::new(&open.op);
                let r = match self.user_slot(&grant) {
                    Err(e) => Err(e),
                    Ok(_user) => match open.op.clone() {
                        Op::Grant(req) => {
                            self.grant_capability(&mut ch, &grant, req, local.as_deref())
                                .await
                        }
                        Op::Prune(req) => self.prune(&mut ch, &grant, req, &mut log).await,
                        Op::PruneKeep(req) => self.prune_keep(&mut ch, &grant, req, &mut log).await,
                        Op::Rename(req) => self.rename(&mut ch, &grant, req, &mut log).await,
                        Op::Digests(req) => self.digests(&mut ch, &grant, req, &mut log).await,
                        Op::Sums(req) => self.sums(&mut ch, &grant, req, &mut log).await,
                        Op::ThirdParty(tp) => {
                            let tp = tpc::Steered::copy(tp);
                            match self.third_party(&mut ch, &grant, &open, tp, &mut log).await {
                                Ok(done) => {
                                    log.done = Some(done);
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        }
                        Op::ThirdPartySync(s) => {
                            let tp = tpc::Steered::sync(s);
                            match self.third_party(&mut ch, &grant, &open, tp, &mut log).await {
                                Ok(done) => {
                                    log.done = Some(done);
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        }
                        _ => {
                            self.run_session(
                                &mut ch,
                                open,
                                place,
                                &peer,
                                &grant,
                                (master, rtt),
                                &mut reported,
                                &mut log,
                            )
                            .await
                        }
                    },
                };
                log.emit(&peer, &grant.user, &r);
                if let Proven::Capability(nonce) = grant.proven {
                    // A sync's capability: its next session may follow a long one.
                    let ttl = self.cfg.tpc_capability_ttl.as_secs();
                    self.nonces.ended(nonce, tpc::unix_now(), ttl);
                }
                r
            }
        };
        // Data streams that joined ahead of a session that failed to open (early data,
        // protocol version 8) are refused now rather than at their wait's limit.
        self.joins.close(auth::session_id(&master).0);
        if let Err(e) = &result {
            // Tell the client why (a data stream's failure too), unless it was the
            // client's own report; a dead control connection just fails the send.
            if !matches!(e, Error::Remote { .. }) {
                if !reported {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        ch.send(&Control::Error(e.to_msg())),
                    )
                    .await;
                }
                // The client sends its first messages without waiting for answers, so
                // some may be unread: closing now would reset the connection and could
                // cost the client our error. Read until it closes (briefly).
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    let mut sink = [0u8; 4096];
                    while matches!(ch.get_mut().read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
            }
        }
        result
    }

    fn user_slot(&self, grant: &Grant) -> Result<UserGuard<'_>> {
        let mut m = self.per_user.lock();
        let n = m.entry(grant.user.clone()).or_insert(0);
        if *n >= self.cfg.max_sessions_per_user {
            let n = *n;
            self.monitor.refused("max_sessions_per_user");
            return Err(Error::refused(
                ErrorCode::Busy,
                format!(
                    "user {:?} already runs {n} sessions (the limit)",
                    grant.user
                ),
            ));
        }
        *n += 1;
        Ok(UserGuard(self, grant.user.clone()))
    }

    /// Hello/Welcome, Auth/AuthOk, Open: who the client is and what it wants, all by
    /// `deadline` ([`Acceptance`], driven by [`drive::accept`]). A failure has been
    /// reported to the client.
    async fn authenticate<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        binding: &[u8; 32],
        deadline: tokio::time::Instant,
        peer_key: Option<&str>,
    ) -> Result<(Grant, Open)> {
        let peer = ch.peer().to_string();
        // The policy in force now; a reload later is checked by the session itself.
        let policy = self.policy.borrow().clone();
        let welcome = Welcome {
            software: SOFTWARE.into(),
            nonce: rand::random(),
            auth: if policy.users.is_some() {
                AuthMethod::Required
            } else {
                AuthMethod::None
            },
        };
        let mut timing = drive::timing(session::HEARTBEAT, self.cfg.idle_timeout);
        timing.handshake = self.cfg.handshake_timeout;
        let m = Acceptance::new(peer.clone(), timing, deadline.into_std(), welcome);
        let mut granted = None;
        let open = drive::accept(m, ch, |hello, a| {
            let transcript = auth::transcript(binding, &a.user, &hello.nonce);
            if let Credential::Capability(c) = &a.credential {
                return match self.accept_capability(&policy, c, peer_key) {
                    Ok(grant) => {
                        tracing::info!(
                            "{peer}: capability accepted from {} for user {:?} ({:?})",
                            peer_key.unwrap_or("?"),
                            grant.user,
                            grant.scope
                        );
                        granted = Some(grant);
                        Ok(AuthOk { proof: None })
                    }
                    Err(why) => {
                        tracing::warn!(
                            "capability refused for {peer} ({}): {why}",
                            hello.software.escape_debug()
                        );
                        self.monitor.auth_failed("capability");
                        Err(Error::refused(
                            ErrorCode::Auth,
                            format!("third-party capability refused: {why}"),
                        ))
                    }
                };
            }
            let (grant, proof) = match &policy.users {
                None => (
                    Grant {
                        user: String::new(),
                        login: a.user.clone(),
                        proven: Proven::Nothing,
                        exports: policy.all_exports(),
                        scope: None,
                    },
                    None,
                ),
                Some(users) => match check_credential(users, &a.user, &a.credential, &transcript) {
                    Ok(x) => x,
                    Err(why) => {
                        tracing::warn!(
                            "authentication failed for {peer} ({}): user {:?}: {why}",
                            hello.software.escape_debug(),
                            a.user
                        );
                        self.monitor.auth_failed(if why == UNKNOWN_USER {
                            "unknown_user"
                        } else {
                            "bad_credential"
                        });
                        return Err(Error::refused(
                            ErrorCode::Auth,
                            "authentication failed: unknown user or wrong credential",
                        ));
                    }
                },
            };
            if policy.users.is_some() {
                tracing::info!(
                    "{peer}: authenticated as {:?} ({})",
                    grant.user,
                    hello.software.escape_debug()
                );
            } else {
                tracing::info!(
                    "{peer}: connected without authentication ({})",
                    hello.software.escape_debug()
                );
            }
            granted = Some(grant);
            Ok(AuthOk { proof })
        })
        .await?;
        let grant = granted.expect("the credential was verified before Open");
        Ok((grant, open))
    }
}

/// The bandwidth limit of a session (bytes per second) and what sets it: the lowest of
/// its user's `bwlimit` and those of the exports it uses.
fn session_bwlimit(policy: &Policy, grant: &Grant, uses: &[Use]) -> Option<(u64, String)> {
    let user = policy
        .users
        .as_ref()
        .and_then(|u| u.get(&grant.user))
        .and_then(|u| Some((u.bwlimit?, format!("user {:?}", u.name))));
    let exports = uses
        .iter()
        .filter_map(|u| Some((u.export.bwlimit?, format!("export {:?}", u.export.name))));
    user.into_iter().chain(exports).min_by_key(|l| l.0)
}

/// What a control connection brought from TLS: its exported secrets (see
/// [`dmover_proto::auth`]), the deadline of everything up to the session, and the key
/// the client proved in TLS (a server dialing for a third-party copy).
struct Conn {
    binding: [u8; 32],
    master: [u8; 32],
    deadline: tokio::time::Instant,
    peer_key: Option<String>,
    /// The smallest round trip the connection's TCP saw by the end of TLS (its
    /// handshake's and TLS's), where the kernel tells.
    rtt: Option<Duration>,
    /// The address the client reached this server at (`None` in memory).
    local: Option<String>,
}

/// What the server logs of a session when it ends: one event, `session finished` or
/// `session failed`, with its fields (see docs/json.md).
#[derive(Debug)]
struct SessionLog {
    started: Instant,
    op: &'static str,
    /// The op in words, once the session ran.
    what: String,
    protection: Option<DataProtection>,
    /// The session's counters, once it has a run.
    progress: Option<Arc<crate::engine::Progress>>,
    /// Bytes and files of a finished session, from its summary.
    done: Option<(u64, u64)>,
    /// Its entry in the server's monitor, once it asked for something.
    live: Option<crate::monitor::Live>,
    /// The session's bandwidth limit (bytes per second), if it had one.
    bwlimit: Option<u64>,
    /// A pull's congestion control, as the client asked (feature LIMITS).
    congestion: Option<Arc<limits::SendCongestion>>,
}

impl SessionLog {
    fn new(op: &Op) -> Self {
        SessionLog {
            started: Instant::now(),
            op: match op {
                Op::Push { .. } => "push",
                Op::Pull { .. } | Op::PullFiltered(_) | Op::PullListed(_) => "pull",
                Op::MemTest(_) => "memtest",
                Op::Grant(_) => "grant",
                Op::ThirdParty(_) | Op::ThirdPartySync(_) => "third-party",
                Op::Prune(_) | Op::PruneKeep(_) => "prune",
                Op::Rename(_) => "rename",
                Op::Digests(_) => "digests",
                Op::Sums(_) => "sums",
            },
            what: String::new(),
            protection: None,
            progress: None,
            done: None,
            live: None,
            bwlimit: None,
            congestion: None,
        }
    }

    fn emit(&self, peer: &str, user: &str, result: &Result<()>) {
        if let Some(live) = &self.live {
            live.finish(result, self.done);
        }
        let seconds = self.started.elapsed().as_secs_f64();
        // A failed session: the payload that crossed its data streams.
        let (bytes, files) = match self.done {
            Some((b, f)) => (b, Some(f)),
            None => (
                self.progress
                    .as_ref()
                    .map_or(0, |p| p.bytes.load(Ordering::Relaxed)),
                None,
            ),
        };
        let gbit_per_s = bytes as f64 * 8.0 / seconds.max(1e-9) / 1e9;
        let data = self.protection.map(|p| format!("{p:?}"));
        // What the data streams this server sent on use, read back from their sockets,
        // when the client asked for an algorithm.
        let congestion = self.congestion.as_ref().and_then(|c| c.used());
        match result {
            Ok(()) => tracing::info!(
                peer,
                user,
                op = self.op,
                what = self.what,
                bytes,
                files,
                seconds,
                gbit_per_s,
                data,
                bwlimit = self.bwlimit,
                congestion,
                result = "ok",
                "session finished"
            ),
            Err(e) => tracing::warn!(
                peer,
                user,
                op = self.op,
                bytes,
                files,
                seconds,
                gbit_per_s,
                data,
                bwlimit = self.bwlimit,
                congestion,
                result = "error",
                error = %e,
                "session failed"
            ),
        }
    }
}

/// Why [`check_credential`] fails for a name no user (and no `*` entry) has.
const UNKNOWN_USER: &str = "unknown user";

/// Checks a credential against the configured users (a user named `*` stands for any
/// name): the session's grant and the server's token proof, or why it failed (for the
/// log; the client only learns that it failed).
pub fn check_credential(
    users: &BTreeMap<String, User>,
    name: &str,
    credential: &Credential,
    transcript: &[u8; 32],
) -> std::result::Result<(Grant, Option<[u8; 32]>), &'static str> {
    let user = users
        .get(name)
        .or_else(|| users.get("*"))
        .ok_or(UNKNOWN_USER)?;
    if user.metrics_only {
        // Checked before the credential: a monitoring token never opens a session,
        // whatever it proves.
        return Err("a metrics user (metrics_users): its token reads the metrics only");
    }
    let (proof, proven) = match credential {
        Credential::None => return Err("no credential given"),
        Credential::Capability(_) => return Err("a capability, checked elsewhere"),
        Credential::Token { proof } => {
            let v = user.token.as_ref().ok_or("the user has no token")?;
            if !auth::verify_token_proof(v, transcript, proof) {
                return Err("wrong token");
            }
            (
                Some(auth::server_token_proof(v, transcript)),
                Proven::Token(v.clone()),
            )
        }
        Credential::Key { public, signature } => {
            if !user.keys.contains(public) {
                return Err("key not authorised for the user");
            }
            if !verify_signature(public, &auth::key_auth_message(transcript), signature) {
                return Err("bad signature");
            }
            (None, Proven::Key(*public))
        }
    };
    Ok((
        Grant {
            user: user.name.clone(),
            login: name.to_string(),
            proven,
            exports: user.exports.clone(),
            scope: None,
        },
        proof,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's limit is the lowest of its user's and those of the exports it uses,
    /// named; none of them set: no limit.
    #[test]
    fn the_lowest_of_the_users_and_the_exports_limits_holds() {
        let spec = |name: &str, bwlimit| ExportSpec {
            name: name.into(),
            path: "/x".into(),
            read_only: false,
            third_party: false,
            bwlimit,
            preserve_owner: false,
            xattrs_all: false,
        };
        let use_of = |e: ExportSpec| Use {
            path: Vec::new(),
            write: false,
            export: e,
        };
        let policy = |bwlimit| Policy {
            exports: Vec::new(),
            users: Some(BTreeMap::from([(
                "alice".to_string(),
                User {
                    name: "alice".into(),
                    token: None,
                    keys: Vec::new(),
                    exports: BTreeMap::new(),
                    bwlimit,
                    metrics_only: false,
                },
            )])),
        };
        let grant = Grant {
            user: "alice".into(),
            login: "alice".into(),
            proven: Proven::Nothing,
            exports: BTreeMap::new(),
            scope: None,
        };
        let uses = [use_of(spec("a", Some(300))), use_of(spec("b", Some(200)))];
        assert_eq!(
            session_bwlimit(&policy(Some(1000)), &grant, &uses),
            Some((200, "export \"b\"".into()))
        );
        assert_eq!(
            session_bwlimit(&policy(Some(100)), &grant, &uses),
            Some((100, "user \"alice\"".into()))
        );
        let free = [use_of(spec("a", None))];
        assert_eq!(session_bwlimit(&policy(None), &grant, &free), None);
        let unauthenticated = Policy {
            exports: Vec::new(),
            users: None,
        };
        assert_eq!(
            session_bwlimit(&unauthenticated, &grant, &uses[..1]),
            Some((300, "export \"a\"".into()))
        );
    }
}
