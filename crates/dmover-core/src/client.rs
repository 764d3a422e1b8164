//! The client: connects to a server, authenticates, and pushes or pulls a dataset.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::mpsc;

use dmover_net::control::ControlChannel;
use dmover_net::join::{Dialer, Dials, JoinError, JoinWait, LinkMode};
use dmover_net::pace::{Paced, Pacer};
use dmover_net::stream::DataIo;
use dmover_net::tcp;
use dmover_net::tls::TlsConnector;
use dmover_net::{ControlStream, NetError};
use dmover_proto::auth;
use dmover_proto::capability::Scope;
use dmover_proto::control::{
    Auth, Credential, ErrorCode, FailedFile, Hello, Op, Open, SessionInfo, Summary,
};
use dmover_proto::control::{
    AuthMethod, Control, GrantRequest, ManifestEnd, ManifestPart, Prune, PruneReport,
    SessionOptions, ThirdParty, TpcMode,
};
use dmover_proto::manifest::{Entry, EntryKind, NO_PARENT, Totals};
use dmover_proto::preamble::{ConnKind, Preamble};
use dmover_proto::{PROTOCOL_VERSION, control};

use dmover_store::Source;
use dmover_store::paths::{self, Base};
use dmover_store::sink::{FileSink, SinkOptions, prepare_sink};
use dmover_store::source::{FileSource, SourceOptions};
use dmover_store::walk;

use crate::diskpool::DiskPool;
use crate::drive::{self, GrowPart};
use crate::engine::{DataStream, Run};
use crate::error::{Error, Result};
use crate::livewalk;
use crate::session::{self, HANDSHAKE_TIMEOUT, TransferOptions};
use dmover_proto::session::{Dial, Limits, SinkSession, SourceSession, Timing};

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
    /// Chunk size used (the session's).
    pub chunk_size: u32,
    /// The chunk sizes the layout used, in layout order, with the chunks of each: one
    /// size, or (feature `PART_CHUNKS`) later parts' own (docs/protocol.md, "Chunks
    /// per part"). Empty where this side holds no layout (a third-party copy).
    pub chunk_sizes: Vec<(u64, u64)>,
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
    /// `sync --delete`: what was deleted (`None`: nothing was to be deleted).
    pub pruned: Option<PruneReport>,
    /// `sync --delete` deleted nothing because the source's listing was incomplete:
    /// why.
    pub delete_refused: Option<String>,
    /// A relay through this client (`cp --via-client`): what it received from the
    /// source server.
    pub relayed: Option<Relayed>,
}

/// A push whose manifest grows while it runs ([`Client::push_growing`]).
#[derive(Debug)]
pub struct Growing {
    grower: walk::Grower,
    totals: Totals,
    tx: mpsc::UnboundedSender<GrowPart>,
    task: tokio::task::JoinHandle<Result<Report>>,
}

impl Growing {
    /// Whether `rel` (a path below the source root) is in the manifest already (a
    /// directory, or a file sent before, which cannot be sent again in this session:
    /// names are unique in a manifest).
    pub fn has(&self, rel: &[u8]) -> bool {
        self.grower.has(rel)
    }

    /// Whether `rel` is in the manifest as a file or symlink: its next version
    /// needs a new session.
    pub fn has_file(&self, rel: &[u8]) -> bool {
        self.grower.has_file(rel)
    }

    /// Entries in the manifest so far.
    pub fn entries(&self) -> u32 {
        self.grower.len()
    }

    /// Whether the session ended (failed, since only [`Growing::finish`] ends it
    /// otherwise).
    pub fn ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Adds `rels` (paths below the source root; those already in the manifest, gone,
    /// or special files are left out) as the next part.
    pub fn send(&mut self, rels: &[Vec<u8>]) -> Part {
        let (entries, paths) = self.grower.part(rels);
        let (tell, durable) = tokio::sync::oneshot::channel();
        let t = Totals::of(&entries);
        self.totals = self.totals.plus(t);
        let _ = self.tx.send(GrowPart {
            entries,
            totals: self.totals,
            // The source's storage lays the part out and says how long it is.
            chunks: 0,
            last: false,
            durable: Some(tell),
            times: Vec::new(),
            meta: Vec::new(),
            sent: false,
            sparse: Vec::new(),
        });
        Part {
            paths,
            files: t.files,
            bytes: t.bytes,
            durable,
        }
    }

    /// Ends the manifest and waits for the session's end (every part complete at
    /// the server, directories given their modes and mtimes).
    pub async fn finish(self) -> Result<Report> {
        // Their contents changed since their entries went out: the directories get
        // their modification times as they are now.
        let _ = self.tx.send(GrowPart {
            entries: Vec::new(),
            totals: self.totals,
            chunks: 0,
            last: true,
            durable: None,
            times: self.grower.dir_times(),
            meta: Vec::new(),
            sent: false,
            sparse: Vec::new(),
        });
        self.wait().await
    }

    /// Waits for the session's end without ending the manifest (after a
    /// cancellation of its run, or a failure).
    pub async fn wait(self) -> Result<Report> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(Error::refused(
                ErrorCode::Io,
                format!("the session's task failed: {e}"),
            )),
        }
    }
}

/// A part of a growing push ([`Growing::send`]).
#[derive(Debug)]
pub struct Part {
    /// The paths it holds (of those asked for).
    pub paths: Vec<Vec<u8>>,
    /// Regular files and bytes of file data in it.
    pub files: u64,
    pub bytes: u64,
    /// Told once its files are complete under their final names at the server; an
    /// error: the session failed first.
    pub durable: tokio::sync::oneshot::Receiver<()>,
}

/// What a relay through this client moved besides what it sent on ([`Report::relayed`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Relayed {
    /// Payload bytes received from the source server, all attempts.
    pub bytes_received: u64,
    /// The most bytes of chunks the client held at once (the last attempt).
    pub peak_buffered: u64,
}

/// What `dmover sync --dry-run` found ([`Client::sync_dry_run`]).
#[derive(Debug, Clone)]
pub struct DryRun {
    /// The source's manifest (one root, the mirror's source).
    pub entries: Vec<Entry>,
    /// What the destination holds unchanged, and what `--delete` would delete.
    pub report: PruneReport,
    /// Entries the source walk skipped (a push's local walk).
    pub skipped: u64,
}

/// Adds what a later prune did to an earlier one's counts.
fn merge_pruned(a: &mut PruneReport, b: PruneReport) {
    a.deleted += b.deleted;
    a.deleted_bytes += b.deleted_bytes;
    a.over_limit += b.over_limit;
    a.protected = b.protected;
    a.paths.extend(b.paths);
    a.unchanged = b.unchanged;
}

