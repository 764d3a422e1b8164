//! What the user sees: a progress bar while data moves (or JSON lines, see
//! [`Ndjson`]), then one summary line or one JSON object. Every JSON field is
//! documented in docs/json.md.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dmover_core::Error;
use dmover_core::client::Report;
use dmover_core::engine::{Progress, ProgressEvent};
use dmover_core::transfer::{Event, Snapshot};
use dmover_net::NetError;
use dmover_proto::control::ErrorCode;
use serde::Serialize;

/// Which way data went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Local to server.
    Push,
    /// Server to local.
    Pull,
    /// Server to server, the source dialing the destination (`--tpc push`).
    #[serde(rename = "third-party-push")]
    TpcPush,
    /// Server to server, the destination dialing the source (`--tpc pull`).
    #[serde(rename = "third-party-pull")]
    TpcPull,
    /// Server to server through this client (`--via-client`).
    #[serde(rename = "third-party-relay")]
    TpcRelay,
    /// Local to local (both halves of the session in this process).
    Local,
}

impl Direction {
    /// The library's direction, as the summary names it.
    pub fn of(d: dmover_core::transfer::Direction) -> Self {
        use dmover_core::transfer::Direction as D;
        match d {
            D::Push => Direction::Push,
            D::Pull => Direction::Pull,
            D::ThirdPartyPush => Direction::TpcPush,
            D::ThirdPartyPull => Direction::TpcPull,
            D::Relay => Direction::TpcRelay,
            D::Local => Direction::Local,
        }
    }
}

/// Where a transfer's time went, beside its end-to-end rate: from samples of the bytes
/// that crossed the data streams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Seconds from the start until the first whole chunk crossed a data stream
    /// (written to its socket by a source, read by a destination), within the 50 ms
    /// sampling: the walk, the session's set-up round trips, the first disk read, and
    /// on a long link part of TCP's ramp-up (a source's write of a 16 MiB chunk returns
    /// once all but `TCP_NOTSENT_LOWAT`, 4 MiB, of it has been sent).
    pub first_chunk_seconds: Option<f64>,
    /// The rate between the moments 25 % and 90 % of the bytes had crossed: without
    /// the set-up, TCP's ramp-up and the tail, which weigh on the end-to-end rate of a
    /// short transfer over a long link. `None` when those moments are under half a
    /// second apart (too short to tell).
    pub steady_gbit_per_s: Option<f64>,
}

impl Timing {
    /// From `(seconds since start, bytes so far)` samples in time order.
    pub fn from_samples(samples: &[(f64, u64)]) -> Self {
        let first_chunk_seconds = samples.iter().find(|(_, b)| *b > 0).map(|(t, _)| *t);
        let total = samples.last().map_or(0, |(_, b)| *b);
        // When the counter first reached `mark`, interpolated between samples.
        let when = |mark: f64| {
            let i = samples.iter().position(|(_, b)| *b as f64 >= mark)?;
            let (t1, b1) = samples[i];
            let (t0, b0) = if i == 0 { (0.0, 0) } else { samples[i - 1] };
            let span = b1.saturating_sub(b0) as f64;
            Some(if span == 0.0 {
                t1
            } else {
                t0 + (t1 - t0) * (mark - b0 as f64) / span
            })
        };
        let steady_gbit_per_s = match (when(0.25 * total as f64), when(0.9 * total as f64)) {
            (Some(a), Some(b)) if b - a >= 0.5 => Some(0.65 * total as f64 * 8.0 / (b - a) / 1e9),
            _ => None,
        };
        Timing {
            first_chunk_seconds,
            steady_gbit_per_s,
        }
    }
}

/// Samples a transfer's byte counter every 50 ms while it lasts (see [`Timing`]).
pub struct Sampler {
    samples: Arc<std::sync::Mutex<Vec<(f64, u64)>>>,
    task: tokio::task::JoinHandle<()>,
    started: std::time::Instant,
    progress: Arc<Progress>,
}

impl Sampler {
    /// Starts sampling; times count from now.
    pub fn start(rt: &tokio::runtime::Runtime, progress: Arc<Progress>) -> Self {
        let started = std::time::Instant::now();
        let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, p) = (samples.clone(), progress.clone());
        let task = rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                let b = p.bytes.load(Ordering::Relaxed);
                s.lock()
                    .expect("sampler lock")
                    .push((started.elapsed().as_secs_f64(), b));
            }
        });
        Sampler {
            samples,
            task,
            started,
            progress,
        }
    }

    /// Stops sampling (with a last sample now) and sums up.
    pub fn finish(self) -> Timing {
        self.task.abort();
        let mut s = self.samples.lock().expect("sampler lock");
        s.push((
            self.started.elapsed().as_secs_f64(),
            self.progress.bytes.load(Ordering::Relaxed),
        ));
        Timing::from_samples(&s)
    }
}

/// What a transfer has done so far, read from its counters, in the summary's units
/// (bytes in KiB/MiB/GiB, the rate in Gbit/s, files counted): the progress bar's text
/// and the status lines' (`--progress bar` when stderr is not a terminal).
struct Status {
    /// Samples `(seconds, bytes crossed)` of the last few seconds, for the rate.
    window: std::collections::VecDeque<(f64, u64)>,
    started: std::time::Instant,
}

