//! The race part of the hostile-peer suite (issue 46): a real server on loopback whose
//! export is changed under a transfer by a local user who can write in it, the way the
//! rsync-2025 and scp-2019 classes of bug are exploited. A directory the transfer is
//! writing into, or reading from, is swapped for a symlink to a directory outside the
//! export and back again, over and over, while transfers run — up to 200 transfers or
//! 20 s per test. Whatever each transfer's outcome (a swap may well make it fail),
//! nothing outside the export is written, chmodded or read.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_core::transfer::{Endpoint, Transfer, TransferSpec, Watch};

const ROUNDS: usize = 200;
const BUDGET: Duration = Duration::from_secs(20);
/// What the files outside the export hold: a transfer that followed a swapped-in
/// symlink would carry it (a pull) or overwrite it (a push).
const SECRET: &[u8] = b"outside the export: must never move\n";
const FILES: usize = 8;

/// A server exporting `root/export` on loopback; its address and the runtime it runs on.
struct Served {
    rt: tokio::runtime::Runtime,
    addr: String,
    stop: tokio_util::sync::CancellationToken,
}

impl Served {
    fn start(export: &Path) -> Served {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut cfg = ServerConfig::new(export);
        cfg.io_threads = 2;
        let server = Server::new(cfg).unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let addr = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            let (server, stop) = (server.clone(), stop.clone());
            tokio::spawn(async move { server.serve(l, stop).await });
            addr
        });
        Served { rt, addr, stop }
    }

    /// Runs one copy; its outcome does not matter to these tests, only its effects.
    fn copy(&self, known_hosts: &Path, src: Endpoint, dest: Endpoint) -> bool {
        let options = TransferOptions {
            trust: Some(dmover_net::tls::Trust::KnownHosts(
                known_hosts.to_path_buf(),
            )),
            chunk_size: 64 << 10,
            streams: 2,
            ..TransferOptions::default()
        };
        let spec = TransferSpec::copy(vec![src], dest).options(options);
        let t = Transfer::new(spec).unwrap();
        self.rt.block_on(t.run(Watch::events(), |_| {})).is_ok()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A directory outside the export holding `FILES` files with the secret, mode 0700,
/// the files 0600; and what it looks like (names, contents and modes) to compare with
/// at the end.
fn outside(root: &Path) -> (PathBuf, Vec<(String, String, u32)>) {
    let dir = root.join("outside");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..FILES {
        let f = dir.join(format!("f{i}"));
        std::fs::write(&f, SECRET).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let seen = look(&dir);
    (dir, seen)
}

fn look(dir: &Path) -> Vec<(String, String, u32)> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let data = if meta.is_file() {
                String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned()
            } else {
                String::new()
            };
            (
                e.file_name().to_string_lossy().into_owned(),
                data,
                meta.permissions().mode() & 0o7777,
            )
        })
        .collect();
    all.sort();
    let mode = std::fs::symlink_metadata(dir).unwrap().permissions().mode() & 0o7777;
    all.push((".".into(), String::new(), mode));
    all
}

/// A tree `t/d/f0..` of files that are not the secret, `d` with mode 0777 (a chmod that
/// followed a swapped-in link would change the outside directory's 0700).
fn tree(at: &Path) {
    let d = at.join("t/d");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..FILES {
        std::fs::write(
            d.join(format!("f{i}")),
            vec![b'a' + i as u8; 3000 + i * 7000],
        )
        .unwrap();
    }
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// Swaps `dir` for a symlink to `target` and back, as fast as it can, until `stop`;
/// counts the swaps. `dir` is put back (a directory) when it ends.
fn racer(dir: PathBuf, target: PathBuf, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) {
    let aside = dir.with_extension("aside");
    while !stop.load(Ordering::Relaxed) {
        if std::fs::rename(&dir, &aside).is_err() {
            // Not there yet (the first transfer has not made it) or a transfer holds
            // a replacement there: try again.
            std::thread::yield_now();
            continue;
        }
        if std::os::unix::fs::symlink(&target, &dir).is_ok() {
            swaps.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(200));
            let _ = std::fs::remove_file(&dir);
        }
        // A transfer may have made a new directory in the window: keep the old one
        // aside then, and try again with the new.
        if std::fs::rename(&aside, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&aside);
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        let _ = std::fs::remove_file(&dir);
    }
    let _ = std::fs::rename(&aside, &dir);
}

