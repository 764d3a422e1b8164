//! The runner against real servers on loopback: jobs run to their end through the
//! library API, fail with errors by file, are cancelled, and survive a crash of the
//! service (resumed, no partial file under a final name).

mod common;

use std::time::Duration;

use common::{Lab, Running, bytes, staging};
use dmover_jobs::model::State;

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
