//! `dmover mount` (issue 14): the real binary mounts a real server's tree on loopback
//! through FUSE; the tree read through the mount is compared with the source (every
//! file, concurrent readers, random ranges), writes fail with EROFS, a server killed or
//! stopped gives EIO within the stated bound, SIGTERM/SIGINT unmount, and refused paths
//! mount nothing.
//!
//! Every mount sits in a [`Mount`] guard: on drop (a panic too) it kills the process,
//! aborts the FUSE connection if it is still mounted and runs `umount -l`, so no test
//! leaves a hung mount behind. Every wait has a timeout. The tests skip when FUSE
//! cannot be used (no /dev/fuse, not root) unless `DMOVER_REQUIRE_FUSE=1` (CI as root).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};

/// Whether this test can mount; prints why not (and fails if FUSE is required).
fn fuse_available(test: &str) -> bool {
    let why = if !Path::new("/dev/fuse").exists() {
        Some("no /dev/fuse")
    } else if !rustix::process::geteuid().is_root() {
        Some("not root (a user mount needs fusermount3; these tests mount as root)")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var_os("DMOVER_REQUIRE_FUSE").is_some_and(|v| v == "1") => {
            panic!("{test}: DMOVER_REQUIRE_FUSE=1 but FUSE cannot be used: {why}")
        }
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// The `major:minor` of the mount on `dir`, if one is there (from mountinfo, never a
/// stat of `dir`, which could hang on a stuck mount).
fn mounted(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_str().unwrap();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&dir)).then(|| f[2].to_string())
    })
}

/// Waits up to `limit` for `child` to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `f` on a thread of its own and waits up to `limit` for its result (a call
/// into a stuck mount cannot hang the test: the guard's abort frees the thread).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no answer from the mount within {limit:?}"))
}

/// A `dmover mount` process and its mount point; unmounted whatever happens.
struct Mount {
    child: Child,
    dir: PathBuf,
    log: PathBuf,
}

impl Mount {
    /// Mounts `url` on `dir`; `Err` with the process's stderr if it did not mount.
    fn start(url: &str, dir: &Path, kh: &Path, extra: &[&str]) -> Result<Mount, String> {
        Self::start_as(Command::new(bin()), url, dir, kh, extra)
    }

    /// [`Mount::start`] with `cmd` (a binary, a user to run as).
    fn start_as(
        mut cmd: Command,
        url: &str,
        dir: &Path,
        kh: &Path,
        extra: &[&str],
    ) -> Result<Mount, String> {
        std::fs::create_dir_all(dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let log = dir.with_extension("log");
        let mut child = cmd
            .arg("mount")
            .arg(url)
            .arg(&dir)
            .args(extra)
            .env_remove("DMOVER_TOKEN")
            .env_remove("DMOVER_KEY")
            .env("DMOVER_KNOWN_HOSTS", kh)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting dmover mount");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let m = Mount { child, dir, log };
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        if line.starts_with("dmover: mounted ") {
            assert!(
                mounted(&m.dir).is_some(),
                "said mounted, but is not: {line}"
            );
            return Ok(m);
        }
        let mut m = m;
        let code = wait_exit(&mut m.child, Duration::from_secs(30)).and_then(|s| s.code());
        Err(format!("exit code {code:?}: {}", m.stderr()))
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, sig).unwrap();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("dmover mount's stderr:\n{}", self.stderr());
        }
        if let Some(dev) = mounted(&self.dir) {
            // Abort the connection first: nothing waits on it any more.
            let conns = Path::new("/sys/fs/fuse/connections");
            if std::fs::read_dir(conns).is_ok_and(|mut d| d.next().is_none()) {
                let _ = Command::new("mount")
                    .args(["-t", "fusectl", "none"])
                    .arg(conns)
                    .status();
            }
            if let Some((_, minor)) = dev.split_once(':') {
                let _ = std::fs::write(conns.join(minor).join("abort"), "1");
            }
        }
        // Let it end by itself first (its `--rw` staging directory goes with it).
        if matches!(self.child.try_wait(), Ok(None)) {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let _ = wait_exit(&mut self.child, Duration::from_secs(5));
        }
        let _ = self.child.kill();
        let _ = wait_exit(&mut self.child, Duration::from_secs(10));
        if mounted(&self.dir).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A server exporting `root` (with `data/tree` in it) and a mount of `data/tree`.
struct Setup {
    t: tempfile::TempDir,
    server: Server,
}

impl Setup {
    fn new() -> Setup {
        let t = tempfile::Builder::new()
            .prefix("dmover-mount-")
            .tempdir()
            .unwrap();
        make_tree(&t.path().join("root/data/tree"));
        let server = Server::start(&t.path().join("root"), &[]);
        Setup { t, server }
    }

