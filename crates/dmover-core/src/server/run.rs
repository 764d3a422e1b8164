//! Running a session: admitted ([`super::admit`]), its role is set up as any side's
//! is ([`crate::roles`]) and driven over the control connection, the data streams the
//! join listener hands over, and the disk: a push's sink, a pull's source, or a
//! memory test's ends.

use std::time::Duration;

use dmover_net::control::ControlChannel;
use dmover_proto::control::{MemDirection, MemTest, Op, Open};
use dmover_proto::manifest::XattrScope;
use dmover_proto::session::{Limits, SinkSession, SourceSession, Timing, features};
use dmover_store::meta::MetaPolicy;
use dmover_store::source::SourceOptions;
use tokio::io::{AsyncRead, AsyncWrite};

use super::admit::{Admitted, Asked, PushDest};
use super::{Server, SessionLog, SessionPlace};
use crate::access::Grant;
use crate::drive;
use crate::error::{Error, Result};
use crate::roles::{Feed, MetaWant, SinkPlan, SourcePlan, SourceRole, SourceWalk};
use crate::session;
use dmover_proto::control::ErrorCode;

/// The clock a session's machine starts on: now, its timing, and the time by which
/// its set-up must be done.
fn clock(server: &Server) -> (std::time::Instant, Timing, std::time::Instant) {
    let now = tokio::time::Instant::now().into_std();
    let timing = drive::timing(session::HEARTBEAT, server.cfg.idle_timeout);
    (now, timing, now + server.cfg.handshake_timeout)
}

