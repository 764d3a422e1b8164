//! Copies between two servers: steered (the data go from one server to the other
//! directly; this client asks for the capability and follows the progress) or relayed
//! through this client (`cp --via-client`).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use dmover_net::join::JoinWait;
use dmover_proto::capability::Scope;
use dmover_proto::control::{
    Control, ErrorCode, GrantRequest, Op, ThirdParty, ThirdPartySync, TpcMode,
};
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::session::features::SYNC_BETWEEN;
use dmover_proto::session::{Limits, SinkSession};
use dmover_store::Source;

use super::Client;
use crate::dialer::{Connection, Relayed, Report, failed_line, now};
use crate::diskpool::DiskPool;
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::session::{self, HANDSHAKE_TIMEOUT};

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

impl Client {
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
        let scope = self.tpc_scope(c)?;
        let dialer_key = d.server_key.clone();
        let acceptor_key = a.server_key.clone();
        let capability = self
            .grant_on(a, acceptor, acceptor, scope, &dialer_key)
            .await?;
        let paths = match c.mode {
            TpcMode::Push => c.sources.clone(),
            TpcMode::Pull => vec![c.dest.clone()],
        };
        // The dialer dials the address the acceptor named for itself in the
        // capability (the one this client used, if it is that one).
        let peer = dmover_proto::capability::Grant::decode(&capability.grant)
            .ok()
            .and_then(|g| {
                let named = g.addrs.iter().any(|x| x == acceptor);
                if named {
                    Some(acceptor.clone())
                } else {
                    g.addrs.first().cloned()
                }
            })
            .unwrap_or_else(|| acceptor.clone());
        let tp = ThirdParty {
            mode: c.mode,
            peer,
            peer_key: acceptor_key,
            capability,
            paths,
        };
        self.steer_on(d, dialer, self.tpc_op(tp), run, resume).await
    }

    /// The scope of the capability of copy `c`: a sync's (this client's options say
    /// `mirror`) is its mirror's, the few sessions of one sync on the acceptor.
    fn tpc_scope(&self, c: &ThirdPartyCopy) -> Result<Scope> {
        Ok(match (c.mode, self.opts.mirror) {
            (TpcMode::Push, false) => Scope::Push {
                dest: c.dest.clone(),
            },
            (TpcMode::Pull, false) => Scope::Pull {
                sources: c.sources.clone(),
            },
            (TpcMode::Push, true) => Scope::Mirror {
                dest: c.dest.clone(),
            },
            (TpcMode::Pull, true) => match c.sources.as_slice() {
                [source] => Scope::MirrorSource {
                    source: source.clone(),
                },
                _ => {
                    return Err(Error::refused(
                        ErrorCode::Unsupported,
                        "a sync takes one source",
                    ));
                }
            },
        })
    }

    /// The op asking the dialer for `tp`: with a sync's options or filters,
    /// [`Op::ThirdPartySync`] (docs/third-party.md, "Sync between servers").
    fn tpc_op(&self, tp: ThirdParty) -> Op {
        let o = &self.opts;
        if !o.mirror && o.rules.is_empty() && o.files_from.is_none() {
            return Op::ThirdParty(tp);
        }
        Op::ThirdPartySync(ThirdPartySync {
            copy: tp,
            mirror: o.mirror,
            delete: o.mirror && o.delete,
            max_delete: o.max_delete.unwrap_or(u64::MAX),
            checksum: o.mirror && o.compare_content,
            rules: o.rules.clone(),
            files_from: o.files_from.clone(),
        })
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
        let inwards = self.on_disk(Arc::new(DiskPool::new(2, "dmover-relay-in")));
        let outwards = self.on_disk(Arc::new(DiskPool::new(2, "dmover-relay-out")));
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
        // Both sessions resume or neither does (B's answer is the pull's). With
        // continue-on-error A marks the files it cannot read, and the markers go on to
        // B, which drops those files.
        let (tx, rx) = tokio::sync::oneshot::channel::<(Vec<Entry>, u32)>();
        let pulling = async {
            let conn = tokio::select! {
                r = self.connect(from) => r?,
                _ = run.cancelled() => return Err(Error::Aborted),
            };
            let open = self.open_request(
                self.pull_op(c.sources.clone(), false)?,
                self.opts.chunk_size,
            );
            let mut p = inwards.prepare(conn, from, open, resume, JoinWait::Answer, &inbound);
            p.dial.limits = self.limits(true);
            let m = SinkSession::dial(now(), from, p.timing, Limits::default(), p.dial);
            let (checksum, r, name) = (self.opts.checksum, ring.clone(), from.to_string());
            // A's roots must be those asked for: they are named so at B.
            let asked = crate::roles::AskedRoots::of(&c.sources);
            let prepare: drive::Prepare<RelaySink> = Box::new(move |entries, chunk, _| {
                asked.check(&entries)?;
                r.set_cap(cap.max(2 * chunk as usize));
                let sink = RelaySink::new(entries.clone(), chunk, checksum, r, &name)?;
                let _ = tx.send((entries, chunk));
                Ok(sink)
            });
            drive::sink(m, &mut p.ch, p.joins, prepare, Some(p.options), p.env).await
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
                let conn = tokio::select! {
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
                let mut p = outwards.prepare(conn, to, open, resume, JoinWait::Pipelined, &run);
                p.dial.limits = self.limits(false);
                let mut m = Connection::push_machine(early, to, p.timing, p.dial);
                m.push_manifest(&entries);
                m.end_manifest(totals, drive::chunk_set(source.chunks()));
                let r = drive::source(m, &mut p.ch, p.joins, source, p.env).await?;
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
        Ok(relay_report(sent, pulled, &entries, ring.peak() as u64))
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
        self.request_capability_naming(acceptor, acceptor, scope, dialer_key)
            .await
    }

    /// [`Client::request_capability`], naming the acceptor `named` in the request (a
    /// client names the address it reached it at; the acceptor names only its own in
    /// the capability, whatever the request says).
    pub async fn request_capability_naming(
        &self,
        acceptor: &str,
        named: &str,
        scope: Scope,
        dialer_key: &str,
    ) -> Result<dmover_proto::capability::Capability> {
        let a = self.connect(acceptor).await?;
        self.grant_on(a, acceptor, named, scope, dialer_key).await
    }

    async fn grant_on(
        &self,
        a: Connection,
        acceptor: &str,
        named: &str,
        scope: Scope,
        dialer_key: &str,
    ) -> Result<dmover_proto::capability::Capability> {
        let sync = matches!(scope, Scope::Mirror { .. } | Scope::MirrorSource { .. });
        let grant = Op::Grant(GrantRequest {
            scope,
            dialer: dialer_key.to_string(),
            addr: named.to_string(),
        });
        let mut open = self.open_request(grant, 0);
        if sync {
            open.features |= SYNC_BETWEEN;
        }
        let asked = async {
            let mut ach = a
                .request(acceptor, open, self.opts.session_options(false))
                .await?;
            Ok::<_, Error>(ach.recv_timeout(HANDSHAKE_TIMEOUT, "capability").await?)
        };
        match asked.await.map_err(|e| older(e, sync))? {
            Control::Capability(c) => Ok(c),
            // An error answer too.
            other => Err(older(
                session::unexpected(acceptor, other, "Capability"),
                sync,
            )),
        }
    }

    /// Asks `dialer` to run the third-party session `tp` and follows it to its end (the
    /// second half of [`Client::third_party`]).
    pub async fn steer(&self, dialer: &str, tp: ThirdParty, run: Arc<Run>) -> Result<Report> {
        let d = self.connect(dialer).await?;
        self.steer_on(d, dialer, self.tpc_op(tp), run, self.opts.resume)
            .await
    }

    async fn steer_on(
        &self,
        d: Connection,
        dialer: &str,
        op: Op,
        run: Arc<Run>,
        resume: bool,
    ) -> Result<Report> {
        let sync = matches!(op, Op::ThirdPartySync(_));
        let mut open = self.open_request(op, self.opts.chunk_size);
        if sync {
            open.features |= SYNC_BETWEEN;
        }
        let mut heard = false;
        let r = self.follow(d, dialer, open, run, resume, &mut heard).await;
        // An error before any progress: maybe a server older than the op.
        r.map_err(|e| if heard { e } else { older(e, sync) })
    }

    /// Sends `open` to `dialer` and follows the third-party copy it asks for to its
    /// end; `heard`: the dialer reported progress (it took the request).
    async fn follow(
        &self,
        d: Connection,
        dialer: &str,
        open: dmover_proto::control::Open,
        run: Arc<Run>,
        resume: bool,
        heard: &mut bool,
    ) -> Result<Report> {
        let mut ch = d
            .request(dialer, open, self.opts.session_options(resume))
            .await?;
        let mut ping = tokio::time::interval(self.opts.heartbeat);
        let silence = self.opts.heartbeat * session::SILENT_INTERVALS;
        let p = &run.progress;
        let mut pruned = None;
        loop {
            tokio::select! {
                _ = run.cancelled() => {
                    let _ = ch.send(&Control::Error(Error::Aborted.to_msg())).await;
                    return Err(Error::Aborted);
                }
                _ = ping.tick() => ch.send(&Control::Ping).await?,
                msg = ch.recv_timeout(silence, "progress") => match msg? {
                    Control::Pruned(r) => {
                        // A sync's deletions at the destination (before `TpcDone`).
                        *heard = true;
                        pruned = Some(r);
                    }
                    Control::TpcProgress(t) => {
                        *heard = true;
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
                            pruned,
                            delete_refused: None,
                            relayed: None,
                        });
                    }
                    other => return Err(session::unexpected(dialer, other, "TpcProgress")),
                },
            }
        }
    }
}

