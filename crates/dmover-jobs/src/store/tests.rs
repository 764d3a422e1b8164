use super::*;
use crate::model::JobOptions;

fn spec(src: &str) -> JobSpec {
    JobSpec {
        sources: vec![format!("dmover://a/{src}")],
        destination: "dmover://b/in".into(),
        options: JobOptions::default(),
    }
}

fn counters(bytes: u64) -> Counters {
    Counters {
        bytes,
        bytes_total: 100,
        bytes_resumed: 0,
        files_done: 1,
        files_total: 2,
        rate: 5.0,
    }
}

#[test]
fn a_job_goes_from_queued_to_done_and_survives_a_reopen() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("state/jobs.sqlite");
    let id = {
        let s = SqliteStore::open(&path).unwrap();
        let j = s.submit("alice", JobKind::Copy, &spec("x")).unwrap();
        assert_eq!(
            (j.state, j.attempts, j.owner.as_str()),
            (State::Queued, 0, "alice")
        );
        let c = s.claim(now_ms()).unwrap().unwrap();
        assert_eq!(
            (c.id, c.state, c.attempts, c.tries),
            (j.id, State::Running, 1, 1)
        );
        assert!(c.started_ms.is_some());
        assert_eq!(s.claim(now_ms()).unwrap(), None, "one job, claimed once");
        let mut c = counters(40);
        c.bytes_resumed = 7;
        s.progress(j.id, &c).unwrap();
        let p = s.get(j.id).unwrap();
        assert_eq!((p.bytes, p.bytes_total, p.bytes_resumed), (40, 100, 7));
        assert_eq!((p.files_done, p.files_total, p.rate), (1, 2, 5.0));
        let done = s.finish(j.id, &Outcome::Done(counters(100))).unwrap();
        assert_eq!((done.state, done.bytes), (State::Done, 100));
        assert!(done.ended_ms.is_some());
        j.id
    };
    let s = SqliteStore::open(&path).unwrap();
    let j = s.get(id).unwrap();
    assert_eq!(
        (j.state, j.spec.sources[0].as_str()),
        (State::Done, "dmover://a/x")
    );
    let mode: String = s
        .conn
        .lock()
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert!(matches!(s.get(id + 1), Err(StoreError::NotFound(_))));
}

#[test]
fn failures_keep_errors_by_file_and_a_retry_queues_again() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite")).unwrap();
    let j = s.submit("bob", JobKind::Copy, &spec("x")).unwrap();
    s.claim(now_ms()).unwrap().unwrap();
    let files = vec![FileError {
        path: "x/a".into(),
        error: "permission denied".into(),
    }];
    let f = s
        .finish(
            j.id,
            &Outcome::Failed {
                counters: counters(50),
                error: "1 file not copied".into(),
                files: files.clone(),
            },
        )
        .unwrap();
    assert_eq!((f.state, f.files_failed), (State::Failed, 1));
    assert_eq!(f.file_errors, files);
    assert!(matches!(s.cancel(j.id), Err(StoreError::Conflict(_))));
    let r = s.retry(j.id).unwrap();
    assert_eq!((r.state, r.tries, r.attempts), (State::Queued, 0, 1));
    assert!(r.queued_ms >= j.queued_ms && r.created_ms == j.created_ms);
    assert_eq!(r.file_errors, files, "kept until the next run ends");
    let c = s.claim(now_ms()).unwrap().unwrap();
    assert_eq!((c.tries, c.attempts), (1, 2));
    let d = s.finish(j.id, &Outcome::Done(counters(100))).unwrap();
    assert!(d.file_errors.is_empty());
    assert!(matches!(s.retry(j.id), Err(StoreError::Conflict(_))));
}

#[test]
fn a_requeued_job_waits_for_its_backoff() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite")).unwrap();
    let j = s.submit("bob", JobKind::Copy, &spec("x")).unwrap();
    let now = now_ms();
    s.claim(now).unwrap().unwrap();
    let q = s
        .finish(
            j.id,
            &Outcome::Requeue {
                counters: counters(10),
                error: "connection refused".into(),
                not_before_ms: now + 60_000,
            },
        )
        .unwrap();
    assert_eq!(q.state, State::Queued);
    assert_eq!(q.error.as_deref(), Some("connection refused"));
    assert_eq!(s.next_due(now).unwrap(), Some(now + 60_000));
    assert_eq!(s.next_due(now + 60_000).unwrap(), None);
    assert_eq!(s.claim(now + 59_999).unwrap(), None);
    assert_eq!(s.claim(now + 60_000).unwrap().unwrap().tries, 2);
}

