//! A client's transfers: push, pull, a push whose manifest grows (`sync --watch`),
//! `sync --dry-run` and the memory test.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use dmover_net::join::JoinWait;
use dmover_proto::control::{ErrorCode, Op, Prune, PruneReport};
use dmover_proto::manifest::{Entry, EntryKind, Totals};
use dmover_store::paths::{self, Base};
use dmover_store::walk;
use tokio::sync::mpsc;

use super::Client;
use crate::dialer::{Report, failed_line, mirror_dest, now, same_content};
use crate::drive::{self, GrowPart};
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::memtest::{MemTestOptions, MemTestReport};
use crate::roles::{self, SourcePlan, SourceRole, WalkSpec};
use crate::session;
use dmover_proto::session::SourceSession;

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

impl Client {
    /// Copies local `sources` into `dest` on `server` (`host:port`).
    pub async fn push(
        &self,
        sources: &[Vec<u8>],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        self.dialer.push(sources, server, dest, run).await
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
        let spec = WalkSpec {
            filter,
            live: false,
            meta: None,
            ask_xattrs: false,
        };
        let walk = roles::walk(&self.disk, move || Ok(vec![root]), spec).await?;
        let tree = &walk.tree;
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
        // The first part is the root alone: an automatic chunk size is the default one
        // (the files of later parts are not known yet).
        let chunk = walk.chunk(self.opts.chunk_size);
        // Parts carry plain files (no links, no sparse list).
        let plan = SourcePlan {
            chunk,
            options: self.source_options(),
            streamed: false,
            links: false,
            report_skipped: false,
        };
        let mut source = SourceRole::new(walk, plan)?.store;
        source.set_grown_meta(self.opts.meta.xattrs, self.opts.meta.owner);
        let conn = tokio::select! {
            r = self.connect(server) => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let mut open = self.open_request(Op::Push { dest: parent }, chunk);
        open.features &= !dmover_proto::session::features::LINKS;
        let mut p = self.prepare(conn, server, open, false, JoinWait::Pipelined, &run);
        p.dial.limits = self.limits(false);
        let m = SourceSession::dial(now(), server, p.timing, p.dial);
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
        let task = tokio::spawn(async move {
            let r = drive::source_growing(m, &mut p.ch, p.joins, source, p.env, Some(rx)).await?;
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

    /// Copies the local `sources` into the local `dest` through the same session as
    /// a push or a pull, both halves in this process (no server, no listener: see
    /// `dialer/local.rs`).
    pub async fn local(&self, sources: &[Vec<u8>], dest: &[u8], run: Arc<Run>) -> Result<Report> {
        self.dialer.local(sources, dest, run).await
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

    /// The local `source` walked through the filters as the root of the mirror `dest`
    /// (named as the mirror; `local`: `dest` is a local path): what a sync from here
    /// would send.
    async fn walk_as_mirror(
        &self,
        source: &[u8],
        dest: &[u8],
        local: bool,
    ) -> Result<walk::Walked> {
        let (_, name) = mirror_dest(dest, local)?;
        let mut root = paths::source_root(&Base::Local, source, b"")?;
        root.name = name;
        let filter = self.opts.filter.clone().unwrap_or_default();
        Ok(self
            .disk
            .run(move || walk::walk_filtered(vec![root], &filter))
            .await
            .ok_or(Error::Aborted)??)
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
            let walked = self.walk_as_mirror(source, dest, false).await?;
            let entries = walked.tree.entries().to_vec();
            let compare = self.opts.compare_content;
            let req = Prune {
                dry_run: true,
                conflicts_only,
                checksum: compare,
                ..self.prune_request(dest, self.opts.max_delete)
            };
            let mut report = self.prune_keeping(server, &entries, req).await?;
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
        let remote = crate::remote::Remote::open(self, server, source).await?;
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
            quick: self.opts.quick_check,
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

    /// `dmover sync --dry-run` between two local paths: the local `source`'s walk,
    /// and what the local mirror `dest` holds unchanged and (with `--delete`) would
    /// delete, as [`Client::sync_dry_run`] finds them; nothing is changed.
    pub async fn sync_dry_run_local(&self, source: &[u8], dest: &[u8]) -> Result<DryRun> {
        if self.opts.compare_content {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "sync --checksum between two local paths is not supported yet",
            ));
        }
        let walked = self.walk_as_mirror(source, dest, true).await?;
        let entries = walked.tree.entries().to_vec();
        let opts = dmover_store::prune::PruneOptions {
            filter: self.opts.filter.as_deref().cloned().unwrap_or_default(),
            max_delete: self.opts.max_delete,
            dry_run: true,
            conflicts_only: !self.opts.delete,
            checksum: false,
            quick: self.opts.quick_check,
        };
        let (dest, listed) = (dest.to_vec(), entries.clone());
        let pruned = self
            .disk
            .run(move || {
                let Some((parent, name)) = paths::dest_parent(&Base::Local, &dest)? else {
                    return Ok(dmover_store::prune::Pruned::default());
                };
                dmover_store::prune::prune(&parent, &name, &listed, &opts)
            })
            .await
            .ok_or(Error::Aborted)??;
        Ok(DryRun {
            entries,
            report: session::prune_report(pruned),
            skipped: walked.skipped,
        })
    }

    /// `dmover cp --dry-run`: the manifest a copy of `sources` would send, through the
    /// filters. `server`: the sources are paths on it, listed through a request-driven
    /// session per source that asks for no data; else local paths, walked here. Nothing
    /// is changed anywhere.
    pub async fn copy_dry_run(&self, server: Option<&str>, sources: &[Vec<u8>]) -> Result<DryRun> {
        let Some(server) = server else {
            let roots = sources
                .iter()
                .map(|p| paths::source_root(&Base::Local, p, b""))
                .collect::<dmover_store::Result<Vec<_>>>()?;
            let filter = self.opts.filter.clone().unwrap_or_default();
            let walked = self
                .disk
                .run(move || walk::walk_filtered(roots, &filter))
                .await
                .ok_or(Error::Aborted)??;
            return Ok(DryRun {
                entries: walked.tree.entries().to_vec(),
                report: PruneReport::default(),
                skipped: walked.skipped,
            });
        };
        let mut entries: Vec<Entry> = Vec::new();
        for source in sources {
            let remote = crate::remote::Remote::open(self, server, source).await?;
            // Each source's manifest after the others', its parents renumbered.
            let offset = entries.len() as u32;
            entries.extend(remote.entries().iter().map(|e| {
                let mut e = e.clone();
                if e.parent != dmover_proto::manifest::NO_PARENT {
                    e.parent += offset;
                }
                if let EntryKind::HardLink { first } = &mut e.kind {
                    *first += offset;
                }
                e
            }));
            remote.close().await?;
        }
        Ok(DryRun {
            entries,
            report: PruneReport::default(),
            skipped: 0,
        })
    }

    /// Runs a memory-to-memory test against `server` (`host:port`) with this client's
    /// streams, chunk size (0: [`crate::memtest::DEFAULT_CHUNK`]), checksum setting and
    /// socket options.
    pub async fn memtest(
        &self,
        server: &str,
        t: &MemTestOptions,
        run: Arc<Run>,
    ) -> Result<MemTestReport> {
        crate::memtest::run(&self.dialer, server, t, run).await
    }
}
