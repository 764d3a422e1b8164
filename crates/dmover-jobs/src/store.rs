//! The job store: one interface ([`JobStore`]) for the runner and the API, and its
//! first implementation, an embedded SQLite database ([`SqliteStore`]) in the server's
//! state directory. The cluster's PostgreSQL store implements the same trait.
//!
//! The trait is synchronous: SQLite is, and the runner and the API call it from
//! `spawn_blocking`. Each method is one transaction.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use crate::model::{
    Counters, FileError, Job, JobId, JobKind, JobSpec, Outcome, State, WebhookState, link_of,
    now_ms,
};

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such job.
    #[error("no job {0}")]
    NotFound(JobId),
    /// The job is not in a state that allows it.
    #[error("{0}")]
    Conflict(String),
    /// The database file is not a jobs database, or is damaged.
    #[error(
        "the jobs database {path} is corrupt or not a database ({detail}); move it aside to start with an empty queue"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// SQLite's words.
        detail: String,
    },
    /// Another job service has the database open.
    #[error(
        "the jobs database {0} is in use by another job service (two services cannot share one file)"
    )]
    Locked(PathBuf),
    /// Written by a newer dmover.
    #[error("the jobs database {path} has schema version {found}; this dmover knows up to {known}")]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// Ours.
        known: i64,
    },
    /// A per-user cap refused the request (the API's 429 `limit`).
    #[error("{0}")]
    Limit(String),
    /// A stored row that does not read back.
    #[error("job {0}: stored data does not read back: {1}")]
    BadRow(JobId, String),
    /// A shared store's agent name is held by a live service.
    #[error(
        "agent {0} is in use by a live job service on this database: give each service its own agent name"
    )]
    AgentInUse(String),
    /// This service's lease on a shared store was lost (another service took its
    /// agent name, or its jobs were given to others while it could not heartbeat).
    #[error("{0}")]
    Lost(String),
    /// Anything else the database or the file system said.
    #[error("jobs database: {0}")]
    Db(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Db(e.to_string())
    }
}

/// A page of jobs, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page<'a> {
    /// Only this owner's jobs (`None`: everyone's).
    pub owner: Option<&'a str>,
    /// Only jobs with an id below this one (the previous page's last).
    pub before: Option<JobId>,
    /// At most this many.
    pub limit: u32,
}

/// The store's share of the scheduling policy (docs/jobs.md, "Scheduling"): what
/// [`JobStore::claim`] and [`JobStore::submit`] enforce, for every runner of the
/// store at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Jobs running at once on one link (source server, destination server).
    pub link_concurrency: u32,
    /// Unfinished (queued or running) jobs one user may have; `None`: no cap.
    pub max_unfinished_per_user: Option<u32>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            link_concurrency: 4,
            max_unfinished_per_user: Some(1000),
        }
    }
}