#[test]
fn cancel_ends_a_queued_job_and_marks_a_running_one() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite")).unwrap();
    let a = s.submit("u", JobKind::Copy, &spec("a")).unwrap();
    let b = s.submit("u", JobKind::Copy, &spec("b")).unwrap();
    assert_eq!(s.cancel(b.id).unwrap().state, State::Cancelled);
    assert_eq!(s.claim(now_ms()).unwrap().unwrap().id, a.id);
    let m = s.cancel(a.id).unwrap();
    assert_eq!((m.state, m.cancel_requested), (State::Running, true));
    let c = s.finish(a.id, &Outcome::Cancelled(counters(1))).unwrap();
    assert_eq!((c.state, c.cancel_requested), (State::Cancelled, false));
}

#[test]
fn running_jobs_are_requeued_on_recovery_and_pages_go_newest_first() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("j.sqlite");
    {
        let s = SqliteStore::open(&path).unwrap();
        for i in 0..5 {
            let owner = if i % 2 == 0 { "even" } else { "odd" };
            s.submit(owner, JobKind::Copy, &spec(&i.to_string()))
                .unwrap();
        }
        s.claim(now_ms()).unwrap().unwrap();
        let second = s.claim(now_ms()).unwrap().unwrap();
        s.cancel(second.id).unwrap();
        // Dropped with two jobs running: as after kill -9.
    }
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.recover().unwrap(), vec![1, 2]);
    assert_eq!(s.get(1).unwrap().state, State::Queued);
    assert_eq!(
        s.get(2).unwrap().state,
        State::Cancelled,
        "its cancel stands"
    );
    let page = |owner, before, limit| {
        s.list(Page {
            owner,
            before,
            limit,
        })
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect::<Vec<_>>()
    };
    assert_eq!(page(None, None, 3), [5, 4, 3]);
    assert_eq!(page(None, Some(3), 3), [2, 1]);
    assert_eq!(page(Some("even"), None, 10), [5, 3, 1]);
    assert_eq!(page(Some("odd"), Some(4), 10), [2]);
}

#[test]
fn a_second_service_on_the_same_file_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("j.sqlite");
    let first = SqliteStore::open(&path).unwrap();
    let e = SqliteStore::open(&path).unwrap_err();
    assert!(matches!(e, StoreError::Locked(_)), "{e:?}");
    assert!(
        e.to_string().contains("in use by another job service"),
        "{e}"
    );
    drop(first);
    SqliteStore::open(&path).unwrap();
}

#[test]
fn a_corrupt_or_newer_file_is_said_so() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("j.sqlite");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let e = SqliteStore::open(&path).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
    assert!(e.to_string().contains("corrupt or not a database"), "{e}");

    let newer = t.path().join("newer.sqlite");
    {
        let c = Connection::open(&newer).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let e = SqliteStore::open(&newer).unwrap_err();
    assert!(matches!(e, StoreError::TooNew { .. }), "{e:?}");
}

#[test]
fn a_database_at_version_one_is_left_as_it_is() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("j.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    drop(c);
    let s = SqliteStore::open(&path).unwrap();
    s.submit("u", JobKind::Copy, &spec("a")).unwrap();
}

/// A job of `owner` from server `src` to server `dst`, with `priority`.
fn job_on(src: &str, dst: &str, name: &str, priority: Option<u8>) -> JobSpec {
    let mut s = JobSpec {
        sources: vec![format!("dmover://{src}/{name}")],
        destination: format!("dmover://{dst}/in/"),
        options: JobOptions::default(),
    };
    s.options.priority = priority;
    s
}

