//! The dialing side of a session, whoever dials: a [`crate::client::Client`], or a
//! server dialing another server for a third-party copy ([`AsServer`]). A [`Dialer`]
//! connects and authenticates ([`connect`]), builds the first flight of a session and
//! opens its data streams when its machine asks ([`joins`]), and runs the attempts of a
//! push ([`push`]) or a pull ([`pull`]) with retries ([`retry`]). The memory test and
//! remote access prepare their sessions here too ([`Dialer::session`]).

use std::sync::Arc;
use std::time::Duration;

use dmover_net::ControlStream;
use dmover_net::control::ControlChannel;
use dmover_net::join::{self, Dials, JoinWait, LinkMode};
use dmover_net::pace::Pacer;
use dmover_net::tls::TlsConnector;
use dmover_proto::control::{ErrorCode, FailedFile, Op, Open, PruneReport, Summary};
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::session::Dial;
use dmover_store::paths::Base;
use dmover_store::source::SourceOptions;
use parking_lot::Mutex;

use crate::diskpool::DiskPool;
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::roles;
use crate::session::{self, HANDSHAKE_TIMEOUT, TransferOptions};

mod connect;
mod joins;
mod local;
mod pull;
mod push;
mod retry;

pub(crate) use connect::Connection;
pub use connect::MAX_BUSY_BACKOFF;
pub(crate) use joins::Dialing;
pub use local::LOCAL_STREAMS;
pub(crate) use push::same_content;

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

/// What a relay through this client moved besides what it sent on ([`Report::relayed`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Relayed {
    /// Payload bytes received from the source server, all attempts.
    pub bytes_received: u64,
    /// The most bytes of chunks the client held at once (the last attempt).
    pub peak_buffered: u64,
}

/// The dialing side of sessions: options, credentials and disk threads (see the
/// module docs). A [`crate::client::Client`] derefs to its dialer.
#[derive(Debug)]
pub struct Dialer {
    pub(crate) disk: Arc<DiskPool>,
    pub(crate) opts: TransferOptions,
    /// Set when a server dials another server for a third-party copy.
    as_server: Option<Arc<AsServer>>,
    /// Whole-file uploads at once (`remote::StagedFile::upload_within`).
    pub(crate) uploads: Arc<Uploads>,
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
    /// How long its TLS handshake may take (this server's handshake timeout).
    pub(crate) handshake_timeout: std::time::Duration,
}

/// A source root: a base, a path under it, and the name the root gets when the path
/// names the base itself (a server's whole export).
pub(crate) type Root = (Base, Vec<u8>, Vec<u8>);

/// A session set up to be driven (see [`Dialer::session`]).
pub(crate) struct Prepared {
    pub(crate) ch: ControlChannel<ControlStream>,
    /// The dialer's first flight and its checks.
    pub(crate) dial: Dial,
    pub(crate) options: dmover_proto::control::SessionOptions,
    pub(crate) timing: dmover_proto::session::Timing,
    pub(crate) joins: Dialing,
    pub(crate) env: drive::Env,
}

/// Whole-file uploads ([`crate::remote::StagedFile::upload_within`]) one [`Dialer`]
/// runs at once; the others wait for a slot. Each upload is a session of its own: a
/// thousand files closed together through a mount would otherwise open a thousand
/// sessions, and a server sheds connections beyond its set-up limit (measured over a
/// 50 ms link: 452 of 768 such uploads failed with "closed the connection";
/// docs/benchmarks.md).
pub const UPLOAD_SLOTS: usize = 16;

/// A [`Dialer`]'s upload slots, and when an upload last went unanswered.
#[derive(Debug)]
pub(crate) struct Uploads {
    pub(crate) slots: tokio::sync::Semaphore,
    /// When an upload last got no answer within its limit, and to which server.
    pub(crate) silent: Mutex<Option<(std::time::Instant, String)>>,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            slots: tokio::sync::Semaphore::new(UPLOAD_SLOTS),
            silent: Mutex::new(None),
        }
    }
}

impl Uploads {
    /// How long ago an upload to `server` went unanswered, if less than `limit`.
    pub(crate) fn silent_since(&self, server: &str, limit: Duration) -> Option<Duration> {
        let last = self.silent.lock();
        let (at, s) = last.as_ref()?;
        let ago = at.elapsed();
        (s == server && ago < limit).then_some(ago)
    }
}

impl Dialer {
    /// A dialer with `opts` on the disk threads `disk`.
    pub(crate) fn new(opts: TransferOptions, disk: Arc<DiskPool>) -> Self {
        Dialer {
            disk,
            opts,
            as_server: None,
            uploads: Arc::default(),
        }
    }

    /// A dialer with other options on this one's disk threads and credentials.
    pub(crate) fn with_options(&self, opts: TransferOptions) -> Self {
        Dialer {
            disk: self.disk.clone(),
            opts,
            as_server: self.as_server.clone(),
            uploads: self.uploads.clone(),
        }
    }