/// How far back the rate looks.
const RATE_WINDOW: f64 = 5.0;

impl Status {
    fn new() -> Self {
        Status {
            window: std::collections::VecDeque::new(),
            started: std::time::Instant::now(),
        }
    }

    /// Samples the counters; `window`: how far back the rate looks (seconds).
    fn sample(&mut self, p: &Progress, window: f64) -> StatusNow {
        let now = self.started.elapsed().as_secs_f64();
        let sent = p.bytes.load(Ordering::Relaxed);
        self.window.push_back((now, sent));
        while self.window.len() > 2 && self.window[1].0 <= now - window {
            self.window.pop_front();
        }
        let (t0, b0) = self.window[0];
        let gbps = if now > t0 {
            sent.saturating_sub(b0) as f64 * 8.0 / (now - t0) / 1e9
        } else {
            0.0
        };
        StatusNow {
            done: p.held.load(Ordering::Relaxed) + sent + p.holes.load(Ordering::Relaxed),
            total: p.total.load(Ordering::Relaxed),
            files: p.files.load(Ordering::Relaxed),
            total_files: p.total_files.load(Ordering::Relaxed),
            gbps,
            elapsed: now,
        }
    }
}

/// One reading of [`Status`].
#[derive(Debug, Clone, Copy)]
struct StatusNow {
    done: u64,
    total: u64,
    files: u64,
    total_files: u64,
    gbps: f64,
    elapsed: f64,
}

impl StatusNow {
    /// `1.50 GiB/4.00 GiB, 12/40 files, 2.41 Gbit/s` (the totals once known).
    fn counts(&self) -> String {
        let (bytes, files) = match self.total {
            0 => (human_bytes(self.done), self.files.to_string()),
            t => (
                format!("{}/{}", human_bytes(self.done), human_bytes(t)),
                format!("{}/{}", self.files, self.total_files),
            ),
        };
        format!("{bytes}, {files} files, {:.2} Gbit/s", self.gbps)
    }

    /// A status line: `progress: 37% 1.50 GiB/4.00 GiB, 12/40 files, 2.41 Gbit/s,
    /// 10 s elapsed, ETA 15 s` (no percentage nor ETA before the total is known).
    fn line(&self) -> String {
        let elapsed = format!("{:.0} s elapsed", self.elapsed);
        if self.total == 0 {
            return format!("progress: {}, {elapsed}", self.counts());
        }
        let pct = (self.done as f64 * 100.0 / self.total as f64).min(100.0);
        let left = self.total.saturating_sub(self.done);
        let eta = match self.gbps > 0.0 {
            true => format!(", ETA {:.0} s", left as f64 * 8.0 / (self.gbps * 1e9)),
            false => String::new(),
        };
        format!("progress: {pct:.0}% {}, {elapsed}{eta}", self.counts())
    }
}

/// A progress bar on stderr fed from a transfer's counters.
pub struct ProgressBar {
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl ProgressBar {
    /// Starts updating a bar five times a second.
    pub fn start(rt: &tokio::runtime::Runtime, progress: Arc<Progress>) -> Self {
        // Hidden until the walk or the manifest tells how much there is to move.
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::hidden(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} [{wide_bar}] ETA {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        let b = bar.clone();
        let task = rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let mut status = Status::new();
            loop {
                tick.tick().await;
                let now = status.sample(&progress, RATE_WINDOW);
                if now.total > 0 && b.is_hidden() {
                    b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                }
                b.set_length(now.total);
                b.set_position(now.done);
                b.set_message(now.counts());
            }
        });
        ProgressBar { bar, task }
    }

    /// Runs `f` (which prints) with the bar cleared, and draws it again after.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Removes the bar.
    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// `--progress bar` when stderr is not a terminal (a batch job, cron, a pipe): one
/// status line on stderr every `--progress-interval` ([`StatusNow::line`]).
pub struct StatusLines {
    task: tokio::task::JoinHandle<()>,
}

impl StatusLines {
    /// Starts writing a line every `interval` (the first after one interval).
    pub fn start(
        rt: &tokio::runtime::Runtime,
        progress: Arc<Progress>,
        interval: Duration,
    ) -> Self {
        let task = rt.spawn(async move {
            let mut status = Status::new();
            status.sample(&progress, f64::MAX);
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // The rate over the last interval.
                let now = status.sample(&progress, interval.as_secs_f64());
                eprintln!("{}", now.line());
            }
        });
        StatusLines { task }
    }

    /// Stops the lines.
    pub fn finish(self) {
        self.task.abort();
    }
}

/// The exit code of a copy that copied all but some files (`--continue-on-error`): 23,
/// rsync's "partial transfer due to error".
pub const PARTIAL: u8 = 23;

/// The version of the JSON lines' schema (docs/json.md): raised when a field changes
/// meaning or goes away; new fields may appear without it.
pub const SCHEMA: u32 = 1;

