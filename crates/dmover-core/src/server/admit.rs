//! Admitting a session: what the client asked for (a filtered pull is a pull whose walk
//! goes through its rules), the paths it names checked against the user's rights,
//! a pull's source walked (so that an automatic chunk size fits the dataset and a bad
//! path is refused before any session exists), then its place, its data streams' slot
//! in the join listener, its buffers within the memory budget, its limits, and the
//! driver's environment ([`Admitted`]). What runs it is `server/run.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dmover_net::fault::Faulty;
use dmover_net::join::Joined;
use dmover_net::link::SocketOptions;
use dmover_net::pace::{Paced, Pacer};
use dmover_net::stream::DataIo;
use dmover_proto::auth;
use dmover_proto::control::{
    DataProtection, ErrorCode, FilterRule, MemDirection, Op, Open, SessionInfo, SessionLimits,
};
use dmover_proto::manifest::{self, XattrScope};
use dmover_proto::session::features;
use dmover_store::paths::{self, Base};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::{MIB, Server, SessionLog, SessionPlace, SlotGuard, limits, session_bwlimit};
use crate::access::Grant;
use crate::dialer::Root;
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::manifests::Charge;
use crate::policy::{self, Policy, Use};
use crate::roles::{self, SourceWalk, WalkSpec};
use crate::session::{self, MAX_STREAMS};

/// A session as the client asked for it, once authenticated.
pub(super) struct Asked<'a> {
    /// The `Open`, a filtered pull's op made a plain [`Op::Pull`].
    pub open: Open,
    /// The client's address, for the log.
    pub peer: &'a str,
    /// Who the client is and what it may do.
    pub grant: &'a Grant,
    /// The rules (and the `--files-from` list) a filtered pull's walk goes through,
    /// parsed once the user's rights to its sources are checked: a list costs memory
    /// and time, so none before.
    filter: Option<(Vec<FilterRule>, Option<Vec<u8>>)>,
    /// A pull's source reports what its walk skipped (`sync --delete`).
    pub report_skipped: bool,
}

impl<'a> Asked<'a> {
    /// The session `open` asks for, by `peer` as `grant`.
    pub fn new(mut open: Open, peer: &'a str, grant: &'a Grant) -> Self {
        let plain = Op::Pull {
            sources: Vec::new(),
        };
        let (mut filter, mut report_skipped) = (None, false);
        match std::mem::replace(&mut open.op, plain) {
            Op::PullFiltered(p) => {
                filter = Some((p.rules, None));
                report_skipped = p.report_skipped;
                open.op = Op::Pull { sources: p.sources };
            }
            Op::PullListed(p) => {
                filter = Some((p.rules, Some(p.list)));
                report_skipped = p.report_skipped;
                open.op = Op::Pull { sources: p.sources };
            }
            op => open.op = op,
        }
        Asked {
            open,
            peer,
            grant,
            filter,
            report_skipped,
        }
    }

    /// Which way the session's bytes go, for the monitor: bytes pushed or pulled by a
    /// capability are the other half of a third-party copy.
    pub fn direction(&self) -> &'static str {
        match (&self.open.op, self.grant.scope.is_some()) {
            (Op::Push { .. }, false) => "received",
            (Op::Push { .. }, true) => "third_party_received",
            (Op::Pull { .. }, false) => "sent",
            (Op::Pull { .. }, true) => "third_party_sent",
            (Op::MemTest(m), _) if m.direction == MemDirection::ToServer => "memtest_received",
            _ => "memtest_sent",
        }
    }

    /// The features the session uses.
    pub fn features(&self) -> u64 {
        features::negotiate(self.open.features, features::SUPPORTED)
    }
}

/// Where a push's data go.
pub(super) struct PushDest {
    /// The export's base.
    pub base: Base,
    /// The path within it.
    pub dest: Vec<u8>,
    /// The export keeps the files' owners.
    pub preserve_owner: bool,
}

/// Where a session's paths lead, checked against the user's rights; what they resolve
/// to is checked again at every reload (`policy::watch`).
pub(super) struct Paths {
    /// The paths and exports used.
    pub uses: Vec<Use>,
    /// A push's destination.
    pub push: Option<PushDest>,
    /// A pull's sources.
    pub pull: Option<Vec<Root>>,
    /// The extended attributes read or set: every namespace where each export used
    /// says so (`xattrs = "all"`; the client sets what it takes), else `user.*` and
    /// ACLs.
    pub xattrs: XattrScope,
}

