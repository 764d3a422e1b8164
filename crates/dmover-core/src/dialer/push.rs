//! A push's attempts: the local walk (live, or whole while the connection is made),
//! `sync`'s prunes and content comparison, and the source role driven to its end.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use dmover_net::join::JoinWait;
use dmover_proto::control::{ErrorCode, Keep, Op, Open, Prune, PruneKeep, PruneReport};
use dmover_proto::manifest::{Entry, EntryKind, Totals};
use dmover_proto::session::features::KEEP;
use dmover_store::paths;
use dmover_store::source::FileSource;

use super::{Connection, Dialer, Report, Root, failed_line, mirror_dest};
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::livewalk;
use crate::roles::{self, Feed, SourcePlan, SourceRole, SourceWalk, WalkSpec};

/// How long a connection set up while a push's walk runs may wait to be used: a walk
/// (and metadata read) that takes longer connects again once done (the server drops
/// a connection that does not authenticate within its handshake timeout, 30 s by
/// default).
const EARLY_CONNECTION_FRESH: Duration = Duration::from_secs(10);

/// Adds what a later prune did to an earlier one's counts.
pub(crate) fn merge_pruned(a: &mut PruneReport, b: PruneReport) {
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
pub(crate) fn same_content(
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

/// The paths of `entries`' entries `kept`, in manifest order (for
/// [`crate::engine::Progress::paths_held`]).
fn held_paths(entries: &[Entry], kept: &std::collections::HashSet<u32>) -> Vec<String> {
    let mut named: Vec<u32> = kept.iter().copied().collect();
    named.sort_unstable();
    named
        .into_iter()
        .map(|i| crate::session::entry_path(entries, i))
        .collect()
}

/// `e`, a server's answer to [`Op::PruneKeep`], with what a protocol error there most
/// likely means: a server older than the op (it cannot decode it, and changed
/// nothing). As for a sync between servers, the code is read, not the words.
fn older_than_keep(e: Error) -> Error {
    match e {
        Error::Remote {
            peer,
            code: ErrorCode::Protocol,
            message,
        } => Error::Remote {
            message: format!(
                "{message} (--size-only and --ignore-existing on a push need the server to \
                 speak protocol feature {KEEP}, \"{}\": upgrade {peer})",
                dmover_proto::session::features::name(KEEP)
            ),
            peer,
            code: ErrorCode::Protocol,
        },
        e => e,
    }
}

/// Why `sync --delete` must not delete after a transfer whose source listing missed
/// `skipped` entries and could not read `failed` files.
pub(crate) fn delete_refusal(skipped: u64, failed: usize) -> Option<String> {
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

impl Dialer {
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

    /// [`Op::Prune`] `req` on `server` against `entries`.
    pub(crate) async fn prune_remote(
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

    /// [`Dialer::prune_remote`] of a sync's check before its push, or of its dry run:
    /// with `--size-only` or `--ignore-existing` ([`TransferOptions::quick_check`]),
    /// [`Op::PruneKeep`] (offered with feature bit `KEEP`), whose answer lists in
    /// `unchanged` the files the mirror keeps, dry run or not.
    ///
    /// [`TransferOptions::quick_check`]: crate::session::TransferOptions::quick_check
    pub(crate) async fn prune_keeping(
        &self,
        server: &str,
        entries: &[Entry],
        req: Prune,
    ) -> Result<PruneReport> {
        use dmover_store::prune::QuickCheck;
        let keep = match self.opts.quick_check {
            QuickCheck::SizeAndMtime => return self.prune_remote(server, entries, req).await,
            QuickCheck::Size => Keep::SameSize,
            QuickCheck::Exists => Keep::Existing,
        };
        let conn = self.connect(server).await?;
        let mut open = self.open_request(Op::PruneKeep(PruneKeep { prune: req, keep }), 0);
        open.features |= KEEP;
        conn.prune(server, open, self.opts.session_options(false), entries)
            .await
            .map_err(older_than_keep)
    }

    /// A [`Prune`] request of the mirror `dest` with this client's filters.
    pub(crate) fn prune_request(&self, dest: &[u8], max_delete: Option<u64>) -> Prune {
        Prune {
            dest: dest.to_vec(),
            rules: self.opts.rules.clone(),
            max_delete: max_delete.unwrap_or(u64::MAX),
            dry_run: false,
            conflicts_only: false,
            checksum: false,
        }
    }

    /// One attempt of a push of `roots` into `dest` on `server`.
    pub(crate) async fn push_once(
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
        let mut dest = dest.to_vec();
        if self.opts.mirror {
            // `dmover sync`: the source becomes `dest` itself, in `dest`'s parent.
            let (parent, name) = mirror_dest(&dest, false)?;
            if let [root] = roots.as_mut_slice() {
                root.name = name;
            }
            dest = parent;
        }
        let delete = self.opts.mirror && self.opts.delete;
        let compare = self.opts.mirror && self.opts.compare_content;
        let keep = self.opts.mirror && self.opts.quick_check != Default::default();
        let (walk, mut early) = self.walk_push(roots, server, resume, &run).await?;
        if walk.filtered > 0 {
            tracing::info!("the filters left out {} entries", walk.filtered);
        }
        let walked = Walked {
            skipped: walk.skipped,
            totals: Totals::of(walk.tree.entries()),
        };
        let (mut walk, before) = match delete || compare || keep {
            true => (self.sync_before(server, mirror_path, walk, &run.progress)).await?,
            false => (walk, SyncBefore::default()),
        };
        // The round trip is the connection's made during the walk, when there is one.
        let rtt = early.as_ref().and_then(|(c, _)| c.rtt());
        let chunk = walk.chunk(self.opts.chunk_size);
        let tuned_start = walk.tuned_start(rtt);
        if walk.goes_on() {
            tracing::debug!(
                "the walk goes on: its first part of {} entries goes with {} walked",
                walk.tree.entries().len(),
                walk.sized().len()
            );
        }
        let progress = &run.progress;
        let entries = walk.tree.entries();
        progress.total.store(Totals::of(entries).bytes, Relaxed);
        progress
            .total_files
            .store(crate::engine::files_with_data(entries), Relaxed);
        progress.set_manifest(entries);
        let (fixed, threads) = (self.opts.buffers, self.disk.threads());
        let want = walk.buffers(chunk, threads);
        let buffers = Box::new(move |streams| fixed.unwrap_or_else(|| want(streams)));
        // Before connecting, as the walk: no connection idles while it is read (a
        // live walk read it with the entries).
        let meta = walk.meta(self.meta_want());
        // A large tree's manifest in parts (feature STREAMED), the first in the first
        // flight and the data from it on, where nothing at the server depends on the
        // whole: not on a resume or a sync (the files it holds are answered for the
        // first part only), nor with `--checksum`.
        let plan = SourcePlan {
            chunk,
            options: self.source_options(),
            streamed: !(resume || compare || self.opts.mirror),
            links: true,
            report_skipped: false,
        };
        let role = SourceRole::new(walk, plan)?;
        // A busy server may keep us waiting: an interrupt ends the wait.
        let conn = match early.take() {
            // Made while the walk ran, and not waiting too long since.
            Some((c, at)) if at.elapsed() < EARLY_CONNECTION_FRESH => c,
            _ => tokio::select! {
                r = self.connect(server) => r?,
                _ = run.cancelled() => return Err(Error::Aborted),
            },
        };
        let open = self.push_open(dest, chunk, &role);
        // `--checksum`: the manifest holds only files whose content differs (or that
        // the destination lacks), and the quick check (same size and mtime: held)
        // must not skip them, so the session does not resume (a retry sends the
        // reduced manifest again whole).
        let resume = resume && !compare;
        let early = conn.early(resume, open.streams);
        let mut p = self.prepare(conn, server, open, resume, JoinWait::Pipelined, &run);
        p.dial.limits = self.limits(false);
        let mut m = Connection::push_machine(early, server, p.timing, p.dial);
        let (tell, walk_ended) = match role.live() {
            true => Some(tokio::sync::oneshot::channel()).unzip(),
            false => (None, None),
        };
        let feed = Feed {
            first_flight: true,
            run: run.clone(),
            peer: server.to_string(),
            owners: self.opts.meta.owner,
            ended: tell,
        };
        let (source, growth) = role.queue(&mut m, meta, feed);
        let env = drive::Env {
            tuned_start,
            buffers,
            ..p.env
        };
        // The first chunks follow the joins' proofs without waiting for the answers
        // (checked by each stream before anything it receives).
        let r = drive::source_growing(m, &mut p.ch, p.joins, source, env, growth).await?;
        let after = AfterPush {
            walked,
            before,
            walk_ended,
            delete,
        };
        self.push_report(server, mirror_path, r, after).await
    }

    /// A push's `Open` of `role` into `dest`, in `chunk`-byte chunks. The options and
    /// the whole manifest follow the first flight at once: the server reads them once
    /// it has opened the session (with the chunk size we asked for; a server never
    /// changes a push's).
    fn push_open(&self, dest: Vec<u8>, chunk: u32, role: &SourceRole) -> Open {
        use dmover_proto::session::features::{PART_CHUNKS, STREAMED, WALKING};
        let mut open = self.open_request(Op::Push { dest }, chunk);
        if role.streamed() {
            open.features |= STREAMED;
        }
        if role.live() {
            // Its later parts may hold hard links and holes, if `Session` grants it.
            open.features |= STREAMED | WALKING;
        }
        if (role.streamed() || role.live()) && self.opts.chunk_size == 0 {
            // Later parts in chunks of their own size, if `Session` grants it (not
            // when `--chunk` pinned the size).
            open.features |= PART_CHUNKS;
        }
        open
    }

    /// A push's walk of `roots`, with the connection to `server` made meanwhile when
    /// there is nothing to do between the two.
    ///
    /// The connection (TCP, TLS, the data connections dialed ahead) is set up while
    /// the tree is walked: on a long link that is two round trips off every push, and
    /// off a re-run that sends nothing even more in proportion. Not with `--delete` or
    /// `--checksum`, whose prune request comes between the walk and the session.
    /// Whether the files have extended attributes is asked by the walk's threads,
    /// beside their `stat`, when the metadata read after the walk would ask it.
    ///
    /// A fresh push's walk runs live (feature WALKING, docs/protocol.md "Live walk"):
    /// a large tree's manifest goes in parts as the walk finds them, the data from the
    /// first part on, instead of after the whole walk. Not on a resume, a sync or with
    /// `--checksum`, where the server answers for what it holds of the first part
    /// only.
    async fn walk_push(
        &self,
        roots: Vec<paths::SourceRoot>,
        server: &str,
        resume: bool,
        run: &Run,
    ) -> Result<(SourceWalk, Option<(Connection, tokio::time::Instant)>)> {
        let o = &self.opts;
        let sync_first =
            o.mirror && (o.delete || o.compare_content || o.quick_check != Default::default());
        let want = self.meta_want();
        let spec = WalkSpec {
            filter: o.filter.as_deref().cloned().unwrap_or_default(),
            live: !(sync_first || resume || o.mirror),
            meta: want.map(|w| w.scope),
            ask_xattrs: want.is_some_and(|w| w.scope.user || w.scope.acls || w.scope.all),
        };
        let walking = roles::walk(&self.disk, move || Ok(roots), spec);
        match sync_first {
            true => Ok((walking.await?, None)),
            false => self.walk_connected(walking, server, run).await,
        }
    }

    /// `sync --delete` and `--checksum` before a push's session, with the walk's
    /// manifest: entries of another kind where the source's go (a directory where a
    /// file comes, or the reverse) are deleted first, the rest once all is in place;
    /// the destination's digests of its files of the right size leave out of the
    /// manifest those it holds with the same content.
    async fn sync_before(
        &self,
        server: &str,
        mirror: &[u8],
        mut walk: SourceWalk,
        progress: &crate::engine::Progress,
    ) -> Result<(SourceWalk, SyncBefore)> {
        let delete = self.opts.delete;
        let compare = self.opts.compare_content;
        let mut before = SyncBefore::default();
        let req = Prune {
            dry_run: !delete,
            conflicts_only: true,
            checksum: compare,
            ..self.prune_request(mirror, self.opts.max_delete)
        };
        let mut r = self.prune_keeping(server, walk.tree.entries(), req).await?;
        let digests = std::mem::take(&mut r.digests);
        // `--size-only`, `--ignore-existing`: the files the mirror keeps as they are.
        let kept = match self.opts.quick_check != Default::default() {
            true => std::mem::take(&mut r.unchanged),
            false => Vec::new(),
        };
        if delete {
            before.pruned = Some(r);
            before.full = Some(walk.tree.entries().to_vec());
        }
        if !kept.is_empty() {
            let kept: std::collections::HashSet<u32> = kept
                .iter()
                .flat_map(|r| r.first..r.first.saturating_add(r.count))
                .filter(|&i| {
                    walk.tree
                        .entries()
                        .get(i as usize)
                        .is_some_and(|e| matches!(e.kind, EntryKind::File { .. }))
                })
                .collect();
            let entries = walk.tree.entries();
            // Counted as the sink counts what it holds: files with data.
            for &i in &kept {
                let size = entries[i as usize].file_size();
                before.same_files += u64::from(size > 0);
                before.same_bytes += size;
            }
            progress.paths_held(held_paths(entries, &kept));
            tracing::info!(
                "{} files stay as the destination holds them ({})",
                kept.len(),
                match self.opts.quick_check {
                    dmover_store::prune::QuickCheck::Size => "--size-only",
                    _ => "--ignore-existing",
                }
            );
            walk.tree = walk.tree.without(&kept);
        }
        if digests.is_empty() {
            return Ok((walk, before));
        }
        let tree = walk.tree;
        let (tree, same) = self
            .disk
            .run(move || same_content(tree, &digests))
            .await
            .ok_or(Error::Aborted)?;
        for &i in &same {
            before.same_files += 1;
            before.same_bytes += tree.entries()[i as usize].file_size();
        }
        progress.paths_held(held_paths(tree.entries(), &same));
        walk.tree = tree;
        if !same.is_empty() {
            tracing::info!(
                "{} files hold the same content at the destination",
                before.same_files
            );
            walk.tree = walk.tree.without(&same);
        }
        Ok((walk, before))
    }

    /// A finished push's report; with `--delete`, what the destination holds that the
    /// source does not is deleted now (every file is verified and under its final
    /// name: the sink's `Done`), unless the source's listing was incomplete.
    async fn push_report(
        &self,
        server: &str,
        mirror: &[u8],
        r: drive::SourceRun<FileSource>,
        after: AfterPush,
    ) -> Result<Report> {
        let AfterPush {
            walked: Walked {
                mut skipped,
                mut totals,
            },
            before,
            walk_ended,
            delete,
        } = after;
        if let Some(mut ended) = walk_ended {
            // A live walk: what it left out came with its last part, and the totals
            // are those of every part.
            let e = ended.try_recv().unwrap_or_default();
            if e.filtered > 0 {
                tracing::info!("the filters left out {} entries", e.filtered);
            }
            skipped = e.skipped;
            totals = Totals::of(r.store.tree().entries());
        }
        let failed = r.store.failed();
        let SyncBefore {
            mut pruned,
            full,
            same_files,
            same_bytes,
        } = before;
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
                let max = self
                    .opts
                    .max_delete
                    .map(|m| m.saturating_sub(pruned.as_ref().map_or(0, |p| p.deleted)));
                let req = self.prune_request(mirror, max);
                let after = self.prune_remote(server, &listed, req).await?;
                merge_pruned(pruned.get_or_insert_with(Default::default), after);
            }
        }
        Ok(Report {
            summary: r.summary,
            totals,
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
    /// ([`HANDSHAKE_TIMEOUT`](crate::session::HANDSHAKE_TIMEOUT)). A failed walk is
    /// its error, the connection dropped; a failed connection is the error, as it
    /// would have been after the walk.
    async fn walk_connected<F, T>(
        &self,
        walking: F,
        server: &str,
        run: &Run,
    ) -> Result<(T, Option<(Connection, tokio::time::Instant)>)>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let connecting = self.connect(server);
        tokio::pin!(walking, connecting);
        let mut early = None;
        let walked = loop {
            tokio::select! {
                w = &mut walking => break w?,
                c = &mut connecting, if early.is_none() => {
                    early = Some(c.map(|c| (c, tokio::time::Instant::now())));
                }
                _ = run.cancelled() => return Err(Error::Aborted),
            }
        };
        let conn = match early {
            Some(Ok(c)) => c,
            Some(Err(e)) => return Err(e),
            None => tokio::select! {
                c = connecting => (c?, tokio::time::Instant::now()),
                _ = run.cancelled() => return Err(Error::Aborted),
            },
        };
        Ok((walked, Some(conn)))
    }
}

/// What a push's walk found, as its report gives it (a live walk's is replaced by
/// what it found by its end).
struct Walked {
    /// Entries the walk skipped.
    skipped: u64,
    /// The whole walk's totals (before `--checksum` left files out).
    totals: Totals,
}

/// What `sync --delete` and `--checksum` did before a push's session
/// ([`Dialer::sync_before`]).
#[derive(Default)]
struct SyncBefore {
    /// What was deleted (`--delete`).
    pruned: Option<PruneReport>,
    /// The whole walk's manifest, which the mirror holds once the push is done
    /// (`--delete`).
    full: Option<Vec<Entry>>,
    /// Files (and their bytes) the destination holds with the same content.
    same_files: u64,
    same_bytes: u64,
}

/// What a push's report needs besides the run ([`Dialer::push_report`]).
struct AfterPush {
    walked: Walked,
    before: SyncBefore,
    /// A live walk tells what it left out by its end.
    walk_ended: Option<tokio::sync::oneshot::Receiver<livewalk::Ended>>,
    /// `sync --delete`.
    delete: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_protocol_error_to_prune_keep_names_the_feature_and_the_server() {
        let remote = |code| Error::Remote {
            peer: "dtn1:7700".into(),
            code,
            message: "unknown variant".into(),
        };
        let e = older_than_keep(remote(ErrorCode::Protocol)).to_string();
        assert!(e.contains("protocol feature 8192"), "{e}");
        assert!(e.contains("upgrade dtn1:7700"), "{e}");
        assert!(e.contains("unknown variant"), "{e}");
        // Other errors are left as they came.
        let e = older_than_keep(remote(ErrorCode::ReadOnly)).to_string();
        assert!(!e.contains("upgrade"), "{e}");
    }
}