    fn src(&self) -> PathBuf {
        self.t.path().join("root/data/tree")
    }

    fn mount(&self, path: &str, extra: &[&str]) -> Result<Mount, String> {
        let n = std::fs::read_dir(self.t.path()).unwrap().count();
        Mount::start(
            &self.server.url(path),
            &self.t.path().join(format!("mnt{n}")),
            &known_hosts_in(self.t.path()),
            extra,
        )
    }
}

/// The regular files under `dir`, relative.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                todo.push(r);
            } else if ft.is_file() {
                out.push(r);
            }
        }
    }
    out.sort();
    out
}

fn errno(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn a_mounted_tree_reads_as_the_source_and_refuses_writes() {
    if !fuse_available("a_mounted_tree_reads_as_the_source_and_refuses_writes") {
        return;
    }
    let s = Setup::new();
    let m = s.mount("data/tree", &[]).unwrap();
    let (src, dir) = (s.src(), m.dir.clone());
    within(Duration::from_secs(120), move || {
        // Names, kinds, modes, mtimes, sizes, symlink targets and every byte.
        same(&src, &dir);
        let fs = files(&src);
        assert!(fs.len() >= 12, "{fs:?}");
        assert_eq!(fs, files(&dir));
        for f in &fs {
            assert_eq!(
                std::fs::read(src.join(f)).unwrap(),
                std::fs::read(dir.join(f)).unwrap(),
                "{f:?}"
            );
        }
        assert_eq!(
            std::fs::read_link(dir.join("link-rel")).unwrap(),
            Path::new("sub/deeper/small")
        );
        // Through the symlink, as the kernel follows it inside the mount.
        assert_eq!(
            std::fs::read(dir.join("link-rel")).unwrap(),
            std::fs::read(src.join("sub/deeper/small")).unwrap()
        );
        // Read-only.
        let rofs = Some(libc_erofs());
        assert_eq!(errno(std::fs::write(dir.join("new"), b"x")), rofs);
        assert_eq!(
            errno(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("one"))
            ),
            rofs
        );
        assert_eq!(errno(std::fs::create_dir(dir.join("d"))), rofs);
        assert_eq!(errno(std::fs::remove_file(dir.join("one"))), rofs);
        assert_eq!(
            errno(std::fs::rename(dir.join("one"), dir.join("two"))),
            rofs
        );
        assert_eq!(errno(std::fs::metadata(dir.join("missing"))), Some(2));
        // A change on the server shows after --attr-timeout (1 s).
        write_file(&src.join("added"), 77, 5000, 0o644, 1_700_000_000);
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            std::fs::read(dir.join("added")).unwrap(),
            std::fs::read(src.join("added")).unwrap()
        );
    });
}

fn libc_erofs() -> i32 {
    rustix::io::Errno::ROFS.raw_os_error()
}

#[test]
fn concurrent_readers_and_random_ranges_match_the_source() {
    if !fuse_available("concurrent_readers_and_random_ranges_match_the_source") {
        return;
    }
    let s = Setup::new();
    // A small cache (2 chunks of 1 MiB): chunks are dropped and asked for again.
    let m = s.mount("data/tree", &["--cache", "2M"]).unwrap();
    let fs = files(&s.src());
    let mut threads = Vec::new();
    for t in 0..6u64 {
        let (src, dir, fs) = (s.src(), m.dir.clone(), fs.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t);
            for round in 0..3 {
                for f in &fs {
                    let want = std::fs::read(src.join(f)).unwrap();
                    if (t + round) % 2 == 0 {
                        assert_eq!(want, std::fs::read(dir.join(f)).unwrap(), "{f:?}");
                        continue;
                    }
                    // pread at random offsets, some past the end.
                    let file = std::fs::File::open(dir.join(f)).unwrap();
                    for _ in 0..20 {
                        let off = rng.random_range(0..=want.len() as u64 + 10);
                        let len = rng.random_range(1..300_000usize);
                        let mut buf = vec![0; len];
                        let n = file.read_at(&mut buf, off).unwrap();
                        let lo = (off as usize).min(want.len());
                        let hi = (lo + len).min(want.len());
                        assert_eq!(n, hi - lo, "{f:?} at {off} for {len}");
                        assert_eq!(&buf[..n], &want[lo..hi], "{f:?} at {off} for {len}");
                    }
                }
            }
        }));
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        let _ = tx.send(r);
    });
    let results = rx
        .recv_timeout(Duration::from_secs(240))
        .expect("the readers did not finish in 240 s");
    for r in results {
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    }
    drop(m);
}

