//! What a job is, as the store keeps it and the API shows it.

use serde::{Deserialize, Serialize};

/// A job's identifier (assigned by the store, increasing).
pub type JobId = i64;

/// Where a job is in its life. `Queued` and `Running` can change; `Done`, `Failed`
/// and `Cancelled` are ends (a failed or cancelled job can be retried, which queues it
/// again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for a runner (new, retried, or re-queued after a failed attempt).
    Queued,
    /// A runner is moving its data.
    Running,
    /// Every file copied.
    Done,
    /// Ended with an error, or with files that could not be copied.
    Failed,
    /// Cancelled by its owner or an admin.
    Cancelled,
}

impl State {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// The state a stored name names.
    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "queued" => State::Queued,
            "running" => State::Running,
            "done" => State::Done,
            "failed" => State::Failed,
            "cancelled" => State::Cancelled,
            _ => return None,
        })
    }

    /// Whether the job has ended.
    pub fn is_end(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// A copy of the sources into the destination (`dmover cp`).
    #[default]
    Copy,
    /// The destination made a mirror of the one source (`dmover sync`): only what
    /// changed is sent, and with `delete` what the source does not hold is deleted.
    Sync,
}

impl JobKind {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Copy => "copy",
            JobKind::Sync => "sync",
        }
    }

    /// The kind a stored name names.
    pub fn parse(s: &str) -> Option<JobKind> {
        match s {
            "copy" => Some(JobKind::Copy),
            "sync" => Some(JobKind::Sync),
            _ => None,
        }
    }
}

/// A sync job's options (`dmover submit --sync`, as `dmover sync`'s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SyncOptions {
    /// Delete what the mirror holds that the source does not (`--delete`).
    pub delete: bool,
    /// Delete at most this many entries (`--max-delete`, with `delete`).
    pub max_delete: Option<u64>,
    /// Compare files of equal size by content, not mtime (`--checksum`).
    pub checksum: bool,
}

/// One `--include`/`--exclude` rule (rsync's pattern syntax), in command-line order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterRule {
    /// `--include` (else `--exclude`).
    pub include: bool,
    /// The pattern.
    pub pattern: String,
}

/// How a copy between two servers moves its data (`dmover cp --tpc`, `--via-client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// The source server dials the destination.
    #[default]
    Push,
    /// The destination server dials the source.
    Pull,
    /// Through the job service.
    ViaService,
}

/// The options of a job's transfer, a subset of `dmover cp`'s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct JobOptions {
    /// Parallel data streams (`None`: the engine's default).
    pub streams: Option<u16>,
    /// Leave files that cannot be copied and go on with the rest (their errors are
    /// kept by file); without it the first such file fails the job.
    pub continue_on_error: bool,
    /// Read every file back at the destination and compare digests.
    pub verify: bool,
    /// How the data goes between the two servers.
    pub route: Route,
    /// A sync (the job's kind is [`JobKind::Sync`]): the destination is the mirror of
    /// the one source.
    pub sync: Option<SyncOptions>,
    /// `--include`/`--exclude` rules applied to the source's walk (and, for a sync,
    /// protecting what they exclude from deletion).
    pub filters: Vec<FilterRule>,
    /// Its order in its owner's queue, 1 (last) to 5 (first) (`None`: 3,
    /// [`DEFAULT_PRIORITY`]). It orders one user's jobs only: which user's job runs
    /// next is the fair share's choice (docs/jobs.md, "Scheduling").
    pub priority: Option<u8>,
    /// A URL the job's record is POSTed to (JSON) each time it ends (done, failed,
    /// cancelled): under the service's allow-list (`[jobs] webhooks`), checked at
    /// submission and before each delivery.
    pub notify: Option<String>,
    /// A recurring sync: run again this many seconds after each run started (at least
    /// [`MIN_EVERY_SECS`]); between runs the job is queued, its counters, `error` and
    /// `ended_ms` its last run's. Only a sync recurs (it sends only what changed).
    pub every_secs: Option<u64>,
}

/// The shortest period of a recurring job.
pub const MIN_EVERY_SECS: u64 = 60;

/// Where a job's webhook ([`JobOptions::notify`]) is, once the job has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookState {
    /// To be delivered (also after a restart of the service).
    Pending,
    /// Answered 2xx.
    Delivered,
    /// Given up on (the reason in `webhook_error`).
    Failed,
}

impl WebhookState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookState::Pending => "pending",
            WebhookState::Delivered => "delivered",
            WebhookState::Failed => "failed",
        }
    }

    /// The state a stored name names.
    pub fn parse(s: &str) -> Option<WebhookState> {
        match s {
            "pending" => Some(WebhookState::Pending),
            "delivered" => Some(WebhookState::Delivered),
            "failed" => Some(WebhookState::Failed),
            _ => None,
        }
    }
}

