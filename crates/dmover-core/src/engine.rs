//! What a running transfer shares between its attempts, its driver and its display: the
//! cancellation, the first error and the live counters ([`Run`], [`Progress`]), and a
//! data stream with its peer's name ([`DataStream`]). The data pipelines themselves are
//! the role drivers in [`crate::drive`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// Live counters of a transfer, for progress display and summaries. Shared by the
/// attempts of a transfer that is retried.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes the transfer will move, once known (0 before).
    pub total: AtomicU64,
    /// Payload bytes that crossed the data streams (resent chunks count again).
    pub bytes: AtomicU64,
    /// Chunks that crossed the data streams.
    pub chunks: AtomicU64,
    /// Bytes of chunks that crossed as zeros frames (holes of sparse files: in the
    /// total, not in `bytes`), so a progress bar reaches its end.
    pub holes: AtomicU64,
    /// Bytes the destination already held when the latest attempt started.
    pub held: AtomicU64,
    /// Regular files with data the transfer will move, once known (0 before): the
    /// files [`Progress::files`] counts to (see [`files_with_data`]).
    pub total_files: AtomicU64,
    /// Files whose last byte crossed the data streams (a receiver: was written; a
    /// sender: was sent, a chunk sent again counting again). Files of no bytes are
    /// not counted (they travel in the manifest).
    pub files: AtomicU64,
    /// `bytes` by data stream.
    pub stream_bytes: StreamBytes,
    /// Data streams that broke, all attempts.
    pub streams_lost: AtomicU32,
    /// Chunks a source sent again because their stream broke, all attempts.
    pub chunks_resent: AtomicU64,
    /// The attempt running (1 for the first; 0 before any started).
    pub attempt: AtomicU32,
    /// The tuner's state, in a session that tunes itself.
    pub tuning: Mutex<Option<Tuning>>,
    /// This side's disk tuner ([`crate::disktune`]), when its disk threads are not
    /// pinned.
    pub disk: Mutex<Option<DiskTuning>>,
    /// Later parts of a growing manifest this side received as its sink (a
    /// streamed manifest: 0 when it came whole).
    pub manifest_grown: AtomicU32,
    /// (feature LIMITS, a dialer) The acceptor's limits as it told them in the latest
    /// attempt: its bandwidth limit, the congestion control it sends with (`None`: it
    /// told none, e.g. a server without the feature).
    pub peer_limits: Mutex<Option<dmover_proto::control::SessionLimits>>,
    /// Files done are named ([`Progress::take_files_done`]): a reader asked for them.
    pub file_events: std::sync::atomic::AtomicBool,
    /// The running attempt's manifest, kept while `file_events` is on (to name files).
    manifest: Mutex<Option<Arc<Vec<dmover_proto::manifest::Entry>>>>,
    /// Paths of the files done since the reader last took them.
    files_done: Mutex<Vec<String>>,
    /// Files the destination already held are named ([`Progress::take_files_held`]):
    /// a reader asked for them (with `file_events`).
    pub held_events: std::sync::atomic::AtomicBool,
    /// Paths of the files held since the reader last took them.
    files_held: Mutex<Vec<String>>,
    /// The smallest round trip a tuning source's data streams measured (their
    /// `TCP_INFO` `tcpi_min_rtt`, or the acknowledgements' when not TCP), in
    /// microseconds; 0 while unknown (see [`Progress::note_rtt`]).
    pub min_rtt_us: AtomicU64,
    /// The receive buffer this side, as a sink, last set on its data streams
    /// (`SO_RCVBUF`, bytes; their share of [`dmover_net::tcp::receive_budget`]): held
    /// to it where autotuning would grow past it, or raised to it where a stream's
    /// autotuning reached the host's maximum (docs/tuning.md, "Socket buffers"); 0: the
    /// kernel's autotuning.
    pub receive_buffer: AtomicU64,
    /// The send buffer this side, as a source, last set on its data streams
    /// (`SO_SNDBUF`, bytes): raised above the host's maximum where a stream's
    /// autotuning reached it and the stream waited on it (docs/tuning.md, "Socket
    /// buffers"); 0: the kernel's autotuning.
    pub send_buffer: AtomicU64,
    /// When the first chunk crossed a data stream (see [`Progress::data_flowing`]).
    first_data: std::sync::OnceLock<std::time::Instant>,
    /// Events for a live view, oldest first (see [`Progress::event`]).
    events: Mutex<VecDeque<(u32, ProgressEvent)>>,
    /// Wakes a reader of the events.
    notify: tokio::sync::Notify,
}