/// Running jobs by link, as the store has them.
fn running_by_link(s: &SqliteStore) -> std::collections::BTreeMap<String, i64> {
    let c = s.conn.lock().unwrap();
    let mut q = c
        .prepare("SELECT link, COUNT(*) FROM jobs WHERE state = 'running' GROUP BY link")
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// What [`simulate`] saw.
struct Run {
    /// The owner of each claim, in order.
    claims: Vec<String>,
    /// How many claims were made while every user still had queued jobs.
    contended: usize,
    /// The most jobs running at once on one link.
    max_link: i64,
    /// The most jobs running at once.
    max_running: usize,
    /// Each tick's running jobs by owner while every user still had queued jobs (a
    /// run's work: jobs of equal size move equal data per tick).
    work: Vec<std::collections::BTreeMap<String, usize>>,
}

/// Queues `backlog` jobs per user (on three links, in turn) and runs them as a
/// runner of `concurrency` would, on a clock driven here: each tick ends the runs
/// due, then claims while fewer than `concurrency` run. A run lasts 10 to 14 ticks.
fn simulate(backlog: &[(&str, usize)], concurrency: usize, link_limit: u32) -> Run {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite"))
        .unwrap()
        .with_policy(Policy {
            link_concurrency: link_limit,
            max_unfinished_per_user: None,
        });
    let links = [("a", "b"), ("a", "c"), ("d", "b")];
    // Submitted in the order a big backlog is worst for the others: the big user's
    // jobs first.
    let mut queued = std::collections::BTreeMap::new();
    for (owner, n) in backlog {
        for i in 0..*n {
            let (src, dst) = links[i % links.len()];
            s.submit(
                owner,
                JobKind::Copy,
                &job_on(src, dst, &format!("{owner}{i}"), None),
            )
            .unwrap();
        }
        queued.insert(owner.to_string(), *n);
    }
    let mut run = Run {
        claims: Vec::new(),
        contended: 0,
        max_link: 0,
        max_running: 0,
        work: Vec::new(),
    };
    let mut running: Vec<(JobId, i64, String)> = Vec::new();
    let mut now = 1_000_000;
    while !running.is_empty() || queued.values().any(|n| *n > 0) {
        running.retain(|&(id, end, _)| {
            if end > now {
                return true;
            }
            s.finish(id, &Outcome::Done(counters(100))).unwrap();
            false
        });
        while running.len() < concurrency {
            let all_have_work = queued.values().all(|n| *n > 0);
            let Some(j) = s.claim(now).unwrap() else {
                break;
            };
            *queued.get_mut(&j.owner).unwrap() -= 1;
            if all_have_work {
                run.contended += 1;
            }
            run.claims.push(j.owner.clone());
            running.push((j.id, now + 10 + (j.id * 7) % 5, j.owner.clone()));
            run.max_running = run.max_running.max(running.len());
            let by_link = running_by_link(&s);
            run.max_link = run
                .max_link
                .max(by_link.values().copied().max().unwrap_or(0));
        }
        if queued.values().all(|n| *n > 0) {
            let mut tick = std::collections::BTreeMap::new();
            for (_, _, owner) in &running {
                *tick.entry(owner.clone()).or_insert(0) += 1;
            }
            run.work.push(tick);
        }
        now += 1;
    }
    run
}

/// Each user's claims in each window of `window` claims while all had work are
/// within ±20 % of the mean.
fn assert_fair(run: &Run, users: &[&str], window: usize) {
    assert!(run.contended >= window, "{}", run.contended);
    let mean = window as f64 / users.len() as f64;
    for (w, claims) in run.claims[..run.contended - run.contended % window]
        .chunks(window)
        .enumerate()
    {
        for u in users {
            let n = claims.iter().filter(|c| c == u).count() as f64;
            assert!(
                (n - mean).abs() <= 0.2 * mean + 1e-9,
                "window {w}: {u} had {n} of {window} claims (mean {mean}): {claims:?}"
            );
        }
    }
}

/// Each user's work (running jobs × ticks) in each window of `ticks` ticks while all
/// had work is within ±20 % of the mean.
fn assert_fair_work(run: &Run, users: &[&str], ticks: usize) {
    assert!(run.work.len() >= ticks, "{} ticks", run.work.len());
    for (w, window) in run.work.chunks_exact(ticks).enumerate() {
        let of = |u: &str| {
            window
                .iter()
                .map(|t| t.get(u).copied().unwrap_or(0))
                .sum::<usize>()
        };
        let mean = users.iter().map(|u| of(u)).sum::<usize>() as f64 / users.len() as f64;
        for u in users {
            let n = of(u) as f64;
            assert!(
                (n - mean).abs() <= 0.2 * mean,
                "window {w} ({ticks} ticks): {u} had {n} job-ticks (mean {mean})"
            );
        }
    }
}

#[test]
fn four_users_with_70_10_10_10_jobs_share_the_claims_evenly() {
    let users = ["big", "s1", "s2", "s3"];
    // The default concurrency, 4, and links of 2 (three links).
    let run = simulate(&[("big", 70), ("s1", 10), ("s2", 10), ("s3", 10)], 4, 2);
    assert_eq!(run.claims.len(), 100);
    assert!(run.contended >= 36, "{}", run.contended);
    assert_fair(&run, &users, 8);
    assert_fair_work(&run, &users, 60);
    assert_eq!(run.max_running, 4);
    assert!(run.max_link <= 2, "a link ran {} jobs", run.max_link);
    // The small users' jobs all started within the first 44 claims.
    let last_small = run.claims.iter().rposition(|c| c != "big").unwrap();
    assert!(last_small < 44, "{last_small}: {:?}", run.claims);
    // Six places for four users: no fair split of the claims in short windows (two
    // users hold two places at a time), but the work is fair.
    let run = simulate(&[("big", 70), ("s1", 10), ("s2", 10), ("s3", 10)], 6, 2);
    assert_fair_work(&run, &users, 60);
}

#[test]
fn the_share_holds_at_ten_times_the_backlog_and_under_the_link_limit() {
    let users = ["big", "s1", "s2", "s3"];
    let run = simulate(&[("big", 700), ("s1", 100), ("s2", 100), ("s3", 100)], 8, 2);
    assert!(run.contended >= 390, "{}", run.contended);
    assert_fair(&run, &users, 20);
    assert_fair_work(&run, &users, 60);
    // Three links of two: the links bind before the concurrency.
    assert_eq!((run.max_link, run.max_running), (2, 6));
}

#[test]
fn priorities_order_a_users_own_queue_only() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite")).unwrap();
    let mut ids = std::collections::BTreeMap::new();
    for (name, p) in [
        ("low", Some(1)),
        ("mid", None),
        ("top", Some(5)),
        ("mid2", Some(3)),
    ] {
        let j = s
            .submit("alice", JobKind::Copy, &job_on("a", "b", name, p))
            .unwrap();
        assert_eq!(j.priority, p.unwrap_or(3));
        assert_eq!(j.link, "a:7700 -> b:7700");
        ids.insert(j.id, name);
    }
    // Bob's one job, priority 1, still comes before alice's second.
    let b = s
        .submit("bob", JobKind::Copy, &job_on("a", "b", "bob", Some(1)))
        .unwrap();
    ids.insert(b.id, "bob");
    let mut order = Vec::new();
    let now = now_ms();
    while let Some(j) = s.claim(now).unwrap() {
        order.push(ids[&j.id]);
        s.finish(j.id, &Outcome::Done(counters(1))).unwrap();
    }
    assert_eq!(order, ["top", "bob", "mid", "mid2", "low"]);
}

