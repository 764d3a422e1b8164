//! The server's live view of its sessions: what `dmover serve --metrics` shows as
//! Prometheus metrics (`/metrics`), as JSON (`/api/transfers`) and on its web page.
//!
//! A session registers once it is authenticated and has asked for something
//! ([`Monitor::start`], a [`Live`] handle), attaches its [`Progress`] counters when its
//! run exists, and finishes with its result. Nothing here is on a chunk's path: the
//! drivers only bump the atomics of [`Progress`] as they always did; the monitor reads
//! them when scraped or sampled (once a second, [`Monitor::sample`]), and takes its
//! lock when a session starts or ends.
//!
//! Bounded by construction: the finished sessions kept for the page are the last
//! [`RECENT`], each session's rate history the last [`HISTORY`] samples, and the metric
//! labels are the op, the direction, the result, an error class and the user name
//! (from the configured users, so bounded too); never a path or a peer's address.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use dmover_net::NetError;
use dmover_proto::control::ErrorCode;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::diskpool::DiskPool;
use crate::engine::Progress;
use crate::error::Error;

/// The content type of [`Monitor::prometheus`]'s text.
pub const PROMETHEUS_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Finished sessions kept for the page.
pub const RECENT: usize = 50;

/// Rate samples kept per session (one a second: the last ten minutes).
pub const HISTORY: usize = 600;

/// Points of a session's rate history in [`Monitor::transfers`] (averaged over
/// stretches of samples beyond it), so the page's JSON stays small.
pub const HISTORY_POINTS: usize = 120;

/// How often [`Monitor::tick`] is to be called: the resolution of the network busy
/// time.
pub const NET_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// Samples the page's "current rate" and the ETA average over.
const RATE_WINDOW: usize = 5;

/// The ops a session can run, as labels (`third_party`: this server dialed another
/// for a steering client).
const OPS: [&str; 4] = ["push", "pull", "memtest", "third_party"];

/// Where a session's bytes went, from the server's side, as labels: with a client
/// (`received`: a push, `sent`: a pull), with another server in a third-party copy
/// (either side of it), or in a memory-to-memory test (`dmover bench net`).
pub const DIRECTIONS: [&str; 6] = [
    "received",
    "sent",
    "third_party_received",
    "third_party_sent",
    "memtest_received",
    "memtest_sent",
];

/// Authentication failures, by kind (the labels of `dmover_auth_failures_total`).
pub const AUTH_FAILURES: [&str; 5] = [
    // A known user with a wrong token, key or signature, or none.
    "bad_credential",
    // A user name the configuration does not know.
    "unknown_user",
    // A session ended because a reload took its user's credential or rights away.
    "revoked",
    // A control connection whose TLS handshake failed.
    "tls",
    // A third-party capability refused (expired, replayed, another key or address).
    "capability",
];

/// Why the server could not take a session (yet), as labels of
/// `dmover_refusals_total`: the limit that was reached.
pub const REFUSALS: [&str; 6] = [
    // Set-up places taken: the control connection was answered busy before TLS.
    "max_handshakes",
    // Beyond the set-up places and their overflow: answered busy (control) or closed
    // (data), in order.
    "max_handshakes_overflow",
    // The source address's unauthenticated connections at their limit, or holding
    // their share of the session places: answered busy before TLS.
    "max_unauthenticated_per_address",
    // All session places taken (answered busy before TLS, or at `Open`).
    "max_sessions",
    // The user's sessions at their limit (after authentication).
    "max_sessions_per_user",
    // No room in the buffer memory budget in time.
    "memory_budget",
];

/// The server's sessions, live and recent, and its counters.
#[derive(Debug)]
pub struct Monitor {
    inner: Mutex<Inner>,
    next_id: AtomicU64,
    busy_refused: AtomicU64,
    /// Authentication failures and refusals, by label.
    failures: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Network busy time: the last reading of all payload bytes, and the seconds
    /// counted busy so far ([`Monitor::tick`]).
    net: Mutex<NetBusy>,
    /// The server's disk threads and buffer memory, once watched.
    resources: OnceLock<Resources>,
    started: Instant,
    started_unix: f64,
}

#[derive(Debug)]
struct Resources {
    disk: Arc<DiskPool>,
    memory: Arc<Semaphore>,
    /// The buffer memory budget, in permits of `unit` bytes.
    units: usize,
    unit: u64,
}

/// What the server's shared resources are doing.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    disk_busy: f64,
    disk_jobs: u64,
    disk_wait: f64,
    disk_threads: usize,
    memory_budget: u64,
    memory_reserved: u64,
}

impl Default for Monitor {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Default)]
struct NetBusy {
    last: Option<(Instant, u64)>,
    seconds: f64,
}