/// Payload bytes per data stream, for per-stream rates: one counter per possible
/// stream ([`crate::session::MAX_STREAMS`]).
#[derive(Debug)]
pub struct StreamBytes(Box<[AtomicU64]>);

impl Default for StreamBytes {
    fn default() -> Self {
        StreamBytes(
            (0..crate::session::MAX_STREAMS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }
}

impl StreamBytes {
    /// Counts `n` bytes of stream `stream`.
    pub fn add(&self, stream: u16, n: u64) {
        if let Some(c) = self.0.get(usize::from(stream)) {
            c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The counters up to the last stream that moved bytes.
    pub fn snapshot(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .0
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        while v.last() == Some(&0) {
            v.pop();
        }
        v
    }
}

/// Something that happened during a transfer, beside its counters: for a live view
/// (`dmover cp --progress ndjson`). Rare by nature (never per chunk).
#[derive(Debug, Clone, PartialEq)]
pub enum ProgressEvent {
    /// An attempt failed and the transfer resumes after `wait`.
    Retry {
        /// The attempt that failed.
        attempt: u32,
        /// Why.
        error: String,
        /// The pause before the next attempt.
        wait: std::time::Duration,
    },
    /// A data stream broke; its chunks go on the others.
    StreamLost {
        /// The stream's index.
        stream: u16,
        /// Why.
        error: String,
        /// Chunks sent again on the other streams (a source knows; a sink does not).
        resent: Option<u64>,
    },
    /// This side's disk tuner changed its disk threads.
    DiskTuned {
        /// Disk threads from now on.
        threads: usize,
        /// The rate measured before, in bytes per second.
        rate: u64,
        /// Why.
        reason: String,
    },
    /// The source's tuner changed the data streams it sends on.
    Tuned {
        /// Streams in use from now on.
        streams: u16,
        /// The rate measured before, in bytes per second (0: none yet).
        rate: u64,
        /// Why.
        reason: String,
    },
}

/// Where this side's disk tuner stands ([`crate::disktune`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTuning {
    /// Disk threads in use (while a probe runs: those it started from).
    pub threads: usize,
    /// The most it may use.
    pub of: usize,
    /// Changes so far.
    pub changes: u32,
}

/// Where the source's tuner stands (feature `TUNING`), as this side knows it: its own
/// tuner when it is the source, the source's decisions when it is the sink.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Streams in use (when a probe runs: those it started from).
    pub streams: u16,
    /// The session's streams, the most it may use.
    pub of: u16,
    /// Streams sending now (while a probe runs: the probe's count).
    pub active: u16,
    /// Changes so far.
    pub changes: u32,
    /// Milliseconds after the first chunk when the search first settled, or (as a
    /// sink knows it) when the last change came.
    pub settled_ms: Option<u64>,
}

/// The regular files of `entries` that have data (empty files travel in the manifest,
/// not in chunks): what [`Progress::total_files`] counts.
pub fn files_with_data(entries: &[dmover_proto::manifest::Entry]) -> u64 {
    entries.iter().filter(|e| e.file_size() > 0).count() as u64
}

impl Progress {
    /// Events kept for a reader; older ones are dropped beyond this (nobody may be
    /// reading).
    pub const MAX_EVENTS: usize = 1024;

    /// Notes that a chunk crossed a data stream (a load, after the first).
    #[inline]
    pub fn data_flowing(&self) {
        if self.first_data.get().is_none() {
            let _ = self.first_data.set(std::time::Instant::now());
        }
    }

    /// Notes a round trip measured by the data streams: [`Progress::min_rtt`] keeps
    /// the smallest (a zero is no measurement).
    pub fn note_rtt(&self, rtt: std::time::Duration) {
        if rtt.is_zero() {
            return;
        }
        let us = (rtt.as_micros() as u64).max(1);
        self.min_rtt_us
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |old| (old == 0 || us < old).then_some(us),
            )
            .ok();
    }

    /// The smallest round trip the data streams measured so far, if any.
    pub fn min_rtt(&self) -> Option<std::time::Duration> {
        match self.min_rtt_us.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            us => Some(std::time::Duration::from_micros(us)),
        }
    }

