//! The library's front door: describe a transfer, run it, watch it, get its report.
//! `dmover cp` and `dmover sync` run through this module; a job service or a binding
//! does the same (no command-line or terminal types here).
//!
//! - A [`TransferSpec`] describes a transfer: its sources and destination
//!   ([`Endpoint`]s: local paths, or paths on servers parsed from `HOST:PATH` or
//!   `dmover://HOST[:PORT]/PATH`), whether it copies or makes the destination a mirror
//!   ([`Kind`]), how a copy between two servers goes ([`Between`]), the options of the
//!   sessions ([`TransferOptions`]: streams, credentials, trust, retries, resume,
//!   filters, `delete`, ...) and this side's disk threads.
//! - [`Transfer::new`] checks it ([`PlanError`]: nothing touched yet) and decides which
//!   way the data goes ([`Direction`]): local to a server (a push), a server to local (a
//!   pull), or server to server, the data going directly ([`Between::Direct`]: one
//!   server dials the other, this side only steers) or through this side
//!   ([`Between::ViaClient`]). It starts the disk threads.
//! - [`Transfer::run`] runs it on the caller's tokio runtime, retrying and resuming as
//!   the options say, and tells a callback what happens ([`Event`]s: the counters every
//!   [`Watch::interval`], the files done, retries, lost streams, tuning decisions,
//!   files that could not be copied), then returns the [`Finished`] transfer's
//!   [`Report`] or the [`Error`] that ended it.
//! - An [`Engine`] makes transfers that share one set of disk threads (a service
//!   running many at once), where [`Transfer::new`] gives each its own.
//! - [`Transfer::canceller`] hands out a [`Canceller`] (any thread, any time): the
//!   transfer stops cleanly (staging files removed, the destination's journal kept for
//!   a resume) and `run` returns the reason given. Dropping `run`'s future cancels too.
//! - [`Transfer::progress`] and [`Transfer::snapshot`] are the live counters for a
//!   view that polls (a progress bar) rather than listens.
//! - A transfer can be tried first: [`Transfer::dry_run`] says what it would send (a
//!   sync: also leave and delete; [`DryRunPlan`]), changing nothing.
//!
//! ```ignore
//! // Runnable: crates/dmover-core/examples/push.rs (`cargo run -p dmover-core --example push`).
//! let spec = TransferSpec::copy(vec![Endpoint::local("run1")], Endpoint::parse("dtn1:incoming")?)
//!     .options(TransferOptions { trust: Some(Trust::KnownHosts(known_hosts)), ..Default::default() });
//! let transfer = Transfer::new(spec)?;                  // checked; disk threads started
//! let cancel = transfer.canceller();                    // e.g. kept by a job table
//! let finished = transfer
//!     .run(Watch::every(Duration::from_secs(1)), |e| match e {
//!         Event::Progress(s) => println!("{} of {} bytes, {:.0} B/s", s.done(), s.total, s.rate),
//!         Event::FilesDone { paths, .. } => println!("done: {paths:?}"),
//!         other => println!("{other:?}"),
//!     })
//!     .await?;
//! println!("{} files in {:?}", finished.report.summary.files, finished.elapsed);
//! ```
//!
//! Threads: the network work runs on the caller's runtime; disk work runs on the
//! transfer's own disk threads (elastic from 8 to 64 unless pinned,
//! [`crate::diskpool`]; one for a copy between two servers, whose data never touches
//! this side's disk, and a relay's sessions have their own). Dropping a [`Transfer`]
//! joins them, so drop it where blocking for a moment is fine (outside the runtime, or
//! in `spawn_blocking`); by then every staging file of a cancelled transfer is gone.
//!
//! Errors: [`PlanError`] before anything runs; then the engine's [`Error`], whose
//! [`Error::code`] classes it (authentication, a busy server, the network, a refused
//! path, ...) and whose [`Error::retryable`] says whether a later run may succeed.

mod dry_run;
mod endpoint;
mod events;
mod plan;

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use crate::client::Client;
use crate::engine::{Progress, Run};
use crate::error::{Error, Result};
use crate::session::TransferOptions;

pub use crate::client::Report;
/// An [`Error`]'s class ([`Error::code`]); which server dials in [`Between::Direct`].
pub use dmover_proto::control::{ErrorCode, TpcMode};
pub use dry_run::{Deletions, DryRunPlan};
pub use endpoint::{Endpoint, EndpointError, with_port};
pub use events::{Event, Snapshot, Watch};
pub use plan::{Direction, PlanError};

use events::Reporter;
use plan::Route;

/// What a transfer does with its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// Copy the sources into the destination (a directory, or a file's new name).
    #[default]
    Copy,
    /// Make the destination a mirror of the one source: the destination is the copy
    /// itself (never its parent), files whose size and mtime match (with
    /// [`TransferOptions::compare_content`]: whose content matches) are not sent, and
    /// with [`TransferOptions::delete`] what the source lacks is deleted after a
    /// transfer that went well (docs/sync.md).
    Sync,
}