impl Server {
    /// A session's request after authentication: admitted, then run. `reported`: the
    /// session's machine told the client of its failure itself.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_session<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        open: Open,
        place: Option<SessionPlace<'_>>,
        peer: &str,
        grant: &Grant,
        conn: ([u8; 32], Option<Duration>),
        reported: &mut bool,
        log: &mut SessionLog,
    ) -> Result<()> {
        let mut asked = Asked::new(open, peer, grant);
        log.live = Some(
            self.monitor
                .start(peer, &grant.user, log.op, asked.direction()),
        );
        let policy = self.policy.borrow().clone();
        let mut paths = self.check_request(&policy, &asked)?;
        let walk = match paths.pull.take() {
            Some(roots) => Some(self.walk_pull(&mut asked, roots, paths.xattrs).await?),
            None => None,
        };
        let uses = std::mem::take(&mut paths.uses);
        let admitted = self
            .admit(&asked, walk.as_ref(), place, conn, &policy, uses, log)
            .await?;
        let (bytes, files) = match (
            std::mem::replace(
                &mut asked.open.op,
                Op::Pull {
                    sources: Vec::new(),
                },
            ),
            paths.push.take(),
            walk,
        ) {
            (Op::MemTest(m), _, _) => {
                log.what = format!("memory-to-memory test ({:?})", m.direction);
                self.run_memtest(ch, &m, &asked, admitted, reported).await?
            }
            (Op::Push { dest }, Some(to), _) => {
                log.what = format!("push to {:?}", String::from_utf8_lossy(&dest));
                self.run_push(ch, &asked, to, paths.xattrs, admitted, reported)
                    .await?
            }
            (Op::Pull { sources }, _, Some(walk)) => {
                log.what = format!("pull of {} path(s)", sources.len());
                self.run_pull(ch, &asked, walk, paths.xattrs, admitted, reported)
                    .await?
            }
            (op, _, _) => {
                return Err(Error::refused(
                    ErrorCode::Protocol,
                    format!("{op:?} is not a session"),
                ));
            }
        };
        log.done = Some((bytes, files));
        Ok(())
    }

    /// A push's sink: the destination in its export, the export's owners and
    /// extended attributes (`xattrs`), this server's manifest limits. Returns the
    /// bytes and files received.
    async fn run_push<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        asked: &Asked<'_>,
        to: PushDest,
        xattrs: XattrScope,
        admitted: Admitted<'_>,
        reported: &mut bool,
    ) -> Result<(u64, u64)> {
        let peer = asked.peer;
        let limits = Limits {
            max_entries: self.cfg.max_entries,
            max_manifest_bytes: self.cfg.max_manifest_bytes,
            xattrs,
        };
        let plan = SinkPlan {
            base: to.base,
            dest: to.dest,
            checksum: asked.open.checksum,
            direct_io: asked.open.direct_io,
            meta: MetaPolicy {
                xattrs,
                owner: to.preserve_owner,
            },
            root_name: None,
            prune_first: None,
            same: None,
            quick: Default::default(),
            // The client names a push's roots: they land in its destination; a sync
            // between servers has the one root its capability's mirror names.
            asked: match &asked.grant.scope {
                Some(dmover_proto::capability::Scope::Mirror { dest }) => {
                    Some(crate::roles::AskedRoots::of(std::slice::from_ref(dest)))
                }
                _ => None,
            },
        };
        let info = admitted.info.clone();
        let (joins, env, _held) = admitted.into_parts();
        let (now, timing, setup_by) = clock(self);
        let mut m = SinkSession::accept(now, peer, timing, limits, setup_by);
        m.grant(now, info);
        *reported = true;
        let r = drive::sink(m, ch, joins, plan.prepare(), None, env).await?;
        if r.stats.streams_lost > 0 {
            tracing::info!(
                "{peer}: {} data streams broke; {} chunks arrived twice",
                r.stats.streams_lost,
                r.stats.duplicates
            );
        }
        Ok((r.summary.bytes, r.summary.files))
    }

    /// A pull's source: the walk's tree in the session's chunks, its owners and
    /// extended attributes (`xattrs`, feature `METADATA`: read before the session's
    /// clock starts, docs/sync.md has the cost), the manifest whole, streamed in parts
    /// (feature `STREAMED`: the data flow from the first part on, instead of after
    /// the whole manifest crawled through TCP's slow start) or live. Returns the bytes
    /// and files sent.
    async fn run_pull<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        asked: &Asked<'_>,
        mut walk: SourceWalk,
        xattrs: XattrScope,
        admitted: Admitted<'_>,
        reported: &mut bool,
    ) -> Result<(u64, u64)> {
        let info = admitted.info.clone();
        let want = (info.features & features::METADATA != 0).then_some(MetaWant {
            scope: xattrs,
            owners: true,
        });
        let meta = walk.meta(want);
        let both = features::STREAMED | features::GROWING_MANIFEST;
        let plan = SourcePlan {
            chunk: info.chunk_size,
            options: SourceOptions {
                checksum: asked.open.checksum,
                direct_io: asked.open.direct_io,
                continue_on_error: false,
            },
            streamed: info.features & both == both,
            // A client without hard links gets each path of an inode whole.
            links: info.features & features::LINKS != 0,
            report_skipped: asked.report_skipped,
        };
        let role = SourceRole::new(walk, plan)?;
        let (joins, env, _held) = admitted.into_parts();
        let (now, timing, setup_by) = clock(self);
        let mut m = SourceSession::accept(now, asked.peer, timing, setup_by);
        m.grant(now, info);
        let feed = Feed {
            first_flight: false,
            run: env.run.clone(),
            peer: asked.peer.to_string(),
            owners: true,
            ended: None,
        };
        let (source, growth) = role.queue(&mut m, meta, feed);
        *reported = true;
        let r = drive::source_growing(m, ch, joins, source, env, growth).await?;
        Ok((r.summary.bytes, r.summary.files))
    }

    /// A memory test's end here ([`crate::memtest`]): the session must use the
    /// growing manifest. Returns the bytes sent or received (no files).
    async fn run_memtest<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        m: &MemTest,
        asked: &Asked<'_>,
        admitted: Admitted<'_>,
        reported: &mut bool,
    ) -> Result<(u64, u64)> {
        let info = admitted.info.clone();
        crate::memtest::check_features(info.features)?;
        let (joins, env, _held) = admitted.into_parts();
        let (now, timing, setup_by) = clock(self);
        let peer = asked.peer;
        let role = match m.direction {
            MemDirection::FromServer => {
                let mut s = SourceSession::accept(now, peer, timing, setup_by);
                s.grant(now, info);
                crate::memtest::ServeRole::Source(s)
            }
            MemDirection::ToServer => {
                let mut s = SinkSession::accept(now, peer, timing, Limits::default(), setup_by);
                s.grant(now, info);
                crate::memtest::ServeRole::Sink(s)
            }
        };
        *reported = true;
        let bytes = crate::memtest::serve(ch, m, role, asked.open.checksum, joins, env).await?;
        Ok((bytes, 0))
    }
}