/// `s` as it may reach a terminal: control characters (an escape sequence that
/// recolours, moves the cursor or retitles the window; a carriage return or backspace
/// that overwrites what was shown) and the bidirectional overrides that reorder it are
/// written escaped (`\u{1b}`); newlines and tabs stay (dmover's own messages use
/// them). Errors and names that came from a peer (a server's error message, a file
/// name in its manifest) pass through this before they are printed.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes one JSON line on stdout (a closed stdout is not worth a panic).
fn print_line(v: &impl Serialize) {
    let line = serde_json::to_string(v).expect("serialisable");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A `"type": "progress"` line of `--progress ndjson`.
#[derive(Debug, Serialize)]
struct ProgressLine {
    schema: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    seconds: f64,
    bytes_sent: u64,
    bytes_total: u64,
    bytes_resumed: u64,
    chunks: u64,
    files: u64,
    files_total: u64,
    bit_per_s: f64,
    avg_bit_per_s: f64,
    streams_lost: u32,
    attempt: u32,
}

/// An event line of `--progress ndjson`.
#[derive(Debug, Serialize)]
struct EventLine<'a> {
    schema: u32,
    #[serde(flatten)]
    event: EventKind<'a>,
    seconds: f64,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum EventKind<'a> {
    Retry {
        attempt: u32,
        error: &'a str,
        wait_seconds: f64,
    },
    StreamLost {
        attempt: u32,
        stream: u16,
        error: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        resent: Option<u64>,
    },
    Tuning {
        attempt: u32,
        streams: u16,
        gbit_per_s: f64,
        reason: &'a str,
    },
    DiskTuning {
        attempt: u32,
        threads: usize,
        gbit_per_s: f64,
        reason: &'a str,
    },
}

/// `--progress ndjson`: a JSON line on stdout for each of the transfer's events: its
/// counters every interval and at the end, the files done, a retry, a lost stream, a
/// tuning decision; the caller prints the summary last.
pub struct Ndjson {
    started: Instant,
}

impl Ndjson {
    /// Lines whose times count from `started`.
    pub fn new(started: Instant) -> Self {
        Ndjson { started }
    }

    /// Prints the line of `e`, if it has one.
    pub fn event(&mut self, e: &Event) {
        let seconds = self.started.elapsed().as_secs_f64();
        match e {
            Event::Progress(s) => progress_line(s, seconds),
            Event::FilesDone { attempt, paths } => print_line(&FilesLine {
                schema: SCHEMA,
                kind: "files_done",
                attempt: *attempt,
                seconds,
                count: paths.len(),
                files: paths,
            }),
            Event::Session { attempt, event } => event_line(*attempt, event, seconds),
            // Named in the summary's `failed`.
            _ => {}
        }
    }
}

/// `-v`: a line per file sent (rsync's `-v`: the path alone), and with `-vv` per file
/// the destination held (`PATH is uptodate`, rsync's `-vv` words), on stdout, or on
/// stderr when stdout carries JSON. A copy's paths start with their source's name (as
/// they land in the destination directory), a sync's are below the mirror; names from
/// a server pass through [`printable`].
pub struct FileList {
    sync: bool,
    stderr: bool,
}

impl FileList {
    /// A sync's list (`sync`) or a copy's; on stderr (`stderr`) or stdout.
    pub fn new(sync: bool, stderr: bool) -> Self {
        FileList { sync, stderr }
    }

    /// The lines of `e`, if it names files.
    pub fn event(&self, e: &Event) {
        let (paths, held) = match e {
            Event::FilesDone { paths, .. } => (paths, false),
            Event::FilesHeld { paths, .. } => (paths, true),
            _ => return,
        };
        let mut text = String::new();
        for p in paths {
            let p = match self.sync {
                // The root's name is the mirror's; a mirror of one file is its name.
                true => p.split_once('/').map_or(p.as_str(), |(_, rel)| rel),
                false => p,
            };
            text.push_str(&printable(p));
            text.push_str(if held { " is uptodate\n" } else { "\n" });
        }
        // A closed stdout or stderr is not worth a panic.
        let _ = match self.stderr {
            true => std::io::stderr().lock().write_all(text.as_bytes()),
            false => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes()).and_then(|()| out.flush())
            }
        };
    }
}

/// A `files_done` line of `--progress ndjson`.
#[derive(Debug, Serialize)]
struct FilesLine<'a> {
    schema: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    attempt: u32,
    seconds: f64,
    count: usize,
    files: &'a [String],
}

/// The line of a session's event.
fn event_line(attempt: u32, e: &ProgressEvent, seconds: f64) {
    let event = match e {
        ProgressEvent::Retry {
            attempt: failed,
            error,
            wait,
        } => EventKind::Retry {
            attempt: *failed,
            error,
            wait_seconds: wait.as_secs_f64(),
        },
        ProgressEvent::StreamLost {
            stream,
            error,
            resent,
        } => EventKind::StreamLost {
            attempt,
            stream: *stream,
            error,
            resent: *resent,
        },
        ProgressEvent::Tuned {
            streams,
            rate,
            reason,
        } => EventKind::Tuning {
            attempt,
            streams: *streams,
            gbit_per_s: *rate as f64 * 8.0 / 1e9,
            reason,
        },
        ProgressEvent::DiskTuned {
            threads,
            rate,
            reason,
        } => EventKind::DiskTuning {
            attempt,
            threads: *threads,
            gbit_per_s: *rate as f64 * 8.0 / 1e9,
            reason,
        },
    };
    print_line(&EventLine {
        schema: SCHEMA,
        event,
        seconds,
    });
}

