//! The runner against real servers on loopback: jobs run to their end through the
//! library API, fail with errors by file, are cancelled, and survive a crash of the
//! service (resumed, no partial file under a final name).

mod common;

use std::time::Duration;

use common::{Lab, Running, bytes, staging};
use dmover_jobs::model::{JobId, State};
use dmover_jobs::store::StoreError;

#[test]
fn a_job_copies_between_two_servers_and_records_its_end() {
    let lab = Lab::new(None);
    std::fs::create_dir_all(lab.a_root.join("data/run1/sub")).unwrap();
    let files = [
        ("run1/a", 300_000),
        ("run1/sub/b", 5_000),
        ("run1/empty", 0),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        std::fs::write(lab.a_root.join("data").join(name), bytes(i as u64, *len)).unwrap();
    }
    let svc = Running::start(&lab.db(), lab.runner_config());
    let job = svc
        .rt
        .block_on(svc.service.submit("alice", lab.spec(&["data/run1"], "in/")))
        .unwrap();
    assert_eq!(job.state, State::Queued);
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!((j.attempts, j.files_failed), (1, 0));
    assert_eq!((j.files_done, j.files_total), (3, 3));
    assert_eq!((j.bytes, j.bytes_total), (305_000, 305_000));
    assert!(j.ended_ms >= j.started_ms && j.started_ms.is_some());
    for (i, (name, len)) in files.iter().enumerate() {
        let got = std::fs::read(lab.b_root.join("in").join(name)).unwrap();
        assert_eq!(got, bytes(i as u64, *len), "{name}");
    }
    assert_eq!(staging(&lab.b_root), Vec::<std::path::PathBuf>::new());
    svc.stop();
}

#[test]
fn a_missing_source_fails_with_its_error_by_file() {
    let lab = Lab::new(None);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let job = svc
        .rt
        .block_on(svc.service.submit("alice", lab.spec(&["data/nope"], "in/")))
        .unwrap();
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Failed, "{j:#?}");
    assert_eq!(j.attempts, 1, "a missing file is not retried");
    let e = j.error.as_deref().unwrap();
    assert!(e.contains("nope"), "{e}");
    assert_eq!(j.file_errors.len(), 1, "{j:#?}");
    assert_eq!(j.file_errors[0].path, "data/nope", "{j:#?}");
    assert_eq!(j.file_errors[0].error, "no such file or directory");
    assert_eq!(std::fs::read_dir(lab.b_root.join("in")).unwrap().count(), 0);
    svc.stop();
}

/// The size of [`slow_lab`]'s file.
const BIG: usize = 6 << 20;

/// A 6 MiB file read at 50 ms a 64 KiB chunk, two at once: a run of about 2.5 s (a
/// copy between two servers hears its counters once a second).
fn slow_lab() -> Lab {
    let lab = Lab::new(Some(Duration::from_millis(50)));
    std::fs::write(lab.a_root.join("data/big"), bytes(9, BIG)).unwrap();
    lab
}

#[test]
fn a_running_job_is_cancelled_and_leaves_no_partial_file() {
    let lab = slow_lab();
    let svc = Running::start(&lab.db(), lab.runner_config());
    let job = svc
        .rt
        .block_on(svc.service.submit("alice", lab.spec(&["data/big"], "in/")))
        .unwrap();
    svc.wait(job.id, "data moving", |j| j.bytes > 0);
    let c = svc
        .rt
        .block_on(svc.service.cancel(job.id, "alice"))
        .unwrap();
    assert!(c.cancel_requested || c.state == State::Cancelled, "{c:#?}");
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Cancelled, "{j:#?}");
    assert!(
        !lab.b_root.join("in/big").exists(),
        "no partial file under its name"
    );
    // A cancelled job can be retried: it resumes and completes.
    svc.rt.block_on(svc.service.retry(job.id)).unwrap();
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!(
        std::fs::read(lab.b_root.join("in/big")).unwrap(),
        bytes(9, BIG)
    );
    assert_eq!(j.attempts, 2);
    assert!(j.bytes_resumed > 0, "the retry resumed: {j:#?}");
    svc.stop();
}

