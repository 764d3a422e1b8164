//! Third-party transfers, the server's part (docs/third-party.md): issuing capabilities
//! ([`Op::Grant`]), accepting them as credentials, and dialing another server for a
//! client ([`Op::ThirdParty`]).

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use dmover_proto::capability::{self as cap, Capability, CapabilityError, Scope};
use dmover_proto::control::{
    GrantRequest, SessionOptions, ThirdParty, ThirdPartySync, TpcMode, TpcProgress, TpcReport,
};

use super::*;
use crate::dialer::{AsServer, Dialer, Report, Root};
use crate::policy::Use;

/// How long a client may stay silent on a third-party control connection before the
/// dialer gives up on it and stops the copy (it pings every [`session::HEARTBEAT`]).
const STEER_SILENCE: Duration =
    Duration::from_secs(session::HEARTBEAT.as_secs() * session::SILENT_INTERVALS as u64);

/// Nonces of the capabilities this server accepted, kept until they expire: a copy's
/// is accepted once, a sync's as many times as its scope allows ([`Scope::uses`]).
///
/// The set lives in memory, so a server would forget it at a restart, and a capability
/// it had accepted before could be used again while it lasts (at most an hour, and only
/// by the dialer, whose TLS key it names). So the nonces this server issues carry a tag
/// keyed by a secret of this process: half random, half a keyed BLAKE3 hash of that
/// half. A capability issued before a restart carries a tag the new process cannot make,
/// and is refused as such; every attempt of a copy asks for a new one, so a restart
/// costs a steering client nothing but the attempt it interrupted. Nothing is stored,
/// and the nonce keeps its size on the wire.
#[derive(Debug)]
pub(super) struct Nonces {
    taken: Mutex<HashMap<[u8; 16], Taken>>,
    key: [u8; 32],
}

impl Default for Nonces {
    fn default() -> Self {
        Nonces {
            taken: Mutex::default(),
            key: rand::random(),
        }
    }
}

/// A nonce's uses so far.
#[derive(Debug, Clone, Copy)]
struct Taken {
    /// Until when it is kept (its capability's expiry, or later: [`Nonces::ended`]).
    until: u64,
    /// Its capability's expiry.
    expires: u64,
    /// Sessions it opened.
    used: u8,
    /// Sessions it may open.
    uses: u8,
    /// Sessions under it running now.
    running: u8,
}

/// How long after its expiry a sync's capability may still open its later sessions
/// (while one runs, or within its lifetime after the last one ended): a bound on a
/// sync's push.
const SYNC_LIFETIME_SECS: u64 = 24 * 3600;

impl Nonces {
    /// A new nonce for a capability this process issues.
    pub(super) fn issue(&self) -> [u8; 16] {
        let mut n = [0u8; 16];
        n[..8].copy_from_slice(&rand::random::<[u8; 8]>());
        let tag = self.tag(&n[..8]);
        n[8..].copy_from_slice(&tag);
        n
    }

    /// Whether this process issued `nonce`.
    fn ours(&self, nonce: &[u8; 16]) -> bool {
        // Compared in constant time, though a tag guessed is worth nothing without
        // the issuer's signature over it.
        let tag = self.tag(&nonce[..8]);
        tag.iter()
            .zip(&nonce[8..])
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0
    }

    fn tag(&self, half: &[u8]) -> [u8; 8] {
        let h = blake3::keyed_hash(&self.key, half);
        let mut t = [0u8; 8];
        t.copy_from_slice(&h.as_bytes()[..8]);
        t
    }

    /// Takes `nonce` (of a capability valid until `expires`, allowing `uses`
    /// sessions) for a session that starts at `now`; `false` if it was used up.
    fn take(&self, nonce: [u8; 16], expires: u64, uses: u8, now: u64) -> bool {
        let mut m = self.taken.lock();
        m.retain(|_, t| t.until >= now || (t.running > 0 && t.used < t.uses && t.alive(now)));
        let t = m.entry(nonce).or_insert(Taken {
            until: expires,
            expires,
            used: 0,
            uses,
            running: 0,
        });
        if t.used >= t.uses {
            return false;
        }
        t.used += 1;
        t.running += 1;
        true
    }