/// How a copy between two servers moves its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Between {
    /// From server to server, one dialing the other (`Push`: the source dials);
    /// this side only steers and hears the progress (docs/third-party.md).
    Direct(TpcMode),
    /// Through this side, for servers that cannot reach each other: pulled from the
    /// source and pushed to the destination at once, at most `ring_bytes` of chunks
    /// held in memory (at least two chunks).
    ViaClient {
        /// Bytes of chunks held for the destination.
        ring_bytes: usize,
    },
}

impl Between {
    /// Through this side with the default ring ([`crate::relay::RELAY_BYTES`]).
    pub fn via_client() -> Self {
        Between::ViaClient {
            ring_bytes: crate::relay::RELAY_BYTES,
        }
    }
}

impl Default for Between {
    /// The source server dials the destination.
    fn default() -> Self {
        Between::Direct(TpcMode::Push)
    }
}

/// A transfer as its caller describes it; [`Transfer::new`] checks it.
#[derive(Debug, Clone)]
pub struct TransferSpec {
    /// Where the data comes from: local paths, or paths on one server.
    pub sources: Vec<Endpoint>,
    /// Where it goes.
    pub dest: Endpoint,
    /// A copy or a sync.
    pub kind: Kind,
    /// How a copy between two servers goes (`None`: [`Between::default`]); set on any
    /// other transfer, it is refused ([`PlanError::NotBetweenServers`]).
    pub between_servers: Option<Between>,
    /// The sessions' options. A sync sets `mirror` and `resume` itself.
    pub options: TransferOptions,
    /// Disk threads on this side: `Some(n)` pins them, `None` starts with
    /// [`crate::diskpool::DEFAULT_THREADS`] and lets the disk tuner add more up to
    /// [`crate::diskpool::MAX_THREADS`].
    pub disk_threads: Option<usize>,
}

impl TransferSpec {
    /// A copy of `sources` into `dest`, with default options.
    pub fn copy(sources: Vec<Endpoint>, dest: Endpoint) -> Self {
        TransferSpec {
            sources,
            dest,
            kind: Kind::Copy,
            between_servers: None,
            options: TransferOptions::default(),
            disk_threads: None,
        }
    }

    /// A sync making `dest` a mirror of `source`, with default options.
    pub fn sync(source: Endpoint, dest: Endpoint) -> Self {
        TransferSpec {
            kind: Kind::Sync,
            ..TransferSpec::copy(vec![source], dest)
        }
    }

    /// With these session options.
    pub fn options(mut self, options: TransferOptions) -> Self {
        self.options = options;
        self
    }
}

/// A transfer that ended well: its report and how long it ran.
#[derive(Debug, Clone)]
pub struct Finished {
    /// What the engine reports: files, bytes, streams, attempts, resumed bytes, files
    /// that could not be copied (`failed`, `path: why`), what a sync deleted.
    pub report: Report,
    /// From the start of [`Transfer::run`] to its end.
    pub elapsed: Duration,
}

impl Finished {
    /// Whether everything asked for was done: no file left out (`continue_on_error`),
    /// and a sync's deletions neither refused nor stopped by `max_delete`.
    pub fn complete(&self) -> bool {
        let r = &self.report;
        r.failed.is_empty()
            && r.delete_refused.is_none()
            && r.pruned.as_ref().is_none_or(|p| p.over_limit == 0)
    }
}

/// Stops a running [`Transfer`] from anywhere ([`Transfer::canceller`]).
#[derive(Debug, Clone)]
pub struct Canceller(Arc<Run>);

impl Canceller {
    /// Stops the transfer cleanly: its sessions end, staging files are removed, the
    /// destination keeps its journal (a later run with `resume` goes on from there).
    /// [`Transfer::run`] then returns [`Error::Refused`] with [`ErrorCode::Aborted`]
    /// and `reason` as its message (unless the transfer failed first). A transfer
    /// cancelled before it runs does not start.
    pub fn cancel(&self, reason: impl Into<String>) {
        self.0.fail(Error::refused(ErrorCode::Aborted, reason));
    }