/// A `"type": "progress"` line.
fn progress_line(s: &Snapshot, seconds: f64) {
    print_line(&ProgressLine {
        schema: SCHEMA,
        kind: "progress",
        seconds,
        bytes_sent: s.bytes,
        bytes_total: s.total,
        bytes_resumed: s.held,
        chunks: s.chunks,
        files: s.files,
        files_total: s.total_files,
        bit_per_s: s.rate * 8.0,
        avg_bit_per_s: s.bytes as f64 * 8.0 / seconds.max(1e-9),
        streams_lost: s.streams_lost,
        attempt: s.attempt,
    });
}

/// A run of chunks of one size in a transfer's layout.
#[derive(Serialize)]
struct ChunkSize {
    size: u64,
    chunks: u64,
}

#[derive(Serialize)]
struct JsonReport {
    /// The schema version ([`SCHEMA`]).
    schema: u32,
    /// `"summary"`: the last line of `--progress ndjson`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// dmover's version.
    version: &'static str,
    /// When the run started and ended, RFC 3339 in UTC (whole seconds).
    started: String,
    ended: String,
    /// The sources and the destination as the command named them (absent from
    /// `dmover demo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    destination: Option<String>,
    ok: bool,
    direction: Direction,
    /// A third-party copy: the server that dialed the other (as named).
    #[serde(skip_serializing_if = "Option::is_none")]
    dialer: Option<String>,
    /// Dataset size: the regular files' bytes in the source's manifest.
    bytes: u64,
    /// Payload bytes that crossed the data streams in this run (all attempts).
    bytes_sent: u64,
    /// Bytes the destination already held from an earlier attempt (resumed).
    bytes_resumed: u64,
    /// `dmover sync`: files the destination already had whole (unchanged size and
    /// mtime, or complete from an interrupted attempt), not sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    files_unchanged: Option<u64>,
    /// `dmover sync`: the bytes of those files (and of pieces an interrupted attempt
    /// left), not sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_unchanged: Option<u64>,
    /// `dmover sync --delete`: destination entries deleted (files, symlinks and
    /// directories; 0 when deleting was refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    files_deleted: Option<u64>,
    /// `dmover sync --delete`: bytes of the regular files deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_deleted: Option<u64>,
    /// `dmover sync --delete --max-delete N`: entries left because of the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    delete_over_limit: Option<u64>,
    /// Regular files of the dataset (without those that could not be copied).
    files: u64,
    /// Regular files written by the last attempt (resumed files not counted).
    files_sent: u64,
    dirs: u64,
    symlinks: u64,
    seconds: f64,
    gbit_per_s: f64,
    files_per_s: f64,
    streams: u16,
    chunk: u32,
    /// The chunk sizes of the layout and the chunks of each, in layout order.
    chunk_sizes: Vec<ChunkSize>,
    verified: bool,
    skipped: u64,
    /// Chunks sent again because their data stream broke.
    retries: u64,
    /// Data streams that broke.
    streams_lost: u32,
    /// Sessions started (1 + retries of the whole session).
    attempts: u32,
    errors: u64,
    /// Source files that could not be copied (`--continue-on-error`), `path: why`.
    failed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// This side's bandwidth limit (`--bwlimit`), bytes per second; null without.
    bwlimit: Option<u64>,
    /// The server's limit of the session (the lower of its user's and exports'), bytes
    /// per second, as the server told it; null without one or from a server that does
    /// not tell.
    server_bwlimit: Option<u64>,
    /// Which limit holds, the lower: `"client"`, `"server"`, null without either.
    bwlimit_from: Option<&'static str>,
    /// The source's tuner, in a self-tuning transfer (no `-P`); null otherwise.
    tuning: Option<TuningJson>,
    /// This side's disk tuner, when its disk threads were not pinned (`--io-threads`);
    /// absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_threads: Option<DiskJson>,
    /// `--via-client`: payload bytes this client received from the source server
    /// (`bytes_sent`: what it sent on to the destination).
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_received: Option<u64>,
    /// `--via-client`: the most bytes of chunks this client held at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    relay_peak_bytes: Option<u64>,
    /// A pull whose manifest the server sent in parts (a streamed manifest, the data
    /// flowing from the first part on): how many; absent when it came whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    manifest_parts: Option<u32>,
    /// A pull whose client set each data stream's receive buffer to this many bytes
    /// (`SO_RCVBUF`; its share of the session's budget,
    /// [`dmover_net::tcp::receive_budget`]: held to it, or raised to it past the host's
    /// maximum); absent when the kernel's autotuning alone sized them.
    #[serde(skip_serializing_if = "Option::is_none")]
    receive_buffer: Option<u64>,
    /// A push whose client raised its data streams' send buffers past the host's
    /// maximum, to this many bytes each (`SO_SNDBUF`; docs/tuning.md, "Socket
    /// buffers"); absent when the kernel's autotuning alone sized them.
    #[serde(skip_serializing_if = "Option::is_none")]
    send_buffer: Option<u64>,
    /// Set-up time and steady-state rate (see [`Timing`]).
    #[serde(flatten)]
    timing: Timing,
}