/// An admitted session, ready for its role's set-up and driver.
pub(super) struct Admitted<'s> {
    /// The session as granted.
    pub info: SessionInfo,
    /// The driver's environment.
    pub env: drive::Env,
    /// The data streams the join listener hands over.
    rx: mpsc::Receiver<Joined>,
    /// How each is wrapped: injected faults, the session's pacing, the congestion
    /// control of a sending session.
    wrap: DataWrap,
    /// What the session holds until it ends.
    _held: Held<'s>,
}

/// How an accepted data stream is wrapped for its session.
type DataWrap = Box<dyn Fn(DataIo) -> Paced<Faulty<DataIo>> + Send>;

/// What an admitted session holds until it ends: its place, its joins' slot, its
/// buffer memory, and the watch of its rights.
pub(super) struct Held<'s> {
    _place: SessionPlace<'s>,
    _slot: SlotGuard<'s>,
    _memory: OwnedSemaphorePermit,
    _policy: policy::AbortOnDrop,
}

impl<'s> Admitted<'s> {
    /// The session's data streams for its driver, and the environment and what it
    /// holds (kept until the driver is done).
    pub fn into_parts(self) -> (impl drive::Joins + use<'s>, drive::Env, Held<'s>) {
        (
            drive::Accepted::new(self.rx, self.wrap),
            self.env,
            self._held,
        )
    }
}

