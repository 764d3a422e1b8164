//! What a running transfer tells its caller: [`Event`]s for a live view or a job's
//! record, read from the transfer's [`Progress`] (its live counters and its rare
//! events) by [`super::Transfer::run`] while the transfer runs.
//!
//! A caller that only draws a bar can poll [`super::Transfer::snapshot`] instead; the
//! events are for one that keeps a record: every retry, lost stream and tuning
//! decision once, the files as they are done (when [`Watch::files`] asks), and a
//! [`Snapshot`] of the counters every [`Watch::interval`] and once at the end.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::engine::{Progress, ProgressEvent, Tuning};

/// What [`super::Transfer::run`] reports while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    /// A [`Event::Progress`] this often (the first one interval after the start, the
    /// last at the end); `None`: only the last.
    pub interval: Option<Duration>,
    /// Name the files as they are done ([`Event::FilesDone`]): the transfer then keeps
    /// its manifest's names in memory.
    pub files: bool,
    /// With `files`, name too the files the destination already held whole
    /// ([`Event::FilesHeld`]: unchanged in a sync, complete in a resume).
    pub held: bool,
}

impl Watch {
    /// Events as they happen and the last counters; no files, no ticks.
    pub fn events() -> Self {
        Watch {
            interval: None,
            files: false,
            held: false,
        }
    }

    /// Events as they happen, the counters every `interval`, and the files done.
    pub fn every(interval: Duration) -> Self {
        Watch {
            interval: Some(interval),
            files: true,
            held: false,
        }
    }
}

impl Default for Watch {
    /// [`Watch::events`].
    fn default() -> Self {
        Watch::events()
    }
}

/// Something a running transfer reports ([`super::Transfer::run`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// The counters, every [`Watch::interval`] and once at the end.
    Progress(Snapshot),
    /// Files whose last byte crossed the data streams since the last such event
    /// (paths as in the manifest: the source root's name first), in the order they
    /// were done; only with [`Watch::files`].
    FilesDone {
        /// The attempt they were done in (1 for the first).
        attempt: u32,
        /// Their paths.
        paths: Vec<String>,
    },
    /// Files the destination already held whole, not sent (paths as in the
    /// manifest: unchanged in a sync, complete in a resume, kept by `--size-only` or
    /// `--ignore-existing`); only with [`Watch::held`]. Told as the attempt knows them,
    /// before its data flow.
    FilesHeld {
        /// The attempt they were held in (1 for the first).
        attempt: u32,
        /// Their paths.
        paths: Vec<String>,
    },
    /// A source file that could not be copied (with
    /// [`TransferOptions::continue_on_error`](crate::session::TransferOptions::continue_on_error)):
    /// `path: why`, as the report's [`failed`](crate::client::Report::failed) says;
    /// told at the end, once the transfer's report names them.
    FileFailed(String),
    /// A retry, a lost data stream, a tuning decision of the streams or the disk
    /// threads, in the attempt it happened in.
    Session {
        /// The attempt (1 for the first).
        attempt: u32,
        /// What happened.
        event: ProgressEvent,
    },
}

/// A transfer's counters at one moment (all attempts together, unless said).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    /// Time since the run started.
    pub elapsed: Duration,
    /// Payload bytes that crossed the data streams (resent chunks count again).
    pub bytes: u64,
    /// Bytes the transfer moves, once known (0 before).
    pub total: u64,
    /// Bytes the destination already held when the latest attempt started (resumed,
    /// or unchanged in a sync).
    pub held: u64,
    /// Bytes of holes (sparse files) that crossed as zeros frames.
    pub holes: u64,
    /// Chunks that crossed the data streams.
    pub chunks: u64,
    /// Regular files with data whose last byte crossed (see [`Progress::files`]).
    pub files: u64,
    /// Regular files with data to move, once known.
    pub total_files: u64,
    /// Data streams that broke.
    pub streams_lost: u32,
    /// Chunks sent again because their stream broke.
    pub chunks_resent: u64,
    /// The attempt running (1 for the first; 0 before any started).
    pub attempt: u32,
    /// Bytes per second since the previous snapshot of the same run (the average
    /// for the first).
    pub rate: f64,
    /// Bytes per second since the start.
    pub average_rate: f64,
    /// The source's tuner, in a self-tuning transfer.
    pub tuning: Option<Tuning>,
}