    /// Whether a session under `nonce`, taken before and with uses left, may start
    /// at `now` after its capability's expiry: a sync's later session (its prune
    /// after a long push) while another runs or within the lifetime after the last
    /// ended.
    fn renewed(&self, nonce: [u8; 16], now: u64) -> bool {
        self.taken
            .lock()
            .get(&nonce)
            .is_some_and(|t| t.used < t.uses && t.alive(now) && (t.running > 0 || t.until >= now))
    }

    /// A session under `nonce` ended at `now`: a sync's capability with uses left
    /// stays good for `ttl` more seconds.
    pub(super) fn ended(&self, nonce: [u8; 16], now: u64, ttl: u64) {
        if let Some(t) = self.taken.lock().get_mut(&nonce) {
            t.running = t.running.saturating_sub(1);
            if t.used < t.uses {
                t.until = t.until.max(now + ttl);
            }
        }
    }
}

impl Taken {
    fn alive(&self, now: u64) -> bool {
        now <= self.expires + SYNC_LIFETIME_SECS
    }
}

/// What a client asks the dialer of a third-party copy: [`Op::ThirdParty`], or
/// [`Op::ThirdPartySync`] with a sync's options or filters.
pub(super) struct Steered {
    tp: ThirdParty,
    sync: Option<ThirdPartySync>,
}

impl Steered {
    pub(super) fn copy(tp: ThirdParty) -> Self {
        Steered { tp, sync: None }
    }

    pub(super) fn sync(s: ThirdPartySync) -> Self {
        Steered {
            tp: s.copy.clone(),
            sync: Some(s),
        }
    }
}

/// Seconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn refused(code: ErrorCode, what: impl Into<String>) -> Error {
    Error::refused(code, what)
}

fn cap_error(e: CapabilityError) -> Error {
    let code = match e {
        CapabilityError::WrongAddress { .. } => ErrorCode::PermissionDenied,
        _ => ErrorCode::Auth,
    };
    refused(code, format!("third-party copy refused: {e}"))
}

impl Server {
    /// Resolves `path` for a third-party copy: the user's rights as for a two-party
    /// session, and the export's `third_party` switch; with what the session uses, for
    /// the reload's re-check ([`crate::policy::watch`]).
    fn resolve_tpc(
        &self,
        policy: &Policy,
        grant: &Grant,
        path: &[u8],
        write: bool,
    ) -> Result<(Root, Use)> {
        let (export, base, rest, name) = policy.resolve(self.cfg.read_only, grant, path, write)?;
        if !export.third_party {
            let what = if export.name.is_empty() {
                "this server's export".to_string()
            } else {
                format!("export {:?}", export.name)
            };
            return Err(refused(
                ErrorCode::PermissionDenied,
                format!(
                    "{what} does not allow third-party copies (third_party = true in its config)"
                ),
            ));
        }
        let used = Use {
            path: path.to_vec(),
            write,
            export: export.clone(),
        };
        Ok(((base, rest.to_vec(), name), used))
    }

