//! The runner: claims queued jobs from the store and runs each through the library
//! API ([`dmover_core::transfer`], one shared [`Engine`]), recording its counters
//! while it runs and its end; a run that fails in a way a later run may not is
//! queued again after a backoff (doubling, capped) while tries and the job's deadline
//! allow. On start, jobs a stopped service left running are queued again; every run
//! resumes (`resume`), so chunks the destination verified are not sent twice.
//!
//! Every job's sources and destination are server paths, so every run is a copy
//! between two servers, the service steering ([`Between::Direct`]) or relaying
//! ([`Between::ViaClient`]): the service's own server is one server among others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dmover_core::Engine;
use dmover_core::session::TransferOptions;
use dmover_core::transfer::{
    Between, Canceller, Endpoint, ErrorCode, Event, Snapshot, TpcMode, TransferSpec, Watch,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::model::{
    Counters, FileError, Job, JobId, JobKind, JobSpec, MAX_PRIORITY, MIN_PRIORITY, Outcome, Route,
    State, now_ms,
};
use crate::store::{JobStore, RunState, StoreError};

/// How the runner runs jobs.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Jobs run at once.
    pub concurrency: usize,
    /// Runs after the first that a job may take before it fails (each after a
    /// failure a later run may not have: a lost connection, a busy server).
    pub retries: u32,
    /// The wait before the first retry; doubled for each next one.
    pub retry_wait: Duration,
    /// The longest wait between retries.
    pub max_retry_wait: Duration,
    /// A job not done this long after its submission (or its last retry) fails.
    pub deadline: Duration,
    /// The sessions' options: the service's credential (token, key, user name), how
    /// it trusts servers' keys (a known-hosts file of its own), streams, timeouts.
    pub options: TransferOptions,
    /// Counters recorded this often while a job runs.
    pub progress_interval: Duration,
    /// The engine's disk threads (`None`: its default).
    pub disk_threads: Option<usize>,
    /// Sources one job may name.
    pub max_sources: usize,
    /// Finished jobs are deleted this long after their end (`None`: kept).
    pub keep_finished: Option<Duration>,
    /// Where jobs may ask to be notified of their end ([`JobOptions::notify`]),
    /// and how.
    ///
    /// [`JobOptions::notify`]: crate::model::JobOptions::notify
    pub webhooks: crate::webhook::Webhooks,
    /// The time (Unix milliseconds) the runner goes by: when jobs are due, and their
    /// deadlines. The system's; tests drive their own.
    pub clock: Clock,
}

/// A source of the time now, in Unix milliseconds.
#[derive(Clone)]
pub struct Clock(pub Arc<dyn Fn() -> i64 + Send + Sync>);

impl Clock {
    /// The system's clock.
    pub fn system() -> Clock {
        Clock(Arc::new(now_ms))
    }

    /// The time now.
    pub fn now(&self) -> i64 {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({})", self.now())
    }
}

/// How often the runner deletes the finished jobs past [`RunnerConfig::keep_finished`].
pub const PURGE_EVERY: Duration = Duration::from_secs(600);

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            concurrency: 4,
            retries: 3,
            retry_wait: Duration::from_secs(30),
            max_retry_wait: Duration::from_secs(3600),
            deadline: Duration::from_secs(24 * 3600),
            options: TransferOptions::default(),
            progress_interval: Duration::from_secs(1),
            disk_threads: None,
            max_sources: 1000,
            keep_finished: Some(Duration::from_secs(30 * 24 * 3600)),
            webhooks: crate::webhook::Webhooks::none(),
            clock: Clock::system(),
        }
    }
}