#[test]
fn a_link_at_its_limit_leaves_its_jobs_queued_and_others_run() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite"))
        .unwrap()
        .with_policy(Policy {
            link_concurrency: 2,
            max_unfinished_per_user: None,
        });
    for i in 0..4 {
        s.submit(
            "u",
            JobKind::Copy,
            &job_on("a", "b", &format!("x{i}"), None),
        )
        .unwrap();
    }
    let other = s
        .submit("u", JobKind::Copy, &job_on("a", "c:9", "y", Some(1)))
        .unwrap();
    let now = now_ms();
    let (j1, j2) = (
        s.claim(now).unwrap().unwrap(),
        s.claim(now).unwrap().unwrap(),
    );
    assert_eq!((j1.id, j2.id), (1, 2));
    let third = s.claim(now).unwrap().unwrap();
    assert_eq!(third.id, other.id, "the full link is skipped");
    assert_eq!(third.link, "a:7700 -> c:9");
    assert_eq!(s.claim(now).unwrap(), None, "a:7700 -> b:7700 is full");
    s.finish(j1.id, &Outcome::Done(counters(1))).unwrap();
    assert_eq!(s.claim(now).unwrap().unwrap().id, 3);
    assert_eq!(s.claim(now).unwrap(), None);
}

#[test]
fn a_user_with_too_many_unfinished_jobs_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite"))
        .unwrap()
        .with_policy(Policy {
            link_concurrency: 4,
            max_unfinished_per_user: Some(2),
        });
    let a = s.submit("alice", JobKind::Copy, &spec("1")).unwrap();
    s.submit("alice", JobKind::Copy, &spec("2")).unwrap();
    let e = s.submit("alice", JobKind::Copy, &spec("3")).unwrap_err();
    assert!(matches!(e, StoreError::Limit(_)), "{e:?}");
    assert!(e.to_string().contains("max_unfinished_per_user = 2"), "{e}");
    // Another user is not counted with her.
    s.submit("bob", JobKind::Copy, &spec("b")).unwrap();
    // A running job counts; an ended one does not.
    assert_eq!(s.claim(now_ms()).unwrap().unwrap().id, a.id);
    assert!(s.submit("alice", JobKind::Copy, &spec("3")).is_err());
    s.finish(a.id, &Outcome::Done(counters(1))).unwrap();
    s.submit("alice", JobKind::Copy, &spec("3")).unwrap();
    assert_eq!(
        s.list(Page {
            owner: Some("alice"),
            before: None,
            limit: 10
        })
        .unwrap()
        .len(),
        3
    );
}