#[test]
fn a_crashed_service_resumes_its_running_job_on_restart() {
    let lab = slow_lab();
    let first = Running::start(&lab.db(), lab.runner_config());
    let job = first
        .rt
        .block_on(
            first
                .service
                .submit("alice", lab.spec(&["data/big"], "in/")),
        )
        .unwrap();
    let seen = first.wait(job.id, "data moving", |j| j.bytes > 0);
    first.crash();
    assert!(
        !lab.b_root.join("in/big").exists(),
        "no partial file under its name"
    );
    let second = Running::start(&lab.db(), lab.runner_config());
    let j = second.wait_end(job.id);
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!(j.attempts, 2);
    assert_eq!((j.files_done, j.files_total), (1, 1));
    assert_eq!(
        std::fs::read(lab.b_root.join("in/big")).unwrap(),
        bytes(9, BIG)
    );
    assert_eq!(staging(&lab.b_root), Vec::<std::path::PathBuf>::new());
    // What the first run's destination verified was not sent again.
    assert!(seen.bytes > 0);
    assert!(j.bytes_resumed > 0, "{j:#?}");
    second.stop();
}

/// A source server that refuses connections: each run fails in a way that may pass,
/// so the job is retried after its backoff until its retries are spent.
#[test]
fn an_unreachable_server_is_retried_with_backoff_then_fails() {
    let lab = Lab::new(None);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap().to_string();
    drop(closed);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let mut spec = lab.spec(&["x"], "in/");
    spec.sources = vec![format!("dmover://{gone}/x")];
    let t = std::time::Instant::now();
    let job = svc.rt.block_on(svc.service.submit("alice", spec)).unwrap();
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Failed, "{j:#?}");
    // retries = 2: three runs, after waits of 50 and 100 ms.
    assert_eq!((j.attempts, j.tries), (3, 3), "{j:#?}");
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    assert!(j.error.as_deref().unwrap().contains(&gone), "{j:#?}");
    svc.stop();
}

/// A job past its deadline fails with a message that says so; a retry gives it a
/// new deadline.
#[test]
fn a_job_past_its_deadline_fails_and_a_retry_starts_a_new_one() {
    let lab = Lab::new(None);
    std::fs::write(lab.a_root.join("data/f"), bytes(1, 1000)).unwrap();
    let mut cfg = lab.runner_config();
    cfg.deadline = Duration::from_millis(1);
    let store: std::sync::Arc<dyn dmover_jobs::store::JobStore> =
        std::sync::Arc::new(dmover_jobs::store::SqliteStore::open(&lab.db()).unwrap());
    let job = store
        .submit(
            "alice",
            dmover_jobs::model::JobKind::Copy,
            &lab.spec(&["data/f"], "in/"),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(5));
    drop(store);
    let svc = Running::start(&lab.db(), cfg);
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Failed, "{j:#?}");
    assert!(j.error.as_deref().unwrap().contains("deadline"), "{j:#?}");
    svc.stop();
    let mut cfg = lab.runner_config();
    cfg.deadline = Duration::from_secs(60);
    let svc = Running::start(&lab.db(), cfg);
    let r = svc.rt.block_on(svc.service.retry(job.id)).unwrap();
    assert!(r.queued_ms > j.queued_ms);
    assert_eq!(svc.wait_end(job.id).state, State::Done);
    svc.stop();
}

/// A store that watches its claims and ends: the jobs running at once, by link and
/// in all, counted under one lock with the store's own transitions.
#[derive(Debug)]
struct Watched {
    inner: dmover_jobs::store::SqliteStore,
    seen: std::sync::Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    running: usize,
    by_link: std::collections::HashMap<String, usize>,
    max_running: usize,
    max_link: usize,
    /// The owner of each claim, in order.
    claims: Vec<String>,
}