/// What the runner and the API need of a job store.
pub trait JobStore: Send + Sync + std::fmt::Debug {
    /// Records a new queued job and returns it.
    fn submit(&self, owner: &str, kind: JobKind, spec: &JobSpec) -> Result<Job, StoreError>;
    /// One job.
    fn get(&self, id: JobId) -> Result<Job, StoreError>;
    /// A page of jobs, newest first.
    fn list(&self, page: Page<'_>) -> Result<Vec<Job>, StoreError>;
    /// Takes the next queued job whose backoff has passed at `now_ms` and whose link
    /// has fewer running jobs than the [`Policy`]'s limit: it becomes running, its
    /// attempts counted. Which one ([`CLAIM`]): the user with the fewest running jobs,
    /// then the one served least recently (a claim sequence), then by name; of that
    /// user's jobs the highest priority, then the oldest. One transaction: a job is
    /// never claimed twice.
    fn claim(&self, now_ms: i64) -> Result<Option<Job>, StoreError>;
    /// Records a running job's counters, and says whether the run should go on:
    /// [`RunState::CancelAsked`] when a cancel was recorded meanwhile (by this service
    /// or, on a shared store, another), [`RunState::Lost`] when the job is no longer
    /// this service's (a shared store gave it to another agent after this one's lease
    /// ran out).
    fn progress(&self, id: JobId, c: &Counters) -> Result<RunState, StoreError>;
    /// Records how a run ended.
    fn finish(&self, id: JobId, outcome: &Outcome) -> Result<Job, StoreError>;
    /// Cancels a queued job at once; marks a running one (its runner stops it and
    /// records [`Outcome::Cancelled`]). An ended job cannot be cancelled.
    fn cancel(&self, id: JobId) -> Result<Job, StoreError>;
    /// Queues a failed or cancelled job again, its tries counted from zero.
    fn retry(&self, id: JobId) -> Result<Job, StoreError>;
    /// At start: the jobs left running by a service that stopped without recording
    /// their end (a crash, kill -9) are queued again (or cancelled, if that was
    /// asked). Returns their ids.
    fn recover(&self) -> Result<Vec<JobId>, StoreError>;
    /// Queued jobs whose backoff has not passed at `after_ms`: the earliest time one
    /// is due.
    fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError>;
    /// Deletes the jobs that ended (done, failed, cancelled) before `before_ms`, with
    /// their errors by file; returns how many.
    fn purge(&self, before_ms: i64) -> Result<u64, StoreError>;
    /// How many jobs the store holds in each state (states without one left out).
    fn counts(&self) -> Result<Vec<(State, u64)>, StoreError>;
    /// The ended jobs whose webhook is still to be delivered, oldest end first (at
    /// most `limit`).
    fn webhooks_pending(&self, limit: usize) -> Result<Vec<Job>, StoreError>;
    /// Records a delivery's result for job `id`, unless the job was retried (or
    /// deleted) meanwhile: delivered, or why not.
    fn webhook_result(&self, id: JobId, result: Result<(), String>) -> Result<(), StoreError>;
    /// A store shared by several services (each an agent holding a lease on the jobs
    /// it runs): how often [`JobStore::heartbeat`] must be called. `None` (the
    /// default): one service holds the store, and there is no lease to keep.
    fn heartbeat_every(&self) -> Option<std::time::Duration> {
        None
    }
    /// Renews this service's lease ([`JobStore::heartbeat_every`]). An error says it
    /// could not (the database is unreachable: the runs go on, nothing new is claimed
    /// until it is back), or that the lease was lost ([`StoreError::Lost`]).
    fn heartbeat(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Queues again the running jobs of agents whose lease ran out (a shared store;
    /// [`JobStore::recover`] does it once at start for a store of one's own).
    /// Returns their ids.
    fn reclaim(&self) -> Result<Vec<JobId>, StoreError> {
        Ok(Vec::new())
    }
}

/// Whether a run goes on ([`JobStore::progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// It does.
    Running,
    /// A cancel was asked: stop it (its end records the cancel).
    CancelAsked,
    /// The job is no longer this service's: stop it, record nothing.
    Lost,
}

/// A job's fields that a store keeps as text, read back ([`Job`]'s kind, state, spec
/// and webhook state), or the row's fault.
pub(crate) fn parse_row(
    id: JobId,
    kind: &str,
    state: &str,
    spec: &str,
    webhook: Option<&str>,
) -> Result<(JobKind, State, JobSpec, Option<WebhookState>), StoreError> {
    let bad = |what: String| StoreError::BadRow(id, what);
    let kind = JobKind::parse(kind).ok_or_else(|| bad(format!("kind {kind:?}")))?;
    let state = State::parse(state).ok_or_else(|| bad(format!("state {state:?}")))?;
    let spec: JobSpec = serde_json::from_str(spec).map_err(|e| bad(format!("spec: {e}")))?;
    let webhook = match webhook {
        None => None,
        Some(w) => Some(WebhookState::parse(w).ok_or_else(|| bad(format!("webhook {w:?}")))?),
    };
    Ok((kind, state, spec, webhook))
}

/// How a run's [`Outcome`] changes its job ([`JobStore::finish`]), the same in every
/// store.
#[derive(Debug)]
pub(crate) struct Ending<'a> {
    /// Its state after.
    pub state: State,
    /// The run's counters.
    pub counters: &'a Counters,
    /// Why it failed (this attempt, or for good).
    pub error: Option<&'a str>,
    /// The files not copied.
    pub files: &'a [FileError],
    /// Not run again before.
    pub not_before: i64,
    /// When it ended (`None`: queued again).
    pub ended: Option<i64>,
    /// A recurring job queued for its next run: its tries and deadline count from
    /// `not_before`.
    pub recurs: bool,
}

impl Ending<'_> {
    /// The job ended (or a recurring one's run did): its webhook is due.
    pub fn webhook_due(&self) -> bool {
        self.state.is_end() || self.recurs
    }
}

