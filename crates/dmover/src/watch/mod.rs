//! `dmover sync --watch SRC HOST:DST`: a sync that keeps going. It watches every
//! directory of SRC with inotify, ships each file once it was closed after writing and
//! stayed quiet for `--quiet-time`, mirrors deletions and renames with `--delete`, and
//! reports each batch's lag (close → final name on the server) — docs/sync.md,
//! "Continuous mode".
//!
//! The batches ship through one open session whose manifest grows by a part per batch
//! (`Client::push_growing`): one connection and one set of warm data streams for all
//! of them, each batch's files complete under their final names at the server when it
//! says so (`Stored`), which is when the batch is reported. The session ends when it
//! idles ([`STREAM_IDLE`]), grows large, before a catch-up, at a stop, or when a batch
//! holds a file it sent already (names are unique in a manifest) or deletes something
//! it sent; the next batch opens a new one. A restart of either end needs no state of
//! ours: a catch-up sync (the first thing a watch does, and again after a failure or
//! a lost event) sends only what is missing, its quick check and resume mode making
//! whatever is already durable at the destination count as held.
//!
//! The rules of what ships when are in [`batch`], free of I/O.

mod batch;

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use dmover_core::client::{Client, Growing, Report};
use dmover_core::engine::Run;
use dmover_core::session::TransferOptions;
use dmover_core::{Error, error::Result as CoreResult};
use dmover_proto::control::ErrorCode;
use dmover_store::filter::{Action, Filter, Rule};
use rustix::fs::inotify;
use tokio::sync::{Notify, mpsc};

use crate::output;
use crate::resolve::WatchJob;
use batch::{Batch, Batcher, Change, Rel};

/// The first wait after a failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// `dmover sync --watch`, resolved.
pub fn run(job: WatchJob) -> anyhow::Result<ExitCode> {
    let root = PathBuf::from(OsStr::from_bytes(&job.src));
    let opts = job.client.options.clone();
    let filter = opts.filter.clone();
    let rt = job.client.runtime()?;
    let client = job.client.client();
    let stop = Arc::new(Stop::default());
    stop_on_signals(&rt, &stop)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let tree = Tree::new(root, filter, tx)?;
    let w = Watch {
        client,
        opts,
        server: job.server,
        src: job.src,
        dest: job.dest,
        batcher: Batcher::new(job.quiet_time, job.delete),
        tree,
        rx,
        stop,
        json: job.json,
        quiet: job.quiet,
        quiet_time: job.quiet_time,
        started: Instant::now(),
        stream: None,
    };
    let code = rt.block_on(w.run());
    drop(rt);
    Ok(code)
}

/// Set by SIGINT/SIGTERM: the operation running is cancelled (its staging files
/// removed, the destination's journal kept) and the watch ends with exit code 0.
#[derive(Default)]
struct Stop {
    set: AtomicBool,
    notify: Notify,
    running: Mutex<Option<Arc<Run>>>,
}

impl Stop {
    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    fn trigger(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_one();
        if let Some(run) = self.running.lock().unwrap().as_ref() {
            run.fail(Error::refused(ErrorCode::Aborted, "interrupted"));
        }
    }

    /// A run for the next operation, cancelled by a stop.
    fn run(&self) -> Arc<Run> {
        let run = Run::new();
        *self.running.lock().unwrap() = Some(run.clone());
        if self.is_set() {
            run.fail(Error::refused(ErrorCode::Aborted, "interrupted"));
        }
        run
    }
}

fn stop_on_signals(rt: &tokio::runtime::Runtime, stop: &Arc<Stop>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let _guard = rt.enter();
    let mut term = signal(SignalKind::terminate()).context("catching SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("catching SIGINT")?;
    let stop = stop.clone();
    rt.spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop.trigger();
    });
    Ok(())
}

/// An event as read from inotify.
struct Raw {
    wd: i32,
    mask: inotify::ReadFlags,
    name: Option<Vec<u8>>,
}

/// The watched tree: a watch on every directory, by descriptor.
struct Tree {
    fd: Arc<OwnedFd>,
    root: PathBuf,
    filter: Option<Arc<Filter>>,
    dirs: std::collections::HashMap<i32, Rel>,
}

