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