/// The [`Ending`] of `job`'s run with `outcome`, at `now`.
pub(crate) fn ending<'a>(job: &Job, outcome: &'a Outcome, now: i64) -> Ending<'a> {
    let (mut state, counters, error, files, mut not_before, ended) = match outcome {
        Outcome::Done(c) => (State::Done, c, None, &[][..], 0, Some(now)),
        Outcome::Cancelled(c) => (State::Cancelled, c, None, &[][..], 0, Some(now)),
        Outcome::Failed {
            counters,
            error,
            files,
        } => (
            State::Failed,
            counters,
            Some(error.as_str()),
            &files[..],
            0,
            Some(now),
        ),
        Outcome::Requeue {
            counters,
            error,
            not_before_ms,
        } => (
            State::Queued,
            counters,
            Some(error.as_str()),
            &[][..],
            *not_before_ms,
            None,
        ),
    };
    // A recurring job's run that ended done or failed: queued for its next run, a
    // period after this one started (at once if that has passed).
    let recurs = match (job.spec.options.every_secs, state) {
        (Some(every), State::Done | State::Failed) => {
            let every_ms = i64::try_from(every.saturating_mul(1000)).unwrap_or(i64::MAX);
            let started = job.started_ms.unwrap_or(now);
            not_before = started.saturating_add(every_ms);
            state = State::Queued;
            true
        }
        _ => false,
    };
    Ending {
        state,
        counters,
        error,
        files,
        not_before,
        ended,
        recurs,
    }
}

/// The cap on a user's unfinished jobs refused a submission.
pub(crate) fn too_many(owner: &str, n: i64, cap: u32) -> StoreError {
    StoreError::Limit(format!(
        "{owner} has {n} unfinished (queued or running) jobs, the most a user may have \
         (max_unfinished_per_user = {cap}); submit again when some have ended"
    ))
}

/// A cancel of an ended job.
pub(crate) fn nothing_to_cancel(id: JobId, s: State) -> StoreError {
    StoreError::Conflict(format!(
        "job {id} has ended ({}): nothing to cancel",
        s.as_str()
    ))
}

/// A retry of a job that is not failed or cancelled.
pub(crate) fn not_retryable(id: JobId, s: State) -> StoreError {
    StoreError::Conflict(format!(
        "job {id} is {}: only a failed or cancelled job can be retried",
        s.as_str()
    ))
}

/// A stored counter as a database integer (saturating).
pub(crate) fn db_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The claim's choice, in SQL (SQLite's and PostgreSQL's): `?1` now, `?2` the link
/// limit. Eligible jobs are queued, due, and on a link below its limit; their owners
/// are ranked by running jobs, then by their last claim's sequence number (never
/// claimed: 0), then by name; the first owner's best job (priority, then id) wins.
pub const CLAIM: &str = "\
    WITH link_running AS ( \
        SELECT link, COUNT(*) AS n FROM jobs WHERE state = 'running' GROUP BY link), \
    owner_running AS ( \
        SELECT owner, COUNT(*) AS n FROM jobs WHERE state = 'running' GROUP BY owner), \
    eligible AS ( \
        SELECT j.id, j.owner, j.priority FROM jobs j \
        LEFT JOIN link_running l ON l.link = j.link \
        WHERE j.state = 'queued' AND j.not_before_ms <= ?1 AND COALESCE(l.n, 0) < ?2) \
    SELECT e.id FROM eligible e \
    LEFT JOIN owner_running r ON r.owner = e.owner \
    LEFT JOIN owners o ON o.owner = e.owner \
    ORDER BY COALESCE(r.n, 0), COALESCE(o.last_claim, 0), e.owner, e.priority DESC, e.id \
    LIMIT 1";