/// What a watch on a directory asks to hear.
fn watch_flags() -> inotify::WatchFlags {
    use inotify::WatchFlags as W;
    W::CLOSE_WRITE
        | W::MODIFY
        | W::ATTRIB
        | W::CREATE
        | W::DELETE
        | W::MOVED_FROM
        | W::MOVED_TO
        | W::ONLYDIR
        | W::DONT_FOLLOW
}

impl Tree {
    /// Watches every directory below `root` (the filters' excluded ones not) and
    /// starts the thread that reads the events into `tx`.
    fn new(
        root: PathBuf,
        filter: Option<Arc<Filter>>,
        tx: mpsc::UnboundedSender<Raw>,
    ) -> anyhow::Result<Tree> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC).context("starting inotify")?;
        let mut tree = Tree {
            fd: Arc::new(fd),
            root,
            filter,
            dirs: Default::default(),
        };
        tree.add(Vec::new(), None)?;
        let fd = tree.fd.clone();
        std::thread::Builder::new()
            .name("dmover-watch".into())
            .spawn(move || read_events(&fd, &tx))
            .context("starting the watch thread")?;
        Ok(tree)
    }

    fn path(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(OsStr::from_bytes(rel))
        }
    }

    fn admits(&self, rel: &[u8], dir: bool) -> bool {
        !rel.starts_with(b".dmv.") && self.filter.as_ref().is_none_or(|f| f.admits(rel, dir))
    }

    /// Queues the files below `rel` modified less than `quiet` before `now`: probably
    /// still being written, so a catch-up leaves them to their batch (which waits for
    /// the writer's close) instead of shipping them mid-way.
    fn queue_recent(&self, rel: Rel, b: &mut Batcher, quiet: Duration, now: Instant) {
        let Some(cutoff) = std::time::SystemTime::now().checked_sub(quiet) else {
            return;
        };
        let mut stack = vec![rel];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(self.path(&dir)) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(md) = e.metadata() else { continue };
                let child = join(&dir, e.file_name().as_bytes());
                if !self.admits(&child, md.is_dir()) {
                    continue;
                }
                if md.is_dir() {
                    stack.push(child);
                } else if md.modified().is_ok_and(|m| m > cutoff) {
                    b.note(
                        Change::Appeared {
                            rel: child,
                            dir: false,
                        },
                        now,
                    );
                }
            }
        }
    }

    /// Watches the directory `rel` and those below it. `found`: a new directory, so
    /// what it holds is queued (it may have been made before its watch existed).
    fn add(&mut self, rel: Rel, mut found: Option<(&mut Batcher, Instant)>) -> anyhow::Result<()> {
        let path = self.path(&rel);
        let wd = match inotify::add_watch(&*self.fd, &path, watch_flags()) {
            Ok(wd) => wd,
            // Gone or replaced meanwhile: its own event tells.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(()),
            Err(rustix::io::Errno::NOSPC) => anyhow::bail!(
                "watching {}: too many directories for inotify (raise \
                 fs.inotify.max_user_watches)",
                path.display()
            ),
            Err(e) => return Err(e).with_context(|| format!("watching {}", path.display())),
        };
        self.dirs.insert(wd, rel.clone());
        if let Some((b, now)) = found.as_mut()
            && !rel.is_empty()
        {
            b.note(
                Change::Appeared {
                    rel: rel.clone(),
                    dir: true,
                },
                *now,
            );
        }
        let entries = match std::fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        for e in entries {
            let Ok(e) = e else { continue };
            let Ok(ft) = e.file_type() else { continue };
            let child = join(&rel, e.file_name().as_bytes());
            if !self.admits(&child, ft.is_dir()) {
                continue;
            }
            if ft.is_dir() {
                self.add(child, found.as_mut().map(|(b, n)| (&mut **b, *n)))?;
            } else if let Some((b, now)) = found.as_mut() {
                b.note(
                    Change::Appeared {
                        rel: child,
                        dir: false,
                    },
                    *now,
                );
            }
        }
        Ok(())
    }

    /// Stops watching `rel` and what is below it (moved away or deleted).
    fn forget(&mut self, rel: &[u8]) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, d)| d.starts_with(rel) && matches!(d.get(rel.len()), None | Some(b'/')))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = inotify::remove_watch(&*self.fd, wd);
        }
    }

    /// Turns an event into changes for the batcher. `Ok(false)`: events were lost
    /// (the kernel's queue overflowed): a catch-up sync is needed.
    fn translate(&mut self, ev: Raw, b: &mut Batcher, now: Instant) -> anyhow::Result<bool> {
        use inotify::ReadFlags as R;
        if ev.mask.contains(R::QUEUE_OVERFLOW) {
            return Ok(false);
        }
        if ev.mask.contains(R::IGNORED) {
            self.dirs.remove(&ev.wd);
            return Ok(true);
        }
        let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd), ev.name) else {
            return Ok(true);
        };
        let rel = join(dir, &name);
        let is_dir = ev.mask.contains(R::ISDIR);
        if !self.admits(&rel, is_dir) {
            return Ok(true);
        }
        let m = ev.mask;
        if m.intersects(R::DELETE | R::MOVED_FROM) {
            if is_dir {
                self.forget(&rel);
            }
            b.note(Change::Gone { rel, dir: is_dir }, now);
        } else if is_dir {
            if m.intersects(R::CREATE | R::MOVED_TO) {
                self.add(rel, Some((b, now)))?;
            }
        } else if m.contains(R::MOVED_TO) {
            b.note(Change::Appeared { rel, dir: false }, now);
        } else if m.contains(R::CREATE) {
            // A symlink is made whole, with no close to wait for.
            let link = std::fs::symlink_metadata(self.path(&rel))
                .is_ok_and(|md| md.file_type().is_symlink());
            if link {
                b.note(Change::Appeared { rel, dir: false }, now);
            } else {
                b.note(Change::Created(rel), now);
            }
        } else if m.contains(R::MODIFY) {
            b.note(Change::Modified(rel), now);
        } else if m.intersects(R::CLOSE_WRITE | R::ATTRIB) {
            b.note(Change::Closed(rel), now);
        }
        Ok(true)
    }
}