/// Where the source's tuner ended (see docs/json.md).
#[derive(Debug, Clone, Copy, Serialize)]
struct TuningJson {
    /// Data streams it sent on at the end (while a probe ran: those it kept).
    streams: u16,
    /// The session's streams: the most it could use.
    of: u16,
    /// Changes it made.
    changes: u32,
    /// Seconds after the first chunk until its search settled (as the source's
    /// decisions tell it, for a pull: when the last change came); null: it had not.
    settled_seconds: Option<f64>,
}

/// Where this side's disk tuner ended (see docs/json.md).
#[derive(Debug, Clone, Copy, Serialize)]
struct DiskJson {
    /// Disk threads at the end (while a probe ran: those it kept).
    threads: usize,
    /// The most it could use.
    of: usize,
    /// Changes it made.
    changes: u32,
}

fn disk_json(p: &Progress) -> Option<DiskJson> {
    p.disk.lock().map(|d| DiskJson {
        threads: d.threads,
        of: d.of,
        changes: d.changes,
    })
}

/// The server's bandwidth limit of the session, as it told it (feature `LIMITS`).
fn server_bwlimit(p: &Progress) -> Option<u64> {
    p.peer_limits
        .lock()
        .as_ref()
        .map(|l| l.bwlimit)
        .filter(|&b| b > 0)
}

/// Which bandwidth limit holds, and its rate: the lower of this client's and the
/// server's (a tie names the client, whose own pacing then holds first).
fn limit_held(client: Option<u64>, server: Option<u64>) -> Option<(&'static str, u64)> {
    match (client, server) {
        (Some(c), Some(s)) if s < c => Some(("server", s)),
        (Some(c), _) => Some(("client", c)),
        (None, Some(s)) => Some(("server", s)),
        (None, None) => None,
    }
}

/// The text summary's words for a bandwidth limit that holds.
fn limit_words(held: Option<(&'static str, u64)>) -> String {
    match held {
        Some((who, rate)) => format!(
            "; limited to {} by {}",
            dmover_proto::units::format_rate(rate.saturating_mul(8)),
            if who == "server" {
                "the server"
            } else {
                "--bwlimit"
            }
        ),
        None => String::new(),
    }
}

fn tuning_json(p: &Progress) -> Option<TuningJson> {
    p.tuning.lock().map(|t| TuningJson {
        streams: t.streams,
        of: t.of,
        changes: t.changes,
        settled_seconds: t.settled_ms.map(|ms| ms as f64 / 1000.0),
    })
}

/// The process exit code for an error.
pub fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Refused {
            code: ErrorCode::Auth,
            ..
        }
        | Error::Remote {
            code: ErrorCode::Auth,
            ..
        } => 3,
        // The server is not the one pinned: its identity failed, like a credential.
        Error::Net(NetError::HostKeyChanged { .. }) => 3,
        Error::Net(NetError::Proto { .. }) => 1,
        Error::Net(_) => 4,
        // A server still busy after --busy-wait (before TLS, or refusing the session
        // for its user's limit or its memory budget): a failure that may pass, like
        // the network's.
        Error::Refused {
            code: ErrorCode::Busy,
            ..
        }
        | Error::Remote {
            code: ErrorCode::Busy,
            ..
        } => 4,
        _ => 1,
    }
}

pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", units[u])
    }
}

/// The summary line's note on resumes and retries, if any.
fn resilience(r: &Report) -> String {
    let mut parts = Vec::new();
    if r.held_bytes > 0 {
        parts.push(format!(
            "resumed: {} ({} files) already there",
            human_bytes(r.held_bytes),
            r.held_files
        ));
    }
    if r.attempts > 1 {
        parts.push(format!("{} attempts", r.attempts));
    }
    if r.streams_lost > 0 {
        parts.push(format!(
            "{} streams broke, {} chunks sent again",
            r.streams_lost, r.chunks_resent
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; {}", parts.join(", "))
    }
}

/// Prints the outcome and returns the exit code. A failed run's JSON summary reports
/// what it achieved from `progress`, the run's counters.
#[allow(clippy::too_many_arguments)]
pub fn report(
    result: Result<Report, Error>,
    direction: Direction,
    dialer: Option<&str>,
    secs: f64,
    timing: Timing,
    json: bool,
    quiet: bool,
    progress: &Progress,
    bwlimit: Option<u64>,
) -> ExitCode {
    report_with(
        result, direction, dialer, secs, timing, json, quiet, progress, bwlimit, false, None,
    )
}

/// The sources and the destination of a copy as the command named them (the JSON
/// summary's `source` and `destination`).
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub source: Vec<String>,
    pub destination: String,
}

/// dmover's version, in every JSON summary.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// [`report`]; `sync`: a `dmover sync`, whose summary counts the unchanged files;
/// `endpoints`: what the command named.
#[allow(clippy::too_many_arguments)]
pub fn report_with(
    result: Result<Report, Error>,
    direction: Direction,
    dialer: Option<&str>,
    secs: f64,
    timing: Timing,
    json: bool,
    quiet: bool,
    progress: &Progress,
    bwlimit: Option<u64>,
    sync: bool,
    endpoints: Option<&Endpoints>,
) -> ExitCode {
    let o = Outcome {
        endpoints,
        ended: std::time::SystemTime::now(),
        direction,
        dialer,
        secs,
        timing,
        json,
        quiet,
        progress,
        bwlimit,
        sync,
    };
    match result {
        Ok(r) => o.done(&r),
        Err(e) => o.failed(&e),
    }
}

/// How a run's outcome is reported (see [`report_with`]).
struct Outcome<'a> {
    direction: Direction,
    dialer: Option<&'a str>,
    secs: f64,
    timing: Timing,
    json: bool,
    quiet: bool,
    progress: &'a Progress,
    bwlimit: Option<u64>,
    sync: bool,
    endpoints: Option<&'a Endpoints>,
    /// When the run ended (now, as it is reported).
    ended: std::time::SystemTime,
}