/// The lowest priority a job can have.
pub const MIN_PRIORITY: u8 = 1;
/// The highest priority a job can have.
pub const MAX_PRIORITY: u8 = 5;
/// A job's priority unless it says.
pub const DEFAULT_PRIORITY: u8 = 3;

impl JobOptions {
    /// The job's priority, [`DEFAULT_PRIORITY`] unless set (and clamped to the
    /// range: the service refuses a priority out of it at submission).
    pub fn priority(&self) -> u8 {
        self.priority
            .unwrap_or(DEFAULT_PRIORITY)
            .clamp(MIN_PRIORITY, MAX_PRIORITY)
    }
}

/// The link a job runs on: its source server and its destination server
/// (`HOST:PORT -> HOST:PORT`, the default port filled in), or the sources and
/// destination as given when they do not parse (such a job fails at its run). Jobs on
/// one link share its concurrency limit.
pub fn link_of(spec: &JobSpec) -> String {
    let server = |s: &str| {
        dmover_core::transfer::Endpoint::parse(s)
            .ok()
            .and_then(|e| e.server().map(str::to_string))
            .unwrap_or_else(|| s.to_string())
    };
    let source = spec.sources.first().map_or(String::new(), |s| server(s));
    format!("{source} -> {}", server(&spec.destination))
}

/// What a job copies: `dmover://HOST[:PORT]/PATH` sources (one server) and a
/// destination on a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The sources, as submitted.
    pub sources: Vec<String>,
    /// The destination, as submitted.
    pub destination: String,
    /// The transfer's options.
    #[serde(default)]
    pub options: JobOptions,
}

impl JobSpec {
    /// What the job does: a sync when it has a sync's options.
    pub fn kind(&self) -> JobKind {
        match self.options.sync {
            Some(_) => JobKind::Sync,
            None => JobKind::Copy,
        }
    }
}

/// A file that could not be copied, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileError {
    /// The file's path, as the engine names it.
    pub path: String,
    /// Why.
    pub error: String,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// The user who submitted it.
    pub owner: String,
    /// What it does.
    pub kind: JobKind,
    /// Where it is.
    pub state: State,
    /// What it copies.
    pub spec: JobSpec,
    /// Its priority in its owner's queue (1 to 5; [`JobOptions::priority`]).
    pub priority: u8,
    /// Its source and destination servers ([`link_of`]).
    pub link: String,
    /// Runs started, all told.
    pub attempts: u32,
    /// Runs started since it was submitted or last retried (what the retry limit
    /// counts).
    pub tries: u32,
    /// When it was submitted (Unix milliseconds).
    pub created_ms: i64,
    /// When it was submitted or last retried: its deadline counts from here.
    pub queued_ms: i64,
    /// When its last run started.
    pub started_ms: Option<i64>,
    /// When it ended.
    pub ended_ms: Option<i64>,
    /// Not run before this time (a retry's backoff).
    pub not_before_ms: i64,
    /// Bytes copied (counting what a resume found already there).
    pub bytes: u64,
    /// Bytes to copy.
    pub bytes_total: u64,
    /// Bytes the destination already held when the last run started (a resumed run
    /// does not send them again).
    pub bytes_resumed: u64,
    /// Files copied.
    pub files_done: u64,
    /// Files that could not be copied.
    pub files_failed: u64,
    /// Files to copy.
    pub files_total: u64,
    /// Rate of the last run, bytes per second (average so far).
    pub rate: f64,
    /// Why the job (or its last attempt) failed.
    pub error: Option<String>,
    /// The files that could not be copied in its last run.
    pub file_errors: Vec<FileError>,
    /// Cancelling was asked while it ran.
    pub cancel_requested: bool,
    /// Its webhook's delivery after its last end (`None`: it names no webhook, or has
    /// not ended).
    pub webhook: Option<WebhookState>,
    /// Why its webhook was not delivered.
    pub webhook_error: Option<String>,
}

/// A run's counters, recorded while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Counters {
    /// Bytes copied.
    pub bytes: u64,
    /// Bytes to copy.
    pub bytes_total: u64,
    /// Bytes the destination held at the start of the run.
    pub bytes_resumed: u64,
    /// Files copied.
    pub files_done: u64,
    /// Files to copy.
    pub files_total: u64,
    /// Bytes per second.
    pub rate: f64,
}

/// How a run ended, as the runner records it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every file copied.
    Done(Counters),
    /// Ended for good: the error, and the files that could not be copied.
    Failed {
        /// The counters at the end.
        counters: Counters,
        /// Why.
        error: String,
        /// The files not copied.
        files: Vec<FileError>,
    },
    /// Cancelled.
    Cancelled(Counters),
    /// Failed, to be run again from `not_before_ms` on.
    Requeue {
        /// The counters at the end.
        counters: Counters,
        /// Why this attempt failed.
        error: String,
        /// When the next attempt may start.
        not_before_ms: i64,
    },
}

/// The milliseconds since the Unix epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
