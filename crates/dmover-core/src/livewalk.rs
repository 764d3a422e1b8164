//! A live walk (feature `WALKING`): the source's tree walked on a thread of its own
//! while the session runs, its manifest handed out in parts as the walk finds them,
//! the data flowing from the first part on. A pull's server and a push's client use
//! it alike (docs/protocol.md, "Live walk").

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dmover_proto::manifest::{EntryMeta, Totals, XattrScope};
use dmover_store::filter::Filter;
use dmover_store::paths::SourceRoot;
use dmover_store::walk;
use tokio::sync::{mpsc, oneshot};

use crate::drive;
use crate::engine::Run;
use crate::error::{Error, Result};
use crate::session;
use dmover_proto::control::ErrorCode;

/// What a live walk's thread says ([`start`]).
pub(crate) enum Walk {
    Start(walk::Start),
    Part(walk::WalkPart),
    Failed(dmover_store::Error),
}

/// How a live walk cuts its manifest: as a walked manifest is streamed
/// ([`session::manifest_parts`]), and a part every 100 ms of a slow walk.
pub(crate) const CUTS: walk::Cuts = walk::Cuts {
    at: 4 * session::FIRST_PART,
    first: session::FIRST_PART,
    max: session::PART_MAX,
    wait: Duration::from_millis(100),
};

/// Starts a live walk of the roots `roots` gives (called on the walk's thread) on a
/// thread of its own (the disk threads read the chunks meanwhile): its start, then
/// its parts, or why it failed, come through the channel. With `meta`, each entry's
/// owners and extended attributes in that scope are read with it. The walk stops
/// when the channel's receiver is gone.
pub(crate) fn start(
    roots: impl FnOnce() -> dmover_store::Result<Vec<SourceRoot>> + Send + 'static,
    filter: Filter,
    meta: Option<XattrScope>,
) -> Result<mpsc::UnboundedReceiver<Walk>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("dmover-walk".into())
        .spawn(move || {
            let r = roots().and_then(|roots| {
                walk::walk_live(
                    roots,
                    &filter,
                    meta,
                    CUTS,
                    |s| {
                        let _ = tx.send(Walk::Start(s));
                    },
                    |p| tx.send(Walk::Part(p)).is_ok(),
                )
            });
            if let Err(e) = r {
                let _ = tx.send(Walk::Failed(e));
            }
        })
        .map_err(|e| Error::refused(ErrorCode::Busy, format!("starting the walk's thread: {e}")))?;
    Ok(rx)
}

/// Where a live walk's later parts go, and how ([`parts`], [`forward`]).
pub(crate) struct Onward {
    /// The walk's channel, past its start.
    pub walk: mpsc::UnboundedReceiver<Walk>,
    /// The session's run: its progress counts the parts' files, and a walk that fails
    /// fails it.
    pub run: Arc<Run>,
    /// The peer, for the log.
    pub peer: String,
    /// The parts' metadata keeps the entries' owners (else only their xattrs go).
    pub owners: bool,
    /// Hears what the walk left out, once its last part went.
    pub ended: Option<oneshot::Sender<Ended>>,
}

/// The parts of a live walk's manifest for its source's session: the first, the
/// tree `source` holds with its entries' `meta` (`sent`: its entries went in the
/// first flight already), then the walk's later parts as [`forward`] hands them on
/// (spawned here). Sets the progress's totals to the first part's.
pub(crate) fn parts(
    source: &dmover_store::source::FileSource,
    meta: Vec<EntryMeta>,
    sent: bool,
    onward: Onward,
) -> mpsc::UnboundedReceiver<drive::GrowPart> {
    let first = source.tree().entries().to_vec();
    let totals = Totals::of(&first);
    let progress = &onward.run.progress;
    progress
        .total_files
        .store(crate::engine::files_with_data(&first), Ordering::Relaxed);
    progress.total.store(totals.bytes, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(drive::GrowPart {
        sparse: source.tree().sparse().to_vec(),
        entries: first,
        totals,
        chunks: source.layout().n_chunks(),
        last: false,
        durable: None,
        times: Vec::new(),
        meta,
        sent,
    });
    tokio::spawn(forward(onward, tx, totals));
    rx
}

/// Leaves the entries' owners out of `meta` (their extended attributes stay): where
/// owners do not travel.
pub(crate) fn without_owners(meta: &mut [EntryMeta]) {
    for m in meta {
        (m.uid, m.gid) = (u32::MAX, u32::MAX);
    }
}

/// What a live walk left out, told once its last part went: entries it skipped
/// (unreadable, vanished) and entries the filters left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ended {
    pub skipped: u64,
    pub filtered: u64,
}