/// `e`, a server's answer to a request of a sync between servers (`sync`), with what
/// a protocol error there most likely means: a server older than the request (it
/// cannot decode it, and copies nothing).
fn older(e: Error, sync: bool) -> Error {
    match e {
        Error::Remote {
            peer,
            code: ErrorCode::Protocol,
            message,
        } if sync => Error::Remote {
            message: format!(
                "{message} (a sync or filtered copy between two servers needs both to \
                 speak it, protocol feature {SYNC_BETWEEN}, \"{}\": upgrade {peer})",
                dmover_proto::session::features::name(SYNC_BETWEEN)
            ),
            peer,
            code: ErrorCode::Protocol,
        },
        e => e,
    }
}

/// A relay's report: what B did and A could not read, from the push to B (`sent`)
/// and the pull from A (`pulled`) of `entries`; `peak`: the most bytes of chunks the
/// ring held at once.
fn relay_report(
    sent: drive::SourceRun<crate::relay::RelaySource>,
    pulled: drive::SinkRun<crate::relay::RelaySink>,
    entries: &[Entry],
    peak: u64,
) -> Report {
    Report {
        summary: sent.summary,
        totals: Totals::of(entries),
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
            .map(|f| failed_line(entries, f))
            .collect(),
        pruned: None,
        delete_refused: None,
        relayed: Some(Relayed {
            bytes_received: 0,
            peak_buffered: peak,
        }),
    }
}