    /// Whether the transfer was cancelled (or failed).
    pub fn is_cancelled(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// Disk threads that several transfers share, as a server's sessions share theirs: a
/// service running many transfers at once makes them with [`Engine::transfer`]
/// rather than giving each its own threads ([`Transfer::new`]).
#[derive(Debug)]
pub struct Engine {
    /// A client with no transfer of its own: the disk threads.
    base: Client,
}

impl Engine {
    /// Disk threads: `Some(n)` pins them, `None` starts with
    /// [`crate::diskpool::DEFAULT_THREADS`] and lets the disk tuners of the transfers
    /// add more up to [`crate::diskpool::MAX_THREADS`].
    pub fn new(disk_threads: Option<usize>) -> Self {
        let (start, max) = crate::diskpool::threads_from(disk_threads);
        Engine {
            base: Client::elastic(TransferOptions::default(), start, max),
        }
    }

    /// [`Transfer::new`] on these disk threads ([`TransferSpec::disk_threads`] is
    /// not used). The threads stay until the engine and all its transfers are dropped.
    pub fn transfer(&self, spec: TransferSpec) -> Result<Transfer, PlanError> {
        Transfer::with_client(spec, |options, _| self.base.with_options(options))
    }
}

/// A checked transfer with its disk threads, ready to run once.
#[derive(Debug)]
pub struct Transfer {
    route: Route,
    kind: Kind,
    client: Client,
    run: Arc<Run>,
    /// When [`Transfer::run`] started.
    started: OnceLock<tokio::time::Instant>,
    ran: AtomicBool,
}

impl Transfer {
    /// Checks `spec`, decides the transfer's direction and starts its disk threads.
    /// Needs no runtime; nothing is read or connected yet.
    pub fn new(spec: TransferSpec) -> Result<Transfer, PlanError> {
        let disk_threads = spec.disk_threads;
        Transfer::with_client(spec, |options, route| match route {
            Route::Push { .. } | Route::Pull { .. } | Route::Local { .. } => {
                let (start, max) = crate::diskpool::threads_from(disk_threads);
                Client::elastic(options, start, max)
            }
            // The data does not touch this side's disk (a relay's sessions have disk
            // threads of their own).
            Route::ThirdParty(_) | Route::Relay { .. } => Client::new(options, 1),
        })
    }

    /// Checks `spec` and makes the transfer's client with `client`.
    fn with_client(
        spec: TransferSpec,
        client: impl FnOnce(TransferOptions, &Route) -> Client,
    ) -> Result<Transfer, PlanError> {
        let kind = spec.kind;
        let (route, options) = plan::plan(spec)?;
        let client = client(options, &route);
        Ok(Transfer {
            route,
            kind,
            client,
            run: Run::new(),
            started: OnceLock::new(),
            ran: AtomicBool::new(false),
        })
    }

    /// Which way the data goes.
    pub fn direction(&self) -> Direction {
        self.route.direction()
    }

    /// A copy between two servers: the server that dials the other.
    pub fn dialer(&self) -> Option<&str> {
        match &self.route {
            Route::ThirdParty(c) => Some(match c.mode {
                TpcMode::Push => &c.source_server,
                TpcMode::Pull => &c.dest_server,
            }),
            _ => None,
        }
    }

    /// The options the transfer runs with.
    pub fn options(&self) -> &TransferOptions {
        &self.client.opts
    }

    /// A handle that stops the transfer.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.run.clone())
    }

    /// The live counters, shared with the running sessions (all attempts).
    pub fn progress(&self) -> &Arc<Progress> {
        &self.run.progress
    }

    /// The counters now; `elapsed` counts from the start of [`Transfer::run`] (zero
    /// before), `rate` is the average.
    pub fn snapshot(&self) -> Snapshot {
        let elapsed = self.started.get().map_or(Duration::ZERO, |s| s.elapsed());
        Snapshot::of(&self.run.progress, elapsed)
    }

    /// Runs the transfer, telling `on_event` what happens as `watch` asks (see
    /// [`Event`]; the last events are the counters at the end and the files that
    /// could not be copied). A transfer runs once: a second call is refused.
    ///
    /// `on_event` is called on the task that awaits this future, between polls of the
    /// transfer: it should return quickly (hand the events to a channel if they are
    /// written somewhere slow). Dropping the future cancels the transfer.
    pub async fn run(&self, watch: Watch, on_event: impl FnMut(Event)) -> Result<Finished> {
        if self.ran.swap(true, Relaxed) {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "this transfer ran already: make a new one",
            ));
        }
        let started = *self.started.get_or_init(tokio::time::Instant::now);
        let progress = &self.run.progress;
        if watch.files {
            progress.file_events.store(true, Relaxed);
            progress.held_events.store(watch.held, Relaxed);
        }
        let mut reporter = Reporter::new(progress, started, on_event);
        let guard = CancelOnDrop(Some(&self.run));
        let work = self.work();
        tokio::pin!(work);
        let mut tick = watch.interval.map(|i| {
            let mut t = tokio::time::interval_at(started + i, i);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let result = loop {
            tokio::select! {
                r = &mut work => break r,
                _ = next_tick(&mut tick) => {
                    reporter.session_events();
                    reporter.files_held();
                    reporter.files_done();
                    reporter.snapshot();
                }
                _ = progress.event_recorded() => reporter.session_events(),
            }
        };
        guard.disarm();
        reporter.session_events();
        reporter.files_held();
        reporter.files_done();
        reporter.snapshot();
        let report = result?;
        for f in &report.failed {
            reporter.emit(Event::FileFailed(f.clone()));
        }
        Ok(Finished {
            report,
            elapsed: started.elapsed(),
        })
    }

    /// The client call of the route.
    async fn work(&self) -> Result<Report> {
        let (c, run) = (&self.client, self.run.clone());
        match &self.route {
            Route::Push {
                server,
                sources,
                dest,
            } => c.push(sources, server, dest, run).await,
            Route::Pull {
                server,
                sources,
                dest,
            } => c.pull(server, sources, dest, run).await,
            Route::ThirdParty(copy) => c.third_party(copy, run).await,
            Route::Relay { copy, ring } => c.relay(copy, *ring, run).await,
            Route::Local { sources, dest } => c.local(sources, dest, run).await,
        }
    }

    /// A dry run: what the transfer would send, changing nothing on either side; it
    /// does not count as the transfer's run.
    ///
    /// - A sync between this side and a server: what it would send, leave unchanged
    ///   and (with `delete`) delete, comparing both sides (not between two servers
    ///   yet).
    /// - A copy: every file of its sources (through the filters), as a copy sends them
    ///   all: a push's and a local copy's are walked here (the server is not
    ///   contacted), a pull's and a
    ///   copy between servers' are listed by the source server through a session that
    ///   asks for no data.
    pub async fn dry_run(&self) -> Result<DryRunPlan> {
        let sync = self.kind == Kind::Sync;
        if !sync {
            let found = match &self.route {
                Route::Push { sources, .. } | Route::Local { sources, .. } => {
                    self.client.copy_dry_run(None, sources).await?
                }
                Route::Pull {
                    server, sources, ..
                } => self.client.copy_dry_run(Some(server), sources).await?,
                Route::ThirdParty(c) | Route::Relay { copy: c, .. } => {
                    self.client
                        .copy_dry_run(Some(&c.source_server), &c.sources)
                        .await?
                }
            };
            return Ok(DryRunPlan::of(&found, false, false));
        }
        let (push, server, sources, dest) = match &self.route {
            Route::Push {
                server,
                sources,
                dest,
            } => (true, server, sources, dest),
            Route::Pull {
                server,
                sources,
                dest,
            } => (false, server, sources, dest),
            Route::ThirdParty(_) | Route::Relay { .. } => {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    "a dry run of a sync between two servers is not supported yet",
                ));
            }
            Route::Local { sources, dest } => {
                let found = self.client.sync_dry_run_local(&sources[0], dest).await?;
                return Ok(DryRunPlan::of(&found, self.client.opts.delete, true));
            }
        };
        let found = self
            .client
            .sync_dry_run(push, server, &sources[0], dest)
            .await?;
        Ok(DryRunPlan::of(&found, self.client.opts.delete, true))
    }
}

