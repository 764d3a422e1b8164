//! One role set-up: a session's file source and file sink are prepared here, whoever
//! dialed and whatever drives them — a client's push and pull, the server's pull and
//! push arms, a server dialing another for a third-party copy, a growing push
//! (`sync --watch`) — and every session's driver environment ([`env`]) is built here.
//!
//! A source is a walk ([`walk`]: whole on a disk thread, or live, its first part now and
//! the rest as the walk finds them), whose entries size the choices that depend on the
//! files ([`SourceWalk::chunk`], [`SourceWalk::tuned_start`], [`SourceWalk::buffers`]),
//! then storage and a manifest mode ([`SourceRole`]): whole, streamed in parts (feature
//! `STREAMED`), or live (feature `WALKING`), queued on the source machine with the
//! metadata ([`SourceRole::queue`]). A sink is the storage its driver prepares once the
//! manifest came ([`SinkPlan::prepare`]): where it goes, its options, and what a sync
//! adds (the mirror's name, the prune of conflicting entries, the files held with the
//! same content).
//!
//! What differs between the sides stays with the caller as a parameter: the dialer's
//! manifest goes in its first flight ([`Feed::first_flight`]), the acceptor's after
//! `Session`; the dialer decides from the features it offers, the acceptor from those
//! it granted.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use dmover_net::link::{Direction, SocketOptions};
use dmover_proto::control::ErrorCode;
use dmover_proto::manifest::{Entry, EntryMeta, NO_PARENT, Totals, XattrScope};
use dmover_proto::session::SourceSession;
use dmover_store::Source;
use dmover_store::filter::Filter;
use dmover_store::meta::MetaPolicy;
use dmover_store::paths::{self, Base, SourceRoot};
use dmover_store::prune::{PruneOptions, Pruned, QuickCheck};
use dmover_store::sink::{FileSink, SinkOptions, prepare_sink};
use dmover_store::source::{FileSource, SourceOptions};
use dmover_store::tree::Tree;
use dmover_store::walk;
use tokio::sync::{mpsc, oneshot};

use crate::DirectIo;
use crate::diskpool::DiskPool;
use crate::drive::{self, Fault, GrowPart};
use crate::engine::{Run, files_with_data};
use crate::error::{Error, Result};
use crate::livewalk;
use crate::session;

/// A driver's environment for a session on `disk`: its run, its buffers (`buffers`:
/// how many for a session of so many streams), the socket buffer budgets of
/// `socket`, and the slowness injected into every chunk (`chunk_delay`, tests). The
/// rest is the defaults a caller changes where its role needs it: the tuner's first
/// streams ([`session::TUNED_START`]), no answer to the dialer's limits, no disk
/// tuner's room, no zero-copy.
pub(crate) fn env(
    disk: Arc<DiskPool>,
    run: Arc<Run>,
    socket: &SocketOptions,
    chunk_delay: Option<Duration>,
    buffers: Box<dyn Fn(u16) -> usize + Send>,
) -> drive::Env {
    drive::Env {
        disk,
        run,
        buffers,
        chunk_delay,
        zerocopy: None,
        limits: None,
        receive_budget: socket.budget(Direction::Receive),
        send_budget: socket.budget(Direction::Send),
        tuned_start: session::TUNED_START,
        disk_room: None,
        manifest_charge: None,
    }
}

// ---------------------------------------------------------------------------------
// Source

/// How a source is walked ([`walk`]).
pub(crate) struct WalkSpec {
    /// The filters the walk goes through.
    pub filter: Filter,
    /// A live walk (feature `WALKING`): the first part now, the rest as it is found.
    pub live: bool,
    /// (a live walk) Each entry's owners and extended attributes in this scope are
    /// read with it.
    pub meta: Option<XattrScope>,
    /// (a whole walk) Each entry's `stat` comes with whether it has extended
    /// attributes at all, for the metadata read after the walk.
    pub ask_xattrs: bool,
}

/// What a source's walk found: the whole tree, or a live walk's first part with the
/// walk going on.
pub(crate) struct SourceWalk {
    /// The tree (a live walk's first part).
    pub tree: Tree,
    /// Entries the walk skipped (special files, vanished files), so far.
    pub skipped: u64,
    /// Entries the filters left out, so far.
    pub filtered: u64,
    /// The owners and extended attributes a live walk read with the entries.
    meta: Option<Vec<EntryMeta>>,
    /// A live walk that goes on: its channel, and every entry it had walked when it
    /// cut its first part.
    rest: Option<(mpsc::UnboundedReceiver<livewalk::Walk>, Vec<Entry>)>,
}