/// A server that dies (SIGKILL) or goes silent (SIGSTOP) under an open file: the next
/// read that needs it fails with EIO within the bound (here --timeout 5s, heartbeat
/// 200 ms: 0.8 s of silence + 2 s), and the mount still unmounts on SIGTERM.
fn server_gone(stop: bool) {
    let mut s = Setup::new();
    let m = s
        .mount(
            "data/tree",
            &["--timeout", "5s", "--debug-heartbeat-ms", "200"],
        )
        .unwrap();
    let mut buf = vec![0; 4096];
    let first = std::fs::File::open(m.dir.join("multi-chunk")).unwrap();
    assert_eq!(first.read_at(&mut buf, 0).unwrap(), 4096);
    // Opened before, read after: none of its chunks was asked for or cached.
    let f = std::fs::File::open(m.dir.join("sub/deeper/big")).unwrap();
    let pid = rustix::process::Pid::from_child(&s.server.child);
    if stop {
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    } else {
        s.server.kill();
    }
    let started = Instant::now();
    let (r, got) = within(Duration::from_secs(60), move || {
        let mut buf = vec![0; 4096];
        let r = f.read_at(&mut buf, 2 << 20);
        (r, buf)
    });
    let took = started.elapsed();
    match r {
        // A stopped server's kernel still delivers what it had written to its sockets:
        // under load the read succeeded (2 of 9 runs of this file at load 11, none of 9
        // quieter ones; which request brought the chunk is not understood yet). It must
        // then be the right data; the listing below needs the stopped server and must
        // fail.
        Ok(n) if stop => {
            let want = std::fs::read(s.src().join("sub/deeper/big")).unwrap();
            assert_eq!(n, 4096, "a short read from a stopped server");
            assert_eq!(&got[..], &want[2 << 20..(2 << 20) + 4096], "wrong data");
            eprintln!("note: the read was served before the stop took effect");
        }
        r => assert_eq!(errno(r), Some(5), "EIO expected"),
    }
    // The stated bound is 5 s (--timeout); generous slack for a loaded machine.
    assert!(took < Duration::from_secs(15), "EIO after {took:?}");
    // A lookup after the attribute timeout needs the server: EIO too, within the bound.
    std::thread::sleep(Duration::from_millis(1100));
    let started = Instant::now();
    let dir = m.dir.clone();
    let r = within(Duration::from_secs(60), move || {
        errno(std::fs::read_dir(dir.join("sub")))
    });
    assert_eq!(r, Some(5), "EIO expected from a listing");
    assert!(started.elapsed() < Duration::from_secs(15));
    if stop {
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    }
    drop(first);
    let mut m = m;
    m.signal(rustix::process::Signal::TERM);
    let st = wait_exit(&mut m.child, Duration::from_secs(30)).expect("mount did not exit");
    assert!(st.success(), "{st:?}: {}", m.stderr());
    assert!(mounted(&m.dir).is_none(), "still mounted");
}

#[test]
fn a_killed_server_gives_eio_within_the_bound() {
    if !fuse_available("a_killed_server_gives_eio_within_the_bound") {
        return;
    }
    server_gone(false);
}

#[test]
fn a_silent_server_gives_eio_within_the_bound() {
    if !fuse_available("a_silent_server_gives_eio_within_the_bound") {
        return;
    }
    server_gone(true);
}