/// Why a job was refused at submission.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The spec is not a job the service can run.
    #[error("{0}")]
    Invalid(String),
    /// The user's cap on unfinished jobs refused it (the API's 429 `limit`).
    #[error("{0}")]
    Limit(String),
    /// A per-job cap (its sources) refused it (the API's 413 `limit`).
    #[error("{0}")]
    TooLarge(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The job service: its store, its engine and the jobs running now.
#[derive(Debug)]
pub struct Service {
    store: Arc<dyn JobStore>,
    cfg: RunnerConfig,
    engine: Engine,
    running: Mutex<HashMap<JobId, Canceller>>,
    wake: Notify,
    /// The id of every job whose record changed (state, counters), for the API's
    /// event streams: they read the job again from the store, so an event never says
    /// anything the store does not.
    changed: tokio::sync::broadcast::Sender<JobId>,
    counters: crate::metrics::JobCounters,
    /// Jobs whose webhook is being delivered now.
    delivering: Mutex<std::collections::HashSet<JobId>>,
}

/// How soon the runner claims again after a claim failed (the database away).
const CLAIM_AGAIN: Duration = Duration::from_secs(2);

/// Webhooks read from the store at a time (the rest on the next turn of the loop).
const WEBHOOKS_AT_ONCE: usize = 64;

/// Changes a slow event stream may fall behind by before it reads its job again.
const CHANGES_QUEUED: usize = 1024;

/// Runs `f` on the store off the runtime's threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Db(format!("a store call failed: {e}")))?
}

/// The transfer a job's spec describes, checked as the engine checks a `dmover cp`.
pub fn transfer_spec(spec: &JobSpec, base: &TransferOptions) -> Result<TransferSpec, String> {
    let parse = |what: &str, s: &str| -> Result<Endpoint, String> {
        match Endpoint::parse(s) {
            Ok(e) if e.is_remote() => Ok(e),
            Ok(_) => Err(format!(
                "{what} {s:?} is a local path: a job's sources and destination are paths on \
                 servers (dmover://HOST[:PORT]/PATH or HOST:PATH), which the service reaches"
            )),
            Err(e) => Err(format!("{what} {s:?}: {e}")),
        }
    };
    if spec.sources.is_empty() {
        return Err("a job needs at least one source".into());
    }
    if let Some(p) = spec
        .options
        .priority
        .filter(|p| !(MIN_PRIORITY..=MAX_PRIORITY).contains(p))
    {
        return Err(format!(
            "priority: {p} is not between {MIN_PRIORITY} and {MAX_PRIORITY}"
        ));
    }
    let sources = spec
        .sources
        .iter()
        .map(|s| parse("source", s))
        .collect::<Result<Vec<_>, _>>()?;
    let dest = parse("destination", &spec.destination)?;
    let o = &spec.options;
    let mut options = TransferOptions {
        resume: true,
        continue_on_error: o.continue_on_error,
        verify: o.verify,
        ..base.clone()
    };
    if let Some(n) = o.streams {
        if !(1..=128).contains(&n) {
            return Err(format!("streams: {n} is not between 1 and 128"));
        }
        options.streams = n;
    }
    sync_options(spec, &mut options)?;
    let mut t = TransferSpec::copy(sources, dest).options(options);
    if spec.kind() == JobKind::Sync {
        t.kind = dmover_core::transfer::Kind::Sync;
    }
    t.between_servers = Some(match o.route {
        Route::Push => Between::Direct(TpcMode::Push),
        Route::Pull => Between::Direct(TpcMode::Pull),
        Route::ViaService => Between::via_client(),
    });
    Ok(t)
}

/// A spec's filters and sync options on the transfer's `options` (a sync's
/// `mirror` and `resume` are the engine's to set).
fn sync_options(spec: &JobSpec, options: &mut TransferOptions) -> Result<(), String> {
    let rules: Vec<dmover_proto::control::FilterRule> = spec
        .options
        .filters
        .iter()
        .map(|r| dmover_proto::control::FilterRule {
            include: r.include,
            pattern: r.pattern.clone().into_bytes(),
        })
        .collect();
    if !rules.is_empty() {
        let filter = dmover_core::session::filter_of_rules(&rules).map_err(|e| e.to_string())?;
        options.filter = Some(Arc::new(filter));
        options.rules = rules;
    }
    if let Some(s) = &spec.options.sync {
        options.delete = s.delete;
        options.max_delete = s.max_delete;
        options.compare_content = s.checksum;
    }
    Ok(())
}

/// A run's snapshot as the store records it.
fn counters(s: &Snapshot) -> Counters {
    Counters {
        bytes: s.done(),
        bytes_total: s.total,
        bytes_resumed: s.held,
        files_done: s.files,
        files_total: s.total_files,
        rate: s.average_rate,
    }
}

/// `path: why` split where the report joins them.
fn file_error(s: &str) -> FileError {
    match s.split_once(": ") {
        Some((path, error)) => FileError {
            path: path.into(),
            error: error.into(),
        },
        None => FileError {
            path: String::new(),
            error: s.into(),
        },
    }
}