/// Walks the roots `roots` gives as `spec` says: a whole walk on one of `disk`'s
/// threads, or a live walk on a thread of its own, up to its first part.
pub(crate) async fn walk(
    disk: &DiskPool,
    roots: impl FnOnce() -> dmover_store::Result<Vec<SourceRoot>> + Send + 'static,
    spec: WalkSpec,
) -> Result<SourceWalk> {
    let WalkSpec {
        filter,
        live,
        meta,
        ask_xattrs,
    } = spec;
    if !live {
        let w = disk
            .run(move || walk::walk_with(roots()?, &filter, ask_xattrs))
            .await
            .ok_or(Error::Aborted)??;
        return Ok(SourceWalk {
            tree: w.tree,
            skipped: w.skipped,
            filtered: w.filtered,
            meta: None,
            rest: None,
        });
    }
    let mut rx = livewalk::start(roots, filter, meta)?;
    let (w, meta, rest) = match rx.recv().await {
        Some(livewalk::Walk::Start(walk::Start::Whole(w, m))) => (w, m, None),
        Some(livewalk::Walk::Start(walk::Start::First(w, m, so_far))) => (w, m, Some(so_far)),
        Some(livewalk::Walk::Failed(e)) => return Err(e.into()),
        Some(livewalk::Walk::Part(_)) | None => return Err(Error::Aborted),
    };
    Ok(SourceWalk {
        tree: w.tree,
        skipped: w.skipped,
        filtered: w.filtered,
        meta: Some(meta),
        rest: rest.map(|so_far| (rx, so_far)),
    })
}

/// Which metadata a source sends (feature `METADATA`): the extended attributes in
/// `scope`, and the owners or not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MetaWant {
    /// The extended attributes' namespaces.
    pub scope: XattrScope,
    /// The owners too.
    pub owners: bool,
}

impl SourceWalk {
    /// What the choices that depend on the files' sizes see: the whole walk, or what
    /// a live walk had walked when it cut its first part.
    pub fn sized(&self) -> &[Entry] {
        self.rest
            .as_ref()
            .map_or(self.tree.entries(), |(_, e)| e.as_slice())
    }

    /// The walk goes on (a live walk past its first part).
    pub fn goes_on(&self) -> bool {
        self.rest.is_some()
    }

    /// The session's chunk size: `asked`, or (0) one fit to the files
    /// ([`session::auto_chunk_on`]; a walk that goes on is not whole).
    pub fn chunk(&self, asked: u32) -> u32 {
        match asked {
            0 => session::auto_chunk_on(self.sized(), self.rest.is_none()),
            c => c,
        }
    }

    /// The streams a tuned source starts with on a link of round trip `rtt`.
    pub fn tuned_start(&self, rtt: Option<Duration>) -> u16 {
        session::tuned_start(self.sized(), rtt)
    }

    /// The chunk buffers a source of `chunk`-byte chunks wants for so many streams
    /// and `threads` disk threads ([`session::source_buffers`]).
    pub fn buffers(&self, chunk: u32, threads: usize) -> impl Fn(u16) -> usize + Send + 'static {
        let deep = session::mostly_aligned(self.sized());
        move |streams| session::deep_buffers(deep, chunk, streams, threads)
    }

    /// The metadata the source sends, as `want` says (`None`: none): what a live
    /// walk read, else the tree's read now (one stat and one listxattr per entry:
    /// docs/sync.md).
    pub fn meta(&mut self, want: Option<MetaWant>) -> Vec<EntryMeta> {
        let walked = self.meta.take();
        let Some(want) = want else {
            return Vec::new();
        };
        let mut meta =
            walked.unwrap_or_else(|| dmover_store::meta::read_tree(&self.tree, want.scope));
        if !want.owners {
            livewalk::without_owners(&mut meta);
        }
        meta
    }
}

/// How a source's storage is made from its walk ([`SourceRole::new`]).
pub(crate) struct SourcePlan {
    /// The session's chunk size.
    pub chunk: u32,
    /// The storage's options.
    pub options: SourceOptions,
    /// A whole walk's manifest may go in parts (feature `STREAMED`, offered by this
    /// dialer or granted by this acceptor), when it is large enough.
    pub streamed: bool,
    /// The session uses hard links (feature `LINKS`); without, each path of an inode
    /// goes as a file of its own.
    pub links: bool,
    /// The source reports what its walk skipped (`sync --delete`'s pull).
    pub report_skipped: bool,
}