    /// A server's dialer toward another server (a third-party copy), on the server's
    /// disk threads.
    pub(crate) fn as_server(opts: TransferOptions, disk: Arc<DiskPool>, s: AsServer) -> Self {
        Dialer {
            disk,
            opts,
            as_server: Some(Arc::new(s)),
            uploads: Arc::default(),
        }
    }

    /// The TLS settings for connecting.
    pub(crate) fn connector(&self) -> Result<TlsConnector> {
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
    pub(crate) fn data_dialer(&self, server: &str) -> join::Dialer {
        join::Dialer::new(
            server,
            self.opts.socket.clone(),
            self.opts.connect_timeout,
            HANDSHAKE_TIMEOUT,
        )
    }

    /// The link mode of this client's data streams.
    pub(crate) fn link_mode(&self) -> LinkMode {
        LinkMode {
            protection: self.opts.protection,
            idle: self.opts.idle_timeout,
        }
    }

    /// The owners and xattrs a push sends (feature `METADATA`), as far as the options
    /// let them travel (`None`: none); a server without the feature never gets them.
    pub(crate) fn meta_want(&self) -> Option<roles::MetaWant> {
        let p = self.opts.meta;
        (p.owner || p.xattrs.user || p.xattrs.acls || p.xattrs.all).then_some(roles::MetaWant {
            scope: p.xattrs,
            owners: p.owner,
        })
    }

    /// The `Open` of a session for `op`.
    pub(crate) fn open_request(&self, op: Op, chunk_size: u32) -> Open {
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
    pub(crate) fn dialing(
        &self,
        server: &str,
        master: [u8; 32],
        dials: Dials,
        wait: JoinWait,
    ) -> Dialing {
        Dialing::new(
            self.data_dialer(server),
            self.link_mode(),
            wait,
            master,
            dials,
            self.opts.bwlimit.map(Pacer::new),
        )
    }

    /// A session with `server`, set up to be driven: connected, the first flight for
    /// `op` ready (without hard links: a mount reads each path by its own layout slot,
    /// and the memory test has none), the data streams to be joined when asked.
    pub(crate) async fn session(
        &self,
        server: &str,
        op: Op,
        chunk: u32,
        run: &Arc<Run>,
    ) -> Result<Prepared> {
        let conn = tokio::select! {
            r = self.connect(server) => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let mut open = self.open_request(op, chunk);
        open.features &= !dmover_proto::session::features::LINKS;
        Ok(self.prepare(conn, server, open, false, JoinWait::Answer, run))
    }

    /// The session `open` on `conn` (to `server`), set up to be driven: the first
    /// flight with the options of an attempt that resumes or not (its limits left to
    /// the caller), the data streams joined when the machine asks (`wait`: how), and
    /// the driver's environment with as many buffers as the streams and disk threads
    /// need (or `--buffers`).
    pub(crate) fn prepare(
        &self,
        mut conn: Connection,
        server: &str,
        open: Open,
        resume: bool,
        wait: JoinWait,
        run: &Arc<Run>,
    ) -> Prepared {
        let options = self.opts.session_options(resume);
        let dial = conn.dial(open, options);
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let buffers = Box::new(move |streams| {
            fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
        });
        let dials = std::mem::take(&mut conn.dials);
        Prepared {
            joins: self.dialing(server, conn.master, dials, wait),
            ch: conn.ch,
            dial,
            options,
            timing: drive::timing(self.opts.heartbeat, self.opts.idle_timeout),
            env: self.env(run, buffers),
        }
    }

    /// A push's source options, from this client's.
    pub(crate) fn source_options(&self) -> SourceOptions {
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

    /// What a driver needs of this dialer for a session ([`roles::env`]): the disk
    /// threads grow with their buffers unless the user pinned them.
    pub(crate) fn env(
        &self,
        run: &Arc<Run>,
        buffers: Box<dyn Fn(u16) -> usize + Send>,
    ) -> drive::Env {
        let env = roles::env(
            self.disk.clone(),
            run.clone(),
            &self.opts.socket,
            self.opts.chunk_delay,
            buffers,
        );
        drive::Env {
            disk_room: self
                .opts
                .buffers
                .is_none()
                .then(|| Box::new(|n| n) as drive::DiskRoom),
            ..env
        }
    }

    /// This dialer on the disk threads `disk` (a relay's sessions have their own).
    pub(crate) fn on_disk(&self, disk: Arc<DiskPool>) -> Self {
        Dialer {
            disk,
            opts: self.opts.clone(),
            as_server: self.as_server.clone(),
            uploads: self.uploads.clone(),
        }
    }

    /// Copies local `sources` into `dest` on `server` (`host:port`).
    pub(crate) async fn push(
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
}

/// `dmover sync`'s destination `dest` split into the directory that receives the
/// mirror (with a trailing `/`: it must exist) and the mirror's name.
pub(crate) fn mirror_dest(dest: &[u8], local: bool) -> Result<(Vec<u8>, Vec<u8>)> {
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

pub(crate) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// `path: why` for a file the source could not send.
pub(crate) fn failed_line(entries: &[Entry], f: FailedFile) -> String {
    if (f.entry as usize) < entries.len() {
        format!("{}: {}", session::entry_path(entries, f.entry), f.message)
    } else {
        f.message
    }
}