impl Service {
    /// A service over `store`; nothing runs until [`Service::run`].
    pub fn new(store: Arc<dyn JobStore>, cfg: RunnerConfig) -> Arc<Service> {
        Arc::new(Service {
            engine: Engine::new(cfg.disk_threads),
            store,
            cfg,
            running: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            changed: tokio::sync::broadcast::channel(CHANGES_QUEUED).0,
            counters: crate::metrics::JobCounters::default(),
            delivering: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// What the service counted since it started (its Prometheus metrics).
    pub fn counters(&self) -> &crate::metrics::JobCounters {
        &self.counters
    }

    /// The ids of jobs as their records change, from now on (a receiver that falls
    /// behind is told it lagged, and reads its jobs again).
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<JobId> {
        self.changed.subscribe()
    }

    fn changed(&self, id: JobId) {
        // Nobody listening is not an error.
        let _ = self.changed.send(id);
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn JobStore> {
        &self.store
    }

    /// Checks `spec` as the engine would run it, records it queued and wakes the
    /// runner.
    pub async fn submit(&self, owner: &str, spec: JobSpec) -> Result<Job, SubmitError> {
        if spec.sources.len() > self.cfg.max_sources {
            return Err(SubmitError::TooLarge(format!(
                "the job names {} sources, more than a job may (max_sources = {}); \
                 name their directories, or split the job",
                spec.sources.len(),
                self.cfg.max_sources
            )));
        }
        if let Some(every) = spec.options.every_secs {
            if spec.options.sync.is_none() {
                return Err(SubmitError::Invalid(
                    "every_secs: only a sync recurs (a copy would send everything again)".into(),
                ));
            }
            if every < crate::model::MIN_EVERY_SECS {
                return Err(SubmitError::Invalid(format!(
                    "every_secs: {every} is too often: at least {} s",
                    crate::model::MIN_EVERY_SECS
                )));
            }
        }
        if let Some(url) = &spec.options.notify {
            self.cfg
                .webhooks
                .check(url)
                .map_err(|e| SubmitError::Invalid(format!("notify: {e}")))?;
        }
        let t = transfer_spec(&spec, &self.cfg.options).map_err(SubmitError::Invalid)?;
        // The engine's own checks (sources on one server, options that do not apply
        // between servers), nothing connected yet.
        let checked = self
            .engine
            .transfer(t)
            .map_err(|e| SubmitError::Invalid(e.to_string()))?;
        tokio::task::spawn_blocking(move || drop(checked));
        let (store, owner) = (self.store.clone(), owner.to_string());
        let kind = spec.kind();
        let job = blocking(move || store.submit(&owner, kind, &spec))
            .await
            .map_err(|e| match e {
                StoreError::Limit(m) => SubmitError::Limit(m),
                e => SubmitError::Store(e),
            })?;
        self.counters.submitted();
        self.changed(job.id);
        self.wake.notify_one();
        Ok(job)
    }

    /// Cancels job `id`: a queued one at once, a running one by stopping its
    /// transfer (the run records the end).
    pub async fn cancel(&self, id: JobId, by: &str) -> Result<Job, StoreError> {
        let store = self.store.clone();
        let job = blocking(move || store.cancel(id)).await?;
        self.changed(id);
        if job.state.is_end() {
            // Its webhook, if it names one.
            self.wake.notify_one();
        }
        if job.state == State::Running {
            let c = self.lock_running().get(&id).cloned();
            if let Some(c) = c {
                c.cancel(format!("job {id} cancelled by {by}"));
            }
        }
        Ok(job)
    }

    /// Queues a failed or cancelled job again.
    pub async fn retry(&self, id: JobId) -> Result<Job, StoreError> {
        let store = self.store.clone();
        let job = blocking(move || store.retry(id)).await?;
        self.changed(id);
        self.wake.notify_one();
        Ok(job)
    }

    /// The runner's time now ([`RunnerConfig::clock`]).
    fn now(&self) -> i64 {
        self.cfg.clock.now()
    }

    /// Has the runner look for due jobs now (tests that moved its clock).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Canceller>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs jobs until `shutdown`: first queues again the jobs a stopped service left
    /// running, then claims jobs while fewer than the concurrency run. At shutdown
    /// the running jobs are stopped and left running in the store, to be resumed by
    /// the next start (as after a crash).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), StoreError> {
        let store = self.store.clone();
        let recovered = blocking(move || store.recover()).await?;
        if !recovered.is_empty() {
            tracing::info!(
                "jobs: {} job(s) left running by the last service queued again: {recovered:?}",
                recovered.len()
            );
        }
        let mut tasks = tokio::task::JoinSet::new();
        let mut purged_at: Option<std::time::Instant> = None;
        let lease = self
            .store
            .heartbeat_every()
            .map(|every| tokio::spawn(self.clone().keep_lease(every, shutdown.clone())));
        loop {
            if purged_at.is_none_or(|t| t.elapsed() >= PURGE_EVERY) {
                purged_at = Some(std::time::Instant::now());
                if let Err(e) = self.purge(self.now()).await {
                    tracing::error!("jobs: purging finished jobs: {e}");
                }
            }
            self.send_webhooks().await;
            let mut claim_failed = false;
            while tasks.len() < self.cfg.concurrency.max(1) {
                let store = self.store.clone();
                let now = self.now();
                match blocking(move || store.claim(now)).await {
                    Ok(Some(job)) => {
                        self.changed(job.id);
                        let me = self.clone();
                        let stop = shutdown.clone();
                        tasks.spawn(async move { me.run_job(job, stop).await });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("jobs: claiming a job: {e}");
                        claim_failed = true;
                        break;
                    }
                }
            }
            let mut wait = self.next_wait(&tasks).await;
            if std::mem::take(&mut claim_failed) {
                // The database is away: try again soon (the running jobs go on).
                wait = wait.min(CLAIM_AGAIN);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.wake.notified() => {}
                Some(_) = tasks.join_next() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        while tasks.join_next().await.is_some() {}
        if let Some(l) = lease {
            let _ = l.await;
        }
        Ok(())
    }

    /// On a store shared by several services: heartbeats every `every` and queues
    /// again the jobs of agents whose lease ran out, until `shutdown`. A database that
    /// cannot be reached leaves the runs going (their progress waits, nothing new is
    /// claimed); a lease taken by another service under this agent's name stops them.
    async fn keep_lease(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unreachable = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let store = self.store.clone();
            match blocking(move || store.heartbeat()).await {
                Ok(()) if unreachable => {
                    unreachable = false;
                    tracing::info!("jobs: the database answers again; claiming again");
                    self.wake.notify_one();
                }
                Ok(()) => {}
                Err(StoreError::Lost(e)) => {
                    tracing::error!("jobs: {e}: stopping this service's runs");
                    for c in self.lock_running().values() {
                        c.cancel(e.clone());
                    }
                    continue;
                }
                Err(e) => {
                    if !unreachable {
                        tracing::warn!("jobs: heartbeat: {e} (the runs go on)");
                    }
                    unreachable = true;
                    continue;
                }
            }
            let store = self.store.clone();
            match blocking(move || store.reclaim()).await {
                Ok(ids) if !ids.is_empty() => {
                    for id in ids {
                        self.changed(id);
                    }
                    self.wake.notify_one();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("jobs: looking for jobs whose lease ran out: {e}"),
            }
        }
    }

    /// Starts delivering the webhooks of ended jobs that are pending (a job's end,
    /// or a restart, leaves them so) and not being delivered already. A delivery the
    /// service's stop interrupts stays pending, and is made again by the next start:
    /// a receiver may see one twice (`X-Dmover-Job` and `ended_ms` tell them apart).
    async fn send_webhooks(self: &Arc<Self>) {
        let store = self.store.clone();
        let pending = match blocking(move || store.webhooks_pending(WEBHOOKS_AT_ONCE)).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("jobs: reading the webhooks to send: {e}");
                return;
            }
        };
        for job in pending {
            if !self.lock_delivering().insert(job.id) {
                continue;
            }
            let me = self.clone();
            tokio::spawn(async move {
                let id = job.id;
                // Read again: a delivery that ended after the list was read has
                // recorded its result (before leaving `delivering`), so the job is
                // sent once.
                let store = me.store.clone();
                let job = match blocking(move || store.get(id)).await {
                    Ok(j) if j.webhook == Some(crate::model::WebhookState::Pending) => j,
                    _ => {
                        me.lock_delivering().remove(&id);
                        return;
                    }
                };
                let result = match &job.spec.options.notify {
                    Some(url) => me.cfg.webhooks.deliver(url, &job).await,
                    None => Err("the job names no webhook".to_string()),
                };
                match &result {
                    Ok(n) => tracing::info!("jobs: job {id}'s webhook delivered (attempt {n})"),
                    Err(e) => tracing::warn!("jobs: job {id}'s webhook not delivered: {e}"),
                }
                let store = me.store.clone();
                let result = result.map(|_| ());
                if let Err(e) = blocking(move || store.webhook_result(id, result)).await {
                    tracing::error!("jobs: recording job {id}'s webhook: {e}");
                }
                me.lock_delivering().remove(&id);
                me.changed(id);
            });
        }
    }

    fn lock_delivering(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<JobId>> {
        self.delivering.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes the jobs that ended more than [`RunnerConfig::keep_finished`] before
    /// `now_ms` (the loop passes the time now; tests pass a later one). Returns how
    /// many.
    pub async fn purge(&self, now_ms: i64) -> Result<u64, StoreError> {
        let Some(keep) = self.cfg.keep_finished else {
            return Ok(0);
        };
        let before = now_ms.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX));
        let store = self.store.clone();
        let n = blocking(move || store.purge(before)).await?;
        if n > 0 {
            tracing::info!("jobs: {n} job(s) that ended before {before} (Unix ms) deleted");
        }
        Ok(n)
    }

    /// How long the loop may sleep: until the next backoff ends (at most a minute).
    /// A due job that was not claimed waits for its link (or the concurrency) to
    /// free a place: a run's end wakes the loop.
    async fn next_wait(&self, tasks: &tokio::task::JoinSet<()>) -> Duration {
        if tasks.len() >= self.cfg.concurrency.max(1) {
            return Duration::from_secs(60);
        }
        let store = self.store.clone();
        let now = self.now();
        match blocking(move || store.next_due(now)).await {
            Ok(Some(t)) => Duration::from_millis((t - now).clamp(0, 60_000) as u64),
            _ => Duration::from_secs(60),
        }
    }

    /// Runs one claimed job and records its end.
    async fn run_job(self: Arc<Self>, job: Job, shutdown: CancellationToken) {
        let id = job.id;
        let outcome = self.attempt(&job, &shutdown).await;
        let Some(outcome) = outcome else {
            // Shut down mid-run: left running, resumed by the next start.
            return;
        };
        self.counters.ended(&outcome);
        match self.record_end(id, outcome, &shutdown).await {
            Ok(j) => tracing::info!(
                "jobs: job {id} {} (attempt {}){}",
                j.state.as_str(),
                j.attempts,
                j.error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
            Err(StoreError::Lost(e)) => {
                tracing::warn!("jobs: job {id}'s run stopped, its end not recorded: {e}");
            }
            Err(e) => tracing::error!("jobs: recording the end of job {id}: {e}"),
        }
        self.changed(id);
        self.wake.notify_one();
    }

    /// Records a run's end; while the database cannot be reached, tries again every
    /// [`CLAIM_AGAIN`] (the job stays this service's meanwhile: nobody else may
    /// record it) until it answers, the service shuts down (the next start resumes
    /// the job), or the answer is final (the job gone, or no longer this service's).
    async fn record_end(
        &self,
        id: JobId,
        outcome: Outcome,
        shutdown: &CancellationToken,
    ) -> Result<Job, StoreError> {
        let outcome = Arc::new(outcome);
        let mut said = false;
        loop {
            let (store, o) = (self.store.clone(), outcome.clone());
            match blocking(move || store.finish(id, &o)).await {
                Err(StoreError::Db(e)) if !shutdown.is_cancelled() => {
                    if !said {
                        tracing::warn!("jobs: recording the end of job {id}: {e}; trying again");
                        said = true;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(StoreError::Db(e)),
                        _ = tokio::time::sleep(CLAIM_AGAIN) => {}
                    }
                }
                r => return r,
            }
        }
    }

    /// One run of `job`; `None` when the service shut down during it.
    async fn attempt(&self, job: &Job, shutdown: &CancellationToken) -> Option<Outcome> {
        let id = job.id;
        let deadline_ms = job
            .queued_ms
            .saturating_add(self.cfg.deadline.as_millis() as i64);
        let failed = |error: String| Outcome::Failed {
            counters: Counters::default(),
            error,
            files: Vec::new(),
        };
        if self.now() >= deadline_ms {
            return Some(failed(format!(
                "the job's deadline ({} s after its submission or retry) passed{}",
                self.cfg.deadline.as_secs(),
                job.error
                    .as_ref()
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default()
            )));
        }
        let transfer = match transfer_spec(&job.spec, &self.cfg.options)
            .and_then(|t| self.engine.transfer(t).map_err(|e| e.to_string()))
        {
            Ok(t) => Arc::new(t),
            Err(e) => return Some(failed(e)),
        };
        self.lock_running().insert(id, transfer.canceller());
        // A cancel asked between the claim and now found no transfer to stop.
        let store = self.store.clone();
        if blocking(move || store.get(id))
            .await
            .is_ok_and(|j| j.cancel_requested)
        {
            transfer.canceller().cancel(format!("job {id} cancelled"));
        }
        let (tx, rx) = tokio::sync::watch::channel(None::<Snapshot>);
        let recorder = tokio::spawn(record_progress(
            self.store.clone(),
            id,
            rx,
            self.changed.clone(),
            transfer.canceller(),
        ));
        let left = Duration::from_millis((deadline_ms - self.now()).max(0) as u64);
        let watch = Watch {
            interval: Some(self.cfg.progress_interval),
            files: false,
            held: false,
        };
        let canceller = transfer.canceller();
        let run = transfer.run(watch, |e| {
            if let Event::Progress(s) = e {
                tx.send_replace(Some(s));
            }
        });
        let result = tokio::select! {
            r = tokio::time::timeout(left, run) => Some(r),
            _ = shutdown.cancelled() => None,
        };
        self.lock_running().remove(&id);
        drop(tx);
        let _ = recorder.await;
        let c = counters(&transfer.snapshot());
        // The transfer's disk threads are the engine's; dropping it joins nothing
        // but is kept off the runtime's threads all the same.
        tokio::task::spawn_blocking(move || drop(transfer));
        let result = result?;
        Some(self.outcome(job, c, result, &canceller, deadline_ms).await)
    }

    /// What a run's result means for the job.
    async fn outcome(
        &self,
        job: &Job,
        c: Counters,
        result: Result<
            Result<dmover_core::transfer::Finished, dmover_core::Error>,
            tokio::time::error::Elapsed,
        >,
        canceller: &Canceller,
        deadline_ms: i64,
    ) -> Outcome {
        let error = match result {
            Err(_) => {
                return Outcome::Failed {
                    counters: c,
                    error: format!(
                        "the job's deadline ({} s after its submission or retry) passed during a run",
                        self.cfg.deadline.as_secs()
                    ),
                    files: Vec::new(),
                };
            }
            Ok(Ok(f)) if f.complete() => return Outcome::Done(report_counters(&f, c)),
            Ok(Ok(f)) => {
                let files: Vec<FileError> = f.report.failed.iter().map(|s| file_error(s)).collect();
                return Outcome::Failed {
                    counters: report_counters(&f, c),
                    error: format!("{} file(s) could not be copied", files.len().max(1)),
                    files,
                };
            }
            Ok(Err(e)) => e,
        };
        let (store, id) = (self.store.clone(), job.id);
        let cancel_asked = blocking(move || store.get(id))
            .await
            .is_ok_and(|j| j.cancel_requested);
        if cancel_asked || (canceller.is_cancelled() && error.code() == ErrorCode::Aborted) {
            return Outcome::Cancelled(c);
        }
        let wait = self
            .cfg
            .retry_wait
            .saturating_mul(1 << job.tries.saturating_sub(1).min(16))
            .min(self.cfg.max_retry_wait);
        let not_before_ms = self.now().saturating_add(wait.as_millis() as i64);
        if error.retryable() && job.tries <= self.cfg.retries && not_before_ms < deadline_ms {
            return Outcome::Requeue {
                counters: c,
                error: format!("attempt {}: {error}", job.tries),
                not_before_ms,
            };
        }
        let files = error_files(&error, &job.spec);
        Outcome::Failed {
            counters: c,
            error: error.to_string(),
            files,
        }
    }
}

/// The counters at the end of a run that finished: the report's files (a copy
/// between two servers hears no file counts while it runs) and, when complete, its
/// bytes.
fn report_counters(f: &dmover_core::transfer::Finished, c: Counters) -> Counters {
    let r = &f.report;
    Counters {
        bytes: if f.complete() {
            r.totals.bytes
        } else {
            c.bytes
        },
        bytes_total: r.totals.bytes,
        bytes_resumed: r.held_bytes.max(c.bytes_resumed),
        // Files finalised in this run, and those an earlier run completed.
        files_done: r.summary.files + r.held_files,
        files_total: r.totals.files,
        rate: c.rate,
    }
}

/// A refused source said as that file's error too (a job whose source is missing
/// fails with the source named): the engine's message names the path (`SERVER:
/// PATH: why`).
fn error_files(e: &dmover_core::Error, spec: &JobSpec) -> Vec<FileError> {
    if !matches!(e.code(), ErrorCode::NotFound | ErrorCode::PermissionDenied) {
        return Vec::new();
    }
    let msg = e.to_string();
    let named = spec.sources.iter().find_map(|s| {
        let ep = Endpoint::parse(s).ok()?;
        let path = String::from_utf8_lossy(ep.path()).into_owned();
        let at = msg.find(&format!("{path}: "))?;
        Some(FileError {
            error: msg[at + path.len() + 2..].to_string(),
            path,
        })
    });
    vec![named.unwrap_or(FileError {
        path: String::new(),
        error: msg,
    })]
}

/// Writes each new snapshot to the store until the run ends (at most one write in
/// flight; a slow store skips snapshots rather than queueing them).
async fn record_progress(
    store: Arc<dyn JobStore>,
    id: JobId,
    mut rx: tokio::sync::watch::Receiver<Option<Snapshot>>,
    changed: tokio::sync::broadcast::Sender<JobId>,
    canceller: Canceller,
) {
    while rx.changed().await.is_ok() {
        let Some(s) = *rx.borrow_and_update() else {
            continue;
        };
        let store = store.clone();
        match blocking(move || store.progress(id, &counters(&s))).await {
            Ok(state) => {
                let _ = changed.send(id);
                match state {
                    RunState::Running => {}
                    // Asked through another service sharing the store (this one's
                    // own cancels stop the transfer at once).
                    RunState::CancelAsked => canceller.cancel(format!("job {id} cancelled")),
                    RunState::Lost => canceller.cancel(format!(
                        "job {id} is no longer this service's: its lease ran out and \
                         another agent runs it"
                    )),
                }
            }
            Err(e) => tracing::warn!("jobs: recording job {id}'s progress: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobOptions;

    fn spec(sources: &[&str], dest: &str) -> JobSpec {
        JobSpec {
            sources: sources.iter().map(|s| s.to_string()).collect(),
            destination: dest.into(),
            options: JobOptions::default(),
        }
    }

    #[test]
    fn specs_are_checked_before_they_are_queued() {
        let base = TransferOptions::default();
        let e = |s: JobSpec| transfer_spec(&s, &base).unwrap_err();
        assert!(e(spec(&["data/x"], "dmover://b/y")).contains("is a local path"));
        assert!(e(spec(&["a:x"], "/tmp/y")).contains("destination \"/tmp/y\" is a local path"));
        assert!(e(spec(&[], "b:y")).contains("at least one source"));
        assert!(e(spec(&["dmover:///x"], "b:y")).contains("empty host name"));
        let mut s = spec(&["a:x"], "b:y");
        s.options.streams = Some(0);
        assert!(e(s).contains("streams"));
        let t = transfer_spec(&spec(&["a:x", "a:z"], "dmover://b:9/y"), &base).unwrap();
        assert!(t.options.resume, "every run resumes");
        assert_eq!(t.between_servers, Some(Between::Direct(TpcMode::Push)));
        let engine = Engine::new(Some(1));
        let mixed = transfer_spec(&spec(&["a:x", "c:z"], "b:y"), &base).unwrap();
        assert_eq!(
            engine.transfer(mixed).unwrap_err().to_string(),
            "all sources must be on the same server"
        );
    }

    #[test]
    fn report_lines_split_into_path_and_error() {
        assert_eq!(
            file_error("run1/a: permission denied"),
            FileError {
                path: "run1/a".into(),
                error: "permission denied".into()
            }
        );
        assert_eq!(file_error("odd").path, "");
    }
}