/// `sync --checksum`: the files among `digests` (`(entry, the destination's content
/// digest)`) whose content here has the same digest. A file that cannot be read is
/// not among them (the transfer will say why).
fn same_content(
    tree: dmover_store::tree::Tree,
    digests: &[(u32, u64)],
) -> (dmover_store::tree::Tree, std::collections::HashSet<u32>) {
    use rustix::fs::OFlags;
    let same_one = |&(i, d): &(u32, u64)| -> bool {
        let Some(e) = tree.entries().get(i as usize) else {
            return false;
        };
        if e.file_size() == 0 {
            return false;
        }
        let Ok((dir, name)) = tree.locate(i) else {
            return false;
        };
        let flags = OFlags::RDONLY | OFlags::NONBLOCK;
        let Ok(fd) = dmover_store::sys::open_in(&*dir, name, flags, 0) else {
            return false;
        };
        let size_ok = rustix::fs::fstat(&fd).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
                && st.st_size as u64 == e.file_size()
        });
        size_ok && dmover_store::prune::content_digest(&fd).is_ok_and(|x| x == d)
    };
    // Reading waits on the disk more than on a core: several files at once, as the
    // server digests its own.
    let threads = 8.min(digests.len() / 4).max(1);
    let per = digests.len().div_ceil(threads).max(1);
    let same = std::thread::scope(|s| {
        let parts: Vec<_> = digests
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .filter(|x| same_one(x))
                        .map(|&(i, _)| i)
                        .collect::<Vec<u32>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    (tree, same)
}

/// What [`Client::same_remote_content`] found: the files (paths below the mirror's
/// root) the destination holds with the source's content.
#[derive(Debug, Default)]
struct SameContent {
    paths: std::collections::HashSet<Vec<u8>>,
    files: u64,
    bytes: u64,
}

/// Why `sync --delete` must not delete after a transfer whose source listing missed
/// `skipped` entries and could not read `failed` files.
fn delete_refusal(skipped: u64, failed: usize) -> Option<String> {
    match (skipped, failed) {
        (0, 0) => None,
        (s, 0) => Some(format!(
            "not deleting anything: the source walk skipped {s} entries (special files, or \
             files that vanished while listed), so the destination cannot tell them from \
             deleted ones; exclude them with --exclude to delete the rest"
        )),
        (_, f) => Some(format!(
            "not deleting anything: {f} source files could not be read (an incomplete \
             source listing must not delete their copies)"
        )),
    }
}

/// How long a client waits for a server's [`Op::Prune`] answer.
const PRUNE_WAIT: Duration = Duration::from_secs(3600);

/// A client with its own disk threads.
#[derive(Debug)]
pub struct Client {
    disk: Arc<DiskPool>,
    pub(crate) opts: TransferOptions,
    /// Set when a server dials another server for a third-party copy.
    as_server: Option<Arc<AsServer>>,
    /// Whole-file uploads at once (`remote::StagedFile::upload_within`).
    pub(crate) uploads: Arc<crate::remote::Uploads>,
}

/// How a server dialing another server (a third-party copy) differs from a client: it
/// proves its key in TLS, trusts exactly the key the steering client pinned, and
/// authenticates with the other server's capability.
#[derive(Debug)]
pub(crate) struct AsServer {
    /// This server's identity, presented as TLS client certificate.
    pub(crate) identity: dmover_net::tls::ServerIdentity,
    /// The other server's key fingerprint.
    pub(crate) peer_key: String,
    /// The other server's capability for this one.
    pub(crate) capability: dmover_proto::capability::Capability,
}

/// A copy between two servers ([`Client::third_party`]).
#[derive(Debug, Clone)]
pub struct ThirdPartyCopy {
    /// Which server dials the other.
    pub mode: TpcMode,
    /// The source server (`host:port`).
    pub source_server: String,
    /// Paths on it.
    pub sources: Vec<Vec<u8>>,
    /// The destination server.
    pub dest_server: String,
    /// The destination path on it.
    pub dest: Vec<u8>,
}

/// A source root: a base, a path under it, and the name the root gets when the path
/// names the base itself (a server's whole export).
pub(crate) type Root = (Base, Vec<u8>, Vec<u8>);

/// How long a connection set up while a push's walk runs may wait to be used: a walk
/// (and metadata read) that takes longer connects again once done (the server drops
/// a connection that does not authenticate within its handshake timeout, 30 s by
/// default).
const EARLY_CONNECTION_FRESH: Duration = Duration::from_secs(10);

/// A control connection with TLS up and the first flight ready, not sent.
pub(crate) struct Connection {
    ch: ControlChannel<ControlStream>,
    /// Exported for the session key.
    master: [u8; 32],
    transcript: [u8; 32],
    /// The token's keys when the credential is a token proof.
    token: Option<auth::TokenKeys>,
    hello: Hello,
    auth: Auth,
    dials: Dials,
    /// The key the server proved it holds.
    server_key: String,
    /// That key was known before this connection (not pinned on first use now).
    key_known: bool,
}

impl Connection {
    /// The session id and salt a session of `streams` streams on this connection
    /// sends early data under (protocol version 8, docs/protocol.md "Early data"), or
    /// `None` when it waits for `Session` and `Go`: on a resume (what to send waits for
    /// the server's answer), and with a server whose key was pinned just now, on first
    /// use (it proves who it is, a token's proof in `AuthOk`, before it is sent any
    /// file's data).
    fn early(&self, resume: bool, streams: u16) -> Option<(u64, [u8; 32])> {
        (!resume && streams <= session::MAX_STREAMS && self.key_known)
            .then(|| auth::session_id(&self.master))
    }

    /// A push's source machine for `d` (from [`Connection::dial`]), early with
    /// `early` ([`Connection::early`]): its data streams join and the first chunks go
    /// out with the first flight, a round trip before `Session` and `Go` would have
    /// let them.
    fn push_machine(
        early: Option<(u64, [u8; 32])>,
        server: &str,
        timing: Timing,
        d: Dial,
    ) -> SourceSession<drive::Fault> {
        match early {
            Some((id, salt)) => {
                tracing::info!(
                    "early data: session {id:016x}'s streams join and send with the first flight"
                );
                SourceSession::dial_early(now(), server, timing, d, id, salt)
            }
            None => SourceSession::dial(now(), server, timing, d),
        }
    }

    /// The smallest round trip the control connection's TCP has seen (its handshake's
    /// and TLS's), if the kernel tells.
    fn rtt(&self) -> Option<Duration> {
        dmover_net::tcpinfo::min_rtt(self.ch.get_ref().get_ref().0.get_ref())
    }

    /// For a request that is not a session ([`Op::Grant`], [`Op::ThirdParty`]): sends
    /// the first flight and takes the answers up to `AuthOk`, checking the server's
    /// token proof; the channel is then the op's.
    async fn request(
        mut self,
        server: &str,
        open: Open,
        options: SessionOptions,
    ) -> Result<ControlChannel<ControlStream>> {
        let proof = self
            .token
            .as_ref()
            .map(|t| auth::server_token_proof(&t.verifier, &self.transcript));
        let anonymous = matches!(self.auth.credential, Credential::None);
        let ch = &mut self.ch;
        let first = [
            Control::Hello(self.hello),
            Control::Auth(self.auth),
            Control::Open(open),
            Control::Options(options),
        ];
        if let Err(e) = ch.send_all(&first).await {
            return Err(crate::session::peer_report(ch, Error::Net(e)).await);
        }
        let welcome = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "welcome").await? {
            Control::Welcome(w) => w,
            other => return Err(session::unexpected(server, other, "Welcome")),
        };
        if anonymous && welcome.auth == AuthMethod::Required {
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
                if let (AuthMethod::Required, Some(want)) = (welcome.auth, proof) {
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
            other => return Err(session::unexpected(server, other, "AuthOk")),
        }
        Ok(self.ch)
    }

    /// [`Op::Prune`] on this connection: the request, the manifest, the answer.
    async fn prune(
        self,
        server: &str,
        open: Open,
        options: SessionOptions,
        entries: &[Entry],
    ) -> Result<PruneReport> {
        let mut ch = self.request(server, open, options).await?;
        let sent = async {
            for r in dmover_proto::manifest::parts(entries) {
                ch.send(&Control::Manifest(ManifestPart {
                    entries: entries[r].to_vec(),
                }))
                .await?;
            }
            ch.send(&Control::ManifestEnd(ManifestEnd {
                totals: Totals::of(entries),
            }))
            .await
        };
        if let Err(e) = sent.await {
            return Err(crate::session::peer_report(&mut ch, Error::Net(e)).await);
        }
        // Walking (and deleting in) a large tree takes time, and the server sends
        // nothing meanwhile.
        match ch
            .recv_timeout(PRUNE_WAIT, "the destination's deletions")
            .await?
        {
            Control::Pruned(r) => Ok(r),
            // A server older than `Op::Prune` cannot decode the request: it answers a
            // protocol error about it (its wording is the decoder's).
            Control::Error(e) if e.code == ErrorCode::Protocol => Err(Error::Remote {
                peer: server.to_string(),
                code: ErrorCode::Protocol,
                message: format!(
                    "{} (sync --delete/--dry-run/--checksum need a server that knows them: \
                     an older dmover server must be upgraded)",
                    e.message
                ),
            }),
            other => Err(session::unexpected(server, other, "Pruned")),
        }
    }

    /// [`Op::Rename`] on this connection: the request and the answer (`Done`).
    async fn rename(self, server: &str, open: Open, options: SessionOptions) -> Result<()> {
        let mut ch = self.request(server, open, options).await?;
        match ch.recv_timeout(HANDSHAKE_TIMEOUT, "the rename").await? {
            Control::Done(_) => Ok(()),
            // A server older than `Op::Rename` cannot decode the request.
            Control::Error(e) if e.code == ErrorCode::Protocol => Err(Error::Remote {
                peer: server.to_string(),
                code: ErrorCode::Unsupported,
                message: format!("{} (renaming needs a newer dmover server)", e.message),
            }),
            other => Err(session::unexpected(server, other, "Done")),
        }
    }

    /// The dialer's first flight for `open` with `options`, and what it checks in the
    /// answers.
    fn dial(&mut self, open: Open, options: dmover_proto::control::SessionOptions) -> Dial {
        Dial {
            hello: self.hello.clone(),
            auth: self.auth.clone(),
            open,
            options,
            server_proof: self
                .token
                .as_ref()
                .map(|t| auth::server_token_proof(&t.verifier, &self.transcript)),
            // Set by the caller that has any (see `Client::limits`).
            limits: Default::default(),
        }
    }
}

/// A session set up to be driven (see [`Client::memtest_session`]).
pub(crate) struct Prepared {
    pub(crate) ch: ControlChannel<ControlStream>,
    /// The dialer's first flight and its checks.
    pub(crate) dial: Dial,
    pub(crate) options: dmover_proto::control::SessionOptions,
    pub(crate) timing: dmover_proto::session::Timing,
    pub(crate) joins: Dialing,
    pub(crate) env: drive::Env,
}

/// What one try to connect came to.
enum Dialed {
    /// TLS is up.
    Up(Box<Connection>),
    /// The server answered busy: connect again after this long.
    Busy(Duration),
}

/// The longest a client waits between two tries at a busy server.
pub const MAX_BUSY_BACKOFF: Duration = Duration::from_secs(8);

/// The dialer's data streams: each opened when its machine asks, on the connection
/// dialed during set-up when it is still good (see [`Dialer::join`]).
pub(crate) struct Dialing {
    dialer: Dialer,
    mode: LinkMode,
    wait: JoinWait,
    master: [u8; 32],
    /// The session and its key, once open.
    key: Option<(u64, [u8; 32])>,
    /// Streams asked for before the session's key was known.
    asked: Vec<u16>,
    early: Dials,
    /// The transfer's bandwidth limit, shared by its streams.
    pacer: Option<Arc<Pacer>>,
    set: tokio::task::JoinSet<(u16, Result<DataStream<Paced<DataIo>>>)>,
}

impl Dialing {
    /// The session's id and salt, known before `Session` (early data): its streams
    /// may join now.
    fn set_session(&mut self, id: u64, salt: &[u8; 32]) {
        self.key = Some((id, auth::session_key(&self.master, id, salt)));
    }
}

impl drive::Joins for Dialing {
    type Link = Paced<DataIo>;

    fn opened(&mut self, info: &SessionInfo) {
        self.set_session(info.id, &info.salt);
        // Connections the session does not use (it granted fewer streams) close.
        self.early.keep(info.streams);
        for stream in std::mem::take(&mut self.asked) {
            self.open(stream);
        }
    }

    fn open(&mut self, stream: u16) {
        let Some((session, key)) = self.key else {
            self.asked.push(stream);
            return;
        };
        let early = self.early.take(stream);
        let (dialer, mode, wait) = (self.dialer.clone(), self.mode, self.wait);
        let pacer = self.pacer.clone();
        self.set.spawn(async move {
            let r = dialer.join(early, session, stream, &key, mode, wait).await;
            let peer = dialer.server().to_string();
            (
                stream,
                r.map(|io| DataStream {
                    io: Paced::new(io, pacer),
                    peer,
                })
                .map_err(join_error),
            )
        });
    }

    async fn next(&mut self) -> (u16, Result<DataStream<Paced<DataIo>>>) {
        loop {
            match self.set.join_next().await {
                Some(Ok(r)) => return r,
                Some(Err(e)) => tracing::debug!("a data stream join task failed: {e}"),
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// The engine's error for a failed data stream join.
fn join_error(e: JoinError) -> Error {
    match e {
        JoinError::Net(e) => Error::Net(e),
        JoinError::Answer { peer, source } => Error::data("reading from", &peer, source),
    }
}

impl Client {
    /// A client with `io_threads` disk threads.
    pub fn new(opts: TransferOptions, io_threads: usize) -> Self {
        Self::elastic(opts, io_threads, io_threads)
    }

    /// A client with `io_threads` disk threads at the start, which its sessions' disk
    /// tuners may grow to `max` ([`crate::disktune`]).
    pub fn elastic(opts: TransferOptions, io_threads: usize, max: usize) -> Self {
        Client {
            disk: Arc::new(DiskPool::elastic(io_threads, max, "dmover-disk")),
            opts,
            as_server: None,
            uploads: Arc::default(),
        }
    }

    /// A client with other options on this one's disk threads (`sync --watch` runs
    /// each batch with the batch's file list as its filter).
    pub fn with_options(&self, opts: TransferOptions) -> Self {
        Client {
            disk: self.disk.clone(),
            opts,
            as_server: self.as_server.clone(),
            uploads: self.uploads.clone(),
        }
    }

    /// A server's client toward another server (a third-party copy), on the server's
    /// disk threads.
    pub(crate) fn as_server(opts: TransferOptions, disk: Arc<DiskPool>, s: AsServer) -> Self {
        Client {
            disk,
            opts,
            as_server: Some(Arc::new(s)),
            uploads: Arc::default(),
        }
    }

    /// The TLS settings for connecting.
    fn connector(&self) -> Result<TlsConnector> {
        if let Some(s) = &self.as_server {
            let trust = dmover_net::tls::Trust::Key(s.peer_key.clone());
            return Ok(TlsConnector::with_identity(trust, &s.identity)?);
        }
        // The caller resolves the default known-hosts file (it knows the home directory).
        let trust = self.opts.trust.clone().ok_or_else(|| {
            Error::refused(
                ErrorCode::Unsupported,
                "no home directory for the known-hosts file: set DMOVER_KNOWN_HOSTS or pass --known-hosts",
            )
        })?;
        Ok(TlsConnector::new(trust)?)
    }

    /// How this client dials data connections to `server`.
    fn dialer(&self, server: &str) -> Dialer {
        Dialer::new(
            server,
            self.opts.socket.clone(),
            self.opts.connect_timeout,
            HANDSHAKE_TIMEOUT,
        )
    }

    /// The link mode of this client's data streams.
    fn link_mode(&self) -> LinkMode {
        LinkMode {
            protection: self.opts.protection,
            idle: self.opts.idle_timeout,
        }
    }

    /// Connects and sets up TLS; the data connections are dialed meanwhile. Nothing of
    /// the session has gone out yet ([`Connection::dial`]).
    ///
    /// A server that answers busy (too many connections in set-up) is connected to
    /// again after the time it asks for, doubled on each busy answer (at most
    /// [`MAX_BUSY_BACKOFF`]) and jittered up by half, for at most
    /// [`TransferOptions::busy_wait`] in all (the last wait cut to end there, for a last
    /// try; whatever [`TransferOptions::retries`] says); then the error is a refusal
    /// with [`ErrorCode::Busy`].
    pub(crate) async fn connect(&self, server: &str) -> Result<Connection> {
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::ZERO;
        loop {
            let retry_after = match self.connect_once(server).await? {
                Dialed::Up(c) => return Ok(*c),
                Dialed::Busy(after) => after,
            };
            backoff = retry_after
                .max(backoff * 2)
                .min(MAX_BUSY_BACKOFF)
                .max(Duration::from_millis(100));
            let spent = started.elapsed();
            if spent >= self.opts.busy_wait {
                return Err(Error::refused(
                    ErrorCode::Busy,
                    format!(
                        "{server} is busy (too many connections in set-up); gave up after \
                         {:.0} s (--busy-wait {:.0}s)",
                        spent.as_secs_f64(),
                        self.opts.busy_wait.as_secs_f64()
                    ),
                ));
            }
            // The last wait ends at the bound, for one more try.
            let wait = backoff
                .mul_f64(1.0 + rand::random::<f64>() / 2.0)
                .min(self.opts.busy_wait - spent);
            tracing::warn!(
                "{server} is busy (too many connections in set-up); retrying in {:.1} s",
                wait.as_secs_f64()
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One try of [`Client::connect`].
    async fn connect_once(&self, server: &str) -> Result<Dialed> {
        dmover_net::tls::warm_up();
        let connector = self.connector()?;
        // The data connections need the server to be there, not the session: they
        // connect and collect their challenges while the control connection sets up,
        // from the same moment, so that a fresh push's streams can join as its first
        // flight goes out (dropped, and with them the connections, if this fails).
        let dials = self
            .dialer(server)
            .dial_ahead(self.opts.streams.min(session::MAX_STREAMS));
        let stream = tcp::connect_fast_open(
            server,
            &tcp::SocketOptions::default(),
            self.opts.connect_timeout,
        )
        .await?;
        // TLS starts right behind the preamble, which goes out with the ClientHello
        // (in a TCP Fast Open SYN, where the server offers it); the server's answer is
        // read (and checked) before the first TLS bytes.
        let stream = dmover_net::control::ControlTcp::awaiting_answer(
            stream,
            Preamble {
                kind: ConnKind::Control,
                version: PROTOCOL_VERSION,
                busy: None,
            },
        );
        let (tls, key_known) = match tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            connector.connect_checked(stream, server),
        )
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
                if dmover_net::control::Busy::of(&source).is_some() =>
            {
                let busy = dmover_net::control::Busy::of(&source).expect("checked");
                return Ok(Dialed::Busy(busy.retry_after));
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
            // A connection opened with TCP Fast Open is made at its first write: a
            // server that is not there shows here, and is said as a failed connect.
            Ok(Err(NetError::Tls { source, .. })) if tcp::never_connected(&source) => {
                return Err(Error::Net(NetError::Io {
                    what: "connecting to",
                    peer: server.into(),
                    source,
                }));
            }
            Ok(r) => r?,
        };
        let server_key = dmover_net::tls::server_fingerprint(&tls).unwrap_or_default();
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
            _ if self.as_server.is_some() => {
                Credential::Capability(self.as_server.as_ref().expect("checked").capability.clone())
            }
            (Some(key), _) => Credential::Key {
                public: key.public(),
                signature: key.sign(&auth::key_auth_message(&transcript)),
            },
            (None, Some(t)) => Credential::Token {
                proof: auth::client_token_proof(t, &transcript),
            },
            (None, None) => Credential::None,
        };
        Ok(Dialed::Up(Box::new(Connection {
            ch,
            master,
            transcript,
            token: token.filter(|_| matches!(credential, Credential::Token { .. })),
            hello: Hello {
                software: SOFTWARE.into(),
                nonce,
            },
            auth: Auth { user, credential },
            dials,
            server_key,
            key_known,
        })))
    }

    /// Copies between two servers, the data going from one to the other directly
    /// (docs/third-party.md): this client asks the server that will accept for a
    /// capability for the other, and the other to dial it and run the session,
    /// reporting progress here.
    pub async fn third_party(&self, c: &ThirdPartyCopy, run: Arc<Run>) -> Result<Report> {
        self.with_retries(&run, |r, resume| self.third_party_once(c, r, resume))
            .await
    }

    async fn third_party_once(
        &self,
        c: &ThirdPartyCopy,
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let (dialer, acceptor) = match c.mode {
            TpcMode::Push => (&c.source_server, &c.dest_server),
            TpcMode::Pull => (&c.dest_server, &c.source_server),
        };
        // Both servers' keys are pinned (or checked) before either is asked anything.
        let (d, a) = tokio::select! {
            r = async { tokio::try_join!(self.connect(dialer), self.connect(acceptor)) } => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let scope = match c.mode {
            TpcMode::Push => Scope::Push {
                dest: c.dest.clone(),
            },
            TpcMode::Pull => Scope::Pull {
                sources: c.sources.clone(),
            },
        };
        let dialer_key = d.server_key.clone();
        let acceptor_key = a.server_key.clone();
        let capability = self.grant_on(a, acceptor, scope, &dialer_key).await?;
        let paths = match c.mode {
            TpcMode::Push => c.sources.clone(),
            TpcMode::Pull => vec![c.dest.clone()],
        };
        let tp = ThirdParty {
            mode: c.mode,
            peer: acceptor.clone(),
            peer_key: acceptor_key,
            capability,
            paths,
        };
        self.steer_on(d, dialer, tp, run, resume).await
    }

    /// Copies between two servers through this client (`cp --via-client`, for servers
    /// that cannot reach each other): a pull from the source server and a push to the
    /// destination run at once, chunks passing through a bounded ring in memory
    /// ([`crate::relay`]); the destination checks the source's digests. A resumed
    /// attempt (`--resume`, a retry) sends only what the destination lacks: its answer
    /// to the push is the pull's resume answer to the source, and the source's plan
    /// goes back to it. `ring`: the bytes of chunks held for the destination (at least
    /// two chunks; see [`crate::relay::RELAY_BYTES`]).
    pub async fn relay(&self, c: &ThirdPartyCopy, ring: usize, run: Arc<Run>) -> Result<Report> {
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut r = self
            .with_retries(&run, |r, resume| {
                self.relay_once(c, ring, r, resume, received.clone())
            })
            .await?;
        if let Some(x) = r.relayed.as_mut() {
            x.bytes_received = received.load(Relaxed);
        }
        Ok(r)
    }

    async fn relay_once(
        &self,
        c: &ThirdPartyCopy,
        cap: usize,
        run: Arc<Run>,
        resume: bool,
        received: Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<Report> {
        use crate::relay::{RelaySink, RelaySource, Ring, Side};
        let inbound = run.side();
        let ring = Ring::new(cap);
        // Disk threads of each session's own: the push's reads wait for chunks the
        // pull's writes bring.
        let in_disk = Arc::new(DiskPool::new(2, "dmover-relay-in"));
        let out_disk = Arc::new(DiskPool::new(2, "dmover-relay-out"));
        // Whatever happens to this attempt, nothing waits on the ring after it (this
        // goes before the disk threads are joined).
        struct Release(Arc<Ring>);
        impl Drop for Release {
            fn drop(&mut self) {
                self.0.fail(Side::In, "the relay ended");
            }
        }
        let _release = Release(ring.clone());
        let (from, to) = (c.source_server.as_str(), c.dest_server.as_str());
        // Resumed on both sides or on neither (B's answer is the pull's). With
        // continue-on-error A marks the files it cannot read, and the markers go on to
        // B, which drops those files.
        let options = self.opts.session_options(resume);
        let timing = drive::timing(self.opts.heartbeat, self.opts.idle_timeout);
        let (tx, rx) = tokio::sync::oneshot::channel::<(Vec<Entry>, u32)>();
        let pulling = async {
            let mut conn = tokio::select! {
                r = self.connect(from) => r?,
                _ = run.cancelled() => return Err(Error::Aborted),
            };
            let open = self.open_request(
                self.pull_op(c.sources.clone(), false)?,
                self.opts.chunk_size,
            );
            let mut d = conn.dial(open, options);
            d.limits = self.limits(true);
            let m = SinkSession::dial(now(), from, timing, Limits::default(), d);
            let (checksum, r, name) = (self.opts.checksum, ring.clone(), from.to_string());
            let prepare: drive::Prepare<RelaySink> = Box::new(move |entries, chunk, _| {
                r.set_cap(cap.max(2 * chunk as usize));
                let sink = RelaySink::new(entries.clone(), chunk, checksum, r, &name)?;
                let _ = tx.send((entries, chunk));
                Ok(sink)
            });
            let (fixed, threads) = (self.opts.buffers, in_disk.threads());
            let buffers = Box::new(move |streams| {
                fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
            });
            let dials = std::mem::take(&mut conn.dials);
            let joins = self.dialing(from, conn.master, dials, JoinWait::Answer);
            let env = drive::Env {
                disk: in_disk.clone(),
                run: inbound.clone(),
                buffers,
                chunk_delay: self.opts.chunk_delay,
                zerocopy: None,
                limits: None,
                receive_budget: self
                    .opts
                    .socket
                    .budget(dmover_net::link::Direction::Receive),
                send_budget: self.opts.socket.budget(dmover_net::link::Direction::Send),
                tuned_start: session::TUNED_START,
                disk_room: None,
            };
            drive::sink(m, &mut conn.ch, joins, prepare, Some(options), env).await
        };
        let pulling = async {
            let r = pulling.await;
            received.fetch_add(inbound.progress.bytes.load(Relaxed), Relaxed);
            if let Err(e) = &r {
                ring.fail(Side::In, format!("the copy from {from} failed: {e}"));
            }
            r
        };
        let pushing = async {
            // The manifest and chunk size are A's (none: the pull failed first).
            let Ok((entries, chunk)) = rx.await else {
                return Ok(None);
            };
            let r = async {
                let source = RelaySource::new(&entries, chunk, ring.clone())?;
                let totals = Totals::of(&entries);
                run.progress.total.store(totals.bytes, Relaxed);
                run.progress
                    .total_files
                    .store(crate::engine::files_with_data(&entries), Relaxed);
                let mut conn = tokio::select! {
                    r = self.connect(to) => r?,
                    _ = run.cancelled() => return Err(Error::Aborted),
                };
                let open = self.open_request(
                    Op::Push {
                        dest: c.dest.clone(),
                    },
                    chunk,
                );
                let early = conn.early(resume, open.streams);
                let mut d = conn.dial(open, options);
                d.limits = self.limits(false);
                let mut m = Connection::push_machine(early, to, timing, d);
                m.push_manifest(&entries);
                m.end_manifest(totals, drive::chunk_set(source.chunks()));
                let (fixed, threads) = (self.opts.buffers, out_disk.threads());
                let buffers = Box::new(move |streams| {
                    fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
                });
                let dials = std::mem::take(&mut conn.dials);
                let joins = self.dialing(to, conn.master, dials, JoinWait::Pipelined);
                let env = drive::Env {
                    disk: out_disk.clone(),
                    run: run.clone(),
                    buffers,
                    chunk_delay: self.opts.chunk_delay,
                    zerocopy: None,
                    limits: None,
                    receive_budget: self
                        .opts
                        .socket
                        .budget(dmover_net::link::Direction::Receive),
                    send_budget: self.opts.socket.budget(dmover_net::link::Direction::Send),
                    tuned_start: session::TUNED_START,
                    disk_room: None,
                };
                let r = drive::source(m, &mut conn.ch, joins, source, env).await?;
                // B took every chunk it expected (none, maybe) without a resume
                // answer: a pull still waiting for one hears that nothing was held.
                ring.offer_none(&entries);
                Ok((r, entries))
            }
            .await;
            if let Err(e) = &r {
                ring.fail(Side::Out, format!("the copy to {to} failed: {e}"));
                // The pull stops at once, telling A why.
                inbound.fail(Error::refused(
                    ErrorCode::Aborted,
                    format!("the relay's copy to {to} failed"),
                ));
            }
            r.map(Some)
        };
        let (pulled, pushed) = tokio::join!(pulling, pushing);
        let (pulled, (sent, entries)) = match (pulled, pushed) {
            (Ok(p), Ok(Some(q))) => (p, q),
            (Err(e), Ok(None)) | (Err(e), Ok(Some(_))) => return Err(e),
            (Ok(_), Ok(None)) => {
                return Err(Error::protocol(
                    from,
                    "the session ended without a manifest",
                ));
            }
            (Ok(_), Err(e)) => return Err(e),
            (Err(a), Err(b)) => {
                return Err(if ring.failed_side() == Some(Side::In) {
                    a
                } else {
                    b
                });
            }
        };
        Ok(Report {
            summary: sent.summary,
            totals: Totals::of(&entries),
            streams: sent.info.streams,
            chunk_size: sent.info.chunk_size,
            chunk_sizes: sent.store.layout().chunk_sizes(),
            skipped: 0,
            held_bytes: crate::drive::SourceStore::held_bytes(&*sent.store),
            held_files: sent.store.held_files(),
            bytes_sent: 0,
            chunks_resent: sent.stats.chunks_resent + pulled.report.chunks_resent,
            streams_lost: sent.stats.streams_lost + pulled.report.streams_lost,
            attempts: 1,
            // A's account of the files it could not read.
            failed: pulled
                .report
                .failed
                .into_iter()
                .map(|f| failed_line(&entries, f))
                .collect(),
            pruned: None,
            delete_refused: None,
            relayed: Some(Relayed {
                bytes_received: 0,
                peak_buffered: ring.peak() as u64,
            }),
        })
    }

    /// The fingerprint of `server`'s key (checked against this client's trust).
    pub async fn server_key(&self, server: &str) -> Result<String> {
        Ok(self.connect(server).await?.server_key.clone())
    }

    /// Asks `acceptor` for a capability that lets the server with key `dialer_key`
    /// run the session `scope` there (the first half of [`Client::third_party`]).
    pub async fn request_capability(
        &self,
        acceptor: &str,
        scope: Scope,
        dialer_key: &str,
    ) -> Result<dmover_proto::capability::Capability> {
        let a = self.connect(acceptor).await?;
        self.grant_on(a, acceptor, scope, dialer_key).await
    }

    async fn grant_on(
        &self,
        a: Connection,
        acceptor: &str,
        scope: Scope,
        dialer_key: &str,
    ) -> Result<dmover_proto::capability::Capability> {
        let grant = Op::Grant(GrantRequest {
            scope,
            dialer: dialer_key.to_string(),
            addr: acceptor.to_string(),
        });
        let mut ach = a
            .request(
                acceptor,
                self.open_request(grant, 0),
                self.opts.session_options(false),
            )
            .await?;
        match ach.recv_timeout(HANDSHAKE_TIMEOUT, "capability").await? {
            Control::Capability(c) => Ok(c),
            other => Err(session::unexpected(acceptor, other, "Capability")),
        }
    }

    /// Asks `dialer` to run the third-party session `tp` and follows it to its end (the
    /// second half of [`Client::third_party`]).
    pub async fn steer(&self, dialer: &str, tp: ThirdParty, run: Arc<Run>) -> Result<Report> {
        let d = self.connect(dialer).await?;
        self.steer_on(d, dialer, tp, run, self.opts.resume).await
    }

    async fn steer_on(
        &self,
        d: Connection,
        dialer: &str,
        tp: ThirdParty,
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let open = self.open_request(Op::ThirdParty(tp), self.opts.chunk_size);
        let mut ch = d
            .request(dialer, open, self.opts.session_options(resume))
            .await?;
        let mut ping = tokio::time::interval(self.opts.heartbeat);
        let silence = self.opts.heartbeat * session::SILENT_INTERVALS;
        let p = &run.progress;
        loop {
            tokio::select! {
                _ = run.cancelled() => {
                    let _ = ch.send(&Control::Error(Error::Aborted.to_msg())).await;
                    return Err(Error::Aborted);
                }
                _ = ping.tick() => ch.send(&Control::Ping).await?,
                msg = ch.recv_timeout(silence, "progress") => match msg? {
                    Control::TpcProgress(t) => {
                        // Counters of the dialer's session; this client's own are these.
                        p.bytes.store(t.bytes, Relaxed);
                        p.total.store(t.total, Relaxed);
                        p.held.store(t.held, Relaxed);
                    }
                    Control::TpcDone(r) => {
                        p.bytes.store(p.bytes.load(Relaxed).max(r.summary.bytes), Relaxed);
                        return Ok(Report {
                            summary: r.summary,
                            totals: r.totals,
                            streams: r.streams,
                            chunk_size: r.chunk_size,
                            chunk_sizes: Vec::new(),
                            skipped: 0,
                            held_bytes: r.held_bytes,
                            held_files: r.held_files,
                            bytes_sent: 0,
                            chunks_resent: r.chunks_resent,
                            streams_lost: r.streams_lost,
                            attempts: 1,
                            failed: r.failed,
                            pruned: None,
                            delete_refused: None,
                            relayed: None,
                        });
                    }
                    other => return Err(session::unexpected(dialer, other, "TpcProgress")),
                },
            }
        }
    }

    /// The `Open` of a session for `op`.
    /// The owners and xattrs a push sends (feature `METADATA`), as far as the options
    /// let them travel; a server without the feature never gets them. Read here, on
    /// the task (one stat and one listxattr per entry: docs/sync.md).
    fn read_meta(&self, tree: &dmover_store::tree::Tree) -> Vec<dmover_proto::manifest::EntryMeta> {
        let p = self.opts.meta;
        if !(p.owner || p.xattrs.user || p.xattrs.acls || p.xattrs.all) {
            return Vec::new();
        }
        let mut meta = dmover_store::meta::read_tree(tree, p.xattrs);
        if !p.owner {
            livewalk::without_owners(&mut meta);
        }
        meta
    }

    fn open_request(&self, op: Op, chunk_size: u32) -> Open {
        Open {
            op,
            streams: self.opts.streams,
            chunk_size,
            checksum: self.opts.checksum,
            direct_io: self.opts.direct_io,
            protection: self.opts.protection,
            // A streamed manifest (and a live walk, and chunks per part) and early
            // data in a pull only where the caller offers them (a plain push or pull:
            // `push_once`, `pull_once`). A push's early data assume a `Session`
            // granting exactly the base features it offered; the negotiated bits it
            // offers (a live walk's, chunks per part) are for messages that wait for
            // `Session`.
            features: if self.opts.tune {
                dmover_proto::session::features::SUPPORTED
                    & !dmover_proto::session::features::STREAMED
                    & !dmover_proto::session::features::EARLY
                    & !dmover_proto::session::features::WALKING
                    & !dmover_proto::session::features::PART_CHUNKS
            } else {
                dmover_proto::session::features::SUPPORTED
                    & !dmover_proto::session::features::TUNING
                    & !dmover_proto::session::features::STREAMED
                    & !dmover_proto::session::features::EARLY
                    & !dmover_proto::session::features::WALKING
                    & !dmover_proto::session::features::PART_CHUNKS
            },
        }
    }

    /// The session's data streams, opened when the machine asks (see [`Dialing`]).
    fn dialing(&self, server: &str, master: [u8; 32], dials: Dials, wait: JoinWait) -> Dialing {
        Dialing {
            dialer: self.dialer(server),
            mode: self.link_mode(),
            wait,
            master,
            key: None,
            asked: Vec::new(),
            early: dials,
            pacer: self.opts.bwlimit.map(Pacer::new),
            set: tokio::task::JoinSet::new(),
        }
    }

    /// A memory test's session with `server`, set up to be driven: connected, the
    /// first flight for `op` ready, the data streams to be joined when asked.
    pub(crate) async fn memtest_session(
        &self,
        server: &str,
        op: Op,
        chunk: u32,
        run: &Arc<Run>,
    ) -> Result<Prepared> {
        let mut conn = tokio::select! {
            r = self.connect(server) => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let options = self.opts.session_options(false);
        // A mount reads each path by its own layout slot: no hard links (each path of
        // an inode comes as a file of its own).
        let mut open = self.open_request(op, chunk);
        open.features &= !dmover_proto::session::features::LINKS;
        let dial = conn.dial(open, options);
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let buffers = Box::new(move |streams| {
            fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
        });
        let dials = std::mem::take(&mut conn.dials);
        Ok(Prepared {
            joins: self.dialing(server, conn.master, dials, JoinWait::Answer),
            ch: conn.ch,
            dial,
            options,
            timing: drive::timing(self.opts.heartbeat, self.opts.idle_timeout),
            env: self.env(run, buffers),
        })
    }

    /// A push's source options, from this client's.
    fn source_options(&self) -> SourceOptions {
        SourceOptions {
            checksum: self.opts.checksum,
            direct_io: self.opts.direct_io,
            continue_on_error: self.opts.continue_on_error,
        }
    }

    /// This client's limits for a session (feature LIMITS): its bandwidth limit, and
    /// when it pulls (the server sends), the congestion control it asks the server to
    /// send with (`--congestion`).
    pub(crate) fn limits(&self, pulling: bool) -> dmover_proto::control::SessionLimits {
        dmover_proto::control::SessionLimits {
            bwlimit: self.opts.bwlimit.unwrap_or(0),
            congestion: match &self.opts.socket.congestion {
                Some(c) if pulling => c.clone(),
                _ => String::new(),
            },
            refused: String::new(),
        }
    }

    /// What a driver needs of this client for a session.
    fn env(&self, run: &Arc<Run>, buffers: Box<dyn Fn(u16) -> usize + Send>) -> drive::Env {
        drive::Env {
            disk: self.disk.clone(),
            run: run.clone(),
            buffers,
            chunk_delay: self.opts.chunk_delay,
            zerocopy: None,
            limits: None,
            receive_budget: self
                .opts
                .socket
                .budget(dmover_net::link::Direction::Receive),
            send_budget: self.opts.socket.budget(dmover_net::link::Direction::Send),
            tuned_start: session::TUNED_START,
            // The buffers grow with the threads unless the user pinned them.
            disk_room: self
                .opts
                .buffers
                .is_none()
                .then(|| Box::new(|n| n) as drive::DiskRoom),
        }
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
        // Refusals after authentication by a server that cannot take the session yet:
        // since when, and the last wait.
        let mut not_yet: Option<tokio::time::Instant> = None;
        let mut backoff = Duration::ZERO;
        loop {
            run.progress.attempt.store(attempt, Relaxed);
            match once(run.attempt(), resume).await {
                Ok(mut r) => {
                    r.attempts = attempt;
                    r.bytes_sent = run.progress.bytes.load(Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    // The user interrupted: that is the error, and no retry.
                    if let Some(top) = run.take_error() {
                        return Err(top);
                    }
                    // The server cannot take the session yet (its user's session
                    // limit, its memory budget): come back, as for a busy answer before
                    // TLS, within --busy-wait and whatever --retries says.
                    if e.server_busy() && !run.is_cancelled() {
                        let since = *not_yet.get_or_insert_with(tokio::time::Instant::now);
                        let spent = since.elapsed();
                        if spent < self.opts.busy_wait {
                            backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BUSY_BACKOFF);
                            let wait = backoff
                                .mul_f64(1.0 + rand::random::<f64>() / 2.0)
                                .min(self.opts.busy_wait - spent);
                            tracing::warn!(
                                "{e}; trying again in {:.1} s (for at most --busy-wait {:.0}s)",
                                wait.as_secs_f64(),
                                self.opts.busy_wait.as_secs_f64()
                            );
                            tokio::select! {
                                _ = run.cancelled() => return Err(run.take_error().unwrap_or(e)),
                                _ = tokio::time::sleep(wait) => {}
                            }
                            continue;
                        }
                    }
                    if attempt > self.opts.retries || !e.retryable() || run.is_cancelled() {
                        return Err(e);
                    }
                    tracing::warn!(
                        "attempt {attempt} failed: {e}; resuming in {:.1} s ({} retries left)",
                        self.opts.retry_wait.as_secs_f64(),
                        self.opts.retries + 1 - attempt
                    );
                    run.progress.event(crate::engine::ProgressEvent::Retry {
                        attempt,
                        error: e.to_string(),
                        wait: self.opts.retry_wait,
                    });
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
        let roots: Vec<Root> = sources
            .iter()
            .map(|p| (Base::Local, p.clone(), Vec::new()))
            .collect();
        self.push_roots(&roots, server, dest, run).await
    }

    /// [`Client::push`] of `roots`: each a base, a path under it and the name the
    /// root gets when the path names the base itself (see [`paths::source_root`]).
    pub(crate) async fn push_roots(
        &self,
        roots: &[Root],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        self.with_retries(&run, |r, resume| {
            self.push_once(roots, server, dest, r, resume)
        })
        .await
    }

    /// A push whose manifest grows while the session runs (`sync --watch`): the
    /// local directory `src` becomes `dest` on `server` (as `dmover sync`: `dest` is
    /// the mirror itself). The first part of the manifest is the root directory
    /// alone; [`Growing::send`] adds paths below it as they are ready, and each
    /// part's files are complete under their final names at the server once it says
    /// so. One connection, one set of data streams, kept warm between parts. Not
    /// resumed (a caller catches up with an ordinary sync first); owners and extended
    /// attributes travel with each part as the options say, hard links and holes do
    /// not (docs/sync.md).
    pub async fn push_growing(
        &self,
        src: &[u8],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Growing> {
        let mut root = paths::source_root(&Base::Local, src, &[])?;
        let (parent, name) = mirror_dest(dest, false)?;
        root.name = name;
        // The first part: the root alone (an empty `--files-from` list rules every
        // name below it out by name, without a stat).
        let mut filter = dmover_store::filter::Filter::none();
        filter
            .set_files_from(b"")
            .map_err(|e| Error::refused(ErrorCode::Unsupported, e))?;
        let walked = self
            .disk
            .run(move || walk::walk_filtered(vec![root], &filter))
            .await
            .ok_or(Error::Aborted)??;
        let tree = walked.tree;
        if tree.entries().first().map(|e| &e.kind) != Some(&EntryKind::Dir) {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!("{} is not a directory", String::from_utf8_lossy(src)),
            ));
        }
        let root_dir = tree.dir(0).map_err(|e| {
            Error::Store(dmover_store::Error::io(
                "opening",
                String::from_utf8_lossy(src),
                e,
            ))
        })?;
        let first = tree.entries().to_vec();
        let chunk = match self.opts.chunk_size {
            0 => dmover_proto::layout::DEFAULT_CHUNK,
            c => c,
        };
        let mut source = FileSource::new(tree, chunk, self.source_options())?;
        source.set_grown_meta(self.opts.meta.xattrs, self.opts.meta.owner);
        let mut conn = tokio::select! {
            r = self.connect(server) => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let mut open = self.open_request(Op::Push { dest: parent }, chunk);
        // Parts carry plain files (no links, no sparse list).
        open.features &= !dmover_proto::session::features::LINKS;
        let mut d = conn.dial(open, self.opts.session_options(false));
        d.limits = self.limits(false);
        let timing = drive::timing(self.opts.heartbeat, self.opts.idle_timeout);
        let m = SourceSession::dial(now(), server, timing, d);
        let (tx, rx) = mpsc::unbounded_channel();
        let totals = Totals::of(&first);
        let _ = tx.send(GrowPart {
            entries: first,
            totals,
            chunks: 0,
            last: false,
            durable: None,
            times: Vec::new(),
            meta: Vec::new(),
            sent: false,
            sparse: Vec::new(),
        });
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let buffers = Box::new(move |streams| {
            fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
        });
        let dials = std::mem::take(&mut conn.dials);
        let joins = self.dialing(server, conn.master, dials, JoinWait::Pipelined);
        let env = self.env(&run, buffers);
        let task = tokio::spawn(async move {
            let r = drive::source_growing(m, &mut conn.ch, joins, source, env, Some(rx)).await?;
            let failed = r.store.failed();
            let tree = r.store.tree();
            Ok(Report {
                summary: r.summary,
                totals: Totals::of(tree.entries()),
                streams: r.info.streams,
                chunk_size: r.info.chunk_size,
                chunk_sizes: r.store.layout().chunk_sizes(),
                skipped: 0,
                held_bytes: 0,
                held_files: 0,
                bytes_sent: run.progress.bytes.load(Relaxed),
                chunks_resent: r.stats.chunks_resent,
                streams_lost: r.stats.streams_lost,
                attempts: 1,
                failed: failed
                    .into_iter()
                    .map(|f| failed_line(tree.entries(), f))
                    .collect(),
                pruned: None,
                delete_refused: None,
                relayed: None,
            })
        });
        Ok(Growing {
            grower: walk::Grower::new(root_dir),
            totals,
            tx,
            task,
        })
    }

    /// Copies `sources` on `server` into the local `dest`.
    pub async fn pull(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        self.pull_into(server, sources, &Base::Local, dest, run)
            .await
    }

    /// [`Client::pull`] into `dest` under `base`.
    pub(crate) async fn pull_into(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        base: &Base,
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        // A `--files-from` list too large for the request fails before any connection.
        self.pull_op(sources.to_vec(), false)?;
        // `sync --checksum`: the files the mirror already holds with the source's
        // content, found before the session (the quick check cannot tell them).
        let compare = self.opts.mirror && self.opts.compare_content;
        let mut same = None;
        let (mut same_files, mut same_bytes) = (0, 0);
        if compare {
            let [source] = sources else {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    "sync --checksum takes one source",
                ));
            };
            let found = tokio::select! {
                r = self.same_remote_content(server, source, base, dest) => r?,
                _ = run.cancelled() => return Err(Error::Aborted),
            };
            (same_files, same_bytes) = (found.files, found.bytes);
            same = Some(Arc::new(found.paths));
        }
        let report = self
            .with_retries(&run, |r, resume| {
                self.pull_once(server, sources, (base, dest), r, resume, same.clone())
            })
            .await
            .map_err(|e| self.pull_error(e))?;
        if compare {
            tracing::info!("{same_files} files ({same_bytes} bytes) hold the same content here");
        }
        // The sink counts them among the files it held (`files_unchanged`).
        Ok(report)
    }

    /// `sync --checksum` on a pull: the files of the local mirror `dest` (under `base`)
    /// whose content is the server's `source`'s. The mirror's manifest goes to the
    /// server ([`Op::Digests`]), which digests its files of the same sizes; this side
    /// digests its own of those and keeps the paths whose digests match.
    async fn same_remote_content(
        &self,
        server: &str,
        source: &[u8],
        base: &Base,
        dest: &[u8],
    ) -> Result<SameContent> {
        let (parent, name) = mirror_dest(dest, matches!(base, Base::Local))?;
        let (base, filter) = (base.clone(), self.opts.filter.clone().unwrap_or_default());
        let walked = self
            .disk
            .run(move || {
                let walked = paths::source_root(&base, &[parent, name].concat(), b"")
                    .and_then(|root| walk::walk_filtered(vec![root], &filter));
                match walked {
                    Ok(w) => Ok(Some(w)),
                    // No mirror yet: nothing to compare.
                    Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await
            .ok_or(Error::Aborted)??;
        let Some(walked) = walked else {
            return Ok(SameContent::default());
        };
        let entries = walked.tree.entries().to_vec();
        let conn = self.connect(server).await?;
        let open = self.open_request(
            Op::Digests(control::Digests {
                source: source.to_vec(),
            }),
            0,
        );
        let report = conn
            .prune(server, open, self.opts.session_options(false), &entries)
            .await?;
        let digests = report.digests;
        let (tree, same) = self
            .disk
            .run(move || same_content(walked.tree, &digests))
            .await
            .ok_or(Error::Aborted)?;
        let mut out = SameContent::default();
        for i in same {
            out.files += 1;
            out.bytes += tree.entries()[i as usize].file_size();
            out.paths.insert(tree.rel_path(i));
        }
        Ok(out)
    }

    /// The op of a pull of `sources`: with filters, [`Op::PullFiltered`] (the server
    /// walks through them; a server older than it refuses the op), with a
    /// `--files-from` list [`Op::PullListed`] (likewise).
    /// `report_skipped`: the server reports what its walk skipped (`sync --delete`).
    /// A list whose `Open` would not fit in a control frame is refused here, before
    /// any connection.
    pub(crate) fn pull_op(&self, sources: Vec<Vec<u8>>, report_skipped: bool) -> Result<Op> {
        if let Some(list) = &self.opts.files_from {
            let op = Op::PullListed(control::PullListed {
                sources,
                rules: self.opts.rules.clone(),
                report_skipped,
                list: list.clone(),
            });
            // The largest `Open` of this op (a chunk size of 5 varint bytes): the
            // encoder refuses a frame over the limit.
            let mut frame = Vec::new();
            if let Err(e) =
                Control::Open(self.open_request(op.clone(), u32::MAX)).encode(&mut frame)
            {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "--files-from list of {} bytes is too large for a pull (the request, \
                         list and source paths together, must fit in {} bytes: {e})",
                        list.len(),
                        control::MAX_FRAME
                    ),
                ));
            }
            Ok(op)
        } else if self.opts.rules.is_empty() && !report_skipped {
            Ok(Op::Pull { sources })
        } else {
            Ok(Op::PullFiltered(control::PullFiltered {
                sources,
                rules: self.opts.rules.clone(),
                report_skipped,
            }))
        }
    }

    /// A pull's failure `e`, explained when the server may be older than
    /// [`Op::PullListed`]: such a server cannot decode the request (or finds it too
    /// large before authentication). Servers of this protocol version end the
    /// connection then (handled in `pull_once`); one that answers says
    /// `Error{Protocol}`.
    pub(crate) fn pull_error(&self, e: Error) -> Error {
        match e {
            Error::Remote {
                peer,
                code: ErrorCode::Protocol,
                message,
            } if self.opts.files_from.is_some() && !message.contains("--files-from") => {
                Error::Remote {
                    peer,
                    code: ErrorCode::Protocol,
                    message: format!(
                        "{message} (--files-from on a pull needs a server that knows it: \
                         an older dmover server must be upgraded)"
                    ),
                }
            }
            e => e,
        }
    }

    /// [`Op::Prune`] `req` on `server` against `entries`.
    async fn prune_remote(
        &self,
        server: &str,
        entries: &[Entry],
        req: Prune,
    ) -> Result<PruneReport> {
        let conn = self.connect(server).await?;
        let open = self.open_request(Op::Prune(req), 0);
        conn.prune(server, open, self.opts.session_options(false), entries)
            .await
    }

    /// Deletes the entry `name` (a file, or a directory with what it holds) directly in
    /// the directory `dir` on `server`, and nothing else, with [`Op::Prune`]: the
    /// mirror is `dir`, the manifest its root alone, the filters include `/name` (and
    /// what is below it) and exclude everything else, and at most `max_delete`
    /// entries go. `dry_run`: only checks that the server would let this client delete
    /// there (a writable export, write rights). `dir` may be an export's root (the
    /// server prunes one only for rules that name entries, as these do). After a
    /// deletion the server gives `dir` the mtime `dir_mtime` (as a sync's mirror gets
    /// its source's): pass the one it had. For `dmover tune`'s test files.
    pub async fn remove_remote(
        &self,
        server: &str,
        dir: &[u8],
        name: &[u8],
        dir_mtime: dmover_proto::manifest::Mtime,
        max_delete: u64,
        dry_run: bool,
    ) -> Result<PruneReport> {
        // The name goes into filter rules: no path; what a pattern would read as a
        // wildcard or an escape is escaped.
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!(
                    "{:?}: not a plain name to remove",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        let mut anchored = b"/".to_vec();
        for &b in name {
            if b"*?[]\\".contains(&b) {
                anchored.push(b'\\');
            }
            anchored.push(b);
        }
        let mut below = anchored.clone();
        below.extend_from_slice(b"/***");
        let req = Prune {
            dest: dir.to_vec(),
            // `/name/***` matches `name` only as a directory.
            rules: vec![
                control::FilterRule {
                    include: true,
                    pattern: anchored,
                },
                control::FilterRule {
                    include: true,
                    pattern: below,
                },
                control::FilterRule {
                    include: false,
                    pattern: b"*".to_vec(),
                },
            ],
            max_delete,
            dry_run,
            conflicts_only: false,
            checksum: false,
        };
        let root = Entry {
            parent: NO_PARENT,
            name: b"dir".to_vec(),
            kind: dmover_proto::manifest::EntryKind::Dir,
            mode: 0o755,
            mtime: dir_mtime,
        };
        self.prune_remote(server, &[root], req).await
    }

    /// Deletes `name` (a file, or a directory and everything below it) in the directory `dir` on
    /// `server`: an [`Op::Prune`] of `dir` against a manifest of `dir` alone, whose
    /// filters protect everything but `name`. A dry run goes first and must list
    /// nothing outside `name`, else nothing is deleted. `dir` cannot be an export's
    /// root (the server refuses a prune there). `dir` gets `mtime` when something was
    /// deleted (a prune gives a directory it changed the manifest's mtime: pass the one
    /// `dir` had before, see [`Client::dir_mtime`]). Returns the entries deleted; with
    /// nothing to delete it only checks that the server would allow it.
    /// (`dmover bench remote` removes its test files with it.)
    pub async fn remove_in(
        &self,
        server: &str,
        dir: &[u8],
        name: &[u8],
        mtime: dmover_proto::manifest::Mtime,
    ) -> Result<u64> {
        let dry = self
            .remove_remote(server, dir, name, mtime, u64::MAX, true)
            .await?;
        let inside =
            |p: &[u8]| p.starts_with(name) && matches!(p.get(name.len()), None | Some(b'/'));
        if let Some(p) = dry.paths.iter().find(|p| !inside(p)) {
            return Err(Error::protocol(
                server,
                format!(
                    "removing {:?} would also delete {:?}: nothing deleted",
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(p)
                ),
            ));
        }
        if dry.deleted == 0 {
            return Ok(0);
        }
        let done = self
            .remove_remote(server, dir, name, mtime, dry.deleted, false)
            .await?;
        Ok(done.deleted)
    }

    /// Renames the entry `from` to `to` on `server` ([`Op::Rename`]): rename(2) there,
    /// both paths in one export and confined beneath it, with the user's write rights;
    /// an existing `to` is replaced atomically (a directory only if it is empty). For
    /// `dmover mount --rw` (docs/remote.md).
    pub async fn rename_remote(&self, server: &str, from: &[u8], to: &[u8]) -> Result<()> {
        let conn = self.connect(server).await?;
        let open = self.open_request(
            Op::Rename(control::Rename {
                from: from.to_vec(),
                to: to.to_vec(),
            }),
            0,
        );
        conn.rename(server, open, self.opts.session_options(false))
            .await
    }

    /// Removes the one entry `path` on `server` as unlink(2) (`dir` false: a file or a
    /// symlink) or rmdir(2) (`dir`: an empty directory) would, with
    /// [`Client::remove_remote`] in its parent: a dry run must list exactly that entry,
    /// else nothing is deleted (missing: [`ErrorCode::NotFound`]; EISDIR, ENOTDIR or
    /// ENOTEMPTY as an I/O error), then the prune deletes at most that one entry. The
    /// parent gets the current time as its mtime, as unlink gives it. The parent may be
    /// an export's root; a pattern's characters in the name (`*?[]\`) are escaped.
    /// For `dmover mount --rw` (docs/remote.md).
    pub async fn remove_entry(&self, server: &str, path: &[u8], dir: bool) -> Result<()> {
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mtime = dmover_proto::manifest::Mtime {
            sec: now.as_secs() as i64,
            nsec: now.subsec_nanos(),
        };
        let dry = self
            .remove_remote(server, parent, name, mtime, u64::MAX, true)
            .await?;
        let mut as_dir = name.to_vec();
        as_dir.push(b'/');
        let shown = String::from_utf8_lossy(path).into_owned();
        let refuse = |errno: i32| {
            Error::io(
                "removing",
                shown.clone(),
                std::io::Error::from_raw_os_error(errno),
            )
        };
        match (dry.paths.as_slice(), dir) {
            ([], _) => {
                return Err(Error::refused(
                    ErrorCode::NotFound,
                    format!("{shown}: no such file or directory"),
                ));
            }
            ([p], false) if p == name => {}
            ([p], true) if *p == as_dir => {}
            (_, false) => return Err(refuse(libc::EISDIR)),
            ([p], true) if p == name => return Err(refuse(libc::ENOTDIR)),
            (_, true) => return Err(refuse(libc::ENOTEMPTY)),
        }
        self.remove_remote(server, parent, name, mtime, 1, false)
            .await?;
        Ok(())
    }

    /// The modification time of the directory `dir` on `server` (its manifest without
    /// its contents: a pull whose filters exclude everything below it), or an error if
    /// it is not a directory.
    pub async fn dir_mtime(
        &self,
        server: &str,
        dir: &[u8],
    ) -> Result<dmover_proto::manifest::Mtime> {
        let mut opts = self.opts.clone();
        opts.rules = vec![control::FilterRule {
            include: false,
            pattern: b"*".to_vec(),
        }];
        let c = Client::new(opts, 1);
        let r = crate::remote::Remote::open(&c, server, dir).await?;
        let root = r.roots().first().and_then(|&i| r.stat(i)).cloned();
        let _ = r.close().await;
        match root {
            Some(e) if e.kind == dmover_proto::manifest::EntryKind::Dir => Ok(e.mtime),
            _ => Err(Error::refused(
                control::ErrorCode::Unsupported,
                format!("{}: not a directory", String::from_utf8_lossy(dir)),
            )),
        }
    }

    /// A [`Prune`] request of the mirror `dest` with this client's filters.
    fn prune_request(&self, dest: &[u8], max_delete: Option<u64>) -> Prune {
        Prune {
            dest: dest.to_vec(),
            rules: self.opts.rules.clone(),
            max_delete: max_delete.unwrap_or(u64::MAX),
            dry_run: false,
            conflicts_only: false,
            checksum: false,
        }
    }

    /// `dmover sync --dry-run`: the source's manifest, and what the destination holds
    /// unchanged and (with `--delete`) would delete; nothing is changed on either side.
    /// `push`: the local `source` to the mirror `dest` on `server`; else the server's
    /// `source` to the local `dest`.
    pub async fn sync_dry_run(
        &self,
        push: bool,
        server: &str,
        source: &[u8],
        dest: &[u8],
    ) -> Result<DryRun> {
        let conflicts_only = !self.opts.delete;
        if push {
            let (_, name) = mirror_dest(dest, false)?;
            let mut root = paths::source_root(&Base::Local, source, b"")?;
            root.name = name;
            let filter = self.opts.filter.clone().unwrap_or_default();
            let walked = self
                .disk
                .run(move || walk::walk_filtered(vec![root], &filter))
                .await
                .ok_or(Error::Aborted)??;
            let entries = walked.tree.entries().to_vec();
            let compare = self.opts.compare_content;
            let req = Prune {
                dry_run: true,
                conflicts_only,
                checksum: compare,
                ..self.prune_request(dest, self.opts.max_delete)
            };
            let mut report = self.prune_remote(server, &entries, req).await?;
            if compare {
                // `--checksum`: unchanged means the same content, whatever the mtime.
                let digests = std::mem::take(&mut report.digests);
                let tree = walked.tree;
                let (_, same) = self
                    .disk
                    .run(move || same_content(tree, &digests))
                    .await
                    .ok_or(Error::Aborted)?;
                let mut pruned = dmover_store::prune::Pruned {
                    unchanged: same.into_iter().collect(),
                    ..Default::default()
                };
                pruned.unchanged.sort_unstable();
                report.unchanged = session::prune_report(pruned).unchanged;
            }
            return Ok(DryRun {
                entries,
                report,
                skipped: walked.skipped,
            });
        }
        let remote = crate::remote::Remote::open(self, server, source)
            .await
            .map_err(|e| self.pull_error(e))?;
        let entries = remote.entries().to_vec();
        remote.close().await?;
        // `--checksum`: unchanged means the same content, whatever the mtime.
        let same = match self.opts.compare_content {
            true => Some(
                self.same_remote_content(server, source, &Base::Local, dest)
                    .await?,
            ),
            false => None,
        };
        let opts = dmover_store::prune::PruneOptions {
            filter: self.opts.filter.as_deref().cloned().unwrap_or_default(),
            max_delete: self.opts.max_delete,
            dry_run: true,
            conflicts_only,
            checksum: false,
        };
        let dest = dest.to_vec();
        let (e2, o2) = (entries.clone(), opts);
        let pruned = self
            .disk
            .run(move || {
                let Some((parent, name)) = paths::dest_parent(&Base::Local, &dest)? else {
                    return Ok(dmover_store::prune::Pruned::default());
                };
                dmover_store::prune::prune(&parent, &name, &e2, &o2)
            })
            .await
            .ok_or(Error::Aborted)??;
        let mut pruned = pruned;
        if let Some(same) = same {
            pruned.unchanged = (0..entries.len() as u32)
                .filter(|&i| {
                    entries[i as usize].file_size() > 0
                        && same
                            .paths
                            .contains(&dmover_proto::manifest::rel_path(&entries, i))
                })
                .collect();
        }
        Ok(DryRun {
            entries,
            report: session::prune_report(pruned),
            skipped: 0,
        })
    }

    async fn push_once(
        &self,
        roots: &[Root],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let mut roots = roots
            .iter()
            .map(|(base, p, name)| paths::source_root(base, p, name))
            .collect::<dmover_store::Result<Vec<_>>>()?;
        let mirror_path = dest;
        let mut dest = dest;
        let mirror;
        if self.opts.mirror {
            // `dmover sync`: the source becomes `dest` itself, in `dest`'s parent.
            let (parent, name) = mirror_dest(dest, false)?;
            if let [root] = roots.as_mut_slice() {
                root.name = name;
            }
            mirror = parent;
            dest = &mirror;
        }
        let filter = self.opts.filter.clone().unwrap_or_default();
        let delete = self.opts.mirror && self.opts.delete;
        let compare = self.opts.mirror && self.opts.compare_content;
        // The connection (TCP, TLS, the data connections dialed ahead) is set up while
        // the tree is walked: on a long link that is two round trips off every push, and
        // off a re-run that sends nothing even more in proportion. Not with `--delete`
        // or `--checksum`, whose prune request comes between the walk and the session.
        // Whether the files have extended attributes is asked by the walk's threads,
        // beside their `stat`, when the metadata read after the walk would ask it.
        //
        // A fresh push's walk runs live (feature WALKING, docs/protocol.md "Live walk"):
        // a large tree's manifest goes in parts as the walk finds them, the data from
        // the first part on, instead of after the whole walk. Not on a resume, a sync
        // or with `--checksum`, where the server answers for what it holds of the
        // first part only.
        let live = !(delete || compare || resume || self.opts.mirror);
        let x = self.opts.meta.xattrs;
        let ask = x.user || x.acls || x.all;
        // A live walk's first part: its later parts' channel, every entry walked when
        // it was cut (for the choices that depend on the files' sizes) and its
        // entries' metadata, read by the walk.
        let mut walk_rest: Option<(mpsc::UnboundedReceiver<livewalk::Walk>, Vec<Entry>)> = None;
        let mut walked_meta = None;
        let (walked, mut early) = if live {
            let scope = (self.opts.meta.owner || ask).then_some(x);
            let mut rx = livewalk::start(move || Ok(roots), (*filter).clone(), scope)?;
            let starting = async move {
                match rx.recv().await {
                    Some(livewalk::Walk::Start(s)) => Some(Ok((s, rx))),
                    Some(livewalk::Walk::Failed(e)) => Some(Err(e)),
                    Some(livewalk::Walk::Part(_)) | None => None,
                }
            };
            let (started, early) = self.walk_connected(starting, server, &run).await?;
            let walked = started.map(|r| {
                r.map(|(s, rx)| match s {
                    walk::Start::Whole(w, meta) => {
                        walked_meta = Some(meta);
                        w
                    }
                    walk::Start::First(w, meta, so_far) => {
                        walked_meta = Some(meta);
                        walk_rest = Some((rx, so_far));
                        w
                    }
                })
            });
            (walked, early)
        } else {
            let walking = self.disk.run(move || walk::walk_with(roots, &filter, ask));
            if delete || compare {
                (walking.await, None)
            } else {
                self.walk_connected(walking, server, &run).await?
            }
        };
        let walked = walked.ok_or(Error::Aborted)??;
        if walked.filtered > 0 {
            tracing::info!("the filters left out {} entries", walked.filtered);
        }
        let skipped = walked.skipped;
        let mut tree = walked.tree;
        let full_totals = Totals::of(tree.entries());
        // `--delete`: entries of another kind where the source's go (a directory where
        // a file comes, or the reverse) must go first; the rest once all is in place.
        // `--checksum`: the destination's digests of its files of the right size.
        let mut pruned = None;
        let mut full = None;
        let (mut same_files, mut same_bytes) = (0u64, 0u64);
        if delete || compare {
            let req = Prune {
                dry_run: !delete,
                conflicts_only: true,
                checksum: compare,
                ..self.prune_request(mirror_path, self.opts.max_delete)
            };
            let mut r = self.prune_remote(server, tree.entries(), req).await?;
            let digests = std::mem::take(&mut r.digests);
            if delete {
                pruned = Some(r);
                full = Some(tree.entries().to_vec());
            }
            if !digests.is_empty() {
                let (t, same) = self
                    .disk
                    .run(move || same_content(tree, &digests))
                    .await
                    .ok_or(Error::Aborted)?;
                tree = t;
                for &i in &same {
                    same_files += 1;
                    same_bytes += tree.entries()[i as usize].file_size();
                }
                if !same.is_empty() {
                    tracing::info!("{same_files} files hold the same content at the destination");
                    tree = tree.without(&same);
                }
            }
        }
        // The round trip is the connection's made during the walk, when there is one.
        let rtt = early.as_ref().and_then(|(c, _)| c.rtt());
        // What the choices that depend on the files' sizes see: the whole walk, or
        // what a live walk had walked when it cut its first part.
        let sized = walk_rest
            .as_ref()
            .map_or(tree.entries(), |(_, e)| e.as_slice());
        let chunk = match self.opts.chunk_size {
            0 => session::auto_chunk_on(sized, walk_rest.is_none()),
            c => c,
        };
        let tuned_start = session::tuned_start(sized, rtt);
        if let Some((_, so_far)) = &walk_rest {
            tracing::debug!(
                "the walk goes on: its first part of {} entries goes with {} walked",
                tree.entries().len(),
                so_far.len()
            );
        }
        let totals = Totals::of(tree.entries());
        run.progress.total.store(totals.bytes, Relaxed);
        let files = crate::engine::files_with_data(tree.entries());
        run.progress.total_files.store(files, Relaxed);
        run.progress.set_manifest(tree.entries());
        let deep = session::mostly_aligned(sized);
        // Before connecting, as the walk: no connection idles while it is read (a
        // live walk read it with the entries).
        let meta = match walked_meta {
            Some(mut meta) => {
                if !self.opts.meta.owner {
                    livewalk::without_owners(&mut meta);
                }
                meta
            }
            None => self.read_meta(&tree),
        };
        // A large tree's manifest in parts (feature STREAMED), the first in the first
        // flight and the data from it on, where nothing at the server depends on the
        // whole: not on a resume or a sync (the files it holds are answered for the
        // first part only), nor with `--checksum`.
        let streamed = if resume || compare || self.opts.mirror || walk_rest.is_some() {
            None
        } else {
            session::manifest_parts(tree.entries().len())
                .and_then(|ends| tree.split_off(ends[0]).map(|rest| (rest, ends)))
        };
        let source = FileSource::new(tree, chunk, self.source_options())?;
        // A busy server may keep us waiting: an interrupt ends the wait.
        let mut conn = match early.take() {
            // Made while the walk ran, and not waiting too long since.
            Some((c, at)) if at.elapsed() < EARLY_CONNECTION_FRESH => c,
            _ => tokio::select! {
                r = self.connect(server) => r?,
                _ = run.cancelled() => return Err(Error::Aborted),
            },
        };
        // The options and the whole manifest follow the first flight at once: the
        // server reads them once it has opened the session (with the chunk size we
        // asked for; a server never changes a push's).
        let mut open = self.open_request(
            Op::Push {
                dest: dest.to_vec(),
            },
            chunk,
        );
        if streamed.is_some() {
            open.features |= dmover_proto::session::features::STREAMED;
        }
        if walk_rest.is_some() {
            // Its later parts may hold hard links and holes, if `Session` grants it.
            open.features |= dmover_proto::session::features::STREAMED
                | dmover_proto::session::features::WALKING;
        }
        if (streamed.is_some() || walk_rest.is_some()) && self.opts.chunk_size == 0 {
            // Later parts in chunks of their own size, if `Session` grants it (not
            // when `--chunk` pinned the size).
            open.features |= dmover_proto::session::features::PART_CHUNKS;
        }
        // `--checksum`: the manifest holds only files whose content differs (or that
        // the destination lacks), and the quick check (same size and mtime: held)
        // must not skip them, so the session does not resume (a retry sends the
        // reduced manifest again whole).
        let resume = resume && !compare;
        let open_features = open.features;
        let early = conn.early(resume, open.streams);
        let mut d = conn.dial(open, self.opts.session_options(resume));
        d.limits = self.limits(false);
        let timing = drive::timing(self.opts.heartbeat, self.opts.idle_timeout);
        let mut m = Connection::push_machine(early, server, timing, d);
        // The whole manifest, or a streamed one's first part.
        m.push_manifest(source.tree().entries());
        let mut growth = None;
        let mut walk_ended = None;
        match streamed {
            None if walk_rest.is_some() => {
                // A live walk: its first part in the first flight, the others as the
                // walk finds them (their `Grow` once `Session` came).
                let (rest, _) = walk_rest.take().expect("checked");
                let (tell, ended) = tokio::sync::oneshot::channel();
                walk_ended = Some(ended);
                let onward = livewalk::Onward {
                    walk: rest,
                    run: run.clone(),
                    peer: server.to_string(),
                    owners: self.opts.meta.owner,
                    ended: Some(tell),
                };
                let rx = livewalk::parts(&source, meta, true, onward);
                growth = Some(rx);
            }
            None => {
                if open_features & dmover_proto::session::features::LINKS != 0 {
                    m.sparse_files(source.tree().sparse());
                }
                m.push_meta(meta);
                m.end_manifest(totals, drive::chunk_set(source.chunks()));
            }
            Some((rest, ends)) => {
                let first = source.tree().entries().to_vec();
                let mut parts =
                    drive::streamed_parts(first, source.layout().n_chunks(), rest, &ends, meta);
                // Its entries are in the first flight, and its `Grow` behind them
                // (the server takes parts: STREAMED is offered, and granted).
                parts[0].sent = true;
                let (tx, rx) = mpsc::unbounded_channel();
                for p in parts {
                    let _ = tx.send(p);
                }
                growth = Some(rx);
            }
        }
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let buffers = Box::new(move |streams| {
            fixed.unwrap_or_else(|| session::deep_buffers(deep, chunk, streams, threads))
        });
        let dials = std::mem::take(&mut conn.dials);
        // The first chunks follow the joins' proofs without waiting for the answers
        // (checked by each stream before anything it receives).
        let joins = self.dialing(server, conn.master, dials, JoinWait::Pipelined);
        let env = drive::Env {
            tuned_start,
            ..self.env(&run, buffers)
        };
        let r = drive::source_growing(m, &mut conn.ch, joins, source, env, growth).await?;
        let (mut skipped, mut full_totals) = (skipped, full_totals);
        if let Some(mut ended) = walk_ended {
            // A live walk: what it left out came with its last part, and the
            // totals are those of every part.
            let e = ended.try_recv().unwrap_or_default();
            if e.filtered > 0 {
                tracing::info!("the filters left out {} entries", e.filtered);
            }
            skipped = e.skipped;
            full_totals = Totals::of(r.store.tree().entries());
        }
        let failed = r.store.failed();
        // The lines naming the failed files, and with `--delete` what the mirror must
        // hold: every entry walked (also those `--checksum` found there already).
        let (failed_lines, listed) = {
            let tree = r.store.tree();
            let lines: Vec<String> = failed
                .iter()
                .map(|f| failed_line(tree.entries(), f.clone()))
                .collect();
            let listed = match full {
                Some(full) => full,
                None if delete => tree.entries().to_vec(),
                None => Vec::new(),
            };
            (lines, listed)
        };
        let mut delete_refused = None;
        if delete {
            delete_refused = delete_refusal(skipped, failed.len());
            if delete_refused.is_none() {
                // Every file is verified and under its final name (the sink's `Done`).
                let max = self
                    .opts
                    .max_delete
                    .map(|m| m.saturating_sub(pruned.as_ref().map_or(0, |p| p.deleted)));
                let req = self.prune_request(mirror_path, max);
                let after = self.prune_remote(server, &listed, req).await?;
                merge_pruned(pruned.get_or_insert_with(Default::default), after);
            }
        }
        Ok(Report {
            summary: r.summary,
            totals: full_totals,
            streams: r.info.streams,
            chunk_size: r.info.chunk_size,
            chunk_sizes: r.store.layout().chunk_sizes(),
            skipped,
            held_bytes: r.store.held_bytes() + same_bytes,
            held_files: r.store.held_files() + same_files,
            bytes_sent: 0,
            chunks_resent: r.stats.chunks_resent,
            streams_lost: r.stats.streams_lost,
            attempts: 1,
            failed: failed_lines,
            pruned,
            delete_refused,
            relayed: None,
        })
    }

    /// Awaits `walking` (a push's walk) while connecting to `server`, and gives the
    /// walk's result with the connection and when it was made, when both succeeded.
    /// The caller drops a connection that has waited longer than
    /// [`EARLY_CONNECTION_FRESH`] when it comes to use it (and connects again), well
    /// before the server gives up on a connection that does not open its session
    /// ([`HANDSHAKE_TIMEOUT`]). A failed walk is returned without a connection; a
    /// failed connection is the error, as it would have been after the walk.
    async fn walk_connected<F, T>(
        &self,
        walking: F,
        server: &str,
        run: &Run,
    ) -> Result<(
        Option<dmover_store::Result<T>>,
        Option<(Connection, tokio::time::Instant)>,
    )>
    where
        F: std::future::Future<Output = Option<dmover_store::Result<T>>>,
    {
        let connecting = self.connect(server);
        tokio::pin!(walking, connecting);
        let mut early = None;
        let walked = loop {
            tokio::select! {
                w = &mut walking => break w,
                c = &mut connecting, if early.is_none() => {
                    early = Some(c.map(|c| (c, tokio::time::Instant::now())));
                }
                _ = run.cancelled() => return Err(Error::Aborted),
            }
        };
        if !matches!(walked, Some(Ok(_))) {
            return Ok((walked, None));
        }
        let conn = match early {
            Some(Ok(c)) => c,
            Some(Err(e)) => return Err(e),
            None => tokio::select! {
                c = connecting => (c?, tokio::time::Instant::now()),
                _ = run.cancelled() => return Err(Error::Aborted),
            },
        };
        let conn = Some(conn);
        Ok((walked, conn))
    }

    /// One attempt of a pull into `dest` under `base`. `same`: `sync --checksum`'s
    /// files (paths below the mirror's root) the destination holds with the source's
    /// content.
    async fn pull_once(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        (base, dest): (&Base, &[u8]),
        run: Arc<Run>,
        resume: bool,
        same: Option<Arc<std::collections::HashSet<Vec<u8>>>>,
    ) -> Result<Report> {
        // A busy server may keep us waiting: an interrupt ends the wait.
        let mut conn = tokio::select! {
            r = self.connect(server) => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let report_skipped = self.opts.mirror && self.opts.delete;
        let mut open = self.open_request(
            self.pull_op(sources.to_vec(), report_skipped)?,
            self.opts.chunk_size,
        );
        // The server may send its manifest in parts, data flowing from the first on,
        // where nothing here depends on the whole of it: not on a resume or a sync
        // (the files held are answered for the first part only).
        // The server may also cut them from its walk while it runs (`WALKING`), hard
        // links and files with holes in later parts.
        if !resume && !self.opts.mirror && same.is_none() {
            open.features |= dmover_proto::session::features::STREAMED
                | dmover_proto::session::features::WALKING;
            if self.opts.chunk_size == 0 {
                // Later parts in chunks of their own size, unless `--chunk` pinned it.
                open.features |= dmover_proto::session::features::PART_CHUNKS;
            }
        }
        // Early data (protocol version 8), on the terms of a push's (`push_once`): the
        // data streams join with the first flight, and the server sends from its
        // manifest's end, a round trip before this side's `Go` would have let it.
        let early_id = conn.early(resume, open.streams);
        if early_id.is_some() {
            open.features |= dmover_proto::session::features::EARLY;
        }
        let options = self.opts.session_options(resume);
        let mut d = conn.dial(open, options);
        d.limits = self.limits(true);
        let timing = drive::timing(self.opts.heartbeat, self.opts.idle_timeout);
        // The xattr namespaces this pull takes (`--all-xattrs`: every one).
        let limits = Limits {
            xattrs: self.opts.meta.xattrs,
            ..Limits::default()
        };
        let m = match early_id {
            Some((id, salt)) => {
                tracing::info!(
                    "early data: session {id:016x}'s streams join with the first flight"
                );
                SinkSession::dial_early(now(), server, timing, limits, d, id, salt)
            }
            None => SinkSession::dial(now(), server, timing, limits, d),
        };
        let (mut dest, base) = (dest.to_vec(), base.clone());
        let mut rename = None;
        let mirror_path = dest.clone();
        let delete = self.opts.mirror && self.opts.delete;
        let prune_opts = dmover_store::prune::PruneOptions {
            filter: self.opts.filter.as_deref().cloned().unwrap_or_default(),
            max_delete: self.opts.max_delete,
            dry_run: false,
            conflicts_only: true,
            checksum: false,
        };
        // What `--delete` removed before the transfer (entries of another kind where
        // the source's go), from the preparation (a disk thread).
        let early: Arc<parking_lot::Mutex<Option<dmover_store::prune::Pruned>>> =
            Default::default();
        if self.opts.mirror {
            // `dmover sync`: the source becomes `dest` itself, in `dest`'s parent.
            let (parent, name) = mirror_dest(&dest, matches!(base, Base::Local))?;
            dest = parent;
            rename = Some(name);
        }
        let o = &self.opts;
        let (checksum, direct_io, fsync, verify, journal) =
            (o.checksum, o.direct_io, o.fsync, o.verify, o.journal);
        let meta = o.meta;
        let (pre, early_in, mirror_in) = (prune_opts.clone(), early.clone(), mirror_path.clone());
        // Whether the server answered the request with its manifest (see below).
        let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answered_in = answered.clone();
        let prepare: drive::Prepare<FileSink> = Box::new(move |mut entries, chunk, so| {
            answered_in.store(true, Relaxed);
            if let Some(name) = rename {
                let mut roots = entries.iter_mut().filter(|e| e.parent == NO_PARENT);
                if let (Some(root), None) = (roots.next(), roots.next()) {
                    root.name = name;
                }
            }
            if delete {
                if let Some((parent, name)) = paths::dest_parent(&base, &mirror_in)? {
                    let p = dmover_store::prune::prune(&parent, &name, &entries, &pre)?;
                    *early_in.lock() = Some(p);
                }
            }
            let opts = SinkOptions {
                checksum,
                direct_io,
                fsync,
                verify: verify && checksum,
                journal,
                resume: so.resume,
                // Files already there with the manifest's size and mtime are
                // kept (a re-run or `dmover sync` sends only what changed); with
                // `--checksum`, those whose digests matched instead.
                unchanged: so.resume && same.is_none(),
                meta,
            };
            let mut sink = prepare_sink(&base, &dest, entries, chunk, opts)?;
            if let Some(same) = same {
                sink.hold_same_content(same.as_ref().clone());
            }
            Ok(sink)
        });
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let buffers = Box::new(move |streams| {
            fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
        });
        let dials = std::mem::take(&mut conn.dials);
        let mut joins = self.dialing(server, conn.master, dials, JoinWait::Answer);
        if let Some((id, salt)) = early_id {
            joins.set_session(id, &salt);
        }
        let env = self.env(&run, buffers);
        let r = match drive::sink(m, &mut conn.ch, joins, prepare, Some(options), env).await {
            Ok(r) => r,
            // A server that cannot decode the request's op ends the connection without
            // a word (an `Op::PullListed` to a server older than it).
            Err(Error::Net(NetError::Closed { peer }))
                if self.opts.files_from.is_some() && !answered.load(Relaxed) =>
            {
                return Err(Error::Remote {
                    peer,
                    code: ErrorCode::Protocol,
                    message: "closed the connection without answering the request (a server \
                              older than this client does so: --files-from on a pull needs \
                              a server that knows it, an older dmover server must be \
                              upgraded)"
                        .into(),
                });
            }
            Err(e) => return Err(e),
        };
        let (totals, held_files) = {
            let names = r.store.tree_entries();
            let with_data = names.iter().filter(|e| e.file_size() > 0).count() as u64;
            (
                Totals::of(&names),
                with_data - r.store.layout().files().len() as u64,
            )
        };
        // The server's count of entries its walk skipped, if it was asked for it.
        let (skips, failed): (Vec<FailedFile>, Vec<FailedFile>) = r
            .report
            .failed
            .into_iter()
            .partition(|f| f.entry == dmover_store::source::SKIPPED_MARKER);
        let skipped: u64 = skips
            .iter()
            .map(|f| f.message.parse::<u64>().unwrap_or(1))
            .sum();
        let mut pruned = None;
        let mut delete_refused = None;
        if delete {
            pruned = early.lock().take().map(session::prune_report);
            delete_refused = delete_refusal(skipped, failed.len());
            if delete_refused.is_none() {
                // Every file is verified and under its final name (our own `Done`).
                let entries = r.store.tree_entries().to_vec();
                let opts = dmover_store::prune::PruneOptions {
                    conflicts_only: false,
                    max_delete: prune_opts
                        .max_delete
                        .map(|m| m.saturating_sub(pruned.as_ref().map_or(0, |p| p.deleted))),
                    ..prune_opts
                };
                let after = self
                    .disk
                    .run(move || {
                        let Some((parent, name)) = paths::dest_parent(&Base::Local, &mirror_path)?
                        else {
                            return Ok(dmover_store::prune::Pruned::default());
                        };
                        dmover_store::prune::prune(&parent, &name, &entries, &opts)
                    })
                    .await
                    .ok_or(Error::Aborted)??;
                merge_pruned(
                    pruned.get_or_insert_with(Default::default),
                    session::prune_report(after),
                );
            }
        }
        Ok(Report {
            summary: r.summary,
            totals,
            streams: r.info.streams,
            chunk_size: r.info.chunk_size,
            chunk_sizes: r.store.layout().chunk_sizes(),
            skipped,
            held_bytes: r.store.held_bytes(),
            held_files,
            bytes_sent: 0,
            chunks_resent: r.report.chunks_resent,
            streams_lost: r.report.streams_lost,
            attempts: 1,
            failed: {
                let names = r.store.tree_entries();
                failed.into_iter().map(|f| failed_line(&names, f)).collect()
            },
            pruned,
            delete_refused,
            relayed: None,
        })
    }
}

/// `dmover sync`'s destination `dest` split into the directory that receives the
/// mirror (with a trailing `/`: it must exist) and the mirror's name.
fn mirror_dest(dest: &[u8], local: bool) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut d = dest;
    while d.len() > 1 && d.ends_with(b"/") {
        d = &d[..d.len() - 1];
    }
    let (parent, name) = match d.iter().rposition(|&b| b == b'/') {
        Some(i) => (&d[..=i], &d[i + 1..]),
        None if local => (&b"./"[..], d),
        None => (&b""[..], d),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::refused(
            ErrorCode::NotFound,
            format!(
                "sync: the destination {:?} must name the mirror directory itself \
                 (DST is the copy, not its parent)",
                String::from_utf8_lossy(dest)
            ),
        ));
    }
    Ok((parent.to_vec(), name.to_vec()))
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// `path: why` for a file the source could not send.
fn failed_line(entries: &[Entry], f: FailedFile) -> String {
    if (f.entry as usize) < entries.len() {
        format!("{}: {}", session::entry_path(entries, f.entry), f.message)
    } else {
        f.message
    }
}