    /// The grant of a capability presented as credential by the TLS peer with key
    /// `peer_key`, or why it is refused (for the log; the client learns that it
    /// failed).
    pub(super) fn accept_capability(
        &self,
        policy: &Policy,
        c: &Capability,
        peer_key: Option<&str>,
    ) -> std::result::Result<Grant, String> {
        let g = dmover_net::capability::verify(c, self.identity.fingerprint())
            .map_err(|e| e.to_string())?;
        let Some(pk) = peer_key else {
            return Err("a capability without a TLS client certificate".into());
        };
        let now = unix_now();
        match g.check(now, pk) {
            Ok(()) => {}
            // A sync's later session, within the window its last one opened.
            Err(CapabilityError::Expired(_))
                if g.dialer == pk && self.nonces.renewed(g.nonce, now) => {}
            Err(e) => return Err(e.to_string()),
        }
        if !self.nonces.ours(&g.nonce) {
            return Err(
                "a capability issued before this server restarted: ask for a new one".into(),
            );
        }
        if !self.nonces.take(g.nonce, g.expires, g.scope.uses(), now) {
            return Err(CapabilityError::Replayed.to_string());
        }
        // The user's rights as they are now (a user removed since is refused); a reload
        // re-checks them as for any session (the user by name, no credential).
        let exports = match &policy.users {
            None => policy.all_exports(),
            Some(users) => users
                .values()
                .find(|u| u.name == g.user)
                .ok_or_else(|| format!("user {:?} of the capability is gone", g.user))?
                .exports
                .clone(),
        };
        Ok(Grant {
            login: g.user.clone(),
            user: g.user,
            proven: crate::access::Proven::Capability(g.nonce),
            exports,
            scope: Some(g.scope),
        })
    }

    /// Whether `op` is what the session's capability allows (always, without one).
    pub(super) fn check_scope(grant: &Grant, op: &Op) -> Result<()> {
        let Some(scope) = &grant.scope else {
            return Ok(());
        };
        let ok = match (scope, op) {
            (Scope::Push { dest }, Op::Push { dest: d }) => dest == d,
            (Scope::Pull { sources }, Op::Pull { sources: s }) => sources == s,
            // A sync's push goes into the mirror's parent, its one root named as the
            // mirror ([`Server::mirror_root`]).
            (Scope::Mirror { dest }, Op::Push { dest: d }) => {
                crate::dialer::mirror_dest(dest, false).is_ok_and(|(parent, _)| parent == *d)
            }
            (Scope::Mirror { dest }, Op::Prune(p)) => *dest == p.dest,
            (Scope::Mirror { dest }, Op::PruneKeep(p)) => *dest == p.prune.dest,
            (Scope::MirrorSource { source }, Op::Pull { sources }) => {
                sources.as_slice() == std::slice::from_ref(source)
            }
            (Scope::MirrorSource { source }, Op::Digests(d)) => *source == d.source,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(refused(
                ErrorCode::PermissionDenied,
                "the capability does not allow this session (another op or path)",
            ))
        }
    }