/// Hands a live walk's later parts to the session as they come, with the totals
/// over every part so far (`totals`: the first part's); a walk that fails fails
/// the session with its error.
pub(crate) async fn forward(
    onward: Onward,
    parts: mpsc::UnboundedSender<drive::GrowPart>,
    mut totals: Totals,
) {
    let Onward {
        mut walk,
        run,
        peer,
        owners,
        mut ended,
    } = onward;
    let started = Instant::now();
    let mut n = 1;
    while let Some(w) = walk.recv().await {
        match w {
            Walk::Part(mut p) => {
                totals = totals.plus(Totals::of(&p.entries));
                run.progress.total_files.fetch_add(
                    crate::engine::files_with_data(&p.entries),
                    Ordering::Relaxed,
                );
                run.progress.extend_manifest(&p.entries);
                n += 1;
                if p.last {
                    tracing::debug!(
                        "{peer}: the walk ended {:.3} s after its first part: {} entries \
                         in {n} parts, {} skipped, {} filtered out",
                        started.elapsed().as_secs_f64(),
                        totals.entries,
                        p.skipped,
                        p.filtered
                    );
                    if let Some(tell) = ended.take() {
                        let _ = tell.send(Ended {
                            skipped: p.skipped,
                            filtered: p.filtered,
                        });
                    }
                }
                if !owners {
                    without_owners(&mut p.meta);
                }
                let last = p.last;
                let part = drive::GrowPart {
                    entries: p.entries,
                    totals,
                    chunks: 0,
                    last,
                    durable: None,
                    times: Vec::new(),
                    meta: p.meta,
                    sent: false,
                    sparse: p.sparse,
                };
                if parts.send(part).is_err() || last {
                    return;
                }
            }
            Walk::Failed(e) => {
                run.fail(e.into());
                return;
            }
            Walk::Start(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn onward(
        walk: mpsc::UnboundedReceiver<Walk>,
        run: &Arc<Run>,
        owners: bool,
        ended: Option<oneshot::Sender<Ended>>,
    ) -> Onward {
        Onward {
            walk,
            run: run.clone(),
            peer: "peer".into(),
            owners,
            ended,
        }
    }

    fn file(parent: u32, name: &str, size: u64) -> dmover_proto::manifest::Entry {
        dmover_proto::manifest::Entry {
            parent,
            name: name.as_bytes().to_vec(),
            kind: dmover_proto::manifest::EntryKind::File { size },
            mode: 0o644,
            mtime: dmover_proto::manifest::Mtime { sec: 0, nsec: 0 },
        }
    }

    fn part_of(entries: Vec<dmover_proto::manifest::Entry>, last: bool) -> walk::WalkPart {
        walk::WalkPart {
            entries,
            sparse: Vec::new(),
            meta: Vec::new(),
            last,
            skipped: 0,
            filtered: 0,
        }
    }

    fn part(entries: Vec<dmover_proto::manifest::Entry>, last: bool) -> Walk {
        Walk::Part(part_of(entries, last))
    }

    /// A live walk's parts reach the session with the totals over every part so far,
    /// the last marked; a walk that fails after its first part fails the session with
    /// its error.
    #[tokio::test]
    async fn a_live_walks_parts_carry_running_totals_and_its_failure_ends_the_session() {
        let first = Totals::of(&[file(0, "a", 10)]);
        let (walk_tx, walk_rx) = tokio::sync::mpsc::unbounded_channel();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let run = Run::new();
        walk_tx.send(part(vec![file(0, "b", 5)], false)).unwrap();
        walk_tx
            .send(Walk::Part(walk::WalkPart {
                meta: vec![EntryMeta {
                    entry: 2,
                    uid: 7,
                    gid: 8,
                    xattrs: Vec::new(),
                }],
                skipped: 3,
                filtered: 4,
                ..part_of(vec![file(0, "c", 7), file(0, "d", 0)], true)
            }))
            .unwrap();
        let (tell, mut ended) = tokio::sync::oneshot::channel();
        forward(onward(walk_rx, &run, false, Some(tell)), tx, first).await;
        let a = rx.recv().await.unwrap();
        assert_eq!((a.totals.entries, a.totals.bytes, a.last), (2, 15, false));
        let b = rx.recv().await.unwrap();
        assert_eq!((b.totals.entries, b.totals.bytes, b.last), (4, 22, true));
        assert_eq!(
            b.chunks, 0,
            "later parts are laid out by the source's storage"
        );
        // Owners left out where they do not travel; what the walk left out told.
        assert_eq!((b.meta[0].uid, b.meta[0].gid), (u32::MAX, u32::MAX));
        assert_eq!(
            ended.try_recv().unwrap(),
            Ended {
                skipped: 3,
                filtered: 4
            }
        );
        assert!(!run.is_cancelled());
        // Files with data counted as they come (the first part's by the caller).
        assert_eq!(run.progress.total_files.load(Ordering::Relaxed), 2);

        let (walk_tx, walk_rx) = tokio::sync::mpsc::unbounded_channel();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let run = Run::new();
        walk_tx.send(part(vec![file(0, "b", 5)], false)).unwrap();
        walk_tx
            .send(Walk::Failed(dmover_store::Error::io(
                "listing",
                "d/sub",
                std::io::Error::from_raw_os_error(13),
            )))
            .unwrap();
        forward(onward(walk_rx, &run, true, None), tx, first).await;
        assert!(rx.recv().await.is_some());
        assert!(rx.recv().await.is_none(), "no part after the failure");
        assert!(run.is_cancelled());
        let e = run.take_error().expect("the walk's error").to_string();
        assert!(e.contains("listing d/sub"), "{e}");
    }
}