    /// When the first chunk crossed a data stream, once one did.
    pub fn first_data(&self) -> Option<std::time::Instant> {
        self.first_data.get().copied()
    }

    /// Records an event of the running attempt for a live view and wakes its reader.
    pub fn event(&self, e: ProgressEvent) {
        let attempt = self.attempt.load(std::sync::atomic::Ordering::Relaxed);
        let mut q = self.events.lock();
        if q.len() >= Self::MAX_EVENTS {
            q.pop_front();
        }
        q.push_back((attempt, e));
        drop(q);
        self.notify.notify_one();
    }

    /// The running attempt's manifest, for naming files done (kept only while
    /// [`Progress::file_events`] is on).
    pub fn set_manifest(&self, entries: &[dmover_proto::manifest::Entry]) {
        if self.file_events.load(std::sync::atomic::Ordering::Relaxed) {
            *self.manifest.lock() = Some(Arc::new(entries.to_vec()));
        }
    }

    /// A later part of a growing manifest: its entries join the manifest kept for
    /// naming files (while [`Progress::file_events`] is on).
    pub fn extend_manifest(&self, entries: &[dmover_proto::manifest::Entry]) {
        if self.file_events.load(std::sync::atomic::Ordering::Relaxed) {
            let mut m = self.manifest.lock();
            if let Some(all) = m.as_mut() {
                Arc::make_mut(all).extend_from_slice(entries);
            }
        }
    }

    /// A later part of a growing manifest at the sink: its bytes and files join the
    /// totals, its entries the manifest kept for naming files.
    pub fn grow_manifest(&self, entries: &[dmover_proto::manifest::Entry]) {
        use std::sync::atomic::Ordering::Relaxed;
        let t = dmover_proto::manifest::Totals::of(entries);
        self.manifest_grown.fetch_add(1, Relaxed);
        self.total.fetch_add(t.bytes, Relaxed);
        self.total_files
            .fetch_add(crate::engine::files_with_data(entries), Relaxed);
        self.extend_manifest(entries);
    }

    /// Counts the files chunk `k` of `layout` completes (those whose last piece it
    /// carries) into `files`: called once per chunk written (a receiver) or sent (a
    /// sender).
    pub fn count_files(&self, layout: &dmover_proto::layout::Layout, k: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut n = 0;
        for piece in layout.pieces(k).filter(|piece| piece.last) {
            n += 1;
            if let Some(f) = layout.files().get(piece.file as usize) {
                self.file_done(f.entry);
            }
        }
        if n > 0 {
            self.files.fetch_add(n, Relaxed);
        }
    }

    /// Notes that the file of manifest entry `entry` is done (its last byte crossed
    /// the data streams), when files are named.
    pub fn file_done(&self, entry: u32) {
        if !self.file_events.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let m = self.manifest.lock().clone();
        if let Some(m) = m {
            if (entry as usize) < m.len() {
                let path = crate::session::entry_path(&m, entry);
                self.files_done.lock().push(path);
            }
        }
    }

    /// Notes that the destination holds the files of manifest entries `entries`
    /// whole (unchanged in a sync, complete in a resume; not sent), when held files
    /// are named.
    pub fn files_held(&self, entries: impl IntoIterator<Item = u32>) {
        if !self.held_events.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let m = self.manifest.lock().clone();
        if let Some(m) = m {
            let named = entries
                .into_iter()
                .filter(|&e| (e as usize) < m.len())
                .map(|e| crate::session::entry_path(&m, e));
            self.files_held.lock().extend(named);
        }
    }

    /// [`Progress::files_held`] of files named already (paths as in the manifest),
    /// e.g. left out of it before the session.
    pub fn paths_held(&self, paths: impl IntoIterator<Item = String>) {
        if self.held_events.load(std::sync::atomic::Ordering::Relaxed) {
            self.files_held.lock().extend(paths);
        }
    }

    /// Takes the paths of the files held noted since the last call.
    pub fn take_files_held(&self) -> Vec<String> {
        std::mem::take(&mut *self.files_held.lock())
    }

    /// Takes the paths of the files done since the last call, in the order they
    /// were done.
    pub fn take_files_done(&self) -> Vec<String> {
        std::mem::take(&mut *self.files_done.lock())
    }

