//! Jobs that meet faults of the servers they name (issue 41, item 7): a destination
//! that refuses writes, a destination whose disk fills mid-job. Each ends `failed` at
//! once with a clear error, not retried (a retry cannot succeed), and leaves no
//! partial file under a final name.

mod common;

use std::path::Path;

use common::{Lab, Running, bytes};
use dmover_core::server::{Server, ServerConfig};
use dmover_jobs::model::{JobSpec, State};

/// A third server on `lab`'s runtime serving `root`, changed by `tweak`; its address.
fn another_server(lab: &Lab, root: &Path, tweak: impl FnOnce(&mut ServerConfig)) -> String {
    let mut cfg = ServerConfig::new(root);
    cfg.exports[0].third_party = true;
    (cfg.io_threads, cfg.io_threads_max) = (2, 2);
    tweak(&mut cfg);
    let server = Server::new(cfg).unwrap();
    // It serves until the lab's runtime is dropped.
    let stop = tokio_util::sync::CancellationToken::new();
    lab.rt.block_on(async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move { server.serve(l, stop).await });
        addr
    })
}

/// Names below `dir` that are not dmover's own (`.dmv.*`), as paths relative to it.
fn final_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".dmv.") {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
            out.push(
                e.path()
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    out.sort();
    out
}

#[test]
fn a_destination_that_refuses_writes_fails_the_job_at_once() {
    let lab = Lab::new(None);
    std::fs::write(lab.a_root.join("data/f"), bytes(1, 10_000)).unwrap();
    let ro = lab.dir.path().join("ro");
    std::fs::create_dir_all(ro.join("in")).unwrap();
    let c = another_server(&lab, &ro, |cfg| cfg.exports[0].read_only = true);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let spec = JobSpec {
        destination: format!("dmover://{c}/in/"),
        ..lab.spec(&["data/f"], "in/")
    };
    let job = svc.rt.block_on(svc.service.submit("alice", spec)).unwrap();
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Failed, "{j:#?}");
    assert_eq!(j.attempts, 1, "a refusal is not retried: {j:#?}");
    let e = j.error.as_deref().unwrap();
    assert!(e.contains("read-only"), "{e}");
    assert_eq!(final_names(&ro), ["in"]);
    svc.stop();
}

/// B's `in` is a 1 MiB tmpfs: a 3 MiB file cannot fit. As root only (mounting).
#[test]
fn a_full_disk_fails_the_job_with_its_cause_and_no_partial_file() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let lab = Lab::new(None);
    std::fs::write(lab.a_root.join("data/small"), bytes(2, 100_000)).unwrap();
    std::fs::write(lab.a_root.join("data/big"), bytes(3, 3 << 20)).unwrap();
    let full = lab.b_root.join("in");
    let mounted = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "dmover-test",
            full.to_str().unwrap(),
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: could not mount a tmpfs");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
    let _unmount = Unmount(&full);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let job = svc
        .rt
        .block_on(
            svc.service
                .submit("alice", lab.spec(&["data/small", "data/big"], "in/")),
        )
        .unwrap();
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Failed, "{j:#?}");
    assert_eq!(j.attempts, 1, "a full disk is not retried at once: {j:#?}");
    let e = j.error.as_deref().unwrap();
    assert!(e.contains("No space left on device"), "{e}");
    eprintln!("{e}");
    // Nothing partial under a final name: `big` is not there, and what is there is
    // whole.
    let names = final_names(&full);
    assert!(!names.contains(&"big".to_string()), "{names:?}");
    if names.contains(&"small".to_string()) {
        assert_eq!(
            std::fs::read(full.join("small")).unwrap(),
            bytes(2, 100_000)
        );
    }
    svc.stop();
}
