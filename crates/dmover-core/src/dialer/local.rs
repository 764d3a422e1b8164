//! A copy from local paths to a local path (`dmover cp SRC... DST`, `dmover sync SRC
//! DST` with no server named): the same session as a pull from a server, both of its
//! halves in this process.
//!
//! This side's half is a pull's, unchanged ([`Dialer::pull_once`]'s sink: staging
//! files renamed into place once their digests match, metadata, the journal and
//! `resume`, `sync`'s unchanged files held and `--delete`'s prunes, its report and
//! retries). The other half is what a server runs for a pull (`server/run.rs`): the
//! local sources walked, read and checksummed by a [`FileSource`] on the disk threads
//! and driven by the source's driver. The two meet over the in-process transport
//! (`dmover_net::memnet`): the control connection is a pipe, and each data stream a
//! pipe joined through a real join table, with the real proofs. There is no listener,
//! no TLS and no record protection (nothing leaves the process: the data streams are
//! plain), and no export or rights: the user owns both sides, and the paths are
//! resolved as any local path is ([`Base::Local`]: symbolic links in them followed).
//!
//! [`FileSource`]: dmover_store::source::FileSource

use std::sync::Arc;

use dmover_net::join::{Ahead, JoinWait, LinkMode};
use dmover_net::memnet::MemNet;
use dmover_net::pace::Pacer;
use dmover_proto::auth;
use dmover_proto::control::{
    Auth, AuthMethod, AuthOk, Credential, DataProtection, ErrorCode, Hello, MAX_FRAME, SessionInfo,
    Welcome,
};
use dmover_proto::session::{Acceptance, Dial, Limits, SinkSession, SourceSession, features};
use dmover_store::paths::{self, Base};
use dmover_store::source::SourceOptions;

use super::{Dialer, Dialing, Report, now};
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::roles::{self, Feed, SourcePlan, SourceRole, WalkSpec};
use crate::session::{self, HANDSHAKE_TIMEOUT, MAX_STREAMS, SOFTWARE};

/// The data streams of a local copy unless `--streams` says: enough to keep the disk
/// threads fed through the pipes, no tuner (it reads a TCP link's counters).
pub const LOCAL_STREAMS: u16 = 4;

/// How the in-process peer names itself in messages.
const PEER: &str = "local";