fn join(dir: &[u8], name: &[u8]) -> Rel {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

/// The reading thread: blocks on the inotify descriptor, forwards every event; ends
/// when the watch is dropped (the process exits with it blocked: nothing to clean up).
fn read_events(fd: &OwnedFd, tx: &mpsc::UnboundedSender<Raw>) {
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
    let mut r = inotify::Reader::new(fd, &mut buf);
    loop {
        match r.next() {
            Ok(e) => {
                let raw = Raw {
                    wd: e.wd(),
                    mask: e.events(),
                    name: e.file_name().map(|n| n.to_bytes().to_vec()),
                };
                if tx.send(raw).is_err() {
                    return;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                tracing::error!("reading inotify events: {e}");
                // As lost events: the watch does a catch-up sync, then waits on.
                let _ = tx.send(Raw {
                    wd: -1,
                    mask: inotify::ReadFlags::QUEUE_OVERFLOW,
                    name: None,
                });
                return;
            }
        }
    }
}

/// A running watch.
struct Watch {
    client: Client,
    opts: TransferOptions,
    server: String,
    src: Vec<u8>,
    dest: Vec<u8>,
    batcher: Batcher,
    tree: Tree,
    rx: mpsc::UnboundedReceiver<Raw>,
    stop: Arc<Stop>,
    json: bool,
    quiet: bool,
    quiet_time: Duration,
    started: Instant,
    /// The session the batches ship through, while one is open.
    stream: Option<Stream>,
}

/// A stream session idle this long is ended (its directories get their modes and
/// mtimes, the server's buffers are freed); the next file opens a new one.
const STREAM_IDLE: Duration = Duration::from_secs(10);
/// A stream session whose manifest holds this many entries is ended and a new one
/// opened: the manifest each side keeps stays small.
const STREAM_ENTRIES: u32 = 20_000;
/// How long a stop waits for the open stream session to end cleanly.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The open session whose manifest grows by a part per batch ([`Growing`]).
struct Stream {
    g: Growing,
    run: Arc<Run>,
    /// Parts sent whose files are not yet known complete at the server, in order.
    waiting: std::collections::VecDeque<Waiting>,
    /// When the last part was sent (or the session opened).
    last: Instant,
}

/// A batch shipped as a part of the stream's manifest.
struct Waiting {
    n: u64,
    files: Vec<(Rel, Instant)>,
    count: u64,
    bytes: u64,
    deleted: u64,
    started: Instant,
    durable: tokio::sync::oneshot::Receiver<()>,
}

/// The next part of `s` told durable (`Ok(false)`: it failed); never without one.
async fn next_durable(s: &mut Option<Stream>) -> bool {
    match s.as_mut().and_then(|s| s.waiting.front_mut()) {
        Some(w) => (&mut w.durable).await.is_ok(),
        None => std::future::pending().await,
    }
}

impl Watch {
    async fn run(mut self) -> ExitCode {
        // The watches exist already: nothing written from now on is missed, and the
        // catch-up sends what was written before (or while the watch was down).
        let mut catch_up = true;
        let mut first = true;
        let mut backoff = FIRST_BACKOFF;
        let mut not_before = Instant::now();
        let mut batches = 0u64;
        loop {
            if self.stop.is_set() {
                break;
            }
            let now = Instant::now();
            let mut done = Ok(());
            if now >= not_before {
                done = if catch_up {
                    // Not beside a stream session: both would take the destination's
                    // journal.
                    match self.close_stream().await {
                        Ok(()) => self.catch_up().await.map(|()| catch_up = false),
                        Err(e) => Err(e),
                    }
                } else {
                    let batch = self.batcher.take(now);
                    if !batch.is_empty() {
                        batches += 1;
                        self.ship(batch, batches).await
                    } else if self.stream.as_ref().is_some_and(|s| {
                        s.waiting.is_empty() && now.duration_since(s.last) >= STREAM_IDLE
                    }) {
                        self.close_stream().await
                    } else {
                        Ok(())
                    }
                };
            }
            if done.is_ok() {
                let due = if catch_up {
                    Some(not_before)
                } else {
                    let idle = self
                        .stream
                        .as_ref()
                        .filter(|s| s.waiting.is_empty())
                        .map(|s| s.last + STREAM_IDLE);
                    let next = self.batcher.next_due(Instant::now());
                    match (next, idle) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                    .map(|d| d.max(not_before))
                };
                let sleep = async {
                    match due {
                        Some(d) => tokio::time::sleep_until(d.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    ev = self.rx.recv() => {
                        let Some(ev) = ev else { break };
                        match self.take_events(ev) {
                            Ok(true) => {}
                            Ok(false) => catch_up = true,
                            Err(e) => {
                                eprintln!("dmover: error: {e:#}");
                                return ExitCode::from(1);
                            }
                        }
                    }
                    ok = next_durable(&mut self.stream) => {
                        done = if ok {
                            self.part_durable();
                            Ok(())
                        } else {
                            self.stream_failed().await
                        };
                    }
                    _ = sleep => {}
                    _ = self.stop.notify.notified() => {}
                }
            }
            match done {
                Ok(()) => {
                    if now >= not_before {
                        backoff = FIRST_BACKOFF;
                        first = false;
                    }
                }
                Err(_) if self.stop.is_set() => break,
                Err(e) if first && !e.retryable() => {
                    eprintln!("dmover: error: {e}");
                    return ExitCode::from(output::exit_code(&e));
                }
                Err(e) => {
                    self.say_retry(&e, backoff);
                    catch_up = true;
                    not_before = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        // What the open session has in flight completes, within a bound.
        let run = self.stream.as_ref().map(|s| s.run.clone());
        if tokio::time::timeout(STOP_GRACE, self.close_stream())
            .await
            .is_err()
            && let Some(run) = run
        {
            run.fail(Error::refused(ErrorCode::Aborted, "interrupted"));
        }
        if !self.quiet {
            eprintln!(
                "watch: stopped ({} changes queued; the next start catches up)",
                self.batcher.len()
            );
        }
        ExitCode::SUCCESS
    }

    /// Queues `first` and the events that came with it. `Ok(false)`: events were
    /// lost, a catch-up sync must follow. An error (a directory that cannot be
    /// watched) ends the watch: what is below it would silently not be mirrored.
    fn take_events(&mut self, first: Raw) -> anyhow::Result<bool> {
        let now = Instant::now();
        let mut complete = true;
        let mut next = Some(first);
        // At most a few thousand at once: a flood of events does not hold batches up.
        for _ in 0..4096 {
            let Some(ev) = next.take() else { break };
            if !self.tree.translate(ev, &mut self.batcher, now)? {
                tracing::warn!("inotify lost events: a catch-up sync follows");
                complete = false;
            }
            next = self.rx.try_recv().ok();
        }
        if let Some(ev) = next
            && !self.tree.translate(ev, &mut self.batcher, now)?
        {
            complete = false;
        }
        Ok(complete)
    }

    /// A sync of the whole tree: what is durable at the destination is not sent
    /// again. Files queued (perhaps still being written) are left to their batch.
    async fn catch_up(&mut self) -> CoreResult<()> {
        let t = Instant::now();
        // What the events say first, then what looks written just now.
        if let Ok(ev) = self.rx.try_recv()
            && let Err(e) = self.take_events(ev)
        {
            return Err(Error::refused(ErrorCode::Io, format!("{e:#}")));
        }
        self.tree
            .queue_recent(Vec::new(), &mut self.batcher, self.quiet_time, t);
        let mut opts = self.opts.clone();
        // Queued files are excluded (and so never deleted): exclusions first, since
        // the first matching rule wins, then the user's rules.
        opts.rules = self
            .batcher
            .queued()
            .map(|rel| dmover_proto::control::FilterRule {
                include: false,
                pattern: anchored(rel),
            })
            .chain(opts.rules)
            .collect();
        let mut filter = Filter::none();
        for r in &opts.rules {
            let action = if r.include {
                Action::Include
            } else {
                Action::Exclude
            };
            filter.push(
                Rule::new(action, &r.pattern)
                    .map_err(|e| Error::refused(ErrorCode::Unsupported, e))?,
            );
        }
        opts.filter = Some(Arc::new(filter));
        let r = self.push(opts).await?;
        let pruned = r.pruned.clone().unwrap_or_default();
        if let Some(why) = &r.delete_refused {
            tracing::warn!("catch-up: not deleting anything: {why}");
        }
        self.say(
            serde_json::json!({
                "type": "watch_catch_up",
                "files": r.summary.files,
                "files_unchanged": r.held_files,
                "bytes_sent": r.bytes_sent,
                "deleted": pruned.deleted,
                "seconds_taken": t.elapsed().as_secs_f64(),
            }),
            format!(
                "watch: catch-up sync: sent {} bytes, {} files unchanged, {} deleted ({:.2} s)",
                r.bytes_sent,
                r.held_files,
                pruned.deleted,
                t.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// Ships a batch: its deletions, then its files as the next part of the stream
    /// session's manifest (opened first if none is). Its report follows once the
    /// server has its files ([`Watch::part_durable`]).
    async fn ship(&mut self, batch: Batch, n: u64) -> CoreResult<()> {
        let t = Instant::now();
        // A deleted name the stream's manifest holds (or a directory with something of
        // it below) may come back: the session that sent it must end first, since
        // its manifest would go on naming the deleted directory.
        if let Some(s) = &self.stream
            && batch.delete.iter().any(|rel| s.g.has(rel))
        {
            self.close_stream().await?;
        }
        let mut deleted = 0;
        for rel in &batch.delete {
            match self.delete(rel).await {
                Ok(d) => deleted += d,
                Err(e) if e.retryable() => {
                    // The catch-up that follows mirrors it (it runs with --delete).
                    self.batcher.requeue(Batch {
                        delete: Vec::new(),
                        ship: batch.ship,
                    });
                    return Err(e);
                }
                Err(e) => tracing::warn!("not deleting {}: {e}", String::from_utf8_lossy(rel)),
            }
        }
        if batch.ship.is_empty() {
            self.report(n, 0, 0, deleted, &[], t);
            return Ok(());
        }
        // A file sent before in this session (rewritten since), or a session grown
        // large or gone: a new session.
        if let Some(s) = &self.stream
            && (s.g.ended()
                || s.g.entries() >= STREAM_ENTRIES
                || batch.ship.iter().any(|(rel, _)| s.g.has_file(rel)))
            && let Err(e) = self.close_stream().await
        {
            self.batcher.requeue(batch);
            return Err(e);
        }
        if self.stream.is_none() {
            let run = Run::new();
            let opened = self
                .client
                .push_growing(&self.src, &self.server, &self.dest, run.clone());
            let g = tokio::select! {
                g = opened => g,
                _ = self.stop.notify.notified() => Err(Error::Aborted),
            };
            match g {
                Ok(g) => {
                    self.stream = Some(Stream {
                        g,
                        run,
                        waiting: Default::default(),
                        last: Instant::now(),
                    })
                }
                Err(e) => {
                    self.batcher.requeue(batch);
                    return Err(e);
                }
            }
        }
        let s = self.stream.as_mut().expect("opened above");
        let rels: Vec<Rel> = batch.ship.iter().map(|(rel, _)| rel.clone()).collect();
        let part = s.g.send(&rels);
        s.last = Instant::now();
        s.waiting.push_back(Waiting {
            n,
            files: batch.ship,
            count: part.files,
            bytes: part.bytes,
            deleted,
            started: t,
            durable: part.durable,
        });
        Ok(())
    }

    /// The stream's oldest part is complete at the server: its report.
    fn part_durable(&mut self) {
        let Some(w) = self.stream.as_mut().and_then(|s| s.waiting.pop_front()) else {
            return;
        };
        self.report(w.n, w.count, w.bytes, w.deleted, &w.files, w.started);
    }

    /// The stream session failed: the files of its parts not yet complete at the
    /// server are queued again (a catch-up follows), and why is the error.
    async fn stream_failed(&mut self) -> CoreResult<()> {
        let Some(s) = self.stream.take() else {
            return Ok(());
        };
        for w in s.waiting {
            self.batcher.requeue(Batch {
                delete: Vec::new(),
                ship: w.files,
            });
        }
        match s.g.wait().await {
            Err(e) => Err(e),
            Ok(_) => Err(Error::refused(
                ErrorCode::Io,
                "the watch's session ended early",
            )),
        }
    }

    /// Ends the stream session, if one is open: what it has in flight completes,
    /// directories get their modes, the parts still waiting are reported.
    async fn close_stream(&mut self) -> CoreResult<()> {
        let Some(mut s) = self.stream.take() else {
            return Ok(());
        };
        let waiting = std::mem::take(&mut s.waiting);
        let run = s.run.clone();
        let finishing = s.g.finish();
        tokio::pin!(finishing);
        let r = tokio::select! {
            r = &mut finishing => r,
            // A stop: what is in flight gets a short while to complete.
            _ = self.stop.notify.notified() => {
                match tokio::time::timeout(STOP_GRACE, &mut finishing).await {
                    Ok(r) => r,
                    Err(_) => {
                        run.fail(Error::refused(ErrorCode::Aborted, "interrupted"));
                        finishing.await
                    }
                }
            }
        };
        match r {
            Ok(r) => {
                for f in &r.failed {
                    tracing::info!("{f}: changed while read; it ships after its next close");
                }
                for w in waiting {
                    self.report(w.n, w.count, w.bytes, w.deleted, &w.files, w.started);
                }
                Ok(())
            }
            Err(e) => {
                for w in waiting {
                    self.batcher.requeue(Batch {
                        delete: Vec::new(),
                        ship: w.files,
                    });
                }
                Err(e)
            }
        }
    }

    /// A batch's line: its files are complete at the server (or it had none).
    fn report(
        &self,
        n: u64,
        files: u64,
        bytes: u64,
        deleted: u64,
        shipped: &[(Rel, Instant)],
        started: Instant,
    ) {
        let done = Instant::now();
        let mut lags: Vec<f64> = shipped
            .iter()
            .map(|(_, closed)| done.duration_since(*closed).as_secs_f64())
            .collect();
        lags.sort_by(f64::total_cmp);
        let p50 = lags.get(lags.len() / 2).copied().unwrap_or(0.0);
        let max = lags.last().copied().unwrap_or(0.0);
        self.say(
            serde_json::json!({
                "type": "watch_batch",
                "batch": n,
                "files": files,
                "bytes_sent": bytes,
                "deleted": deleted,
                "lag_p50_ms": (p50 * 1e3).round() as u64,
                "lag_max_ms": (max * 1e3).round() as u64,
                "queued": self.batcher.len(),
                "seconds_taken": done.duration_since(started).as_secs_f64(),
            }),
            format!(
                "watch: batch {n}: {files} files, {bytes} bytes sent, {deleted} deleted, lag p50 {:.0} ms, max {:.0} ms",
                p50 * 1e3,
                max * 1e3
            ),
        );
    }

    /// Deletes `rel` at the destination (it left the source): an `Op::Prune` of that
    /// one name in its directory (`Client::remove_in`). Returns the entries deleted.
    async fn delete(&self, rel: &[u8]) -> CoreResult<u64> {
        let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (&rel[..0], rel),
        };
        // The directory gets back its source's mtime; a directory gone at the source
        // too is deleted with what it holds by its own event.
        let Ok(md) = std::fs::symlink_metadata(self.tree.path(parent)) else {
            return Ok(0);
        };
        use std::os::unix::fs::MetadataExt;
        let mtime = dmover_proto::manifest::Mtime {
            sec: md.mtime(),
            nsec: md.mtime_nsec() as u32,
        };
        let dir = if parent.is_empty() {
            self.dest.clone()
        } else {
            [self.dest.as_slice(), b"/", parent].concat()
        };
        match self.client.remove_in(&self.server, &dir, name, mtime).await {
            // The directory was never shipped: nothing there to delete.
            Err(Error::Remote {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(0),
            r => r,
        }
    }

    /// One sync session of the source with `opts`.
    async fn push(&self, opts: TransferOptions) -> CoreResult<Report> {
        let client = self.client.with_options(opts);
        let run = self.stop.run();
        client
            .push(
                std::slice::from_ref(&self.src),
                &self.server,
                &self.dest,
                run,
            )
            .await
    }

    fn say_retry(&self, e: &Error, wait: Duration) {
        self.say(
            serde_json::json!({
                "type": "watch_retry",
                "error": e.to_string(),
                "wait_ms": wait.as_millis() as u64,
            }),
            format!("watch: {e}; catching up in {:.1} s", wait.as_secs_f64()),
        );
    }

    /// A line on stderr, or with `--json` an ndjson line on stdout.
    fn say(&self, mut j: serde_json::Value, text: String) {
        if self.json {
            j["schema"] = output::SCHEMA.into();
            j["seconds"] = self.started.elapsed().as_secs_f64().into();
            // A reader that went away does not stop the watch (println! would panic).
            let _ = writeln!(std::io::stdout().lock(), "{j}");
        } else if !self.quiet {
            eprintln!("{text}");
        }
    }
}

/// An rsync pattern matching exactly `rel` below the source root.
fn anchored(rel: &[u8]) -> Vec<u8> {
    let mut p = b"/".to_vec();
    for &b in rel {
        if b"*?[\\".contains(&b) {
            p.push(b'\\');
        }
        p.push(b);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchored_patterns_match_only_their_path() {
        let mut f = Filter::none();
        f.push(Rule::new(Action::Exclude, &anchored(b"d/a*[1]?")).unwrap());
        assert!(!f.admits(b"d/a*[1]?", false));
        assert!(f.admits(b"d/ab[1]c", false));
        assert!(f.admits(b"x/d/a*[1]?", false));
    }
}
