//! A push's attempts: the local walk (live, or whole while the connection is made),
//! `sync`'s prunes and content comparison, and the source role driven to its end.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use dmover_proto::control::{Op, Prune, PruneReport};
use dmover_proto::manifest::{Entry, Totals};
use dmover_store::Source;
use dmover_store::paths;
use dmover_store::source::FileSource;
use dmover_store::walk;
use tokio::sync::mpsc;

use super::{Connection, Dialer, Report, Root, failed_line, mirror_dest};
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::livewalk;
use crate::session;
use dmover_net::join::JoinWait;

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
    /// ([`HANDSHAKE_TIMEOUT`](crate::session::HANDSHAKE_TIMEOUT)). A failed walk is returned without a connection; a
    /// failed connection is the error, as it would have been after the walk.
    pub(crate) async fn walk_connected<F, T>(
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
}