impl Server {
    /// The paths `asked` names, resolved and checked against `grant`'s rights in
    /// `policy`, before anything else; the session's own limits checked too.
    pub(super) fn check_request(&self, policy: &Policy, asked: &Asked<'_>) -> Result<Paths> {
        let open = &asked.open;
        if open.streams == 0 {
            return Err(Error::refused(
                ErrorCode::Protocol,
                "zero data streams requested",
            ));
        }
        Self::check_scope(asked.grant, &open.op)?;
        if self.cfg.require_encryption && open.protection != DataProtection::Encrypted {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "this server requires encrypted data streams: use --encrypt",
            ));
        }
        let read_only = self.cfg.read_only;
        let mut paths = Paths {
            uses: Vec::new(),
            push: None,
            pull: None,
            xattrs: XattrScope::DEFAULT,
        };
        let used = |export: &crate::access::ExportSpec, path: &[u8], write| Use {
            path: path.to_vec(),
            write,
            export: export.clone(),
        };
        match &open.op {
            Op::Push { dest } => {
                let (export, base, rest, _) = policy.resolve(read_only, asked.grant, dest, true)?;
                paths.uses.push(used(export, dest, true));
                paths.push = Some(PushDest {
                    base,
                    dest: rest.to_vec(),
                    preserve_owner: export.preserve_owner,
                });
            }
            Op::Pull { sources } => {
                let mut roots = Vec::new();
                for p in sources {
                    let (export, base, rest, name) =
                        policy.resolve(read_only, asked.grant, p, false)?;
                    paths.uses.push(used(export, p, false));
                    roots.push((base, rest.to_vec(), name));
                }
                paths.pull = Some(roots);
            }
            _ => {}
        }
        paths.xattrs.all = !paths.uses.is_empty() && paths.uses.iter().all(|u| u.export.xattrs_all);
        Ok(paths)
    }

    /// A pull's source walked through the client's filters: whole, or (feature
    /// `WALKING`) live, up to its first part. Not live for a sync's pull, whose report
    /// counts what the whole walk skipped. A live walk reads the owners and xattrs
    /// (feature `METADATA`) with the entries, in `xattrs`.
    pub(super) async fn walk_pull(
        &self,
        asked: &mut Asked<'_>,
        roots: Vec<Root>,
        xattrs: XattrScope,
    ) -> Result<SourceWalk> {
        let filter = match asked.filter.take() {
            None => dmover_store::filter::Filter::none(),
            Some((rules, None)) => session::filter_of_rules(&rules)?,
            Some((rules, Some(list))) => session::filter_of_list(&rules, &list)?,
        };
        let granted = asked.features();
        let live_walk =
            features::STREAMED | features::GROWING_MANIFEST | features::LINKS | features::WALKING;
        let spec = WalkSpec {
            filter,
            live: granted & live_walk == live_walk && !asked.report_skipped,
            meta: (granted & features::METADATA != 0).then_some(xattrs),
            ask_xattrs: false,
        };
        let roots = move || {
            roots
                .iter()
                .map(|(base, p, name)| paths::source_root(base, p, name))
                .collect()
        };
        let started = Instant::now();
        let walk = roles::walk(&self.disk, roots, spec).await?;
        tracing::debug!(
            "{}: walked {} entries in {:.3} s{}",
            asked.peer,
            walk.tree.entries().len(),
            started.elapsed().as_secs_f64(),
            if walk.goes_on() {
                ", the first part of a walk that goes on"
            } else {
                ""
            }
        );
        Ok(walk)
    }

    /// Admits the session `asked` (a pull's source walked: `walk`) on the
    /// connection's secret `master` and round trip `rtt`: its chunk size, its place
    /// (`place`, if taken at the preamble), its joins' slot, its buffers, its limits
    /// and its run, watched against reloads of `policy` on `uses`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn admit<'s>(
        &'s self,
        asked: &Asked<'_>,
        walk: Option<&SourceWalk>,
        place: Option<SessionPlace<'s>>,
        (master, rtt): ([u8; 32], Option<Duration>),
        policy: &Policy,
        uses: Vec<Use>,
        log: &mut SessionLog,
    ) -> Result<Admitted<'s>> {
        let open = &asked.open;
        let chunk = walk.map_or(open.chunk_size, |w| w.chunk(open.chunk_size));
        // A pull's tuner starts as a push's.
        let tuned_start = walk.map_or(session::TUNED_START, |w| w.tuned_start(rtt));
        dmover_proto::layout::validate_chunk_size(chunk)
            .map_err(|e| Error::refused(ErrorCode::Protocol, e.to_string()))?;
        let manifest_charge = self.manifest_charge(walk)?;
        let Some(place) = place.or_else(|| self.session_place()) else {
            self.monitor.refused("max_sessions");
            return Err(Error::refused(
                ErrorCode::Busy,
                format!("server busy: {} sessions running", self.cfg.max_sessions),
            ));
        };
        // The connection's session (protocol version 8): the client knows its id and
        // key as soon as TLS is up, so its data streams may join (and a fresh push's
        // first chunks wait in them) before this. A push gets exactly the streams and
        // chunk size it asked for, and the base features it offered, as its early
        // data assumed (`Dial::assumed`).
        let (id, salt) = auth::session_id(&master);
        let key = auth::session_key(&master, id, &salt);
        let streams = open.streams.min(MAX_STREAMS);
        let Some(rx) = self.joins.open(id, key, open.protection, streams) else {
            // Only a connection whose exported secret repeats another's: never over TLS.
            return Err(Error::refused(
                ErrorCode::Protocol,
                format!("session {id:016x} is open already"),
            ));
        };
        let slot = SlotGuard(self, id);
        let info = SessionInfo {
            id,
            salt,
            streams,
            chunk_size: chunk,
            features: asked.features(),
        };
        let (count, memory) = self.session_buffers(&info, walk).await?;
        let (wrap, answer) = self.data_limits(asked, &info, policy, &uses, log);
        let run = Run::new();
        let watch = policy::watch(
            self.policy.subscribe(),
            self.cfg.read_only,
            run.clone(),
            asked.grant.clone(),
            uses,
        );
        log.progress = Some(run.progress.clone());
        if let Some(live) = &log.live {
            live.attach(&run.progress);
        }
        log.protection = Some(open.protection);
        let env = roles::env(
            self.disk.clone(),
            run,
            &self.cfg.socket,
            self.faults.chunk_delay,
            Box::new(move |_| count),
        );
        Ok(Admitted {
            info,
            env: drive::Env {
                limits: Some(answer),
                tuned_start,
                disk_room: Some(self.disk_room(chunk)),
                manifest_charge: Some(manifest_charge),
                ..env
            },
            rx,
            wrap,
            _held: Held {
                _place: place,
                _slot: slot,
                _memory: memory,
                _policy: watch,
            },
        })
    }

    /// A session's charge on the server's manifest budget ([`crate::manifests`]): a
    /// push's grows as its manifest arrives (its sink charges it); a pull's is its
    /// walk's manifest, at most `max_manifest_bytes_read` (the ops a read-only user
    /// can run get the smaller limit).
    fn manifest_charge(&self, walk: Option<&SourceWalk>) -> Result<Charge> {
        let mut charge = Charge::new(self.manifests.clone());
        if let Some(w) = walk {
            let bytes: u64 = w.tree.entries().iter().map(manifest::entry_bytes).sum();
            if bytes > self.cfg.max_manifest_bytes_read {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "the pull's manifest takes more than this server's limit for a \
                         read ({}, max_manifest_bytes_read in its config): pull fewer \
                         files at once",
                        crate::manifests::size(self.cfg.max_manifest_bytes_read)
                    ),
                ));
            }
            charge.grow_to(bytes)?;
        }
        Ok(charge)
    }

    /// A session's buffers: what it wants (a pull's source sizes them with its walk)
    /// if the memory budget has room now, else the minimum it needs (waiting for that
    /// much, within the handshake timeout).
    async fn session_buffers(
        &self,
        info: &SessionInfo,
        walk: Option<&SourceWalk>,
    ) -> Result<(usize, OwnedSemaphorePermit)> {
        let chunk = info.chunk_size;
        let tuned = info.features & features::TUNING != 0;
        let buffer_streams = session::buffer_streams(info.streams, tuned);
        let threads = self.disk.threads();
        let minimum = session::default_buffers(buffer_streams, threads);
        let want = walk.map_or(minimum, |w| w.buffers(chunk, threads)(buffer_streams));
        // The budget counts whole MiB of buffers: a session's buffers together, rounded
        // up (not each buffer: 2560 × 64 KiB would count as 2.5 GiB).
        let budget_bufs = (self.cfg.memory_budget / MIB * MIB / u64::from(chunk).max(1)) as usize;
        let permits = |bufs: usize| (bufs as u64 * u64::from(chunk)).div_ceil(MIB) as u32;
        let minimum = minimum.min(budget_bufs);
        if minimum < 2 {
            // No wait would help: not "busy", which clients come back for.
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "chunk size exceeds the server's memory budget",
            ));
        }
        let want = want.min(budget_bufs);
        match self.memory.clone().try_acquire_many_owned(permits(want)) {
            Ok(permit) => Ok((want, permit)),
            Err(_) => {
                let permit = tokio::time::timeout(
                    self.cfg.handshake_timeout,
                    self.memory.clone().acquire_many_owned(permits(minimum)),
                )
                .await
                .map_err(|_| {
                    self.monitor.refused("memory_budget");
                    Error::refused(ErrorCode::Busy, "server busy: memory budget in use")
                })?
                .map_err(|_| Error::Aborted)?;
                Ok((minimum, permit))
            }
        }
    }

    /// A session's limits on its data streams: how each stream is wrapped (injected
    /// faults, the lowest of its user's and exports' bandwidth limits, a memory test's
    /// congestion control, a sending session's congestion control as the client asks),
    /// and the answer to the client's `Limits` (feature LIMITS).
    fn data_limits(
        &self,
        asked: &Asked<'_>,
        info: &SessionInfo,
        policy: &Policy,
        uses: &[Use],
        log: &mut SessionLog,
    ) -> (DataWrap, drive::LimitsAnswer) {
        let (open, peer) = (&asked.open, asked.peer);
        let plan = self.faults.link.clone();
        // A memory test may name the congestion control of the server's ends.
        let congestion = match &open.op {
            Op::MemTest(m) if !m.congestion.is_empty() => Some(SocketOptions {
                congestion: Some(m.congestion.clone()),
                ..SocketOptions::default()
            }),
            _ => None,
        };
        let pacer = session_bwlimit(policy, asked.grant, uses).map(|(rate, by)| {
            tracing::info!(
                "{peer}: session limited to {} ({rate} bytes/s) by {by}",
                dmover_proto::units::format_rate(rate.saturating_mul(8))
            );
            log.bwlimit = Some(rate);
            Pacer::new(rate)
        });
        // Feature LIMITS: a pulling client names the congestion control of the data
        // streams this server sends on (the client's `Limits`, before its `Go`).
        let sending = matches!(&open.op, Op::Pull { .. })
            || matches!(&open.op, Op::MemTest(m) if m.direction == MemDirection::FromServer);
        let send_cc = sending.then(|| {
            let cc = limits::SendCongestion::new(peer, self.send_default.clone());
            if info.features & features::LIMITS == 0 {
                // No `Limits` will come: the server's algorithm.
                cc.decide("");
            }
            Arc::new(cc)
        });
        log.congestion = send_cc.clone();
        let answer: drive::LimitsAnswer = {
            let (send_cc, bwlimit) = (send_cc.clone(), log.bwlimit.unwrap_or(0));
            Box::new(move |asked: &SessionLimits| {
                let (congestion, refused) = match &send_cc {
                    Some(cc) => cc.decide(&asked.congestion),
                    None => (String::new(), String::new()),
                };
                SessionLimits {
                    bwlimit,
                    congestion,
                    refused,
                }
            })
        };
        let wrap = Box::new(move |io: DataIo| {
            let probe = dmover_net::transport::DataLink::probe(&io);
            if probe.is_none() && (congestion.is_some() || send_cc.is_some()) {
                tracing::warn!(
                    "a data stream's congestion control cannot be set: no handle on its \
                     connection"
                );
            }
            if let (Some(o), Some(p)) = (&congestion, &probe) {
                p.apply(o);
            }
            if let (Some(cc), Some(p)) = (&send_cc, probe) {
                cc.joined(p);
            }
            Paced::new(Faulty::new(io, plan.clone()), pacer.clone())
        });
        (wrap, answer)
    }
}