impl Outcome<'_> {
    fn started(&self) -> String {
        let secs = Duration::try_from_secs_f64(self.secs).unwrap_or_default();
        let started = self.ended.checked_sub(secs).unwrap_or(self.ended);
        dmover_bench::report::timestamps(started).1
    }

    fn ended(&self) -> String {
        dmover_bench::report::timestamps(self.ended).1
    }

    /// A run that finished: its summary (JSON or a line), what was not copied or
    /// deleted, and the exit code.
    fn done(&self, r: &Report) -> ExitCode {
        let failed = r.failed.len() as u64;
        let over = r.pruned.as_ref().map_or(0, |p| p.over_limit);
        let ok = failed == 0 && r.delete_refused.is_none() && over == 0;
        if self.json {
            print_line(&self.done_json(r, ok));
        } else if !self.quiet {
            self.done_line(r);
        }
        self.aftermath(r, ok)
    }

    fn done_json(&self, r: &Report, ok: bool) -> JsonReport {
        let (direction, dialer, secs, timing) =
            (self.direction, self.dialer, self.secs, self.timing);
        let (sync, progress, bwlimit) = (self.sync, self.progress, self.bwlimit);
        let server_limit = server_bwlimit(progress);
        let held = limit_held(bwlimit, server_limit);
        let s = r.summary;
        let gbps = r.bytes_sent as f64 * 8.0 / secs.max(1e-9) / 1e9;
        let fps = s.files as f64 / secs.max(1e-9);
        let failed = r.failed.len() as u64;
        let pruned = r.pruned.clone().unwrap_or_default();
        let deleting = r.pruned.is_some() || r.delete_refused.is_some();
        let over = pruned.over_limit;
        JsonReport {
            schema: SCHEMA,
            kind: "summary",
            version: VERSION,
            started: self.started(),
            ended: self.ended(),
            source: self.endpoints.map(|e| e.source.clone()),
            destination: self.endpoints.map(|e| e.destination.clone()),
            ok,
            direction,
            dialer: dialer.map(str::to_string),
            bytes: r.totals.bytes,
            bytes_sent: r.bytes_sent,
            bytes_resumed: r.held_bytes,
            files_unchanged: sync.then_some(r.held_files),
            bytes_unchanged: sync.then_some(r.held_bytes),
            files_deleted: deleting.then_some(pruned.deleted),
            bytes_deleted: deleting.then_some(pruned.deleted_bytes),
            delete_over_limit: deleting.then_some(over),
            files: r.totals.files - failed,
            files_sent: s.files,
            dirs: s.dirs,
            symlinks: s.symlinks,
            seconds: secs,
            gbit_per_s: gbps,
            files_per_s: fps,
            streams: r.streams,
            chunk: r.chunk_size,
            chunk_sizes: r
                .chunk_sizes
                .iter()
                .map(|&(size, chunks)| ChunkSize { size, chunks })
                .collect(),
            verified: s.verified,
            skipped: r.skipped,
            retries: r.chunks_resent,
            streams_lost: r.streams_lost,
            attempts: r.attempts,
            errors: failed,
            failed: r.failed.clone(),
            error: None,
            bwlimit,
            server_bwlimit: server_limit,
            bwlimit_from: held.map(|h| h.0),
            tuning: tuning_json(progress),
            disk_threads: disk_json(progress),
            bytes_received: r.relayed.map(|x| x.bytes_received),
            relay_peak_bytes: r.relayed.map(|x| x.peak_buffered),
            manifest_parts: match progress.manifest_grown.load(Ordering::Relaxed) {
                0 => None,
                n => Some(n + 1),
            },
            receive_buffer: match progress.receive_buffer.load(Ordering::Relaxed) {
                0 => None,
                n => Some(n),
            },
            send_buffer: match progress.send_buffer.load(Ordering::Relaxed) {
                0 => None,
                n => Some(n),
            },
            timing,
        }
    }

    fn done_line(&self, r: &Report) {
        let (direction, secs, progress) = (self.direction, self.secs, self.progress);
        let held = limit_held(self.bwlimit, server_bwlimit(progress));
        let s = r.summary;
        let gbps = r.bytes_sent as f64 * 8.0 / secs.max(1e-9) / 1e9;
        let fps = s.files as f64 / secs.max(1e-9);
        let verb = match direction {
            Direction::Push => "pushed",
            Direction::Pull => "pulled",
            Direction::TpcPush | Direction::TpcPull => "copied server to server",
            Direction::TpcRelay => "relayed server to server",
            Direction::Local => "copied locally",
        };
        eprintln!(
            "{verb} {} in {} files, {} dirs, {} symlinks in {secs:.2} s: {gbps:.2} Gbit/s, {fps:.0} files/s ({} streams, {} chunks{}){}{}{}",
            human_bytes(r.bytes_sent),
            s.files,
            s.dirs,
            s.symlinks,
            match *progress.tuning.lock() {
                Some(t) => format!("{} of {} tuned", t.streams, t.of),
                None => r.streams.to_string(),
            },
            human_bytes(r.chunk_size.into()),
            if s.verified {
                ", checksums verified"
            } else {
                ", not checksummed"
            },
            if r.skipped > 0 {
                format!("; skipped {} special files", r.skipped)
            } else {
                String::new()
            },
            resilience(r),
            limit_words(held),
        );
    }

    /// What was not copied or deleted, and the exit code.
    fn aftermath(&self, r: &Report, ok: bool) -> ExitCode {
        let (json, quiet) = (self.json, self.quiet);
        let failed = r.failed.len() as u64;
        let pruned = r.pruned.clone().unwrap_or_default();
        let over = pruned.over_limit;
        for f in &r.failed {
            eprintln!("dmover: not copied: {}", printable(&f.to_string()));
        }
        if r.pruned.is_some() && !quiet && !json {
            eprintln!(
                "deleted {} entries ({}) the source does not have{}",
                pruned.deleted,
                human_bytes(pruned.deleted_bytes),
                if pruned.protected > 0 {
                    format!("; kept {} excluded by the filters", pruned.protected)
                } else {
                    String::new()
                }
            );
        }
        if let Some(why) = &r.delete_refused {
            eprintln!("dmover: error: {}", printable(why));
        }
        if over > 0 {
            eprintln!(
                "dmover: error: --max-delete stopped deletions: {over} more entries the \
                 source does not have were not deleted"
            );
        }
        if failed == 0 && !ok {
            ExitCode::from(1)
        } else if failed > 0 {
            eprintln!(
                "dmover: error: {failed} files could not be copied; the rest was (rerun with --resume to retry them)"
            );
            ExitCode::from(PARTIAL)
        } else {
            ExitCode::SUCCESS
        }
    }

    /// A run that failed: its JSON summary reports what it achieved from the run's
    /// counters (all attempts); the error, and its exit code.
    fn failed(&self, e: &Error) -> ExitCode {
        if self.json {
            print_line(&self.failed_json(e));
        }
        eprintln!("dmover: error: {}", printable(&e.to_string()));
        ExitCode::from(exit_code(e))
    }

    fn failed_json(&self, e: &Error) -> JsonReport {
        let (direction, dialer, secs, timing) =
            (self.direction, self.dialer, self.secs, self.timing);
        let (progress, bwlimit) = (self.progress, self.bwlimit);
        let server_limit = server_bwlimit(progress);
        let held = limit_held(bwlimit, server_limit);
        // What only a finished session reports (files, streams, chunk size) stays 0.
        let bytes_sent = progress.bytes.load(Ordering::Relaxed);
        JsonReport {
            schema: SCHEMA,
            kind: "summary",
            version: VERSION,
            started: self.started(),
            ended: self.ended(),
            source: self.endpoints.map(|e| e.source.clone()),
            destination: self.endpoints.map(|e| e.destination.clone()),
            ok: false,
            direction,
            dialer: dialer.map(str::to_string),
            bytes: progress.total.load(Ordering::Relaxed),
            bytes_sent,
            bytes_resumed: progress.held.load(Ordering::Relaxed),
            files_unchanged: None,
            bytes_unchanged: None,
            files_deleted: None,
            bytes_deleted: None,
            delete_over_limit: None,
            files: 0,
            files_sent: 0,
            dirs: 0,
            symlinks: 0,
            seconds: secs,
            gbit_per_s: bytes_sent as f64 * 8.0 / secs.max(1e-9) / 1e9,
            files_per_s: 0.0,
            streams: 0,
            chunk: 0,
            chunk_sizes: Vec::new(),
            verified: false,
            skipped: 0,
            retries: progress.chunks_resent.load(Ordering::Relaxed),
            streams_lost: progress.streams_lost.load(Ordering::Relaxed),
            attempts: progress.attempt.load(Ordering::Relaxed),
            errors: 1,
            failed: Vec::new(),
            error: Some(e.to_string()),
            bwlimit,
            server_bwlimit: server_limit,
            bwlimit_from: held.map(|h| h.0),
            tuning: tuning_json(progress),
            disk_threads: disk_json(progress),
            bytes_received: None,
            relay_peak_bytes: None,
            manifest_parts: None,
            receive_buffer: None,
            send_buffer: None,
            timing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_counts_bytes_and_files_in_the_summary_units() {
        let mut now = StatusNow {
            done: 3 << 30,
            total: 4 << 30,
            files: 30,
            total_files: 40,
            gbps: 8.0 * 1.024 * 1.024 * 1.024,
            elapsed: 12.4,
        };
        // 1 GiB left at 1 GiB/s.
        assert_eq!(
            now.line(),
            "progress: 75% 3.00 GiB/4.00 GiB, 30/40 files, 8.59 Gbit/s, 12 s elapsed, ETA 1 s"
        );
        now.gbps = 0.0;
        assert_eq!(
            now.line(),
            "progress: 75% 3.00 GiB/4.00 GiB, 30/40 files, 0.00 Gbit/s, 12 s elapsed"
        );
        // Before the walk tells the totals.
        now.total = 0;
        now.total_files = 0;
        assert_eq!(
            now.line(),
            "progress: 3.00 GiB, 30 files, 0.00 Gbit/s, 12 s elapsed"
        );
    }

    #[test]
    fn the_status_rate_is_over_the_window() {
        let p = Progress::default();
        let mut s = Status::new();
        s.sample(&p, 1.0);
        std::thread::sleep(Duration::from_millis(50));
        p.bytes.store(1_000_000, Ordering::Relaxed);
        let now = s.sample(&p, 1.0);
        assert!(now.gbps > 0.0, "{now:?}");
        assert_eq!(now.done, 1_000_000);
        // Nothing more crossed: the rate over a short window falls to 0.
        std::thread::sleep(Duration::from_millis(30));
        s.sample(&p, 0.01);
        std::thread::sleep(Duration::from_millis(30));
        let now = s.sample(&p, 0.01);
        assert_eq!(now.gbps, 0.0, "{now:?}");
    }

    #[test]
    fn what_reaches_the_terminal_is_printable() {
        assert!(matches!(
            printable("plain\nline\t2 é"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("a\u{1b}]0;title\u{7}b\rc\u{202e}d"),
            "a\\u{1b}]0;title\\u{7}b\\u{d}c\\u{202e}d"
        );
    }

    #[test]
    fn the_lower_bandwidth_limit_holds_and_is_named() {
        assert_eq!(limit_held(None, None), None);
        assert_eq!(limit_held(Some(10), None), Some(("client", 10)));
        assert_eq!(limit_held(None, Some(20)), Some(("server", 20)));
        assert_eq!(limit_held(Some(10), Some(20)), Some(("client", 10)));
        assert_eq!(limit_held(Some(30), Some(20)), Some(("server", 20)));
        assert_eq!(limit_held(Some(20), Some(20)), Some(("client", 20)));
        assert_eq!(
            limit_words(Some(("server", 5_000_000))),
            "; limited to 40mbit by the server"
        );
        assert_eq!(
            limit_words(Some(("client", 1_250_000))),
            "; limited to 10mbit by --bwlimit"
        );
        assert_eq!(limit_words(None), "");
        // A server's 0 is "none".
        let p = Progress::default();
        assert_eq!(server_bwlimit(&p), None);
        *p.peer_limits.lock() = Some(dmover_proto::control::SessionLimits::default());
        assert_eq!(server_bwlimit(&p), None);
        p.peer_limits.lock().as_mut().unwrap().bwlimit = 7;
        assert_eq!(server_bwlimit(&p), Some(7));
    }

    #[test]
    fn steady_rate_leaves_out_setup_ramp_and_tail() {
        // 1 s of set-up, 1 s of ramp at 0.1 Gbit/s, then 1 Gbit/s for 8 s, sampled
        // every 50 ms: end to end ~0.8 Gbit/s, steady 1.0.
        let rate = |t: f64| -> f64 {
            match t {
                t if t < 1.0 => 0.0,
                t if t < 2.0 => (t - 1.0) * 0.1e9 / 8.0,
                t => 0.1e9 / 8.0 + (t - 2.0) * 1e9 / 8.0,
            }
        };
        let samples: Vec<(f64, u64)> = (0..=200)
            .map(|i| {
                let t = i as f64 * 0.05;
                (t, rate(t) as u64)
            })
            .collect();
        let t = Timing::from_samples(&samples);
        let first = t.first_chunk_seconds.unwrap();
        assert!((1.0..=1.06).contains(&first), "{first}");
        let steady = t.steady_gbit_per_s.unwrap();
        assert!((steady - 1.0).abs() < 0.01, "{steady}");
        // Too short to tell, or nothing moved: no steady rate.
        let short: Vec<(f64, u64)> = (0..=6).map(|i| (i as f64 * 0.05, i * 1000)).collect();
        assert_eq!(Timing::from_samples(&short).steady_gbit_per_s, None);
        assert_eq!(Timing::from_samples(&[(0.5, 0)]), Timing::default());
    }
}
