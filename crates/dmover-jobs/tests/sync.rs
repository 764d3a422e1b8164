//! Sync jobs (`dmover submit --sync`): the destination made a mirror of the source
//! between two servers on loopback, a second job sending only what changed, with
//! `--delete` and filters; and what a sync job refuses at submission.

mod common;

use common::{Lab, Running, bytes, staging};
use dmover_jobs::model::{FilterRule, JobKind, JobSpec, Route, State, SyncOptions};

/// A sync of A's `data/src` into B's mirror `in/m`.
fn sync_spec(lab: &Lab, sync: SyncOptions, filters: &[(bool, &str)]) -> JobSpec {
    let mut s = lab.spec(&["data/src"], "in/m");
    s.options.sync = Some(sync);
    s.options.filters = filters
        .iter()
        .map(|(include, p)| FilterRule {
            include: *include,
            pattern: p.to_string(),
        })
        .collect();
    s
}

#[test]
fn a_sync_job_mirrors_and_a_second_sends_only_changes() {
    let lab = Lab::new(None);
    let src = lab.a_root.join("data/src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), bytes(1, 200_000)).unwrap();
    std::fs::write(src.join("sub/b"), bytes(2, 3_000)).unwrap();
    std::fs::write(src.join("skip.tmp"), bytes(3, 10)).unwrap();
    let svc = Running::start(&lab.db(), lab.runner_config());
    let run = |spec: JobSpec| {
        let job = svc.rt.block_on(svc.service.submit("alice", spec)).unwrap();
        assert_eq!(job.kind, JobKind::Sync);
        svc.wait_end(job.id)
    };
    let filters = [(false, "*.tmp")];
    let j = run(sync_spec(&lab, SyncOptions::default(), &filters));
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!((j.bytes_total, j.bytes_resumed), (203_000, 0), "{j:#?}");
    let mirror = lab.b_root.join("in/m");
    assert_eq!(std::fs::read(mirror.join("a")).unwrap(), bytes(1, 200_000));
    assert_eq!(
        std::fs::read(mirror.join("sub/b")).unwrap(),
        bytes(2, 3_000)
    );
    assert!(!mirror.join("skip.tmp").exists(), "excluded");

    // Again, with a changed file and an extra one at B: only the change goes, the
    // extra is deleted, the excluded one kept.
    std::fs::write(src.join("sub/b"), bytes(4, 3_000)).unwrap();
    std::fs::write(mirror.join("extra"), b"x").unwrap();
    std::fs::write(mirror.join("keep.tmp"), b"x").unwrap();
    let delete = SyncOptions {
        delete: true,
        ..SyncOptions::default()
    };
    let j = run(sync_spec(&lab, delete, &filters));
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!(j.bytes_resumed, 200_000, "only b is sent: {j:#?}");
    assert_eq!(
        std::fs::read(mirror.join("sub/b")).unwrap(),
        bytes(4, 3_000)
    );
    assert!(!mirror.join("extra").exists());
    assert!(mirror.join("keep.tmp").exists());
    assert!(!mirror.join("m").exists(), "a second run nested a copy");
    assert_eq!(staging(&lab.b_root), Vec::<std::path::PathBuf>::new());
    svc.stop();
}

#[test]
fn a_sync_job_refuses_what_a_sync_refuses_at_submission() {
    let lab = Lab::new(None);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let submit = |spec: JobSpec| svc.rt.block_on(svc.service.submit("alice", spec));
    let mut two = sync_spec(&lab, SyncOptions::default(), &[]);
    two.sources.push(two.sources[0].clone());
    let mut relayed = sync_spec(&lab, SyncOptions::default(), &[]);
    relayed.options.route = Route::ViaService;
    let limit_alone = SyncOptions {
        max_delete: Some(1),
        ..SyncOptions::default()
    };
    for (spec, says) in [
        (two, "one source"),
        (relayed, "not through the client"),
        (sync_spec(&lab, limit_alone, &[]), "needs deleting on"),
        (lab.spec(&["data/src"], "in/"), ""),
    ] {
        match submit(spec) {
            Err(e) => assert!(e.to_string().contains(says), "{e}"),
            // A copy, not a sync: taken.
            Ok(j) => assert_eq!((says, j.kind), ("", JobKind::Copy)),
        }
    }
    svc.stop();
}

/// A recurring sync (`every_secs`) on a clock the test drives: the first run mirrors,
/// the job waits queued until its period has passed on that clock, the second run
/// sends only the change; a cancel ends the recurrence. Too short a period, and a
/// recurring copy, are refused.
#[test]
fn a_recurring_sync_runs_again_on_its_clock_and_sends_only_changes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    let lab = Lab::new(None);
    let src = lab.a_root.join("data/src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), bytes(5, 100_000)).unwrap();
    std::fs::write(src.join("b"), bytes(6, 2_000)).unwrap();
    let clock = Arc::new(AtomicI64::new(dmover_jobs::model::now_ms()));
    let mut cfg = lab.runner_config();
    let c = clock.clone();
    cfg.clock = dmover_jobs::runner::Clock(Arc::new(move || c.load(Ordering::SeqCst)));
    let svc = Running::start(&lab.db(), cfg);

    let submit = |every: u64, sync: bool| {
        let mut spec = sync_spec(&lab, SyncOptions::default(), &[]);
        spec.options.every_secs = Some(every);
        if !sync {
            spec.options.sync = None;
        }
        svc.rt.block_on(svc.service.submit("alice", spec))
    };
    for (every, sync, says) in [(59, true, "too often"), (3600, false, "only a sync")] {
        let e = submit(every, sync).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
    let job = submit(3600, true).unwrap();
    let j = svc.wait(job.id, "the first run's end", |j| {
        j.attempts == 1 && j.state == State::Queued
    });
    let started = j.started_ms.unwrap();
    assert_eq!(j.not_before_ms, started + 3_600_000, "{j:#?}");
    assert_eq!(
        (j.bytes_total, j.bytes_resumed, j.error.as_deref()),
        (102_000, 0, None)
    );
    assert!(j.ended_ms.is_some());
    let mirror = lab.b_root.join("in/m");
    assert_eq!(std::fs::read(mirror.join("b")).unwrap(), bytes(6, 2_000));

    // Not due yet: nothing runs, however long the wait in real time.
    std::fs::write(src.join("b"), bytes(7, 2_000)).unwrap();
    svc.service.wake();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(svc.service.store().get(job.id).unwrap().attempts, 1);

    // An hour later on the runner's clock: the second run sends only b.
    clock.fetch_add(3_600_001, Ordering::SeqCst);
    svc.service.wake();
    let j = svc.wait(job.id, "the second run's end", |j| {
        j.attempts == 2 && j.state == State::Queued
    });
    assert_eq!(
        (j.bytes_total, j.bytes_resumed),
        (102_000, 100_000),
        "{j:#?}"
    );
    assert_eq!(std::fs::read(mirror.join("b")).unwrap(), bytes(7, 2_000));
    assert_eq!(staging(&lab.b_root), Vec::<std::path::PathBuf>::new());

    // Cancelled between runs: it ends, and runs no more.
    let j = svc
        .rt
        .block_on(svc.service.cancel(job.id, "alice"))
        .unwrap();
    assert_eq!(j.state, State::Cancelled);
    clock.fetch_add(7_200_000, Ordering::SeqCst);
    svc.service.wake();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let j = svc.service.store().get(job.id).unwrap();
    assert_eq!((j.state, j.attempts), (State::Cancelled, 2));
    svc.stop();
}