    /// `Options` behind `Open`, for the ops that are not sessions.
    pub(super) async fn options<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
    ) -> Result<SessionOptions> {
        let peer = ch.peer().to_string();
        match ch
            .recv_timeout(self.cfg.handshake_timeout, "options")
            .await?
        {
            Control::Options(o) => Ok(o),
            other => Err(session::unexpected(&peer, other, "Options")),
        }
    }

    /// [`Op::Grant`]: a capability for the dialer the client names, for a session the
    /// client could run itself. It names one address for the dialer: this server's own
    /// (`tpc_address`, else `local`, the address the client's connection reached it
    /// at), never one the client names (docs/third-party.md, "Trust").
    pub(super) async fn grant_capability<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: GrantRequest,
        local: Option<&str>,
    ) -> Result<()> {
        self.options(ch).await?;
        if grant.scope.is_some() {
            return Err(refused(
                ErrorCode::PermissionDenied,
                "a capability cannot ask for another",
            ));
        }
        let policy = self.policy.borrow().clone();
        match &req.scope {
            Scope::Push { dest } => {
                self.resolve_tpc(&policy, grant, dest, true)?;
            }
            Scope::Mirror { dest } => {
                crate::dialer::mirror_dest(dest, false)?;
                self.resolve_tpc(&policy, grant, dest, true)?;
            }
            Scope::Pull { sources } => {
                for p in sources {
                    self.resolve_tpc(&policy, grant, p, false)?;
                }
            }
            Scope::MirrorSource { source } => {
                self.resolve_tpc(&policy, grant, source, false)?;
            }
        }
        if !req.dialer.starts_with("sha256:") {
            return Err(refused(
                ErrorCode::Protocol,
                format!("{:?} is not a key fingerprint", req.dialer),
            ));
        }
        let Some(own) = self.cfg.tpc_address.as_deref().or(local) else {
            return Err(refused(
                ErrorCode::Unsupported,
                "this server knows no address of its own to name in a capability \
                 (tpc_address in its config)",
            ));
        };
        if req.addr != own {
            tracing::debug!(
                "{}: the client named this server {:?}; the capability names {own:?}",
                ch.peer(),
                req.addr
            );
        }
        let addrs = vec![own.to_string()];
        let ttl = self.cfg.tpc_capability_ttl.as_secs().min(cap::MAX_TTL_SECS);
        let g = cap::Grant {
            version: cap::GRANT_VERSION,
            issuer: self.identity.fingerprint().to_string(),
            addrs,
            dialer: req.dialer.clone(),
            user: grant.user.clone(),
            scope: req.scope,
            expires: unix_now() + ttl,
            nonce: self.nonces.issue(),
        };
        let c = dmover_net::capability::issue(&self.identity, &g)?;
        tracing::info!(
            "{}: capability for {} ({:?}) issued to user {:?}, valid {ttl} s",
            ch.peer(),
            g.dialer,
            g.scope,
            grant.user
        );
        ch.send(&Control::Capability(c)).await?;
        Ok(())
    }

    /// [`Op::ThirdParty`]: dials the other server with its capability and runs the
    /// session for the client, reporting progress to it; returns (bytes, files).
    pub(super) async fn third_party<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        open: &Open,
        steered: Steered,
        log: &mut SessionLog,
    ) -> Result<(u64, u64)> {
        let Steered { tp, sync } = steered;
        let options = self.options(ch).await?;
        if grant.scope.is_some() {
            return Err(refused(
                ErrorCode::PermissionDenied,
                "a capability cannot start a third-party copy",
            ));
        }
        let (g, target) = self.tpc_target(&tp)?;
        // The local paths, checked now and at every reload, as for any session.
        let policy = self.policy.borrow().clone();
        let write = tp.mode == TpcMode::Pull;
        if write && tp.paths.len() != 1 {
            return Err(refused(
                ErrorCode::Protocol,
                "a third-party pull names one destination",
            ));
        }
        let (roots, uses): (Vec<Root>, Vec<Use>) = tp
            .paths
            .iter()
            .map(|p| self.resolve_tpc(&policy, grant, p, write))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let mut opts = self.tpc_options(open, &options, write, &uses);
        match sync {
            Some(s) => sync_options(&mut opts, s, &g.scope, tp.mode)?,
            None if g.scope.uses() > 1 => {
                return Err(refused(
                    ErrorCode::Protocol,
                    "the capability's scope (a sync's) does not match the third-party copy",
                ));
            }
            None => {}
        }
        // This server's own limit for the user and the exports, paced on its side.
        if let Some((rate, by)) = super::session_bwlimit(&policy, grant, &uses) {
            tracing::info!(
                "third-party copy with {target}: limited to {} ({rate} bytes/s) by {by}",
                dmover_proto::units::format_rate(rate.saturating_mul(8))
            );
            log.bwlimit = Some(rate);
            opts.bwlimit = Some(rate);
        }
        let dialer = Dialer::as_server(
            opts,
            self.disk.clone(),
            AsServer {
                identity: self.identity.clone(),
                peer_key: tp.peer_key.clone(),
                capability: tp.capability.clone(),
                handshake_timeout: self.cfg.handshake_timeout,
            },
        );
        let run = Run::new();
        let direction = match tp.mode {
            TpcMode::Push => "third_party_sent",
            TpcMode::Pull => "third_party_received",
        };
        let live = self
            .monitor
            .start(ch.peer(), &grant.user, "third_party", direction);
        live.attach(&run.progress);
        log.live = Some(live);
        let _policy = crate::policy::watch(
            self.policy.subscribe(),
            self.cfg.read_only,
            run.clone(),
            grant.clone(),
            uses,
        );
        log.progress = Some(run.progress.clone());
        log.protection = Some(open.protection);
        let work = async {
            match (tp.mode, &g.scope) {
                (TpcMode::Push, Scope::Push { dest } | Scope::Mirror { dest }) => {
                    log.what = format!("third-party push of {} path(s) to {target}", roots.len());
                    dialer.push_roots(&roots, &target, dest, run.clone()).await
                }
                (TpcMode::Pull, Scope::MirrorSource { source }) => {
                    let (base, rest, _) = &roots[0];
                    log.what = format!("third-party sync from {target}");
                    let sources = std::slice::from_ref(source);
                    dialer
                        .pull_into(&target, sources, base, rest, run.clone())
                        .await
                }
                (TpcMode::Pull, Scope::Pull { sources }) => {
                    let (base, rest, _) = &roots[0];
                    log.what = format!("third-party pull from {target}");
                    dialer
                        .pull_into(&target, sources, base, rest, run.clone())
                        .await
                }
                _ => Err(refused(
                    ErrorCode::Protocol,
                    "the capability's scope does not match the third-party mode",
                )),
            }
        };
        let r = steer(ch, work, &run).await;
        let report = r.map_err(tpc_error)?;
        if let Some(why) = report.delete_refused {
            // Copied, but the mirror keeps what the source may still hold.
            return Err(refused(ErrorCode::Io, format!("sync --delete: {why}")));
        }
        if let Some(pruned) = report.pruned {
            // A sync's deletions at the destination, before the end (a client that
            // asked for a sync between servers reads it).
            ch.send(&Control::Pruned(pruned)).await?;
        }
        let (bytes, files) = (report.summary.bytes, report.summary.files);
        ch.send(&Control::TpcDone(TpcReport {
            summary: report.summary,
            totals: report.totals,
            streams: report.streams,
            chunk_size: report.chunk_size,
            held_bytes: report.held_bytes,
            held_files: report.held_files,
            chunks_resent: report.chunks_resent,
            streams_lost: report.streams_lost,
            attempts: report.attempts,
            failed: report.failed,
            dialer: String::new(),
        }))
        .await?;
        Ok((bytes, files))
    }

    /// The grant of a third-party copy's capability `tp` names, and the address to
    /// dial, checked before anything is dialed: the issuer's key is one this server
    /// trusts (`tpc_peers`; without it, the key the client pinned), the signature is
    /// the issuer's, the grant is for this server and alive, and the address is the
    /// one the issuer named for itself. So this server connects only to an address a
    /// server vouched for as its own, for this dialer.
    fn tpc_target(&self, tp: &ThirdParty) -> Result<(cap::Grant, String)> {
        let peers = &self.cfg.tpc_peers;
        if !peers.is_empty() && !peers.contains(&tp.peer_key) {
            return Err(refused(
                ErrorCode::PermissionDenied,
                format!(
                    "third-party copy refused: this server dials only the servers its \
                     tpc_peers names, and {} is not one",
                    tp.peer_key
                ),
            ));
        }
        let g = dmover_net::capability::verify(&tp.capability, &tp.peer_key).map_err(cap_error)?;
        g.check(unix_now(), self.identity.fingerprint())
            .and_then(|()| g.check_addr(&tp.peer))
            .map_err(cap_error)?;
        Ok((g, tp.peer.clone()))
    }

    /// The options of the session this server dials for a third-party copy: the
    /// client's `open` and `options`, this server's sockets and timeouts, no retry; a
    /// pull (`write`) keeps owners only where the exports `uses` keep them, as for a
    /// push to this server, and every xattr namespace goes where this server's exports
    /// say so (the other server's decide for its side).
    fn tpc_options(
        &self,
        open: &Open,
        options: &SessionOptions,
        write: bool,
        uses: &[Use],
    ) -> crate::session::TransferOptions {
        let mut opts = crate::session::TransferOptions {
            streams: open.streams.clamp(1, MAX_STREAMS),
            // The client's choice: a client that tunes (no `-P`) offers the feature,
            // and the session between the servers tunes as its own would.
            tune: open.features & dmover_proto::session::features::TUNING != 0,
            chunk_size: open.chunk_size,
            checksum: open.checksum,
            direct_io: open.direct_io,
            protection: open.protection,
            fsync: options.fsync,
            verify: options.verify,
            journal: options.journal,
            resume: options.resume,
            continue_on_error: options.continue_on_error,
            socket: self.cfg.socket.clone(),
            idle_timeout: self.cfg.idle_timeout,
            retries: 0,
            busy_wait: Duration::from_secs(10),
            chunk_delay: self.faults.chunk_delay,
            ..Default::default()
        };
        opts.meta.owner = !write || uses.iter().all(|u| u.export.preserve_owner);
        opts.meta.xattrs.all = uses.iter().all(|u| u.export.xattrs_all);
        opts
    }
}