/// How a source's manifest goes beyond the first part its storage holds.
enum Rest {
    /// Nothing beyond: the manifest is whole.
    Whole,
    /// A walked manifest's later parts (feature `STREAMED`), cut at the ends.
    Streamed(Vec<Entry>, Vec<usize>),
    /// A live walk's later parts, as it finds them.
    Live(mpsc::UnboundedReceiver<livewalk::Walk>),
}

/// A file source with its manifest, ready for its machine ([`SourceRole::queue`]).
pub(crate) struct SourceRole {
    /// The storage (the manifest's first part, or all of it).
    pub store: FileSource,
    rest: Rest,
}

/// Where a source's manifest parts go, and how ([`SourceRole::queue`]).
pub(crate) struct Feed {
    /// This side dialed: the manifest's first part is in its first flight.
    pub first_flight: bool,
    /// The session's run: its progress counts the manifest.
    pub run: Arc<Run>,
    /// The peer, for the log.
    pub peer: String,
    /// A live walk's later parts keep the entries' owners.
    pub owners: bool,
    /// Hears what a live walk left out, once its last part went.
    pub ended: Option<oneshot::Sender<livewalk::Ended>>,
}

impl SourceRole {
    /// The storage for `walk` as `plan` says, the manifest cut into parts where it
    /// goes so.
    pub fn new(walk: SourceWalk, plan: SourcePlan) -> Result<Self> {
        let SourceWalk {
            mut tree,
            skipped,
            rest,
            ..
        } = walk;
        if !plan.links {
            tree.links_as_files();
        }
        let rest = match rest {
            Some((rx, _)) => Rest::Live(rx),
            None if plan.streamed => session::manifest_parts(tree.entries().len())
                .and_then(|ends| tree.split_off(ends[0]).map(|rest| (rest, ends)))
                .map_or(Rest::Whole, |(rest, ends)| Rest::Streamed(rest, ends)),
            None => Rest::Whole,
        };
        let mut store = FileSource::new(tree, plan.chunk, plan.options)?;
        if plan.report_skipped {
            store.report_skipped(skipped);
        }
        Ok(SourceRole { store, rest })
    }

    /// The manifest is a walked one streamed in parts (feature `STREAMED`).
    pub fn streamed(&self) -> bool {
        matches!(self.rest, Rest::Streamed(..))
    }

    /// The manifest comes from a live walk (features `STREAMED` and `WALKING`).
    pub fn live(&self) -> bool {
        matches!(self.rest, Rest::Live(_))
    }

    /// Queues the manifest on the source machine `m` with the entries' `meta`: whole
    /// (entries, sparse files, metadata and `ManifestEnd`), or its parts' feed for
    /// the driver (a dialer's first part in its first flight). Sets the progress's
    /// totals to the manifest's, as far as known.
    pub fn queue(
        self,
        m: &mut SourceSession<Fault>,
        meta: Vec<EntryMeta>,
        feed: Feed,
    ) -> (FileSource, Option<mpsc::UnboundedReceiver<GrowPart>>) {
        let SourceRole { store, rest } = self;
        if feed.first_flight || matches!(rest, Rest::Whole) {
            m.push_manifest(store.tree().entries());
        }
        let growth = match rest {
            Rest::Whole => {
                let tree = store.tree();
                let entries = tree.entries();
                let totals = Totals::of(entries);
                let progress = &feed.run.progress;
                progress.total.store(totals.bytes, Relaxed);
                progress
                    .total_files
                    .store(files_with_data(entries), Relaxed);
                // Sent only in a session that uses LINKS (the machine knows).
                m.sparse_files(store.tree().sparse());
                m.push_meta(meta);
                m.end_manifest(totals, drive::chunk_set(store.chunks()));
                None
            }
            Rest::Streamed(rest, ends) => Some(streamed(&store, rest, &ends, meta, &feed)),
            Rest::Live(walk) => {
                let onward = livewalk::Onward {
                    walk,
                    run: feed.run,
                    peer: feed.peer,
                    owners: feed.owners,
                    ended: feed.ended,
                };
                Some(livewalk::parts(&store, meta, feed.first_flight, onward))
            }
        };
        (store, growth)
    }
}