#[test]
fn sigterm_and_sigint_unmount_and_leave_nothing_mounted() {
    if !fuse_available("sigterm_and_sigint_unmount_and_leave_nothing_mounted") {
        return;
    }
    let s = Setup::new();
    for (sig, hold_open) in [
        (rustix::process::Signal::TERM, false),
        (rustix::process::Signal::INT, true),
    ] {
        let mut m = s.mount("data/tree", &[]).unwrap();
        let dir = m.dir.clone();
        // With a file open, the unmount detaches and the process still exits.
        let open = hold_open.then(|| {
            within(Duration::from_secs(60), move || {
                std::fs::File::open(dir.join("meg-plus")).unwrap()
            })
        });
        m.signal(sig);
        let st = wait_exit(&mut m.child, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{sig:?}: the mount did not exit"));
        assert!(st.success(), "{sig:?}: {st:?}: {}", m.stderr());
        assert!(mounted(&m.dir).is_none(), "{sig:?}: still mounted");
        drop(open);
    }
}

#[test]
fn paths_outside_the_export_mount_nothing() {
    if !fuse_available("paths_outside_the_export_mount_nothing") {
        return;
    }
    let s = Setup::new();
    std::fs::write(s.t.path().join("secret"), b"outside").unwrap();
    for path in [
        "../secret",
        "data/../../secret",
        "/etc",
        "data/missing",
        "data/tree/one",
    ] {
        match s.mount(path, &[]) {
            Ok(m) => panic!("{path:?} mounted: {}", m.stderr()),
            Err(e) => {
                assert!(e.starts_with("exit code Some(1): "), "{path:?}: {e}");
                assert!(e.contains("error"), "{path:?}: {e}");
            }
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let t = s.t.path().canonicalize().unwrap();
        assert!(!info.contains(t.to_str().unwrap()), "{path:?}: {info}");
    }
}

#[test]
fn mount_usage_errors_exit_2() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().to_str().unwrap();
    let missing = t.path().join("missing");
    for (args, says) in [
        (vec!["mount", "local/path", d], "must be on a server"),
        (
            vec!["mount", "dmover://127.0.0.1:1/x", missing.to_str().unwrap()],
            "mount point",
        ),
        (vec!["mount", "dmover://h:x/y", d], "invalid host"),
        (
            vec!["mount", "dmover://h/y", d, "--timeout", "10ms"],
            "at least 1s",
        ),
        (vec!["mount", "dmover://h/y"], "DIR"),
    ] {
        let o = Command::new(bin())
            .args(&args)
            .env("DMOVER_KNOWN_HOSTS", t.path().join("kh"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
    }
}

/// `--rw`: new files and directories written through the mount appear on the server
/// complete at close (never partial under their final name); what the protocol cannot do
/// fails with EOPNOTSUPP; a failed upload is close()'s error.
#[test]
fn rw_uploads_new_files_whole_at_close() {
    if !fuse_available("rw_uploads_new_files_whole_at_close") {
        return;
    }
    let mut s = Setup::new();
    let m = s.mount("data/tree", &["--rw"]).unwrap();
    let (src, dir) = (s.src(), m.dir.clone());
    within(Duration::from_secs(120), move || {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir(dir.join("new")).unwrap();
        std::fs::create_dir(dir.join("new/deeper")).unwrap();
        assert!(src.join("new/deeper").is_dir());
        for (i, (name, len)) in [("a", 0usize), ("b", 1), ("deeper/c", 3 << 20 | 17)]
            .into_iter()
            .enumerate()
        {
            let data = bytes(100 + i as u64, len);
            let mut f = std::fs::File::create(dir.join("new").join(name)).unwrap();
            f.write_all(&data).unwrap();
            if len > 0 {
                // Not under its final name before the close.
                assert!(!src.join("new").join(name).exists(), "{name} before close");
            }
            f.set_permissions(std::fs::Permissions::from_mode(0o640))
                .unwrap();
            drop(f);
            let got = std::fs::read(src.join("new").join(name)).unwrap();
            assert_eq!(got, data, "{name}");
            let mode = std::fs::metadata(src.join("new").join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o640, "{name}");
            // And read back through the mount once the tree is refreshed.
            assert_eq!(std::fs::read(dir.join("new").join(name)).unwrap(), data);
        }
        assert!(staging_files(&src).is_empty(), "{:?}", staging_files(&src));
        let notsup = Some(95);
        assert_eq!(
            errno(std::os::unix::fs::symlink("one", dir.join("link"))),
            notsup
        );
    });
    // The server gone before the close: the close says so.
    let mut f = std::fs::File::create(m.dir.join("lost")).unwrap();
    std::io::Write::write_all(&mut f, b"never uploaded").unwrap();
    let mut pending = std::fs::File::create(m.dir.join("pending")).unwrap();
    std::io::Write::write_all(&mut pending, b"still open").unwrap();
    s.server.kill();
    let r = within(Duration::from_secs(60), move || {
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        // SAFETY: `fd` was just taken from the File, which no longer owns it.
        let rc = unsafe { libc::close(fd) };
        (rc, std::io::Error::last_os_error().raw_os_error())
    });
    assert_eq!(r, (-1, Some(5)), "close after a failed upload: EIO");
    assert!(!s.src().join("lost").exists());
    // SIGTERM with a file still open for writing: reported, not uploaded, exit 1, and
    // nothing left mounted.
    let mut m = m;
    m.signal(rustix::process::Signal::TERM);
    let st = wait_exit(&mut m.child, Duration::from_secs(30)).expect("mount did not exit");
    let err = m.stderr();
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("pending: still open for writing"), "{err}");
    assert!(mounted(&m.dir).is_none(), "still mounted");
    assert!(!s.src().join("pending").exists());
    drop(pending);
}

/// `--rw` on a read-only server: the upload at close is refused, close() fails with
/// EIO and nothing appears there.
#[test]
fn rw_on_a_read_only_server_fails_at_close() {
    if !fuse_available("rw_on_a_read_only_server_fails_at_close") {
        return;
    }
    let t = tempfile::Builder::new()
        .prefix("dmover-mount-ro-")
        .tempdir()
        .unwrap();
    make_tree(&t.path().join("root/data/tree"));
    let server = Server::start(&t.path().join("root"), &["--read-only"]);
    let m = Mount::start(
        &server.url("data/tree"),
        &t.path().join("mnt"),
        &known_hosts_in(t.path()),
        &["--rw"],
    )
    .unwrap();
    let dir = m.dir.clone();
    let r = within(Duration::from_secs(60), move || {
        let mut f = std::fs::File::create(dir.join("new")).unwrap();
        std::io::Write::write_all(&mut f, b"refused").unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        // SAFETY: `fd` was just taken from the File, which no longer owns it.
        let rc = unsafe { libc::close(fd) };
        (rc, std::io::Error::last_os_error().raw_os_error())
    });
    assert_eq!(r, (-1, Some(5)), "close of a refused upload: EIO");
    assert!(!t.path().join("root/data/tree/new").exists());
    // unlink, rmdir, rename: EROFS; a rewrite's close and a truncate: EIO.
    let dir = m.dir.clone();
    let r = within(Duration::from_secs(60), move || {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(dir.join("one"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"refused").unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        // SAFETY: `fd` was just taken from the File, which no longer owns it.
        let rc = unsafe { libc::close(fd) };
        let close = (rc, std::io::Error::last_os_error().raw_os_error());
        let c =
            std::ffi::CString::new(dir.join("page").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        let rc = unsafe { libc::truncate(c.as_ptr(), 0) };
        let truncate = (rc, std::io::Error::last_os_error().raw_os_error());
        [
            errno(std::fs::remove_file(dir.join("one"))),
            errno(std::fs::remove_dir(dir.join("empty-dir"))),
            errno(std::fs::rename(dir.join("one"), dir.join("uno"))),
            (close.0 == -1).then_some(close.1).flatten(),
            (truncate.0 == -1).then_some(truncate.1).flatten(),
        ]
    });
    let rofs = Some(libc::EROFS);
    assert_eq!(r, [rofs, rofs, rofs, Some(libc::EIO), Some(libc::EIO)]);
    let tree = t.path().join("root/data/tree");
    assert_eq!(std::fs::metadata(tree.join("one")).unwrap().len(), 1);
    assert_eq!(std::fs::metadata(tree.join("page")).unwrap().len(), 4096);
    assert!(tree.join("empty-dir").is_dir() && !tree.join("uno").exists());
    assert!(m.stderr().contains("read-only"), "{}", m.stderr());
}

/// A user who is not root mounts through fusermount3 (Debian's fuse3), sees the files,
/// and SIGTERM unmounts (fusermount3 -u). Runs as root, starting the mount as `nobody`.
#[test]
fn a_user_mounts_through_fusermount3() {
    if !fuse_available("a_user_mounts_through_fusermount3") {
        return;
    }
    if !["/usr/bin/fusermount3", "/bin/fusermount3"]
        .into_iter()
        .any(|p| Path::new(p).exists())
    {
        eprintln!("skipping a_user_mounts_through_fusermount3: no fusermount3 (apt install fuse3)");
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let (uid, gid) = (65534u32, 65534u32); // nobody, nogroup
    let s = Setup::new();
    // Everything the user touches in a directory of its own.
    let home = s.t.path().join("user");
    std::fs::create_dir_all(home.join("mnt")).unwrap();
    let exe = home.join("dmover");
    std::fs::copy(bin(), &exe).unwrap();
    for p in [s.t.path(), &home] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for p in [&home, &home.join("mnt")] {
        rustix::fs::chown(
            p.as_path(),
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .unwrap();
    }
    let mut cmd = Command::new(&exe);
    cmd.uid(uid).gid(gid).env("HOME", &home);
    let m = Mount::start_as(
        cmd,
        &s.server.url("data/tree"),
        &home.join("mnt"),
        &home.join("known_hosts"),
        &[],
    )
    .unwrap_or_else(|e| panic!("a user's mount failed: {e}"));
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(m.dir.to_str().unwrap()))
        .unwrap();
    assert!(line.contains("user_id=65534"), "{line}");
    // Only that user sees the files (no allow_other); read them as that user.
    let cat = Command::new("cat")
        .arg(m.dir.join("meg-plus"))
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(
        cat.status.success(),
        "{}",
        String::from_utf8_lossy(&cat.stderr)
    );
    assert_eq!(cat.stdout, std::fs::read(s.src().join("meg-plus")).unwrap());
    let mut m = m;
    m.signal(rustix::process::Signal::TERM);
    let st = wait_exit(&mut m.child, Duration::from_secs(30)).expect("mount did not exit");
    assert!(st.success(), "{st:?}: {}", m.stderr());
    assert!(mounted(&m.dir).is_none(), "still mounted");
}

/// `--rw`: unlink and rmdir delete on the server at once; a lookup right after sees
/// ENOENT (no wait for `--attr-timeout`); the errors are unlink(2)'s and rmdir(2)'s.
#[test]
fn rw_unlink_and_rmdir_delete_on_the_server() {
    if !fuse_available("rw_unlink_and_rmdir_delete_on_the_server") {
        return;
    }
    let s = Setup::new();
    // A long attribute timeout: only the mount's own change can make the lookup fail.
    let m = s
        .mount("data/tree", &["--rw", "--attr-timeout", "1h"])
        .unwrap();
    let (src, dir) = (s.src(), m.dir.clone());
    within(Duration::from_secs(120), move || {
        assert!(dir.join("one").exists());
        std::fs::remove_file(dir.join("one")).unwrap();
        assert_eq!(
            errno(std::fs::metadata(dir.join("one"))),
            Some(libc::ENOENT)
        );
        assert!(!src.join("one").exists(), "still on the server");
        assert_eq!(
            errno(std::fs::remove_file(dir.join("one"))),
            Some(libc::ENOENT)
        );
        assert_eq!(
            errno(std::fs::remove_file(dir.join("sub"))),
            Some(libc::EISDIR)
        );
        assert_eq!(
            errno(std::fs::remove_dir(dir.join("sub"))),
            Some(libc::ENOTEMPTY)
        );
        assert_eq!(
            errno(std::fs::remove_dir(dir.join("page"))),
            Some(libc::ENOTDIR)
        );
        assert!(src.join("sub/deeper/small").exists() && src.join("page").exists());
        std::fs::remove_dir(dir.join("empty-dir")).unwrap();
        assert_eq!(
            errno(std::fs::metadata(dir.join("empty-dir"))),
            Some(libc::ENOENT)
        );
        assert!(!src.join("empty-dir").exists());
        // Deeper down, and the emptied directory then goes too.
        std::fs::remove_file(dir.join("sub/deeper/small")).unwrap();
        std::fs::remove_file(dir.join("sub/deeper/big")).unwrap();
        std::fs::remove_dir(dir.join("sub/deeper")).unwrap();
        assert!(!src.join("sub/deeper").exists());
        assert!(src.join("sub/.hidden").exists(), "a sibling went too");
        let names: Vec<_> = std::fs::read_dir(dir.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(!names.iter().any(|n| n == "deeper"), "{names:?}");
        assert_eq!(names.len(), 4, "{names:?}");
    });
}

/// `--rw`: rename of a file and a directory, over an existing file, into another
/// directory; the server's tree is then what rename(2) makes of it, and the errors are
/// rename(2)'s.
#[test]
fn rw_rename_renames_on_the_server() {
    if !fuse_available("rw_rename_renames_on_the_server") {
        return;
    }
    let s = Setup::new();
    // A symlink on the server leading out of the export, as a rename's target directory.
    let outside = s.t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, s.src().join("out")).unwrap();
    let m = s
        .mount("data/tree", &["--rw", "--attr-timeout", "1h"])
        .unwrap();
    let (src, dir) = (s.src(), m.dir.clone());
    let before = files(&src);
    let one = std::fs::read(src.join("one")).unwrap();
    let page_1 = std::fs::read(src.join("page-1")).unwrap();
    within(Duration::from_secs(120), move || {
        std::fs::rename(dir.join("one"), dir.join("uno")).unwrap();
        assert_eq!(
            errno(std::fs::metadata(dir.join("one"))),
            Some(libc::ENOENT)
        );
        assert_eq!(std::fs::read(dir.join("uno")).unwrap(), one);
        // Over an existing file, then into another directory.
        std::fs::rename(dir.join("uno"), dir.join("page")).unwrap();
        assert_eq!(std::fs::read(dir.join("page")).unwrap(), one);
        std::fs::rename(dir.join("page-1"), dir.join("sub/deeper/p")).unwrap();
        // A directory, with what it holds.
        std::fs::rename(dir.join("sub/deeper"), dir.join("deep")).unwrap();
        assert!(dir.join("deep/p").is_file() && dir.join("deep/big").is_file());
        // rename(2)'s errors.
        let e = |a: &str, b: &str| errno(std::fs::rename(dir.join(a), dir.join(b)));
        assert_eq!(e("nothing", "x"), Some(libc::ENOENT));
        assert_eq!(e("empty", "nowhere/x"), Some(libc::ENOENT));
        assert_eq!(e("empty", "sub"), Some(libc::EISDIR));
        assert_eq!(e("empty-dir", "align"), Some(libc::ENOTDIR));
        assert_eq!(e("empty-dir", "deep"), Some(libc::ENOTEMPTY));
        assert_eq!(e("deep", "deep/inside"), Some(libc::EINVAL));
        // Written, closed, renamed at once (a tool's temporary file put in place).
        std::fs::write(dir.join("tmp.part"), b"fresh").unwrap();
        std::fs::rename(dir.join("tmp.part"), dir.join("fresh")).unwrap();
        assert_eq!(std::fs::read(dir.join("fresh")).unwrap(), b"fresh");
        std::fs::write(dir.join("gone"), b"x").unwrap();
        std::fs::remove_file(dir.join("gone")).unwrap();
        // Still open with changes not uploaded: EBUSY.
        let mut f = std::fs::File::create(dir.join("open")).unwrap();
        std::io::Write::write_all(&mut f, b"open").unwrap();
        assert_eq!(e("open", "opened"), Some(libc::EBUSY));
        drop(f);
        // The kernel follows the symlink itself: out of the mount, so EXDEV; the
        // server's own refusal of such a path: tests/remote.rs in dmover-core.
        assert_eq!(e("empty", "out/empty"), Some(libc::EXDEV));
    });
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    let mut want: Vec<PathBuf> = before
        .into_iter()
        .filter(|p| !["one", "page", "page-1"].contains(&p.to_str().unwrap()))
        .map(|p| match p.strip_prefix("sub/deeper") {
            Ok(rest) => Path::new("deep").join(rest),
            Err(_) => p,
        })
        .chain(["page", "deep/p", "fresh", "open"].map(PathBuf::from))
        .collect();
    want.sort();
    assert_eq!(files(&src), want);
    assert_eq!(std::fs::read(src.join("deep/p")).unwrap(), page_1);
    assert!(!src.join("sub/deeper").exists());
    assert!(staging_files(&src).is_empty());
}

/// `--rw`: an existing file rewritten with O_TRUNC (`std::fs::write`), appended to,
/// written in the middle, truncated by path: the server has the new content whole after
/// the close (or the truncate), and no staging file is left.
#[test]
fn rw_rewrites_existing_files_whole() {
    if !fuse_available("rw_rewrites_existing_files_whole") {
        return;
    }
    use std::io::Write;
    let s = Setup::new();
    let m = s.mount("data/tree", &["--rw"]).unwrap();
    let (src, dir) = (s.src(), m.dir.clone());
    let big = std::fs::read(src.join("meg-plus")).unwrap();
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    };
    let page_mode = mode(&src.join("page-1"));
    within(Duration::from_secs(120), move || {
        let new = bytes(7, 5000);
        std::fs::write(dir.join("page-1"), &new).unwrap();
        assert_eq!(std::fs::read(src.join("page-1")).unwrap(), new);
        assert_eq!(mode(&src.join("page-1")), page_mode, "the mode stays");
        // Append: the file is fetched first, then uploaded whole.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("meg-plus"))
            .unwrap();
        f.write_all(b"tail").unwrap();
        assert_eq!(
            std::fs::read(src.join("meg-plus")).unwrap(),
            big,
            "before close"
        );
        drop(f);
        let mut want = big.clone();
        want.extend_from_slice(b"tail");
        assert_eq!(std::fs::read(src.join("meg-plus")).unwrap(), want);
        // In the middle, without O_TRUNC.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("meg-plus"))
            .unwrap();
        f.write_all_at(b"MIDDLE", 1 << 19).unwrap();
        drop(f);
        want[1 << 19..(1 << 19) + 6].copy_from_slice(b"MIDDLE");
        assert_eq!(std::fs::read(src.join("meg-plus")).unwrap(), want);
        assert_eq!(std::fs::read(dir.join("meg-plus")).unwrap(), want);
        // Opened for writing, nothing written: nothing uploaded, the mtime stays.
        let before = std::fs::metadata(src.join("align"))
            .unwrap()
            .modified()
            .unwrap();
        drop(
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("align"))
                .unwrap(),
        );
        let after = std::fs::metadata(src.join("align"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(before, after);
        // truncate(path, n).
        let truncate = |p: &str, n: u64| {
            let c =
                std::ffi::CString::new(dir.join(p).into_os_string().into_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            let rc = unsafe { libc::truncate(c.as_ptr(), n as libc::off_t) };
            assert_eq!(rc, 0, "truncate {p}: {}", std::io::Error::last_os_error());
        };
        truncate("below-align", 0);
        assert_eq!(std::fs::metadata(src.join("below-align")).unwrap().len(), 0);
        let one = std::fs::read(src.join("sub/deeper/small")).unwrap();
        truncate("sub/deeper/small", 10);
        assert_eq!(
            std::fs::read(src.join("sub/deeper/small")).unwrap(),
            one[..10]
        );
        assert!(staging_files(&src).is_empty(), "{:?}", staging_files(&src));
    });
}

/// The mount reconnects by itself: the server killed and started again on the same
/// address, root and key, reads work again within `--attr-timeout` (plus a session's
/// set-up) without remounting.
#[test]
fn the_mount_reconnects_when_the_server_is_back() {
    if !fuse_available("the_mount_reconnects_when_the_server_is_back") {
        return;
    }
    let t = tempfile::Builder::new()
        .prefix("dmover-mount-back-")
        .tempdir()
        .unwrap();
    let root = t.path().join("root");
    make_tree(&root.join("data/tree"));
    let state = t.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let args = [std::ffi::OsStr::new("--root"), root.as_os_str()];
    let mut server = Server::start_with(&args, &root, None, Some(&state));
    let m = Mount::start(
        &server.url("data/tree"),
        &t.path().join("mnt"),
        &known_hosts_in(t.path()),
        &["--attr-timeout", "1s", "--timeout", "5s"],
    )
    .unwrap();
    let want = std::fs::read(root.join("data/tree/page")).unwrap();
    let dir = m.dir.clone();
    let got = within(Duration::from_secs(60), move || {
        std::fs::read(dir.join("page"))
    });
    assert_eq!(got.unwrap(), want);
    let addr = server.addr.clone();
    server.kill();
    // Down: reads fail (EIO), the mount stays.
    std::thread::sleep(Duration::from_millis(1500));
    let dir = m.dir.clone();
    let down = within(Duration::from_secs(60), move || {
        std::fs::read(dir.join("page"))
    });
    assert_eq!(errno(down), Some(libc::EIO));
    let _back = Server::start_on(&addr, &args, &root, None, Some(&state));
    let start = Instant::now();
    let dir = m.dir.clone();
    let got = within(Duration::from_secs(60), move || {
        loop {
            match std::fs::read(dir.join("page")) {
                Ok(d) => return Ok(d),
                Err(e) if start.elapsed() > Duration::from_secs(20) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    });
    assert_eq!(
        got.expect("no read within 20 s of the server's return"),
        want
    );
    assert!(mounted(&m.dir).is_some());
}