/// A sync's options or filters `s` (of [`Op::ThirdPartySync`]) on the options `o` of
/// the session this server dials under a capability of scope `scope` in `mode`: a
/// sync's capability is a mirror's ([`Scope::Mirror`], `MirrorSource`), a filtered
/// copy's a copy's; the deletion options belong to a sync.
fn sync_options(
    o: &mut crate::session::TransferOptions,
    s: ThirdPartySync,
    scope: &Scope,
    mode: TpcMode,
) -> Result<()> {
    let fits = matches!(
        (s.mirror, mode, scope),
        (true, TpcMode::Push, Scope::Mirror { .. })
            | (true, TpcMode::Pull, Scope::MirrorSource { .. })
            | (false, TpcMode::Push, Scope::Push { .. })
            | (false, TpcMode::Pull, Scope::Pull { .. })
    );
    if !fits {
        return Err(refused(
            ErrorCode::Protocol,
            "the capability's scope does not match the third-party sync",
        ));
    }
    let deletes = s.delete || s.max_delete != u64::MAX;
    if !s.mirror && (deletes || s.checksum) {
        return Err(refused(
            ErrorCode::Protocol,
            "deleting and comparing content are options of a sync",
        ));
    }
    if s.delete && s.files_from.is_some() {
        return Err(refused(
            ErrorCode::Unsupported,
            "deleting with a list of files is not supported",
        ));
    }
    let filter = match &s.files_from {
        Some(list) => crate::session::filter_of_list(&s.rules, list)?,
        None => crate::session::filter_of_rules(&s.rules)?,
    };
    o.mirror = s.mirror;
    // A sync looks at the destination's files (size, mtime) as a resume does.
    o.resume |= s.mirror;
    o.delete = s.delete;
    o.max_delete = (s.max_delete != u64::MAX).then_some(s.max_delete);
    o.compare_content = s.checksum;
    o.filter = Some(std::sync::Arc::new(filter));
    o.rules = s.rules;
    o.files_from = s.files_from;
    Ok(())
}