#[derive(Debug, Default)]
struct Inner {
    active: BTreeMap<u64, Arc<Session>>,
    recent: VecDeque<Arc<Session>>,
    /// What finished sessions moved, by (direction, user).
    moved: BTreeMap<(&'static str, String), Moved>,
    /// Finished sessions by (op, result).
    sessions: BTreeMap<(&'static str, &'static str), u64>,
    /// Failed sessions by error class.
    errors: BTreeMap<&'static str, u64>,
    /// Payload bytes of finished sessions, all directions (for network busy time).
    finished_bytes: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Moved {
    bytes: u64,
    files: u64,
    streams_lost: u64,
    chunks_resent: u64,
    /// Sessions whose destination held part of the data already (0 or 1 per session).
    resumed: u64,
}

impl Moved {
    fn of(p: &Progress) -> Self {
        Moved {
            bytes: p.bytes.load(Relaxed),
            files: p.files.load(Relaxed),
            streams_lost: u64::from(p.streams_lost.load(Relaxed)),
            chunks_resent: p.chunks_resent.load(Relaxed),
            resumed: u64::from(p.held.load(Relaxed) > 0),
        }
    }

    fn add(&mut self, o: Moved) {
        self.bytes += o.bytes;
        self.files += o.files;
        self.streams_lost += o.streams_lost;
        self.chunks_resent += o.chunks_resent;
        self.resumed += o.resumed;
    }
}

/// One session as the monitor sees it.
#[derive(Debug)]
pub struct Session {
    id: u64,
    peer: String,
    user: String,
    op: &'static str,
    /// Where its bytes go (one of [`DIRECTIONS`]).
    direction: &'static str,
    started: Instant,
    started_unix: f64,
    progress: OnceLock<Arc<Progress>>,
    state: Mutex<SessionState>,
}

#[derive(Debug, Default)]
struct SessionState {
    /// (seconds since the start, bytes) once a second.
    history: VecDeque<(f64, u64)>,
    /// The latest sample's bytes per data stream, and their rates since the one
    /// before.
    streams: (f64, Vec<u64>),
    stream_rates: Vec<f64>,
    end: Option<End>,
}

#[derive(Debug, Clone)]
struct End {
    seconds: f64,
    error: Option<String>,
    bytes: u64,
    files: u64,
}

impl Session {
    /// What the session moved so far (a memory test's parts are no files).
    fn moved(&self) -> Moved {
        let mut m = self
            .progress
            .get()
            .map(|p| Moved::of(p))
            .unwrap_or_default();
        if self.op == "memtest" {
            m.files = 0;
        }
        m
    }
}

/// The error class of a failed session (a bounded label).
pub fn error_kind(e: &Error) -> &'static str {
    if matches!(e, Error::Net(n) if !matches!(n, NetError::Proto { .. })) {
        return "network";
    }
    match e.code() {
        ErrorCode::Protocol => "protocol",
        ErrorCode::Auth => "auth",
        ErrorCode::NotFound => "not_found",
        ErrorCode::PermissionDenied => "permission_denied",
        ErrorCode::PathEscape => "path_escape",
        ErrorCode::ReadOnly => "read_only",
        ErrorCode::Io => "io",
        ErrorCode::Checksum => "checksum",
        ErrorCode::Busy => "busy",
        ErrorCode::Aborted => "aborted",
        ErrorCode::Unsupported => "unsupported",
        ErrorCode::Changed => "changed",
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A registered session; finishes it (as aborted) when dropped unfinished.
#[derive(Debug)]
pub struct Live {
    monitor: Arc<Monitor>,
    session: Arc<Session>,
    finished: AtomicBool,
}

impl Live {
    /// The session's counters, once its run exists.
    pub fn attach(&self, progress: &Arc<Progress>) {
        let _ = self.session.progress.set(progress.clone());
    }

    /// Ends the session with its result and, when it succeeded, its summary's bytes and
    /// files (`done`).
    pub fn finish(&self, result: &crate::Result<()>, done: Option<(u64, u64)>) {
        if self.finished.swap(true, Relaxed) {
            return;
        }
        let (ok, error, kind) = match result {
            Ok(()) => (true, None, None),
            Err(e) => (false, Some(e.to_string()), Some(error_kind(e))),
        };
        if result.as_ref().is_err_and(crate::policy::is_revoked) {
            self.monitor.auth_failed("revoked");
        }
        self.monitor.end(&self.session, ok, error, kind, done);
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if !self.finished.swap(true, Relaxed) {
            let e = Error::Aborted;
            self.monitor.end(
                &self.session,
                false,
                Some(e.to_string()),
                Some(error_kind(&e)),
                None,
            );
        }
    }
}

impl Monitor {
    /// A monitor with no session yet.
    pub fn new() -> Self {
        Monitor {
            inner: Mutex::default(),
            next_id: AtomicU64::new(1),
            busy_refused: AtomicU64::new(0),
            failures: Mutex::default(),
            net: Mutex::default(),
            resources: OnceLock::new(),
            started: Instant::now(),
            started_unix: unix_now(),
        }
    }

    /// Watches the server's disk threads and its buffer memory, `units` permits of
    /// `unit` bytes (the first call counts; before it, both read as 0).
    pub fn watch(&self, disk: &Arc<DiskPool>, memory: &Arc<Semaphore>, units: usize, unit: u64) {
        let _ = self.resources.get_or_init(|| Resources {
            disk: disk.clone(),
            memory: memory.clone(),
            units,
            unit,
        });
    }

    fn usage(&self) -> Usage {
        let Some(r) = self.resources.get() else {
            return Usage::default();
        };
        let (disk_busy, disk_jobs) = r.disk.busy();
        let reserved = r.units.saturating_sub(r.memory.available_permits()) as u64;
        Usage {
            disk_busy,
            disk_jobs,
            disk_wait: r.disk.waited(),
            disk_threads: r.disk.threads(),
            memory_budget: r.units as u64 * r.unit,
            memory_reserved: reserved * r.unit,
        }
    }

    /// Registers a session of `user` (a configured name) from `peer` running `op`
    /// (one of [`OPS`]: `push`, `pull`, `memtest` or `third_party`), its bytes going
    /// `direction` (one of [`DIRECTIONS`]).
    pub fn start(
        self: &Arc<Self>,
        peer: &str,
        user: &str,
        op: &'static str,
        direction: &'static str,
    ) -> Live {
        debug_assert!(OPS.contains(&op) && DIRECTIONS.contains(&direction));
        let session = Arc::new(Session {
            id: self.next_id.fetch_add(1, Relaxed),
            peer: peer.to_string(),
            user: user.to_string(),
            op,
            direction,
            started: Instant::now(),
            started_unix: unix_now(),
            progress: OnceLock::new(),
            state: Mutex::default(),
        });
        self.inner.lock().active.insert(session.id, session.clone());
        Live {
            monitor: self.clone(),
            session,
            finished: AtomicBool::new(false),
        }
    }

    /// Counts a control connection answered busy before TLS.
    pub fn busy_refused(&self) {
        self.busy_refused.fetch_add(1, Relaxed);
    }

    /// Counts an authentication failure of `kind` (one of [`AUTH_FAILURES`]).
    pub fn auth_failed(&self, kind: &'static str) {
        debug_assert!(AUTH_FAILURES.contains(&kind));
        *self.failures.lock().entry(("auth", kind)).or_default() += 1;
    }

    /// Counts a session or connection the server could not take, for `reason` (one
    /// of [`REFUSALS`]).
    pub fn refused(&self, reason: &'static str) {
        debug_assert!(REFUSALS.contains(&reason));
        *self.failures.lock().entry(("refusal", reason)).or_default() += 1;
    }

    /// Counts network busy time: call every [`NET_TICK`]. The interval since the
    /// previous call counts as busy when the payload bytes of all sessions (running
    /// and finished) grew in it.
    pub fn tick(&self) {
        let total = {
            let inner = self.inner.lock();
            inner.finished_bytes
                + inner
                    .active
                    .values()
                    .filter_map(|s| s.progress.get())
                    .map(|p| p.bytes.load(Relaxed))
                    .sum::<u64>()
        };
        let now = Instant::now();
        let mut net = self.net.lock();
        if let Some((t, bytes)) = net.last {
            if total > bytes {
                net.seconds += now.duration_since(t).as_secs_f64();
            }
        }
        net.last = Some((now, total));
    }

    /// Seconds counted busy by [`Monitor::tick`].
    pub fn network_busy_seconds(&self) -> f64 {
        self.net.lock().seconds
    }

    fn end(
        &self,
        s: &Arc<Session>,
        ok: bool,
        error: Option<String>,
        kind: Option<&'static str>,
        done: Option<(u64, u64)>,
    ) {
        let seconds = s.started.elapsed().as_secs_f64();
        let mut moved = s.moved();
        if let (true, Some((_, files)), false) = (ok, done, s.op == "memtest") {
            // Files of no bytes count at the end; the counter never goes back.
            moved.files = moved.files.max(files);
        }
        {
            let mut st = s.state.lock();
            push_sample(&mut st.history, seconds, moved.bytes);
            st.end = Some(End {
                seconds,
                error,
                bytes: moved.bytes,
                files: moved.files,
            });
        }
        let mut inner = self.inner.lock();
        inner.active.remove(&s.id);
        inner.finished_bytes += moved.bytes;
        inner
            .moved
            .entry((s.direction, s.user.clone()))
            .or_default()
            .add(moved);
        *inner
            .sessions
            .entry((s.op, if ok { "ok" } else { "error" }))
            .or_default() += 1;
        if let Some(kind) = kind {
            *inner.errors.entry(kind).or_default() += 1;
        }
        if inner.recent.len() >= RECENT {
            inner.recent.pop_front();
        }
        inner.recent.push_back(s.clone());
    }

    /// Takes a rate sample of every running session (call once a second).
    pub fn sample(&self) {
        let active: Vec<Arc<Session>> = self.inner.lock().active.values().cloned().collect();
        for s in active {
            if let Some(p) = s.progress.get() {
                let t = s.started.elapsed().as_secs_f64();
                let per_stream = p.stream_bytes.snapshot();
                let mut st = s.state.lock();
                push_sample(&mut st.history, t, p.bytes.load(Relaxed));
                let (t0, before) = &st.streams;
                let rates = per_stream
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| rate((*t0, before.get(i).copied().unwrap_or(0)), (t, b)))
                    .collect();
                st.stream_rates = rates;
                st.streams = (t, per_stream);
            }
        }
    }

    /// Sessions running now.
    pub fn active(&self) -> usize {
        self.inner.lock().active.len()
    }

    /// The running sessions (newest first), then the recent finished ones (newest
    /// first), for `/api/transfers`.
    pub fn transfers(&self) -> Transfers {
        let (active, recent) = {
            let inner = self.inner.lock();
            let a: Vec<_> = inner.active.values().rev().cloned().collect();
            let r: Vec<_> = inner.recent.iter().rev().cloned().collect();
            (a, r)
        };
        let u = self.usage();
        Transfers {
            now_unix: unix_now(),
            server: ServerView {
                started_unix: self.started_unix,
                uptime_seconds: self.started.elapsed().as_secs_f64(),
                active: active.len(),
                memory_budget_bytes: u.memory_budget,
                memory_reserved_bytes: u.memory_reserved,
                disk_threads: u.disk_threads,
                disk_busy_seconds: u.disk_busy,
                network_busy_seconds: self.network_busy_seconds(),
            },
            transfers: active
                .iter()
                .chain(recent.iter())
                .map(|s| s.view())
                .collect(),
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of the metrics in
    /// docs/metrics.md.
    pub fn prometheus(self: &Arc<Self>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Collect(self.clone())));
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }
}

fn push_sample(h: &mut VecDeque<(f64, u64)>, t: f64, bytes: u64) {
    if h.len() >= HISTORY {
        h.pop_front();
    }
    h.push_back((t, bytes));
}

/// Rate in bits per second between two samples.
fn rate(a: (f64, u64), b: (f64, u64)) -> f64 {
    let dt = b.0 - a.0;
    if dt <= 0.0 {
        return 0.0;
    }
    b.1.saturating_sub(a.1) as f64 * 8.0 / dt
}

/// The rates of a session's samples, at most [`HISTORY_POINTS`]: each
/// `[seconds, bit/s]` the average over its stretch of samples.
fn rates(h: &VecDeque<(f64, u64)>) -> Vec<[f64; 2]> {
    let step = h.len().saturating_sub(1).div_ceil(HISTORY_POINTS).max(1);
    let mut picked: Vec<(f64, u64)> = h.iter().step_by(step).copied().collect();
    let tail = (h.back().copied()).filter(|l| picked.last().is_some_and(|k| l.0 > k.0));
    picked.extend(tail);
    picked
        .iter()
        .zip(picked.iter().skip(1))
        .map(|(&a, &b)| [b.0, rate(a, b)])
        .collect()
}

impl Session {
    fn view(&self) -> TransferView {
        let p = self.progress.get();
        let load = |f: fn(&Progress) -> u64| p.map_or(0, |p| f(p));
        let st = self.state.lock();
        let end = st.end.clone();
        let seconds = end
            .as_ref()
            .map_or_else(|| self.started.elapsed().as_secs_f64(), |e| e.seconds);
        let bytes = end
            .as_ref()
            .map_or_else(|| load(|p| p.bytes.load(Relaxed)), |e| e.bytes);
        let files = end.as_ref().map_or_else(|| self.moved().files, |e| e.files);
        let h = &st.history;
        let history = rates(h);
        let window = h.len().saturating_sub(RATE_WINDOW + 1);
        let bit_per_s = match (h.get(window), h.back()) {
            (Some(&a), Some(&b)) if end.is_none() => rate(a, b),
            _ => 0.0,
        };
        let bytes_total = load(|p| p.total.load(Relaxed));
        let bytes_held = load(|p| p.held.load(Relaxed));
        let eta_seconds = if end.is_none() && bytes_total > 0 && bit_per_s > 0.0 {
            let left = bytes_total.saturating_sub(bytes_held.saturating_add(bytes));
            Some(left as f64 * 8.0 / bit_per_s)
        } else {
            None
        };
        TransferView {
            id: self.id,
            peer: self.peer.clone(),
            user: self.user.clone(),
            op: self.op,
            direction: self.direction,
            state: match &end {
                None => "running",
                Some(e) if e.error.is_none() => "ok",
                Some(_) => "error",
            },
            started_unix: self.started_unix,
            seconds,
            bytes,
            bytes_total,
            bytes_held,
            files,
            files_total: load(|p| p.total_files.load(Relaxed)),
            bit_per_s,
            avg_bit_per_s: bytes as f64 * 8.0 / seconds.max(1e-9),
            eta_seconds,
            streams: match &end {
                None => st.stream_rates.clone(),
                Some(_) => Vec::new(),
            },
            streams_lost: load(|p| u64::from(p.streams_lost.load(Relaxed))),
            chunks_resent: load(|p| p.chunks_resent.load(Relaxed)),
            error: end.and_then(|e| e.error),
            history,
        }
    }
}

/// What `/api/transfers` answers (docs/json.md).
#[derive(Debug, Serialize)]
pub struct Transfers {
    /// The server's clock, seconds since the Unix epoch.
    pub now_unix: f64,
    /// The server as a whole.
    pub server: ServerView,
    /// Running sessions, newest first, then finished ones, newest first.
    pub transfers: Vec<TransferView>,
}

/// The server as a whole.
#[derive(Debug, Serialize)]
pub struct ServerView {
    /// When the server started (Unix seconds).
    pub started_unix: f64,
    /// Seconds since.
    pub uptime_seconds: f64,
    /// Sessions running.
    pub active: usize,
    /// Bytes of chunk buffers all sessions may hold together.
    pub memory_budget_bytes: u64,
    /// Bytes of that budget the running sessions hold.
    pub memory_reserved_bytes: u64,
    /// Disk threads.
    pub disk_threads: usize,
    /// Seconds the disk threads spent on jobs, all together.
    pub disk_busy_seconds: f64,
    /// Seconds during which some session's data streams moved payload bytes
    /// (docs/metrics.md).
    pub network_busy_seconds: f64,
}

/// One session (docs/json.md).
#[derive(Debug, Serialize)]
pub struct TransferView {
    /// Unique within the server's life.
    pub id: u64,
    /// The client's address and port.
    pub peer: String,
    /// The authenticated user.
    pub user: String,
    /// `push`, `pull`, `memtest` or `third_party` (this server dialed another).
    pub op: &'static str,
    /// Where its bytes go, from the server's side: `received`, `sent`,
    /// `third_party_received`, `third_party_sent`, `memtest_received` or
    /// `memtest_sent`.
    pub direction: &'static str,
    /// `running`, `ok` or `error`.
    pub state: &'static str,
    /// Unix seconds.
    pub started_unix: f64,
    /// Seconds from the start to now, or to the end.
    pub seconds: f64,
    /// Payload bytes that crossed the data streams.
    pub bytes: u64,
    /// The dataset's bytes, once known.
    pub bytes_total: u64,
    /// Bytes the destination already held (resume).
    pub bytes_held: u64,
    /// Files completed.
    pub files: u64,
    /// The dataset's regular files, once known.
    pub files_total: u64,
    /// The rate over the last seconds (0 once finished).
    pub bit_per_s: f64,
    /// `bytes` × 8 / `seconds`.
    pub avg_bit_per_s: f64,
    /// Seconds left at the current rate, when known.
    pub eta_seconds: Option<f64>,
    /// Each data stream's rate over the last second (stream 0 first; empty once
    /// finished).
    pub streams: Vec<f64>,
    /// Data streams that broke.
    pub streams_lost: u64,
    /// Chunks sent again (a sending server).
    pub chunks_resent: u64,
    /// Why it failed.
    pub error: Option<String>,
    /// `[seconds since the start, bit/s over the second before]`, oldest first.
    pub history: Vec<[f64; 2]>,
}

/// Reads the monitor at scrape time.
#[derive(Debug)]
struct Collect(Arc<Monitor>);

fn counter_family<L>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> std::fmt::Result
where
    L: prometheus_client::encoding::EncodeLabelSet,
{
    let c = ConstCounter::new(0u64);
    let mut m = enc.encode_descriptor(name, help, None, c.metric_type())?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: V,
) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter<V: prometheus_client::encoding::EncodeCounterValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: V,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// One consistent reading of the counters the metrics report.
struct Reading {
    /// What sessions moved, finished ones' sums plus running ones', by (direction,
    /// user), every direction present for every user seen.
    moved: BTreeMap<(&'static str, String), Moved>,
    sessions: BTreeMap<(&'static str, &'static str), u64>,
    errors: BTreeMap<&'static str, u64>,
    active_by_op: BTreeMap<&'static str, u64>,
}

impl Reading {
    /// Finished sessions' sums plus the running ones' counters, under the lock a
    /// session takes to move from one to the other.
    fn of(m: &Monitor) -> Self {
        let inner = m.inner.lock();
        let mut moved = inner.moved.clone();
        let mut active_by_op: BTreeMap<&'static str, u64> = OPS.iter().map(|&o| (o, 0)).collect();
        for s in inner.active.values() {
            *active_by_op.entry(s.op).or_default() += 1;
            moved
                .entry((s.direction, s.user.clone()))
                .or_default()
                .add(s.moved());
        }
        let (sessions, errors) = (inner.sessions.clone(), inner.errors.clone());
        drop(inner);
        // Every direction appears for every user seen, so rates start from 0.
        let users: Vec<String> = moved.keys().map(|(_, u)| u.clone()).collect();
        for u in users {
            for dir in DIRECTIONS {
                moved.entry((dir, u.clone())).or_default();
            }
        }
        Reading {
            moved,
            sessions,
            errors,
            active_by_op,
        }
    }
}

impl Collector for Collect {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let m = &self.0;
        let r = Reading::of(m);
        encode_sessions(&mut enc, r.active_by_op, r.sessions, r.errors)?;
        encode_moved(&mut enc, &r.moved)?;
        encode_refusals(&mut enc, m)?;
        encode_usage(&mut enc, m)
    }
}

/// Sessions running, ended and failed.
fn encode_sessions(
    enc: &mut DescriptorEncoder<'_>,
    active_by_op: BTreeMap<&'static str, u64>,
    sessions: BTreeMap<(&'static str, &'static str), u64>,
    errors: BTreeMap<&'static str, u64>,
) -> std::fmt::Result {
    {
        let g = ConstGauge::new(0i64);
        let mut family = enc.encode_descriptor(
            "dmover_sessions_active",
            "Sessions running now, by op.",
            None,
            g.metric_type(),
        )?;
        for (op, n) in active_by_op {
            ConstGauge::new(n as i64).encode(family.encode_family(&[("op", op)])?)?;
        }
    }
    let mut rows: BTreeMap<(&str, &str), u64> = OPS
        .iter()
        .flat_map(|&o| [((o, "ok"), 0), ((o, "error"), 0)])
        .collect();
    rows.extend(sessions);
    counter_family(
        enc,
        "dmover_sessions",
        "Sessions ended (after authentication), by op and result.",
        rows.into_iter()
            .map(|((op, result), v)| ([("op", op), ("result", result)], v)),
    )?;
    counter_family(
        enc,
        "dmover_session_errors",
        "Failed sessions, by error class.",
        errors.into_iter().map(|(kind, v)| ([("kind", kind)], v)),
    )?;
    Ok(())
}

/// What the sessions moved, by direction and user.
fn encode_moved(
    enc: &mut DescriptorEncoder<'_>,
    moved: &BTreeMap<(&'static str, String), Moved>,
) -> std::fmt::Result {
    let series = |f: fn(&Moved) -> u64| {
        moved
            .iter()
            .map(move |((dir, user), v)| {
                (
                    [("direction", (*dir).to_string()), ("user", user.clone())],
                    f(v),
                )
            })
            .collect::<Vec<_>>()
    };
    counter_family(
        enc,
        "dmover_bytes",
        "Payload bytes that crossed the data streams (chunks sent again count again), \
             by direction (received: pushes, sent: pulls, third_party_received/sent: \
             third-party copies, memtest_received/sent: memory-to-memory tests) and user.",
        series(|v| v.bytes),
    )?;
    counter_family(
        enc,
        "dmover_files",
        "Regular files completed, by direction and user.",
        series(|v| v.files),
    )?;
    counter_family(
        enc,
        "dmover_streams_lost",
        "Data streams that broke mid-session (their chunks went on the others).",
        series(|v| v.streams_lost),
    )?;
    counter_family(
        enc,
        "dmover_sessions_resumed",
        "Sessions whose destination already held part of the data: a resumed or \
             retried copy (--resume, --retries), or a sync re-run.",
        series(|v| v.resumed),
    )?;
    counter_family(
        enc,
        "dmover_chunks_resent",
        "Chunks this server sent again because their data stream broke.",
        series(|v| v.chunks_resent),
    )?;
    Ok(())
}

/// What the server refused: busy answers, authentication failures, limits reached.
fn encode_refusals(enc: &mut DescriptorEncoder<'_>, m: &Monitor) -> std::fmt::Result {
    counter(
        enc,
        "dmover_busy_refusals",
        "Control connections answered busy before TLS (session or set-up limit).",
        m.busy_refused.load(Relaxed),
    )?;
    let failures = m.failures.lock().clone();
    let of = |class: &'static str, labels: &'static [&'static str]| {
        labels
            .iter()
            .map(|&l| (l, failures.get(&(class, l)).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
    };
    counter_family(
        enc,
        "dmover_auth_failures",
        "Authentication failures, by kind (bad_credential, unknown_user, revoked, tls, \
             capability).",
        of("auth", &AUTH_FAILURES)
            .into_iter()
            .map(|(k, v)| ([("kind", k)], v)),
    )?;
    counter_family(
        enc,
        "dmover_refusals",
        "Sessions or connections the server could not take (yet), by the limit reached.",
        of("refusal", &REFUSALS)
            .into_iter()
            .map(|(k, v)| ([("reason", k)], v)),
    )?;
    Ok(())
}

/// How busy the network and the disk threads were, and the buffer memory.
fn encode_usage(enc: &mut DescriptorEncoder<'_>, m: &Monitor) -> std::fmt::Result {
    counter(
        enc,
        "dmover_network_busy_seconds",
        "Seconds during which some session's data streams moved payload bytes (0.25 s \
             resolution); its rate is the fraction of time data was moving.",
        m.network_busy_seconds(),
    )?;
    let u = m.usage();
    counter(
        enc,
        "dmover_disk_busy_seconds",
        "Seconds the disk threads spent on jobs (reads, writes, walks), all threads \
             together; divide its rate by dmover_disk_threads for utilisation.",
        u.disk_busy,
    )?;
    counter(
        enc,
        "dmover_disk_jobs",
        "Jobs the disk threads ran.",
        u.disk_jobs,
    )?;
    counter(
        enc,
        "dmover_disk_wait_seconds",
        "Seconds disk jobs waited in the queue for a thread, all jobs together; its \
             rate is the mean number of jobs waiting.",
        u.disk_wait,
    )?;
    gauge(
        enc,
        "dmover_disk_threads",
        "Disk I/O threads shared by all sessions, now.",
        u.disk_threads as i64,
    )?;
    gauge(
        enc,
        "dmover_buffer_memory_budget_bytes",
        "Bytes of chunk buffers all sessions may hold together (--memory).",
        u.memory_budget as i64,
    )?;
    gauge(
        enc,
        "dmover_buffer_memory_reserved_bytes",
        "Bytes of the buffer budget the running sessions hold.",
        u.memory_reserved as i64,
    )?;
    gauge(
        enc,
        "dmover_start_time_seconds",
        "When the server started, seconds since the Unix epoch.",
        m.started_unix,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor() -> Arc<Monitor> {
        let m = Monitor::new();
        let memory = Arc::new(Semaphore::new(64));
        m.watch(
            &Arc::new(DiskPool::new(1, "test-disk")),
            &memory,
            64,
            1 << 20,
        );
        memory.try_acquire_many(4).unwrap().forget();
        Arc::new(m)
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn counters_follow_live_sessions_and_keep_what_finished_ones_moved() {
        let m = monitor();
        let t = m.prometheus();
        assert_eq!(value(&t, "dmover_sessions_active{op=\"push\"}"), 0.0);
        assert_eq!(
            value(&t, "dmover_buffer_memory_budget_bytes"),
            64.0 * 1048576.0
        );
        assert_eq!(
            value(&t, "dmover_buffer_memory_reserved_bytes"),
            4.0 * 1048576.0
        );
        assert_eq!(value(&t, "dmover_disk_threads"), 1.0);
        assert_eq!(
            value(&t, "dmover_sessions_total{op=\"pull\",result=\"ok\"}"),
            0.0
        );

        let live = m.start("10.0.0.1:5000", "alice", "push", "received");
        let p = Arc::new(Progress::default());
        live.attach(&p);
        p.bytes.store(1000, Relaxed);
        p.files.store(2, Relaxed);
        let t = m.prometheus();
        assert_eq!(value(&t, "dmover_sessions_active{op=\"push\"}"), 1.0);
        let bytes = "dmover_bytes_total{direction=\"received\",user=\"alice\"}";
        assert_eq!(value(&t, bytes), 1000.0);
        assert_eq!(
            value(&t, "dmover_bytes_total{direction=\"sent\",user=\"alice\"}"),
            0.0
        );
        assert!(!t.contains("10.0.0.1"), "no peer address in labels:\n{t}");

        p.bytes.store(3000, Relaxed);
        // The summary names empty files too: the counter takes the larger count.
        live.finish(&Ok(()), Some((3000, 5)));
        live.finish(&Ok(()), Some((3000, 5)));
        drop(live);
        p.bytes.store(9999, Relaxed);
        let t = m.prometheus();
        assert_eq!(value(&t, "dmover_sessions_active{op=\"push\"}"), 0.0);
        assert_eq!(value(&t, bytes), 3000.0);
        assert_eq!(
            value(
                &t,
                "dmover_files_total{direction=\"received\",user=\"alice\"}"
            ),
            5.0
        );
        assert_eq!(
            value(&t, "dmover_sessions_total{op=\"push\",result=\"ok\"}"),
            1.0
        );

        // Dropped unfinished: counted as aborted.
        let live = m.start("10.0.0.2:5000", "bob", "pull", "sent");
        drop(live);
        let t = m.prometheus();
        assert_eq!(
            value(&t, "dmover_sessions_total{op=\"pull\",result=\"error\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "dmover_session_errors_total{kind=\"aborted\"}"),
            1.0
        );
        assert_eq!(m.active(), 0);
    }

    #[test]
    fn third_party_memtest_failures_and_busy_time_have_their_series() {
        let m = monitor();
        let t = m.prometheus();
        // Every kind and reason from the start, at 0.
        for k in AUTH_FAILURES {
            assert_eq!(
                value(&t, &format!("dmover_auth_failures_total{{kind=\"{k}\"}}")),
                0.0
            );
        }
        for r in REFUSALS {
            assert_eq!(
                value(&t, &format!("dmover_refusals_total{{reason=\"{r}\"}}")),
                0.0
            );
        }
        assert_eq!(value(&t, "dmover_network_busy_seconds_total"), 0.0);
        assert_eq!(value(&t, "dmover_sessions_active{op=\"third_party\"}"), 0.0);

        m.auth_failed("tls");
        m.auth_failed("unknown_user");
        m.auth_failed("unknown_user");
        m.refused("max_sessions_per_user");
        let tpc = m.start("c:1", "alice", "third_party", "third_party_sent");
        let p = Arc::new(Progress::default());
        tpc.attach(&p);
        let mt = m.start("c:2", "alice", "memtest", "memtest_received");
        let q = Arc::new(Progress::default());
        mt.attach(&q);
        m.tick();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Nothing moved: idle.
        m.tick();
        assert_eq!(m.network_busy_seconds(), 0.0);
        p.bytes.store(700, Relaxed);
        p.files.store(3, Relaxed);
        q.bytes.store(500, Relaxed);
        q.files.store(9, Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(50));
        m.tick();
        let busy = m.network_busy_seconds();
        assert!((0.05..1.0).contains(&busy), "{busy}");
        let t = m.prometheus();
        assert_eq!(
            value(&t, "dmover_auth_failures_total{kind=\"unknown_user\"}"),
            2.0
        );
        assert_eq!(value(&t, "dmover_auth_failures_total{kind=\"tls\"}"), 1.0);
        assert_eq!(
            value(
                &t,
                "dmover_refusals_total{reason=\"max_sessions_per_user\"}"
            ),
            1.0
        );
        assert_eq!(value(&t, "dmover_sessions_active{op=\"third_party\"}"), 1.0);
        let tps = "dmover_bytes_total{direction=\"third_party_sent\",user=\"alice\"}";
        assert_eq!(value(&t, tps), 700.0);
        let tpf = "dmover_files_total{direction=\"third_party_sent\",user=\"alice\"}";
        assert_eq!(value(&t, tpf), 3.0);
        let mtb = "dmover_bytes_total{direction=\"memtest_received\",user=\"alice\"}";
        assert_eq!(value(&t, mtb), 500.0);
        // A memory test's parts are no files.
        let mtf = "dmover_files_total{direction=\"memtest_received\",user=\"alice\"}";
        assert_eq!(value(&t, mtf), 0.0);
        assert_eq!(
            value(
                &t,
                "dmover_bytes_total{direction=\"received\",user=\"alice\"}"
            ),
            0.0
        );
        let v = m.transfers();
        assert_eq!(v.transfers.len(), 2);
        assert!(
            v.transfers
                .iter()
                .any(|t| t.op == "third_party" && t.direction == "third_party_sent")
        );
        // Finished sessions keep their bytes in the busy reading: no busy time when
        // nothing more moves.
        tpc.finish(&Ok(()), Some((700, 3)));
        drop(mt);
        m.tick();
        std::thread::sleep(std::time::Duration::from_millis(20));
        m.tick();
        assert_eq!(m.network_busy_seconds(), busy);
        let t = m.prometheus();
        assert_eq!(value(&t, tps), 700.0);
        assert_eq!(value(&t, mtb), 500.0);
        assert_eq!(
            value(
                &t,
                "dmover_sessions_total{op=\"third_party\",result=\"ok\"}"
            ),
            1.0
        );
        // A session ended by a reload counts as revoked.
        let r = m.start("c:3", "bob", "push", "received");
        r.finish(
            &Err(Error::refused(
                ErrorCode::Auth,
                "credential revoked by the server's configuration reload: gone",
            )),
            None,
        );
        let t = m.prometheus();
        assert_eq!(
            value(&t, "dmover_auth_failures_total{kind=\"revoked\"}"),
            1.0
        );
    }

    #[test]
    fn long_histories_are_averaged_over_stretches() {
        // 1000 bytes a second for 300 s, then 2000 a second for 299 s.
        let h: VecDeque<(f64, u64)> = (0..HISTORY as u64)
            .map(|t| {
                (
                    t as f64,
                    if t <= 300 {
                        t * 1000
                    } else {
                        300_000 + (t - 300) * 2000
                    },
                )
            })
            .collect();
        let r = rates(&h);
        assert_eq!(r.len(), HISTORY_POINTS);
        assert_eq!(r[0], [5.0, 8000.0]);
        assert_eq!(r[59], [300.0, 8000.0]);
        assert_eq!(r[60], [305.0, 16000.0]);
        assert_eq!(r[HISTORY_POINTS - 1], [599.0, 16000.0]);
        // Short ones are kept whole.
        let h: VecDeque<(f64, u64)> = [(0.0, 0), (1.0, 10), (2.0, 30)].into();
        assert_eq!(rates(&h), vec![[1.0, 80.0], [2.0, 160.0]]);
        assert!(rates(&VecDeque::new()).is_empty());
    }

    #[test]
    fn recent_sessions_and_histories_are_bounded() {
        let m = monitor();
        let live = m.start("p", "u", "pull", "sent");
        let p = Arc::new(Progress::default());
        live.attach(&p);
        p.total.store(10_000, Relaxed);
        // Per-stream rates: up to the last stream that moved bytes.
        p.stream_bytes.add(0, 10);
        p.stream_bytes.add(2, 10);
        m.sample();
        let v = m.transfers();
        assert_eq!(v.transfers[0].streams.len(), 3);
        assert!(v.transfers[0].streams[0] > 0.0);
        assert_eq!(v.transfers[0].streams[1], 0.0);
        for i in 0..HISTORY + 10 {
            p.bytes.store(i as u64, Relaxed);
            m.sample();
        }
        let v = m.transfers();
        assert_eq!(v.transfers.len(), 1);
        assert_eq!(v.transfers[0].state, "running");
        let history = &v.transfers[0].history;
        assert!(history.len() <= HISTORY_POINTS + 1, "{}", history.len());
        assert!(history.len() >= HISTORY_POINTS / 2, "{}", history.len());
        drop(live);
        for _ in 0..RECENT + 5 {
            m.start("p", "u", "push", "received")
                .finish(&Ok(()), Some((0, 0)));
        }
        let v = m.transfers();
        assert_eq!(v.transfers.len(), RECENT);
        assert!(v.transfers.iter().all(|t| t.state == "ok"));
    }
}