/// Runs `round` up to `ROUNDS` times or for `BUDGET` with the racer swapping `dir`;
/// returns (rounds, rounds that succeeded, swaps).
fn race(dir: PathBuf, target: PathBuf, mut round: impl FnMut() -> bool) -> (usize, usize, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let r = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || racer(dir, target, stop, swaps))
    };
    let start = Instant::now();
    let (mut rounds, mut ok) = (0, 0);
    while rounds < ROUNDS && start.elapsed() < BUDGET {
        ok += usize::from(round());
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    r.join().unwrap();
    (rounds, ok, swaps.load(Ordering::Relaxed))
}

/// Pushes into a directory that a local user keeps swapping for a symlink to a
/// directory outside the export: the files there keep their contents and modes, the
/// directory its mode, and nothing new appears there.
#[test]
fn pushes_into_a_directory_swapped_for_a_symlink_write_nothing_outside() {
    let t = tempfile::tempdir().unwrap();
    let (export, src) = (t.path().join("export"), t.path().join("src"));
    std::fs::create_dir_all(export.join("dest")).unwrap();
    tree(&src);
    let (out, before) = outside(t.path());
    let served = Served::start(&export);
    let kh = t.path().join("kh");
    let push = || {
        served.copy(
            &kh,
            Endpoint::local(src.join("t")),
            Endpoint::remote(&served.addr, "dest/").unwrap(),
        )
    };
    assert!(push(), "a push with nobody racing it works");
    let (rounds, ok, swaps) = race(export.join("dest/t/d"), out.clone(), push);
    assert_eq!(look(&out), before, "the outside directory changed");
    assert!(swaps > 0, "the racer never swapped ({rounds} rounds)");
    eprintln!("{rounds} pushes ({ok} complete) raced by {swaps} swaps");
    // The export still works for an honest push once the racing stops.
    assert!(push());
    for i in 0..FILES {
        let f = format!("dest/t/d/f{i}");
        assert_eq!(
            std::fs::read(export.join(&f)).unwrap(),
            std::fs::read(src.join(format!("t/d/f{i}"))).unwrap()
        );
    }
}

/// Pulls from a directory that a local user keeps swapping for a symlink to a directory
/// outside the export: no pulled file ever holds what is outside.
#[test]
fn pulls_from_a_directory_swapped_for_a_symlink_read_nothing_outside() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    tree(&export.join("src"));
    let (out, before) = outside(t.path());
    let served = Served::start(&export);
    let kh = t.path().join("kh");
    let dest = t.path().join("dest");
    let mut leaked = Vec::new();
    let mut pull = || {
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::create_dir(&dest).unwrap();
        let ok = served.copy(
            &kh,
            Endpoint::remote(&served.addr, "src/t").unwrap(),
            Endpoint::local(&dest),
        );
        leaked.extend(files_holding(&dest, SECRET));
        ok
    };
    let (rounds, ok, swaps) = race(export.join("src/t/d"), out.clone(), &mut pull);
    assert!(swaps > 0, "the racer never swapped ({rounds} rounds)");
    assert_eq!(
        leaked,
        Vec::<PathBuf>::new(),
        "files read from outside the export"
    );
    assert_eq!(look(&out), before, "the outside directory changed");
    eprintln!("{rounds} pulls ({ok} complete) raced by {swaps} swaps");
}

/// Regular files below `dir` (not following links) whose contents are `data`.
fn files_holding(dir: &Path, data: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                todo.push(e.path());
            } else if ft.is_file() && std::fs::read(e.path()).is_ok_and(|b| b == data) {
                found.push(e.path());
            }
        }
    }
    found
}