/// The next tick, or never.
async fn next_tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Cancels a run whose future is dropped before it ended.
struct CancelOnDrop<'a>(Option<&'a Run>);

impl CancelOnDrop<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(run) = self.0 {
            run.fail(Error::refused(
                ErrorCode::Aborted,
                "the transfer's caller went away",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn a_transfer_and_its_run_can_move_between_threads() {
        let spec = TransferSpec::copy(
            vec![Endpoint::local("a")],
            Endpoint::remote("h", "d").unwrap(),
        );
        let t = Arc::new(Transfer::new(spec).unwrap());
        assert_send(&t);
        let run = t.run(Watch::default(), |_| {});
        assert_send(&run);
        assert_eq!(t.direction(), Direction::Push);
        assert_eq!(t.dialer(), None);
        assert_eq!(t.snapshot().elapsed, Duration::ZERO);
    }

    #[tokio::test]
    async fn a_cancelled_transfer_does_not_start_and_runs_once() {
        let spec = TransferSpec::copy(
            vec![Endpoint::remote("h", "a").unwrap()],
            Endpoint::remote("g", "d").unwrap(),
        );
        let t = Transfer::new(spec).unwrap();
        assert_eq!(t.direction(), Direction::ThirdPartyPush);
        assert_eq!(t.dialer(), Some("h:7700"));
        let c = t.canceller();
        c.cancel("stop");
        assert!(c.is_cancelled());
        let mut events = Vec::new();
        let e = t
            .run(Watch::events(), |e| events.push(e))
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "stop");
        assert!(
            matches!(events.last(), Some(Event::Progress(_))),
            "{events:?}"
        );
        let again = t.run(Watch::events(), |_| {}).await.unwrap_err();
        assert!(again.to_string().contains("ran already"), "{again}");
    }
}