impl Dialer {
    /// Copies the local `sources` into the local `dest`, as a pull from a server
    /// would (a sync's `dest` is the mirror itself), with this dialer's retries.
    pub(crate) async fn local(
        &self,
        sources: &[Vec<u8>],
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        if self.opts.mirror && self.opts.compare_content {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "sync --checksum between two local paths is not supported yet",
            ));
        }
        for s in sources {
            check_not_within(s, dest)?;
        }
        let mut opts = self.opts.clone();
        if opts.tune {
            opts.streams = LOCAL_STREAMS;
        }
        opts.tune = false;
        opts.protection = DataProtection::Plain;
        let local = self.with_options(opts);
        local
            .with_retries(&run, |r, resume| local.local_once(sources, dest, r, resume))
            .await
    }

    /// One attempt of a local copy: both halves of the session, run together.
    async fn local_once(
        &self,
        sources: &[Vec<u8>],
        dest: &[u8],
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let master: [u8; 32] = rand::random();
        let (near, far) = tokio::io::duplex(64 << 10);
        let idle = self.opts.idle_timeout;
        let net = MemNet::new(idle, HANDSHAKE_TIMEOUT);
        let joins = Dialing::new(
            net.dialer(PEER, HANDSHAKE_TIMEOUT),
            LinkMode {
                protection: DataProtection::Plain,
                idle,
            },
            JoinWait::Answer,
            master,
            Ahead::default(),
            self.opts.bwlimit.map(Pacer::new),
        );
        let open = self.pull_open(sources, resume, false)?;
        let options = self.opts.session_options(resume);
        let dial = Dial {
            hello: Hello {
                software: SOFTWARE.into(),
                nonce: rand::random(),
            },
            auth: Auth {
                user: String::new(),
                credential: Credential::None,
            },
            open,
            options,
            server_proof: None,
            limits: self.limits(true),
        };
        let timing = drive::timing(self.opts.heartbeat, self.opts.idle_timeout);
        let limits = Limits {
            xattrs: self.opts.meta.xattrs,
            ..Limits::default()
        };
        let m = SinkSession::dial(now(), PEER, timing, limits, dial);
        let (plan, pruned_first) = self.pull_sink(&Base::Local, dest, None)?;
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let buffers = Box::new(move |streams| {
            fixed.unwrap_or_else(|| session::default_buffers(streams, threads))
        });
        let env = self.env(&run, buffers);
        let sink = async {
            let mut ch = dmover_net::control::ControlChannel::new(near, PEER, MAX_FRAME);
            let r = drive::sink(m, &mut ch, joins, plan.prepare(), Some(options), env).await;
            drop(ch);
            r
        };
        let source = async {
            tokio::select! {
                r = self.local_source(far, &net, master, sources) => r,
                _ = run.cancelled() => Err(Error::Aborted),
            }
        };
        let (received, sent) = tokio::join!(sink, source);
        let r = match (received, sent) {
            (Ok(r), _) => r,
            // The sink's error names the cause when the source told it; a source that
            // failed before it could is the cause itself.
            (Err(Error::Net(_)), Err(s)) => return Err(s),
            (Err(e), _) => return Err(e),
        };
        self.pull_report(r, (&Base::Local, dest), pruned_first)
            .await
    }

    /// The source's half of a local copy, as a server runs a pull's
    /// (`server/run.rs`): the handshake answered on `ch`, the local `sources` walked
    /// through this dialer's filters, the session opened on `net`'s join table, the
    /// source's driver run to its end.
    async fn local_source(
        &self,
        ch: tokio::io::DuplexStream,
        net: &MemNet,
        master: [u8; 32],
        sources: &[Vec<u8>],
    ) -> Result<()> {
        let mut ch = dmover_net::control::ControlChannel::new(ch, PEER, MAX_FRAME);
        let timing = drive::timing(session::HEARTBEAT, self.opts.idle_timeout);
        let deadline = now() + HANDSHAKE_TIMEOUT;
        let welcome = Welcome {
            software: SOFTWARE.into(),
            nonce: rand::random(),
            auth: AuthMethod::None,
        };
        let a = Acceptance::new(PEER.to_string(), timing, deadline, welcome);
        let open =
            drive::accept(a, &mut ch, |_: &Hello, _: &Auth| Ok(AuthOk { proof: None })).await?;
        let granted = features::negotiate(open.features, features::SUPPORTED);
        let live_walk =
            features::STREAMED | features::GROWING_MANIFEST | features::LINKS | features::WALKING;
        let report_skipped = self.opts.mirror && self.opts.delete;
        let spec = WalkSpec {
            filter: self.opts.filter.as_deref().cloned().unwrap_or_default(),
            live: granted & live_walk == live_walk && !report_skipped,
            meta: (granted & features::METADATA != 0).then_some(self.opts.meta.xattrs),
            ask_xattrs: false,
        };
        let roots: Vec<Vec<u8>> = sources.to_vec();
        let roots = move || {
            roots
                .iter()
                .map(|p| paths::source_root(&Base::Local, p, b""))
                .collect()
        };
        let mut walk = roles::walk(&self.disk, roots, spec).await?;
        let chunk = walk.chunk(open.chunk_size);
        dmover_proto::layout::validate_chunk_size(chunk)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        let (id, salt) = auth::session_id(&master);
        let key = auth::session_key(&master, id, &salt);
        let streams = open.streams.clamp(1, MAX_STREAMS);
        let Some(rx) = net.table().open(id, key, open.protection, streams) else {
            return Err(Error::refused(
                ErrorCode::Protocol,
                format!("session {id:016x} is open already"),
            ));
        };
        let info = SessionInfo {
            id,
            salt,
            streams,
            chunk_size: chunk,
            features: granted,
        };
        let want = (granted & features::METADATA != 0).then_some(roles::MetaWant {
            scope: self.opts.meta.xattrs,
            owners: true,
        });
        let meta = walk.meta(want);
        let both = features::STREAMED | features::GROWING_MANIFEST;
        let threads = self.disk.threads();
        let buffers = self
            .opts
            .buffers
            .unwrap_or_else(|| walk.buffers(chunk, threads)(streams));
        let plan = SourcePlan {
            chunk,
            options: SourceOptions {
                checksum: open.checksum,
                direct_io: open.direct_io,
                continue_on_error: false,
            },
            streamed: granted & both == both,
            links: granted & features::LINKS != 0,
            report_skipped,
        };
        let role = SourceRole::new(walk, plan)?;
        let run = Run::new();
        let env = roles::env(
            self.disk.clone(),
            run.clone(),
            &self.opts.socket,
            self.opts.chunk_delay,
            Box::new(move |_| buffers),
        );
        let (now, setup_by) = (now(), deadline);
        let mut m = SourceSession::accept(now, PEER, timing, setup_by);
        m.grant(now, info);
        let feed = Feed {
            first_flight: false,
            run,
            peer: PEER.to_string(),
            owners: true,
            ended: None,
        };
        let (source, growth) = role.queue(&mut m, meta, feed);
        let joins = drive::Accepted::new(rx, |io| io);
        drive::source_growing(m, &mut ch, joins, source, env, growth).await?;
        Ok(())
    }
}

/// Refuses a copy of the directory `source` into itself (`dest` is it or below it):
/// the walk would meet the copy as it grows.
fn check_not_within(source: &[u8], dest: &[u8]) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};
    let src = Path::new(std::ffi::OsStr::from_bytes(source));
    let Ok(src) = std::fs::canonicalize(src) else {
        // A source that is not there fails with its own error.
        return Ok(());
    };
    if !src.is_dir() {
        return Ok(());
    }
    // The destination as it will be: itself if it exists, else its parent's.
    let dst = Path::new(std::ffi::OsStr::from_bytes(dest));
    let mut missing = Vec::new();
    let mut at: PathBuf = dst.to_path_buf();
    let found = loop {
        if let Ok(c) = std::fs::canonicalize(&at) {
            break Some(c);
        }
        match (at.file_name(), at.parent()) {
            (Some(name), Some(parent)) => {
                missing.push(name.to_os_string());
                at = if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                };
            }
            _ => break None,
        }
    };
    let Some(mut dst) = found else {
        return Ok(());
    };
    dst.extend(missing.iter().rev());
    if dst.starts_with(&src) {
        return Err(Error::refused(
            ErrorCode::Unsupported,
            format!(
                "cannot copy the directory {} into itself ({})",
                src.display(),
                dst.display()
            ),
        ));
    }
    Ok(())
}
