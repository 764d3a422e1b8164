//! A pull's attempts: the request (with the client's filters or `--files-from` list),
//! `sync --checksum`'s comparison, the sink role driven to its end, and `--delete`.

use std::sync::Arc;

use dmover_net::join::JoinWait;
use dmover_proto::control::{self, Control, ErrorCode, FailedFile, Op, Open};
use dmover_proto::manifest::Totals;
use dmover_proto::session::{Limits, SinkSession};
use dmover_store::paths::{self, Base};
use dmover_store::prune::PruneOptions;
use dmover_store::sink::FileSink;
use dmover_store::walk;

use super::push::{delete_refusal, merge_pruned, same_content};
use super::{Dialer, Report, failed_line, mirror_dest, now};
use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::roles::{AskedRoots, PruneFirst, SinkPlan};
use crate::session;

/// What [`Dialer::same_remote_content`] found: the files (paths below the mirror's
/// root) the destination holds with the source's content.
#[derive(Debug, Default)]
pub(crate) struct SameContent {
    pub(crate) paths: std::collections::HashSet<Vec<u8>>,
    pub(crate) files: u64,
    pub(crate) bytes: u64,
}

impl Dialer {
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
            .await?;
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
    pub(crate) async fn same_remote_content(
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
    /// walks through them), with a `--files-from` list [`Op::PullListed`] (both in
    /// protocol version 8's base: docs/protocol.md, "Versioning").
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

    /// One attempt of a pull into `dest` under `base`. `same`: `sync --checksum`'s
    /// files (paths below the mirror's root) the destination holds with the source's
    /// content.
    pub(crate) async fn pull_once(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        (base, dest): (&Base, &[u8]),
        run: Arc<Run>,
        resume: bool,
        same: Option<Arc<std::collections::HashSet<Vec<u8>>>>,
    ) -> Result<Report> {
        // A busy server may keep us waiting: an interrupt ends the wait.
        let conn = tokio::select! {
            r = self.connect(server) => r?,
            _ = run.cancelled() => return Err(Error::Aborted),
        };
        let mut open = self.pull_open(sources, resume, same.is_some())?;
        // Early data (protocol version 8), on the terms of a push's (`push_once`): the
        // data streams join with the first flight, and the server sends from its
        // manifest's end, a round trip before this side's `Go` would have let it.
        let early_id = conn.early(resume, open.streams);
        if early_id.is_some() {
            open.features |= dmover_proto::session::features::EARLY;
        }
        let mut p = self.prepare(conn, server, open, resume, JoinWait::Answer, &run);
        p.dial.limits = self.limits(true);
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
                p.joins.set_session(id, &salt);
                SinkSession::dial_early(now(), server, p.timing, limits, p.dial, id, salt)
            }
            None => SinkSession::dial(now(), server, p.timing, limits, p.dial),
        };
        let (mut plan, pruned_first) = self.pull_sink(base, dest, same)?;
        // Only the roots asked for are taken: the server does not choose names here.
        plan.asked = Some(AskedRoots::of(sources));
        let prepare = plan.prepare();
        let r = drive::sink(m, &mut p.ch, p.joins, prepare, Some(p.options), p.env).await?;
        self.pull_report(r, (base, dest), pruned_first).await
    }

    /// A pull's `Open` of `sources`. The server may send its manifest in parts, data
    /// flowing from the first on, where nothing here depends on the whole of it: not
    /// on a resume or a sync (the files held are answered for the first part only),
    /// nor with `sync --checksum`'s files held (`same`). The server may also cut them
    /// from its walk while it runs (`WALKING`), hard links and files with holes in
    /// later parts.
    pub(super) fn pull_open(&self, sources: &[Vec<u8>], resume: bool, same: bool) -> Result<Open> {
        use dmover_proto::session::features::{PART_CHUNKS, STREAMED, WALKING};
        let report_skipped = self.opts.mirror && self.opts.delete;
        let op = self.pull_op(sources.to_vec(), report_skipped)?;
        let mut open = self.open_request(op, self.opts.chunk_size);
        if !resume && !self.opts.mirror && !same {
            open.features |= STREAMED | WALKING;
            if self.opts.chunk_size == 0 {
                // Later parts in chunks of their own size, unless `--chunk` pinned it.
                open.features |= PART_CHUNKS;
            }
        }
        Ok(open)
    }

    /// The sink of a pull into `dest` under `base` (`same`: see [`Dialer::pull_once`]),
    /// and where `sync --delete` leaves what it deleted before the transfer (entries
    /// of another kind where the source's go, pruned as the sink is prepared).
    pub(super) fn pull_sink(
        &self,
        base: &Base,
        dest: &[u8],
        same: Option<Arc<std::collections::HashSet<Vec<u8>>>>,
    ) -> Result<(SinkPlan, Option<PrunedFirst>)> {
        let o = &self.opts;
        let mut plan = SinkPlan {
            base: base.clone(),
            dest: dest.to_vec(),
            checksum: o.checksum,
            direct_io: o.direct_io,
            meta: o.meta,
            root_name: None,
            prune_first: None,
            same,
            quick: match o.mirror {
                true => o.quick_check,
                false => Default::default(),
            },
            asked: None,
        };
        if o.mirror {
            // `dmover sync`: the source becomes `dest` itself, in `dest`'s parent.
            let (parent, name) = mirror_dest(dest, matches!(base, Base::Local))?;
            plan.dest = parent;
            plan.root_name = Some(name);
        }
        if !(o.mirror && o.delete) {
            return Ok((plan, None));
        }
        let first = PruneFirst {
            mirror: dest.to_vec(),
            options: self.prune_options(),
            pruned: Arc::default(),
        };
        let pruned = first.pruned.clone();
        plan.prune_first = Some(first);
        Ok((plan, Some(pruned)))
    }

    /// How `sync --delete` prunes a pull's mirror: with this client's filters, at most
    /// `--max-delete` entries, the conflicting ones only (before the transfer).
    fn prune_options(&self) -> PruneOptions {
        PruneOptions {
            filter: self.opts.filter.as_deref().cloned().unwrap_or_default(),
            max_delete: self.opts.max_delete,
            dry_run: false,
            conflicts_only: true,
            checksum: false,
            quick: Default::default(),
        }
    }

    /// A finished pull's report; with `--delete`, what the mirror `mirror` (under
    /// `base`) holds that
    /// the source does not is deleted now (every file is verified and under its final
    /// name: our own `Done`), unless the source's listing was incomplete.
    /// `pruned_first`: what `--delete` deleted before the transfer.
    pub(super) async fn pull_report(
        &self,
        r: drive::SinkRun<FileSink>,
        (base, mirror): (&Base, &[u8]),
        pruned_first: Option<PrunedFirst>,
    ) -> Result<Report> {
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
        if let Some(first) = pruned_first {
            pruned = first.lock().take().map(session::prune_report);
            delete_refused = delete_refusal(skipped, failed.len());
            if delete_refused.is_none() {
                let entries = r.store.tree_entries().to_vec();
                let opts = PruneOptions {
                    conflicts_only: false,
                    max_delete: self
                        .opts
                        .max_delete
                        .map(|m| m.saturating_sub(pruned.as_ref().map_or(0, |p| p.deleted))),
                    ..self.prune_options()
                };
                let (base, mirror) = (base.clone(), mirror.to_vec());
                let after = self
                    .disk
                    .run(move || {
                        let Some((parent, name)) = paths::dest_parent(&base, &mirror)? else {
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

/// What `sync --delete` deleted before a pull's transfer, once its sink is prepared.
type PrunedFirst = Arc<parking_lot::Mutex<Option<dmover_store::prune::Pruned>>>;
