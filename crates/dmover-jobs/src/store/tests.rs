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
    assert_eq!(s.next_due().unwrap(), Some(now + 60_000));
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