#[test]
fn purge_deletes_only_jobs_that_ended_before_the_time_with_their_errors() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite")).unwrap();
    let ids: Vec<JobId> = (0..6)
        .map(|i| {
            s.submit("u", JobKind::Copy, &spec(&i.to_string()))
                .unwrap()
                .id
        })
        .collect();
    let now = now_ms();
    let failed = Outcome::Failed {
        counters: counters(1),
        error: "x".into(),
        files: vec![FileError {
            path: "p".into(),
            error: "e".into(),
        }],
    };
    // 1 done, 2 failed (with an error by file), 3 cancelled, 4 running, 5 and 6
    // queued.
    for (id, how) in [
        (ids[0], Outcome::Done(counters(1))),
        (ids[1], failed),
        (ids[2], Outcome::Cancelled(counters(1))),
    ] {
        assert_eq!(s.claim(now).unwrap().unwrap().id, id);
        s.finish(id, &how).unwrap();
    }
    s.claim(now).unwrap().unwrap();
    let ended = s.get(ids[2]).unwrap().ended_ms.unwrap();
    assert_eq!(s.purge(now - 1).unwrap(), 0, "nothing ended that early");
    assert_eq!(s.purge(ended + 1).unwrap(), 3);
    for id in &ids[..3] {
        assert!(matches!(s.get(*id), Err(StoreError::NotFound(_))));
    }
    for id in &ids[3..] {
        assert!(!s.get(*id).unwrap().state.is_end());
    }
    let c = s.conn.lock().unwrap();
    let n: i64 = c
        .query_row("SELECT COUNT(*) FROM file_errors", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0);
    drop(c);
    // A cancelled queued job has an end too, and goes the same way.
    s.cancel(ids[5]).unwrap();
    assert_eq!(s.purge(now_ms() + 1).unwrap(), 1);
    assert_eq!(
        s.purge(i64::MAX).unwrap(),
        0,
        "running and queued jobs stay"
    );
}

#[test]
fn a_version_one_database_gets_links_and_priorities() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("j.sqlite");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(MIGRATIONS[0]).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
        let spec = serde_json::to_string(&job_on("a", "b:9", "x", None)).unwrap();
        for state in ["queued", "done"] {
            c.execute(
                "INSERT INTO jobs (owner, kind, state, spec, created_ms, queued_ms) \
                 VALUES ('u', 'copy', ?1, ?2, 1, 1)",
                params![state, spec],
            )
            .unwrap();
        }
    }
    let s = SqliteStore::open(&path).unwrap();
    let (q, d) = (s.get(1).unwrap(), s.get(2).unwrap());
    assert_eq!((q.link.as_str(), q.priority), ("a:7700 -> b:9", 3));
    assert_eq!(d.link, q.link);
    assert_eq!(s.claim(now_ms()).unwrap().unwrap().id, 1);
}

/// Claims from eight threads at once: no job is claimed twice, and no link runs more
/// than its limit (the counts and the claim are one transaction).
#[test]
fn concurrent_claims_never_share_a_job_or_pass_a_link_limit() {
    let t = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&t.path().join("j.sqlite"))
        .unwrap()
        .with_policy(Policy {
            link_concurrency: 3,
            max_unfinished_per_user: None,
        });
    let dsts = ["b", "c", "d", "e"];
    for i in 0..80 {
        let owner = format!("u{}", i % 5);
        let spec = job_on("a", dsts[i % dsts.len()], &i.to_string(), None);
        s.submit(&owner, JobKind::Copy, &spec).unwrap();
    }
    let now = now_ms();
    let claimed: Vec<Job> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while let Some(j) = s.claim(now).unwrap() {
                        mine.push(j);
                    }
                    mine
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let mut ids: Vec<JobId> = claimed.iter().map(|j| j.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), claimed.len(), "a job claimed twice");
    assert_eq!(claimed.len(), 3 * dsts.len(), "three on each of four links");
    assert!(running_by_link(&s).values().all(|n| *n == 3));
}