impl Snapshot {
    /// The counters of `p` now, `elapsed` after the start; `rate` is left at the
    /// average.
    pub fn of(p: &Progress, elapsed: Duration) -> Self {
        let bytes = p.bytes.load(Relaxed);
        let average_rate = bytes as f64 / elapsed.as_secs_f64().max(1e-9);
        Snapshot {
            elapsed,
            bytes,
            total: p.total.load(Relaxed),
            held: p.held.load(Relaxed),
            holes: p.holes.load(Relaxed),
            chunks: p.chunks.load(Relaxed),
            files: p.files.load(Relaxed),
            total_files: p.total_files.load(Relaxed),
            streams_lost: p.streams_lost.load(Relaxed),
            chunks_resent: p.chunks_resent.load(Relaxed),
            attempt: p.attempt.load(Relaxed),
            rate: average_rate,
            average_rate,
            tuning: *p.tuning.lock(),
        }
    }

    /// Bytes of the total that are at the destination or on their way: held, sent
    /// and holes (what a progress bar shows against [`Snapshot::total`]).
    pub fn done(&self) -> u64 {
        self.held + self.bytes + self.holes
    }
}

/// Turns a run's [`Progress`] into [`Event`]s for a callback.
pub(super) struct Reporter<'a, F: FnMut(Event)> {
    progress: &'a Progress,
    started: tokio::time::Instant,
    /// The previous snapshot's time and bytes, for the rate between the two.
    mark: (Duration, u64),
    emit: F,
}

impl<'a, F: FnMut(Event)> Reporter<'a, F> {
    pub(super) fn new(progress: &'a Progress, started: tokio::time::Instant, emit: F) -> Self {
        Reporter {
            progress,
            started,
            mark: (Duration::ZERO, 0),
            emit,
        }
    }

    /// The events recorded since the last call.
    pub(super) fn session_events(&mut self) {
        for (attempt, event) in self.progress.take_events() {
            (self.emit)(Event::Session { attempt, event });
        }
    }

    /// The files done since the last call, if any.
    pub(super) fn files_done(&mut self) {
        let paths = self.progress.take_files_done();
        if !paths.is_empty() {
            let attempt = self.progress.attempt.load(Relaxed);
            (self.emit)(Event::FilesDone { attempt, paths });
        }
    }

    /// The files held noted since the last call, if any.
    pub(super) fn files_held(&mut self) {
        let paths = self.progress.take_files_held();
        if !paths.is_empty() {
            let attempt = self.progress.attempt.load(Relaxed);
            (self.emit)(Event::FilesHeld { attempt, paths });
        }
    }

    /// A snapshot of the counters, with the rate since the previous one.
    pub(super) fn snapshot(&mut self) {
        let elapsed = self.started.elapsed();
        let mut s = Snapshot::of(self.progress, elapsed);
        let span = elapsed.saturating_sub(self.mark.0).as_secs_f64();
        s.rate = if span > 0.0 {
            s.bytes.saturating_sub(self.mark.1) as f64 / span
        } else {
            0.0
        };
        self.mark = (elapsed, s.bytes);
        (self.emit)(Event::Progress(s));
    }

    /// Tells `e` as it is.
    pub(super) fn emit(&mut self, e: Event) {
        (self.emit)(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reporter_tells_events_files_and_rates() {
        let p = Progress::default();
        p.attempt.store(2, Relaxed);
        p.bytes.store(1000, Relaxed);
        p.event(ProgressEvent::StreamLost {
            stream: 1,
            error: "cut".into(),
            resent: Some(3),
        });
        let mut got = Vec::new();
        let started = tokio::time::Instant::now() - Duration::from_secs(2);
        {
            let mut r = Reporter::new(&p, started, |e| got.push(e));
            r.session_events();
            r.files_done();
            r.snapshot();
            r.session_events();
        }
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(
            &got[0],
            Event::Session {
                attempt: 2,
                event: ProgressEvent::StreamLost { stream: 1, .. }
            }
        ));
        let Event::Progress(s) = &got[1] else {
            panic!("{got:?}")
        };
        assert_eq!((s.bytes, s.attempt, s.done()), (1000, 2, 1000));
        assert!((s.rate - 500.0).abs() < 10.0, "{}", s.rate);
    }

    #[test]
    fn files_are_named_when_asked() {
        use dmover_proto::manifest::{Entry, EntryKind, NO_PARENT};
        let p = Progress::default();
        p.file_events.store(true, Relaxed);
        let e = |name: &str, parent, kind| Entry {
            name: name.as_bytes().to_vec(),
            parent,
            kind,
            mode: 0o755,
            mtime: Default::default(),
        };
        p.set_manifest(&[
            e("root", NO_PARENT, EntryKind::Dir),
            e("f", 0, EntryKind::File { size: 5 }),
        ]);
        p.file_done(1);
        let mut got = Vec::new();
        Reporter::new(&p, tokio::time::Instant::now(), |e| got.push(e)).files_done();
        assert_eq!(
            got,
            vec![Event::FilesDone {
                attempt: 0,
                paths: vec!["root/f".into()]
            }]
        );
    }
}