/// Runs `work` (a third-party copy's session) while reporting its progress to the
/// steering client on `ch` every second and reading its pings; a client that goes
/// silent, goes away or sends an error fails `run`. Once the client is gone, its
/// connection is not read again (it would answer at once, forever) while the copy
/// winds down.
async fn steer<S, F>(ch: &mut ControlChannel<S>, work: F, run: &Run) -> Result<Report>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    F: std::future::Future<Output = Result<Report>>,
{
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut heard = tokio::time::Instant::now();
    let peer = ch.peer().to_string();
    let mut gone = false;
    loop {
        tokio::select! {
            r = &mut work => return r,
            _ = tick.tick() => {
                if heard.elapsed() > STEER_SILENCE {
                    run.fail(refused(ErrorCode::Aborted, format!("{peer} went silent")));
                    continue;
                }
                let p = &run.progress;
                let msg = Control::TpcProgress(TpcProgress {
                    bytes: p.bytes.load(Ordering::Relaxed),
                    total: p.total.load(Ordering::Relaxed),
                    held: p.held.load(Ordering::Relaxed),
                    streams_lost: p.streams_lost.load(Ordering::Relaxed),
                    attempt: p.attempt.load(Ordering::Relaxed),
                });
                if !gone && ch.send(&msg).await.is_err() {
                    gone = true;
                    run.fail(refused(ErrorCode::Aborted, format!("{peer} is gone")));
                }
            }
            msg = ch.recv(), if !gone => match msg {
                Ok(Control::Ping) => heard = tokio::time::Instant::now(),
                Ok(Control::Error(e)) => run.fail(Error::Remote {
                    peer: peer.clone(),
                    code: e.code,
                    message: e.message,
                }),
                Ok(other) => run.fail(session::unexpected(&peer, other, "Ping")),
                Err(_) => {
                    gone = true;
                    run.fail(refused(
                        ErrorCode::Aborted,
                        format!("{peer} closed the connection"),
                    ));
                }
            },
        }
    }
}