    /// Takes the events recorded so far, oldest first, each with the attempt it
    /// happened in.
    pub fn take_events(&self) -> Vec<(u32, ProgressEvent)> {
        self.events.lock().drain(..).collect()
    }

    /// Resolves once an event was recorded since the last call (or is pending).
    pub async fn event_recorded(&self) {
        self.notify.notified().await
    }
}

/// Shared state of one running session: cancellation, the first error, counters.
#[derive(Debug, Default)]
pub struct Run {
    cancel: CancellationToken,
    error: Mutex<Option<Error>>,
    /// Live counters.
    pub progress: Arc<Progress>,
}

impl Run {
    /// A new run.
    pub fn new() -> Arc<Self> {
        Arc::new(Run::default())
    }

    /// A run for one attempt of this transfer: cancelled when this one is, sharing
    /// its counters, with its own error.
    pub fn attempt(&self) -> Arc<Self> {
        Arc::new(Run {
            cancel: self.cancel.child_token(),
            error: Mutex::new(None),
            progress: self.progress.clone(),
        })
    }

    /// A run beside this one (the other session of a relay): cancelled when this one
    /// is, with its own error and counters.
    pub fn side(&self) -> Arc<Self> {
        Arc::new(Run {
            cancel: self.cancel.child_token(),
            error: Mutex::new(None),
            progress: Arc::default(),
        })
    }

    /// Records an error and cancels the session. Of several errors the most telling
    /// is kept (see [`Error::rank`]); ties keep the first.
    pub fn fail(&self, e: Error) {
        let mut slot = self.error.lock();
        match &*slot {
            Some(old) if old.rank() >= e.rank() => {}
            _ => *slot = Some(e),
        }
        drop(slot);
        self.cancel.cancel();
    }

    /// Whether the session has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the session is cancelled.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The recorded error, if any.
    pub fn take_error(&self) -> Option<Error> {
        self.error.lock().take()
    }

    /// `Err` with the recorded error if the session failed.
    pub fn check(&self) -> Result<()> {
        match self.take_error() {
            Some(e) => Err(e),
            None if self.is_cancelled() => Err(Error::Aborted),
            None => Ok(()),
        }
    }
}

/// A data stream: any byte stream, plus a name for messages.
pub struct DataStream<S> {
    /// The connection.
    pub io: S,
    /// The peer, for messages.
    pub peer: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn the_smallest_round_trip_is_kept() {
        let p = Progress::default();
        assert_eq!(p.min_rtt(), None);
        p.note_rtt(std::time::Duration::ZERO);
        assert_eq!(p.min_rtt(), None, "a zero is no measurement");
        p.note_rtt(std::time::Duration::from_micros(900));
        p.note_rtt(std::time::Duration::from_millis(3));
        assert_eq!(p.min_rtt(), Some(std::time::Duration::from_micros(900)));
        p.note_rtt(std::time::Duration::from_nanos(10));
        assert_eq!(
            p.min_rtt(),
            Some(std::time::Duration::from_micros(1)),
            "below a microsecond counts as one"
        );
    }

    fn lost(stream: u16) -> ProgressEvent {
        ProgressEvent::StreamLost {
            stream,
            error: "cut".into(),
            resent: None,
        }
    }

    #[test]
    fn events_carry_their_attempt_and_are_bounded() {
        let p = Progress::default();
        p.attempt.store(1, Relaxed);
        p.event(lost(0));
        p.attempt.store(2, Relaxed);
        p.event(lost(1));
        assert_eq!(p.take_events(), vec![(1, lost(0)), (2, lost(1))]);
        assert!(p.take_events().is_empty());
        // Nobody reading: the oldest go.
        for i in 0..Progress::MAX_EVENTS + 5 {
            p.event(lost(i as u16));
        }
        let e = p.take_events();
        assert_eq!(e.len(), Progress::MAX_EVENTS);
        assert_eq!(e[0], (2, lost(5)));
    }

    #[tokio::test]
    async fn an_event_wakes_its_reader() {
        let p = Arc::new(Progress::default());
        let q = p.clone();
        let reader = tokio::spawn(async move {
            q.event_recorded().await;
            q.take_events()
        });
        p.event(lost(3));
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got, vec![(0, lost(3))]);
    }
}