/// The feed of a walked manifest streamed in parts: `store`'s first part, then `rest`
/// cut at `ends`. A dialer's first part went in its first flight already.
fn streamed(
    store: &FileSource,
    rest: Vec<Entry>,
    ends: &[usize],
    meta: Vec<EntryMeta>,
    feed: &Feed,
) -> mpsc::UnboundedReceiver<GrowPart> {
    let first = store.tree().entries().to_vec();
    let progress = &feed.run.progress;
    let files = files_with_data(&first) + files_with_data(&rest);
    progress.total_files.store(files, Relaxed);
    let mut parts = drive::streamed_parts(first, store.layout().n_chunks(), rest, ends, meta);
    // The last part's totals are the whole manifest's.
    if let Some(last) = parts.last() {
        progress.total.store(last.totals.bytes, Relaxed);
    }
    if feed.first_flight {
        // Its entries are in the first flight, and its `Grow` behind them (an
        // acceptor grants STREAMED when offered).
        parts[0].sent = true;
    }
    tracing::debug!(
        "{}: the manifest goes in {} parts, data from the first on",
        feed.peer,
        parts.len()
    );
    let (tx, rx) = mpsc::unbounded_channel();
    for p in parts {
        let _ = tx.send(p);
    }
    rx
}

// ---------------------------------------------------------------------------------
// Sink

/// How a file sink is prepared once the manifest came ([`SinkPlan::prepare`]).
pub(crate) struct SinkPlan {
    /// Where the destination path is resolved.
    pub base: Base,
    /// The destination directory.
    pub dest: Vec<u8>,
    /// Per-chunk CRC32C and per-file digests.
    pub checksum: bool,
    /// Direct I/O for large files.
    pub direct_io: DirectIo,
    /// Which owners and extended attributes are applied.
    pub meta: MetaPolicy,
    /// `sync`: the manifest's one root gets this name (the mirror's).
    pub root_name: Option<Vec<u8>>,
    /// `sync --delete`: before the transfer, the entries of the mirror (a path under
    /// `base`) of another kind than the source's where the source's go are deleted
    /// with these options, and what was deleted kept here.
    pub prune_first: Option<PruneFirst>,
    /// `sync --checksum`: the files (paths below the mirror's root) the destination
    /// holds with the source's content, which it keeps (instead of those with the
    /// manifest's size and mtime).
    pub same: Option<Arc<HashSet<Vec<u8>>>>,
    /// Which files under their final names the quick check keeps (a pull's
    /// `sync --size-only`, `--ignore-existing`; else size and mtime).
    pub quick: QuickCheck,
    /// (a pull) The roots this side asked for ([`AskedRoots`]): the manifest's roots
    /// must be among them, so a peer never chooses the names written here.
    pub asked: Option<AskedRoots>,
}

/// The roots a pull asked for, by the names they get: each source path's last
/// component, or (`None`) the name of an export's whole root, which only the server
/// knows (its directory's name).
#[derive(Debug, Clone)]
pub(crate) struct AskedRoots(Vec<Option<Vec<u8>>>);

impl AskedRoots {
    /// The names the roots of a pull of `sources` (paths on the server) get.
    pub fn of(sources: &[Vec<u8>]) -> Self {
        AskedRoots(
            sources
                .iter()
                .map(|p| {
                    p.split(|&b| b == b'/')
                        .rfind(|c| !c.is_empty() && *c != b".")
                        .map(<[u8]>::to_vec)
                })
                .collect(),
        )
    }