impl dmover_jobs::store::JobStore for Watched {
    fn submit(
        &self,
        owner: &str,
        kind: dmover_jobs::model::JobKind,
        spec: &dmover_jobs::model::JobSpec,
    ) -> Result<dmover_jobs::model::Job, StoreError> {
        self.inner.submit(owner, kind, spec)
    }
    fn get(&self, id: JobId) -> Result<dmover_jobs::model::Job, StoreError> {
        self.inner.get(id)
    }
    fn list(
        &self,
        page: dmover_jobs::store::Page<'_>,
    ) -> Result<Vec<dmover_jobs::model::Job>, StoreError> {
        self.inner.list(page)
    }
    fn claim(&self, now_ms: i64) -> Result<Option<dmover_jobs::model::Job>, StoreError> {
        let mut seen = self.seen.lock().unwrap();
        let j = self.inner.claim(now_ms)?;
        if let Some(j) = &j {
            seen.running += 1;
            let n = seen.by_link.entry(j.link.clone()).or_default();
            *n += 1;
            let n = *n;
            seen.max_link = seen.max_link.max(n);
            seen.max_running = seen.max_running.max(seen.running);
            seen.claims.push(j.owner.clone());
        }
        Ok(j)
    }
    fn progress(
        &self,
        id: JobId,
        c: &dmover_jobs::model::Counters,
    ) -> Result<dmover_jobs::store::RunState, StoreError> {
        self.inner.progress(id, c)
    }
    fn finish(
        &self,
        id: JobId,
        outcome: &dmover_jobs::model::Outcome,
    ) -> Result<dmover_jobs::model::Job, StoreError> {
        let mut seen = self.seen.lock().unwrap();
        let j = self.inner.finish(id, outcome)?;
        seen.running -= 1;
        *seen.by_link.get_mut(&j.link).unwrap() -= 1;
        Ok(j)
    }
    fn cancel(&self, id: JobId) -> Result<dmover_jobs::model::Job, StoreError> {
        self.inner.cancel(id)
    }
    fn retry(&self, id: JobId) -> Result<dmover_jobs::model::Job, StoreError> {
        self.inner.retry(id)
    }
    fn recover(&self) -> Result<Vec<JobId>, StoreError> {
        self.inner.recover()
    }
    fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError> {
        self.inner.next_due(after_ms)
    }
    fn purge(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.inner.purge(before_ms)
    }
    fn counts(&self) -> Result<Vec<(dmover_jobs::model::State, u64)>, StoreError> {
        self.inner.counts()
    }
    fn webhooks_pending(&self, limit: usize) -> Result<Vec<dmover_jobs::model::Job>, StoreError> {
        self.inner.webhooks_pending(limit)
    }
    fn webhook_result(&self, id: JobId, result: Result<(), String>) -> Result<(), StoreError> {
        self.inner.webhook_result(id, result)
    }
}

/// Four users with 7, 1, 1 and 1 small jobs on one link (A to B), the big user's
/// queued first: the runner (3 at once) never runs more than the link's limit (2)
/// at once, each small user's job is among the first four started, every file
/// arrives; then the finished jobs are purged on a clock the test moves.
#[test]
fn four_users_share_a_link_within_its_limit_and_finished_jobs_are_purged() {
    use dmover_jobs::model::JobKind;
    use dmover_jobs::store::{JobStore, Policy, SqliteStore};
    let lab = Lab::new(Some(Duration::from_millis(10)));
    let owners = [("big", 7), ("s1", 1), ("s2", 1), ("s3", 1)];
    let store = std::sync::Arc::new(Watched {
        inner: SqliteStore::open(&lab.db()).unwrap().with_policy(Policy {
            link_concurrency: 2,
            max_unfinished_per_user: Some(7),
        }),
        seen: std::sync::Mutex::default(),
    });
    let mut jobs = Vec::new();
    for (owner, n) in owners {
        for i in 0..n {
            let name = format!("{owner}-{i}");
            let dir = lab.a_root.join("data").join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("f"), bytes(jobs.len() as u64, 200_000)).unwrap();
            let spec = lab.spec(&[&format!("data/{name}")], "in/");
            jobs.push((store.submit(owner, JobKind::Copy, &spec).unwrap().id, name));
        }
    }
    let e = store
        .submit("big", JobKind::Copy, &lab.spec(&["data/x"], "in/"))
        .unwrap_err();
    assert!(matches!(e, StoreError::Limit(_)), "{e}");
    let mut cfg = lab.runner_config();
    cfg.concurrency = 3;
    let svc = Running::with_store(store.clone(), cfg);
    for (i, (id, name)) in jobs.iter().enumerate() {
        let j = svc.wait_end(*id);
        assert_eq!(j.state, State::Done, "{j:#?}");
        let got = std::fs::read(lab.b_root.join("in").join(name).join("f")).unwrap();
        assert_eq!(got, bytes(i as u64, 200_000), "{name}");
    }
    {
        let seen = store.seen.lock().unwrap();
        assert_eq!(seen.claims.len(), 10, "{:?}", seen.claims);
        assert_eq!((seen.max_link, seen.max_running), (2, 2), "{seen:?}");
        let mut first: Vec<&str> = seen.claims[..4].iter().map(String::as_str).collect();
        first.sort_unstable();
        assert_eq!(first, ["big", "s1", "s2", "s3"], "{:?}", seen.claims);
    }
    // Purge: nothing has ended 30 days ago; 30 days and a minute later, all has.
    let now = dmover_jobs::model::now_ms();
    assert_eq!(svc.rt.block_on(svc.service.purge(now)).unwrap(), 0);
    let later = now + 30 * 24 * 3600 * 1000 + 60_000;
    assert_eq!(svc.rt.block_on(svc.service.purge(later)).unwrap(), 10);
    assert!(matches!(store.get(jobs[0].0), Err(StoreError::NotFound(_))));
    svc.stop();
}