/// The schema, one step per version (`PRAGMA user_version` counts the steps applied).
const MIGRATIONS: &[&str] = &[
    // 1: jobs and the files they could not copy.
    "CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        owner TEXT NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        tries INTEGER NOT NULL DEFAULT 0,
        created_ms INTEGER NOT NULL,
        queued_ms INTEGER NOT NULL,
        started_ms INTEGER,
        ended_ms INTEGER,
        not_before_ms INTEGER NOT NULL DEFAULT 0,
        bytes INTEGER NOT NULL DEFAULT 0,
        bytes_total INTEGER NOT NULL DEFAULT 0,
        bytes_resumed INTEGER NOT NULL DEFAULT 0,
        files_done INTEGER NOT NULL DEFAULT 0,
        files_failed INTEGER NOT NULL DEFAULT 0,
        files_total INTEGER NOT NULL DEFAULT 0,
        rate REAL NOT NULL DEFAULT 0,
        error TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_queue ON jobs (state, not_before_ms, id);
    CREATE INDEX jobs_owner ON jobs (owner, id);
    CREATE TABLE file_errors (
        job INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        path TEXT NOT NULL,
        error TEXT NOT NULL
    );
    CREATE INDEX file_errors_job ON file_errors (job);",
    // 2: scheduling (a job's priority and link; when each owner was last served)
    // and purging (finished jobs by their end).
    "ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 3;
    ALTER TABLE jobs ADD COLUMN link TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_owner_state ON jobs (owner, state);
    CREATE INDEX jobs_ended ON jobs (state, ended_ms);
    CREATE TABLE owners (
        owner TEXT PRIMARY KEY,
        last_claim INTEGER NOT NULL
    );",
    // 3: webhooks: each ended job's delivery (pending ones are found again after a
    // restart).
    "ALTER TABLE jobs ADD COLUMN webhook TEXT;
    ALTER TABLE jobs ADD COLUMN webhook_error TEXT;
    CREATE INDEX jobs_webhook ON jobs (webhook);",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Jobs in an SQLite database (WAL mode), held by one service at a time.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Mutex<Connection>,
    path: PathBuf,
    policy: Policy,
    /// The lock file `PATH.lock`, locked (`flock`) while the store is open.
    _lock: std::fs::File,
}

/// The columns [`row_job`] reads, in order.
const COLUMNS: &str = "id, owner, kind, state, spec, attempts, tries, created_ms, queued_ms, started_ms, \
    ended_ms, not_before_ms, bytes, bytes_total, bytes_resumed, files_done, files_failed, files_total, rate, \
    error, cancel_requested, priority, link, webhook, webhook_error";

impl SqliteStore {
    /// Opens (or makes) the database at `path`, takes its lock, and migrates its
    /// schema to [`SCHEMA_VERSION`].
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Db(format!("making {}: {e}", dir.display())))?;
        }
        let lock = lock(path)?;
        let corrupt = |e: rusqlite::Error| classify(path, e);
        let conn = Connection::open(path).map_err(corrupt)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(corrupt)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(corrupt)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Db(format!(
                "{}: WAL mode refused (journal mode {mode})",
                path.display()
            )));
        }
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
            .map_err(corrupt)?;
        let mut store = SqliteStore {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
            policy: Policy::default(),
            _lock: lock,
        };
        store.migrate()?;
        store.fill_links()?;
        Ok(store)
    }

    /// The store with `policy` in force.
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> SqliteStore {
        self.policy = policy;
        self
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The jobs of a database made before schema 2 get their link and priority from
    /// their spec (once: a link is never empty after).
    fn fill_links(&self) -> Result<(), StoreError> {
        self.tx(|tx| {
            let mut q = tx.prepare("SELECT id, spec FROM jobs WHERE link = ''")?;
            let rows: Vec<(JobId, String)> = q
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (id, spec) in rows {
                let spec: JobSpec = serde_json::from_str(&spec)
                    .map_err(|e| StoreError::BadRow(id, format!("spec: {e}")))?;
                tx.execute(
                    "UPDATE jobs SET link = ?2, priority = ?3 WHERE id = ?1",
                    params![id, link_of(&spec), spec.options.priority()],
                )?;
            }
            Ok(())
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies the migrations the file lacks, each in its own transaction.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let conn = self.conn.get_mut().unwrap_or_else(|p| p.into_inner());
        let found: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| classify(&path, e))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path,
                found,
                known: SCHEMA_VERSION,
            });
        }
        for (i, step) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
            let tx = conn.transaction().map_err(|e| classify(&path, e))?;
            tx.execute_batch(step).map_err(|e| classify(&path, e))?;
            tx.pragma_update(None, "user_version", i as i64 + 1)?;
            tx.commit()?;
        }
        Ok(())
    }

    /// Runs `f` in a transaction.
    fn tx<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn.transaction().map_err(|e| classify(&self.path, e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| classify(&self.path, e))?;
        Ok(out)
    }
}