/// A third-party copy's failure `e`, as the steering client is told it (a failure
/// to reach the other server is already told without its cause:
/// [`crate::dialer::connect::peer_unreachable`]).
fn tpc_error(e: Error) -> Error {
    match e {
        // The other server's error goes to the client as this copy's, naming that
        // server (a `Remote` error is otherwise taken for the client's own, and not
        // sent back to it).
        Error::Remote {
            peer,
            code,
            message,
        } => refused(code, format!("{peer}: {message}")),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(scope: Option<Scope>) -> Grant {
        Grant {
            user: "alice".into(),
            login: "alice".into(),
            proven: crate::access::Proven::Nothing,
            exports: Default::default(),
            scope,
        }
    }

    #[test]
    fn a_capability_allows_its_one_session_only() {
        let push = Some(Scope::Push {
            dest: b"data/x".to_vec(),
        });
        let g = granted(push);
        assert!(
            Server::check_scope(
                &g,
                &Op::Push {
                    dest: b"data/x".to_vec()
                }
            )
            .is_ok()
        );
        for op in [
            Op::Push {
                dest: b"data/y".to_vec(),
            },
            Op::Push {
                dest: b"data".to_vec(),
            },
            Op::Pull {
                sources: vec![b"data/x".to_vec()],
            },
        ] {
            let e = Server::check_scope(&g, &op).unwrap_err();
            assert!(e.to_string().contains("does not allow this session"), "{e}");
        }
        let pull = granted(Some(Scope::Pull {
            sources: vec![b"a".to_vec(), b"b".to_vec()],
        }));
        assert!(
            Server::check_scope(
                &pull,
                &Op::Pull {
                    sources: vec![b"a".to_vec(), b"b".to_vec()]
                }
            )
            .is_ok()
        );
        assert!(
            Server::check_scope(
                &pull,
                &Op::Pull {
                    sources: vec![b"a".to_vec()]
                }
            )
            .is_err()
        );
        // A sync's: into the mirror's parent (the root named by the sink), prunes of
        // the mirror; from its one source, its digests. Nothing else.
        use dmover_proto::control::{Digests, Prune};
        let prune = |dest: &[u8]| {
            Op::Prune(Prune {
                dest: dest.to_vec(),
                rules: Vec::new(),
                max_delete: u64::MAX,
                dry_run: false,
                conflicts_only: false,
                checksum: false,
            })
        };
        let mirror = granted(Some(Scope::Mirror {
            dest: b"d/m".to_vec(),
        }));
        let push = |d: &[u8]| Op::Push { dest: d.to_vec() };
        assert!(Server::check_scope(&mirror, &push(b"d/")).is_ok());
        assert!(Server::check_scope(&mirror, &prune(b"d/m")).is_ok());
        for op in [
            push(b"d/m"),
            push(b"d"),
            push(b""),
            prune(b"d"),
            prune(b"d/m/x"),
        ] {
            assert!(Server::check_scope(&mirror, &op).is_err(), "{op:?}");
        }
        // A copy's capability prunes nothing.
        assert!(Server::check_scope(&g, &prune(b"data/x")).is_err());
        let source = granted(Some(Scope::MirrorSource {
            source: b"s".to_vec(),
        }));
        let digests = |s: &[u8]| Op::Digests(Digests { source: s.to_vec() });
        assert!(
            Server::check_scope(
                &source,
                &Op::Pull {
                    sources: vec![b"s".to_vec()]
                }
            )
            .is_ok()
        );
        assert!(Server::check_scope(&source, &digests(b"s")).is_ok());
        for op in [
            Op::Pull {
                sources: vec![b"s".to_vec(), b"t".to_vec()],
            },
            Op::Pull {
                sources: vec![b"t".to_vec()],
            },
            digests(b"t"),
            push(b""),
            prune(b"s"),
        ] {
            assert!(Server::check_scope(&source, &op).is_err(), "{op:?}");
        }
        assert!(Server::check_scope(&pull, &digests(b"a")).is_err());
        // Without a capability, the user's rights decide (elsewhere).
        assert!(Server::check_scope(&granted(None), &Op::Pull { sources: vec![] }).is_ok());
    }

    #[test]
    fn nonces_are_taken_once_and_forgotten_after_they_expire() {
        let n = Nonces::default();
        assert!(n.take([1; 16], 100, 1, 50));
        assert!(!n.take([1; 16], 100, 1, 60));
        assert!(n.take([2; 16], 100, 1, 60));
        // Past its expiry a nonce is dropped (a capability that old is refused as
        // expired before its nonce is looked at).
        assert!(n.take([1; 16], 300, 1, 200));
        assert_eq!(n.taken.lock().len(), 1);
    }

    /// A nonce is this process's: another process (a restarted server) does not
    /// take it for its own, nor does a nonce with its tag changed pass.
    #[test]
    fn nonces_issued_before_a_restart_are_not_ours() {
        let (before, after) = (Nonces::default(), Nonces::default());
        let n = before.issue();
        assert!(before.ours(&n));
        assert!(!after.ours(&n));
        let mut bent = n;
        bent[15] ^= 1;
        assert!(!before.ours(&bent));
        assert_ne!(before.issue(), n);
    }

    #[test]
    fn a_syncs_nonce_opens_its_sessions_while_one_runs_or_soon_after() {
        let n = Nonces::default();
        // Three uses: a prune, a push, a prune.
        assert!(n.take([1; 16], 100, 3, 50));
        n.ended([1; 16], 51, 60);
        assert!(n.take([1; 16], 100, 3, 52));
        // The push runs past the expiry: the prune after may come while it runs...
        assert!(n.renewed([1; 16], 5000));
        // ... and within the lifetime after it ended, not later.
        n.ended([1; 16], 6000, 60);
        assert!(n.renewed([1; 16], 6060));
        assert!(!n.renewed([1; 16], 6061));
        assert!(n.take([1; 16], 100, 3, 6060));
        // Used up (and once forgotten, its capability is refused as expired).
        assert!(!n.renewed([1; 16], 6060));
        assert!(!n.take([1; 16], 100, 3, 6060));
        n.ended([1; 16], 6061, 60);
        assert!(!n.renewed([1; 16], 6061));
        // A copy's nonce is never renewed.
        assert!(n.take([2; 16], 100, 1, 50));
        n.ended([2; 16], 51, 60);
        assert!(!n.renewed([2; 16], 101));
        // Nor a sync's past its lifetime, even with a session left running.
        assert!(n.take([3; 16], 100, 2, 50));
        assert!(n.renewed([3; 16], 100 + SYNC_LIFETIME_SECS));
        assert!(!n.renewed([3; 16], 101 + SYNC_LIFETIME_SECS));
    }
}