    /// Checks the roots of `entries` (a manifest's first part; later parts add none)
    /// against what was asked: each root has the name of a source asked for, each
    /// source gives at most one root; a server names an export's whole root itself,
    /// but only with a plain name (not hidden: not starting with `.`). A hostile
    /// server could otherwise name a root `.ssh` and write `~/.ssh/authorized_keys`
    /// through `dmover cp srv:x ~/` (scp's CVE-2019-6111, rsync's CVE-2024-12087).
    pub fn check(&self, entries: &[Entry]) -> Result<()> {
        let mut left: Vec<Option<&[u8]>> = self.0.iter().map(Option::as_deref).collect();
        for root in entries.iter().filter(|e| e.parent == NO_PARENT) {
            let name = root.name.as_slice();
            let slot = left.iter().position(|a| *a == Some(name)).or_else(|| {
                let plain = !name.starts_with(b".");
                left.iter().position(|a| a.is_none()).filter(|_| plain)
            });
            match slot {
                Some(i) => {
                    left.remove(i);
                }
                None => {
                    let asked: Vec<String> = self
                        .0
                        .iter()
                        .map(|a| match a {
                            Some(n) => format!("{:?}", String::from_utf8_lossy(n)),
                            None => "an export's root".into(),
                        })
                        .collect();
                    return Err(Error::refused(
                        ErrorCode::Protocol,
                        format!(
                            "the server sent {:?}, which is not a source this pull asked for \
                             (asked: {}); nothing was written",
                            String::from_utf8_lossy(name),
                            asked.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// See [`SinkPlan::prune_first`].
pub(crate) struct PruneFirst {
    /// The mirror (a path under the plan's base).
    pub mirror: Vec<u8>,
    /// How it is pruned.
    pub options: PruneOptions,
    /// What was deleted.
    pub pruned: Arc<parking_lot::Mutex<Option<Pruned>>>,
}

impl SinkPlan {
    /// The sink's preparation for its driver (on a disk thread, with the manifest,
    /// the session's chunk size and options).
    pub fn prepare(self) -> drive::Prepare<FileSink> {
        Box::new(move |mut entries, chunk, so| {
            if let Some(asked) = &self.asked {
                asked.check(&entries)?;
            }
            if let Some(name) = self.root_name {
                let mut roots = entries.iter_mut().filter(|e| e.parent == NO_PARENT);
                if let (Some(root), None) = (roots.next(), roots.next()) {
                    root.name = name;
                }
            }
            if let Some(p) = self.prune_first {
                if let Some((parent, name)) = paths::dest_parent(&self.base, &p.mirror)? {
                    let pruned = dmover_store::prune::prune(&parent, &name, &entries, &p.options)?;
                    *p.pruned.lock() = Some(pruned);
                }
            }
            let opts = SinkOptions {
                checksum: self.checksum,
                direct_io: self.direct_io,
                fsync: so.fsync,
                verify: so.verify && self.checksum,
                journal: so.journal,
                resume: so.resume,
                // Files already there with the manifest's size and mtime are kept (a
                // re-run or `dmover sync` sends only what changed); with
                // `--checksum`, those whose digests matched instead.
                unchanged: so.resume && self.same.is_none(),
                quick: self.quick,
                meta: self.meta,
            };
            let mut sink = prepare_sink(&self.base, &self.dest, entries, chunk, opts)?;
            if let Some(same) = self.same {
                sink.hold_same_content(same.as_ref().clone());
            }
            Ok(sink)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_proto::manifest::{EntryKind, Mtime};

    fn root(name: &str) -> Entry {
        Entry {
            parent: NO_PARENT,
            name: name.as_bytes().to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime: Mtime::default(),
        }
    }

    fn asked(sources: &[&str]) -> AskedRoots {
        let s: Vec<Vec<u8>> = sources.iter().map(|s| s.as_bytes().to_vec()).collect();
        AskedRoots::of(&s)
    }

    #[test]
    fn the_names_asked_for_are_the_sources_last_components() {
        let names = |s: &[&str]| asked(s).0;
        let x = Some(b"x".to_vec());
        assert_eq!(
            names(&["x", "x/", "x/.", "a/x//", "./x"]),
            vec![x.clone(); 5]
        );
        // An export's whole root: named by the server.
        assert_eq!(names(&["", ".", "/", "./"]), vec![None; 4]);
    }

    #[test]
    fn only_roots_asked_for_pass() {
        let ok = |s: &[&str], roots: &[&str]| {
            let e: Vec<Entry> = roots.iter().map(|r| root(r)).collect();
            asked(s).check(&e).is_ok()
        };
        assert!(ok(&["x"], &["x"]));
        assert!(ok(&["a/x", "b/y/"], &["y", "x"]));
        assert!(ok(&["."], &["export"]));
        assert!(ok(&["x", "."], &["x", "export"]));
        assert!(!ok(&["x"], &[".ssh"]));
        assert!(!ok(&["x"], &["y"]));
        // One root per source, and an export's root never hidden.
        assert!(!ok(&["x"], &["x", "x2"]));
        assert!(!ok(&["."], &[".ssh"]));
        assert!(!ok(&["x", "."], &["x", ".profile"]));
    }
}