/// Takes `PATH.lock` exclusively, or says who holds it.
fn lock(path: &Path) -> Result<std::fs::File, StoreError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| StoreError::Db(format!("opening {}: {e}", lock_path.display())))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StoreError::Locked(path.to_path_buf())),
        Err(e) => Err(StoreError::Db(format!(
            "locking {}: {e}",
            lock_path.display()
        ))),
    }
}

/// SQLite's error, with a corrupt or foreign file said as such.
fn classify(path: &Path, e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseCorrupt, DatabaseLocked, NotADatabase};
    match e.sqlite_error_code() {
        Some(NotADatabase | DatabaseCorrupt) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
        Some(DatabaseBusy | DatabaseLocked) => StoreError::Locked(path.to_path_buf()),
        _ => StoreError::Db(format!("{}: {e}", path.display())),
    }
}

/// Reads a job row ([`COLUMNS`]); its file errors are read apart.
fn row_job(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<Job, StoreError>> {
    let id: JobId = r.get(0)?;
    let (kind, state, spec): (String, String, String) = (r.get(2)?, r.get(3)?, r.get(4)?);
    let webhook: Option<String> = r.get(23)?;
    let (kind, state, spec, webhook) = match parse_row(id, &kind, &state, &spec, webhook.as_deref())
    {
        Ok(x) => x,
        Err(e) => return Ok(Err(e)),
    };
    let u = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
    Ok(Ok(Job {
        id,
        owner: r.get(1)?,
        kind,
        state,
        spec,
        attempts: u(5)? as u32,
        tries: u(6)? as u32,
        created_ms: r.get(7)?,
        queued_ms: r.get(8)?,
        started_ms: r.get(9)?,
        ended_ms: r.get(10)?,
        not_before_ms: r.get(11)?,
        bytes: u(12)?,
        bytes_total: u(13)?,
        bytes_resumed: u(14)?,
        files_done: u(15)?,
        files_failed: u(16)?,
        files_total: u(17)?,
        rate: r.get(18)?,
        error: r.get(19)?,
        file_errors: Vec::new(),
        cancel_requested: r.get::<_, i64>(20)? != 0,
        priority: u(21)?.min(255) as u8,
        link: r.get(22)?,
        webhook,
        webhook_error: r.get(24)?,
    }))
}

/// Job `id` with its file errors, in `tx`.
fn load(tx: &rusqlite::Transaction<'_>, id: JobId) -> Result<Job, StoreError> {
    let row = tx
        .query_row(
            &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
            [id],
            row_job,
        )
        .optional()?;
    let mut job = row.ok_or(StoreError::NotFound(id))??;
    let mut q =
        tx.prepare_cached("SELECT path, error FROM file_errors WHERE job = ?1 ORDER BY rowid")?;
    job.file_errors = q
        .query_map([id], |r| {
            Ok(FileError {
                path: r.get(0)?,
                error: r.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(job)
}

/// Marks `job`'s webhook pending, if it names one: it has just ended.
fn webhook_due(tx: &rusqlite::Transaction<'_>, job: &Job) -> Result<(), StoreError> {
    if job.spec.options.notify.is_some() {
        tx.execute(
            "UPDATE jobs SET webhook = 'pending', webhook_error = NULL WHERE id = ?1",
            [job.id],
        )?;
    }
    Ok(())
}

/// Writes a run's counters.
fn set_counters(tx: &rusqlite::Transaction<'_>, id: JobId, c: &Counters) -> Result<(), StoreError> {
    let i = db_int;
    tx.execute(
        "UPDATE jobs SET bytes = ?2, bytes_total = ?3, files_done = ?4, files_total = ?5, \
         rate = ?6, bytes_resumed = ?7 WHERE id = ?1",
        params![
            id,
            i(c.bytes),
            i(c.bytes_total),
            i(c.files_done),
            i(c.files_total),
            c.rate,
            i(c.bytes_resumed)
        ],
    )?;
    Ok(())
}

impl JobStore for SqliteStore {
    fn submit(&self, owner: &str, kind: JobKind, spec: &JobSpec) -> Result<Job, StoreError> {
        let (link, priority) = (link_of(spec), spec.options.priority());
        let spec = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        self.tx(|tx| {
            if let Some(cap) = self.policy.max_unfinished_per_user {
                let n: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM jobs WHERE owner = ?1 AND state IN ('queued', 'running')",
                    [owner],
                    |r| r.get(0),
                )?;
                if n >= i64::from(cap) {
                    return Err(too_many(owner, n, cap));
                }
            }
            tx.execute(
                "INSERT INTO jobs (owner, kind, state, spec, created_ms, queued_ms, priority, link) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7)",
                params![
                    owner,
                    kind.as_str(),
                    State::Queued.as_str(),
                    spec,
                    now_ms(),
                    priority,
                    link
                ],
            )?;
            load(tx, tx.last_insert_rowid())
        })
    }

    fn get(&self, id: JobId) -> Result<Job, StoreError> {
        self.tx(|tx| load(tx, id))
    }

    fn list(&self, page: Page<'_>) -> Result<Vec<Job>, StoreError> {
        self.tx(|tx| {
            let mut q = tx.prepare_cached(
                "SELECT id FROM jobs WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR id < ?2) \
                 ORDER BY id DESC LIMIT ?3",
            )?;
            let ids: Vec<JobId> = q
                .query_map(params![page.owner, page.before, page.limit], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            ids.into_iter().map(|id| load(tx, id)).collect()
        })
    }

    fn claim(&self, now_ms: i64) -> Result<Option<Job>, StoreError> {
        self.tx(|tx| {
            let id: Option<JobId> = tx
                .query_row(
                    CLAIM,
                    params![now_ms, self.policy.link_concurrency.max(1)],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(id) = id else { return Ok(None) };
            tx.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, tries = tries + 1, \
                 started_ms = ?2, ended_ms = NULL WHERE id = ?1",
                params![id, now_ms],
            )?;
            // The owner was served now: the next claims prefer the others.
            tx.execute(
                "INSERT INTO owners (owner, last_claim) \
                 SELECT owner, (SELECT COALESCE(MAX(last_claim), 0) + 1 FROM owners) \
                 FROM jobs WHERE id = ?1 \
                 ON CONFLICT (owner) DO UPDATE SET last_claim = excluded.last_claim",
                [id],
            )?;
            load(tx, id).map(Some)
        })
    }

    fn progress(&self, id: JobId, c: &Counters) -> Result<RunState, StoreError> {
        self.tx(|tx| {
            set_counters(tx, id, c)?;
            let cancel: Option<i64> = tx
                .query_row(
                    "SELECT cancel_requested FROM jobs WHERE id = ?1 AND state = 'running'",
                    [id],
                    |r| r.get(0),
                )
                .optional()?;
            Ok(match cancel {
                None => RunState::Lost,
                Some(0) => RunState::Running,
                Some(_) => RunState::CancelAsked,
            })
        })
    }

    fn finish(&self, id: JobId, outcome: &Outcome) -> Result<Job, StoreError> {
        self.tx(|tx| {
            let job = load(tx, id)?;
            if job.state != State::Running {
                return Err(StoreError::Conflict(format!(
                    "job {id} is {}, not running",
                    job.state.as_str()
                )));
            }
            let e = ending(&job, outcome, now_ms());
            set_counters(tx, id, e.counters)?;
            tx.execute("DELETE FROM file_errors WHERE job = ?1", [id])?;
            for f in e.files {
                tx.execute(
                    "INSERT INTO file_errors (job, path, error) VALUES (?1, ?2, ?3)",
                    params![id, f.path, f.error],
                )?;
            }
            tx.execute(
                "UPDATE jobs SET state = ?2, error = ?3, not_before_ms = ?4, ended_ms = ?5, \
                 files_failed = ?6, cancel_requested = 0 WHERE id = ?1",
                params![
                    id,
                    e.state.as_str(),
                    e.error,
                    e.not_before,
                    e.ended,
                    e.files.len() as i64
                ],
            )?;
            if e.recurs {
                // Its next run's tries and deadline count from its time.
                tx.execute(
                    "UPDATE jobs SET tries = 0, queued_ms = ?2 WHERE id = ?1",
                    params![id, e.not_before],
                )?;
            }
            if e.webhook_due() {
                webhook_due(tx, &job)?;
            }
            load(tx, id)
        })
    }

    fn cancel(&self, id: JobId) -> Result<Job, StoreError> {
        self.tx(|tx| {
            let job = load(tx, id)?;
            match job.state {
                State::Queued => {
                    tx.execute(
                        "UPDATE jobs SET state = 'cancelled', ended_ms = ?2 WHERE id = ?1",
                        params![id, now_ms()],
                    )?;
                    webhook_due(tx, &job)?;
                }
                State::Running => {
                    tx.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?1", [id])?;
                }
                s => return Err(nothing_to_cancel(id, s)),
            }
            load(tx, id)
        })
    }

    fn retry(&self, id: JobId) -> Result<Job, StoreError> {
        self.tx(|tx| {
            let job = load(tx, id)?;
            if !matches!(job.state, State::Failed | State::Cancelled) {
                return Err(not_retryable(id, job.state));
            }
            tx.execute(
                "UPDATE jobs SET state = 'queued', tries = 0, not_before_ms = 0, ended_ms = NULL, \
                 error = NULL, queued_ms = ?2, webhook = NULL, webhook_error = NULL WHERE id = ?1",
                params![id, now_ms()],
            )?;
            load(tx, id)
        })
    }

    fn recover(&self) -> Result<Vec<JobId>, StoreError> {
        self.tx(|tx| {
            let mut q = tx.prepare(
                "SELECT id, cancel_requested FROM jobs WHERE state = 'running' ORDER BY id",
            )?;
            let found: Vec<(JobId, bool)> = q
                .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? != 0)))?
                .collect::<rusqlite::Result<_>>()?;
            let ids = found.iter().map(|(id, _)| *id).collect();
            tx.execute(
                "UPDATE jobs SET state = 'cancelled', ended_ms = ?1, cancel_requested = 0 \
                 WHERE state = 'running' AND cancel_requested != 0",
                [now_ms()],
            )?;
            for (id, _) in found.iter().filter(|(_, cancelled)| *cancelled) {
                webhook_due(tx, &load(tx, *id)?)?;
            }
            tx.execute(
                "UPDATE jobs SET state = 'queued', not_before_ms = 0, \
                 error = 'the job service stopped during the run; resumed' \
                 WHERE state = 'running'",
                [],
            )?;
            Ok(ids)
        })
    }

    fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError> {
        self.tx(|tx| {
            Ok(tx.query_row(
                "SELECT MIN(not_before_ms) FROM jobs WHERE state = 'queued' AND not_before_ms > ?1",
                [after_ms],
                |r| r.get(0),
            )?)
        })
    }

    fn counts(&self) -> Result<Vec<(State, u64)>, StoreError> {
        self.tx(|tx| {
            let mut q = tx.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state")?;
            let rows: Vec<(String, i64)> = q
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            rows.into_iter()
                .map(|(s, n)| {
                    let state = State::parse(&s).ok_or_else(|| {
                        StoreError::Db(format!("a job in an unknown state {s:?}"))
                    })?;
                    Ok((state, n.max(0) as u64))
                })
                .collect()
        })
    }

    fn webhooks_pending(&self, limit: usize) -> Result<Vec<Job>, StoreError> {
        self.tx(|tx| {
            let mut q = tx.prepare_cached(
                "SELECT id FROM jobs WHERE webhook = 'pending' ORDER BY ended_ms, id LIMIT ?1",
            )?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let ids: Vec<JobId> = q
                .query_map([limit], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            // With their errors by file: what a delivery sends is what the API shows.
            ids.into_iter().map(|id| load(tx, id)).collect()
        })
    }

    fn webhook_result(&self, id: JobId, result: Result<(), String>) -> Result<(), StoreError> {
        let (state, error) = match result {
            Ok(()) => (WebhookState::Delivered, None),
            Err(e) => (WebhookState::Failed, Some(e)),
        };
        self.tx(|tx| {
            // A job retried meanwhile has no pending webhook any more: its next end
            // makes a new one.
            tx.execute(
                "UPDATE jobs SET webhook = ?2, webhook_error = ?3 \
                 WHERE id = ?1 AND webhook = 'pending'",
                params![id, state.as_str(), error],
            )?;
            Ok(())
        })
    }

    fn purge(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.tx(|tx| {
            let ended = "state IN ('done', 'failed', 'cancelled') AND ended_ms < ?1";
            tx.execute(
                &format!(
                    "DELETE FROM file_errors WHERE job IN (SELECT id FROM jobs WHERE {ended})"
                ),
                [before_ms],
            )?;
            let n = tx.execute(&format!("DELETE FROM jobs WHERE {ended}"), [before_ms])?;
            // Owners with no job left are forgotten (their next job is served first).
            tx.execute(
                "DELETE FROM owners WHERE owner NOT IN (SELECT owner FROM jobs)",
                [],
            )?;
            Ok(n as u64)
        })
    }
}

pub mod pg;

#[cfg(test)]
mod tests;
