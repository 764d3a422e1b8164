//! Shared helpers for the end-to-end tests: the real binary, real servers on loopback,
//! real trees on disk.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, SystemTime};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_dmover")
}

/// A `dmover serve` process; killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub root: PathBuf,
    /// The server's state directory (its TLS key), removed with the server.
    pub state: tempfile::TempDir,
}

impl Server {
    pub fn start(root: &Path, extra: &[&str]) -> Server {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--root".as_ref(), root.as_os_str()];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        Self::start_with(&args, root, None, None)
    }

    /// `dmover serve ARGS --listen 127.0.0.1:0 --state-dir DIR` (`state`, else a fresh
    /// temporary directory), stderr to `log` if given (else discarded).
    pub fn start_with(
        args: &[&std::ffi::OsStr],
        root: &Path,
        log: Option<&Path>,
        state_dir: Option<&Path>,
    ) -> Server {
        Self::start_on("127.0.0.1:0", args, root, log, state_dir)
    }

    /// [`Server::start_with`], listening on `listen`.
    pub fn start_on(
        listen: &str,
        args: &[&std::ffi::OsStr],
        root: &Path,
        log: Option<&Path>,
        state_dir: Option<&Path>,
    ) -> Server {
        Self::spawn(Path::new(bin()), listen, args, root, log, state_dir)
    }

    /// [`Server::start_on`] with another dmover binary (an older build, in the
    /// upgrade tests).
    pub fn spawn(
        binary: &Path,
        listen: &str,
        args: &[&std::ffi::OsStr],
        root: &Path,
        log: Option<&Path>,
        state_dir: Option<&Path>,
    ) -> Server {
        let state = tempfile::Builder::new()
            .prefix("dmover-state-")
            .tempdir()
            .unwrap();
        let state_path = state_dir.unwrap_or(state.path()).to_path_buf();
        let stderr = match (log, std::env::var_os("DMOVER_TEST_LOG_DIR")) {
            (Some(p), _) => Stdio::from(std::fs::File::create(p).unwrap()),
            // Server logs for diagnosing a failed test: one file per server.
            (None, Some(dir)) => Stdio::from(
                tempfile::Builder::new()
                    .prefix("server-")
                    .suffix(".log")
                    .tempfile_in(dir)
                    .expect("creating a server log")
                    .keep()
                    .expect("keeping a server log")
                    .0,
            ),
            (None, None) => Stdio::null(),
        };
        let mut child = Command::new(binary)
            .arg("serve")
            .args(args)
            .args(["--listen", listen, "--state-dir"])
            .arg(&state_path)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starting dmover serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("reading the listen line");
        let addr = line
            .trim()
            .strip_prefix("dmover: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server {
            child,
            addr,
            root: root.to_path_buf(),
            state,
        }
    }

    /// `dmover://ADDR/path`
    pub fn url(&self, path: &str) -> String {
        format!("dmover://{}/{}", self.addr, path)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn cp(args: &[&str]) -> Output {
    cp_env(args, &[])
}

/// Runs `dmover cp` with `env` set. Unless `env` names one, the client gets a fresh
/// known-hosts file of its own (tests never touch the real home directory).
pub fn cp_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    command_env("cp", args, env)
}

/// Runs `dmover sync ARGS`, with a known-hosts file of its own as [`cp_env`].
pub fn sync(args: &[&str]) -> Output {
    command_env("sync", args, &[])
}

/// Runs `dmover SUBCOMMAND ARGS` with `env` set and, unless `env` names one, a fresh
/// known-hosts file.
fn command_env(sub: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    command_of(Path::new(bin()), sub, args, env)
}

/// [`command_env`] with another dmover binary (an older build, in the upgrade tests).
pub fn command_of(binary: &Path, sub: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let kh = tempfile::Builder::new()
        .prefix("dmover-kh-")
        .tempdir()
        .unwrap();
    let mut c = Command::new(binary);
    c.arg(sub)
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_KEY")
        .env_remove("DMOVER_USER")
        .env_remove("DMOVER_LOG")
        .env("DMOVER_KNOWN_HOSTS", kh.path().join("known_hosts"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.output()
        .unwrap_or_else(|e| panic!("running dmover {sub}: {e}"))
}

/// A fresh known-hosts path under `dir` (a test's temporary directory), for clients
/// started by hand: tests never pin keys in the real home directory, and a port a later
/// server reuses never meets an old pin.
pub fn known_hosts_in(dir: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(".dmover-known-hosts")
        .join(format!("known_hosts-{n}"))
}

/// Asserts a command succeeded, showing its stderr otherwise.
pub fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "dmover failed with {:?}:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Deterministic incompressible bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn write_file(p: &Path, seed: u64, len: usize, mode: u32, mtime_secs: u64) {
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let mut f = std::fs::File::create(p).unwrap();
    f.write_all(&bytes(seed, len)).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::new(mtime_secs, 123_456_789))
        .unwrap();
    drop(f);
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn set_dir_meta(p: &Path, mode: u32, mtime_secs: u64) {
    std::fs::File::open(p)
        .unwrap()
        .set_modified(SystemTime::UNIX_EPOCH + Duration::new(mtime_secs, 5))
        .unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with every kind of entry the copy must preserve: regular files around the
/// alignment and chunk boundaries (empty, tiny, 128 KiB ± 1, multi-chunk), nested and
/// empty directories, symlinks (relative, absolute, dangling), odd modes and mtimes.
pub fn make_tree(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    let sizes: &[(&str, usize)] = &[
        ("empty", 0),
        ("one", 1),
        ("page-1", 4095),
        ("page", 4096),
        ("below-align", 128 * 1024 - 1),
        ("align", 128 * 1024),
        ("meg-plus", (1 << 20) + 3),
        ("multi-chunk", 9 * (1 << 20) + 4097),
        ("sub/deeper/small", 333),
        ("sub/deeper/big", 3 * (1 << 20) + 1),
        ("sub/name with spaces & ünïcödé", 1000),
        ("sub/.hidden", 10),
    ];
    for (i, (name, len)) in sizes.iter().enumerate() {
        let mode = match i % 3 {
            0 => 0o644,
            1 => 0o600,
            _ => 0o755,
        };
        write_file(
            &root.join(name),
            i as u64 + 1,
            *len,
            mode,
            1_600_000_000 + i as u64,
        );
    }
    std::fs::set_permissions(root.join("page"), std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::create_dir_all(root.join("empty-dir")).unwrap();
    symlink("sub/deeper/small", root.join("link-rel")).unwrap();
    symlink("/etc/hostname", root.join("link-abs")).unwrap();
    symlink("does/not/exist", root.join("sub/link-dangling")).unwrap();
    symlink("deeper", root.join("sub/link-dir")).unwrap();
    set_dir_meta(&root.join("empty-dir"), 0o750, 1_500_000_000);
    set_dir_meta(&root.join("sub/deeper"), 0o700, 1_500_000_001);
    set_dir_meta(&root.join("sub"), 0o755, 1_500_000_002);
    set_dir_meta(root, 0o755, 1_500_000_003);
}

/// Many small files in several directories.
pub fn make_small_files(root: &Path, n: usize, dirs: usize) {
    for i in 0..n {
        let p = root.join(format!("d{:03}/f{i:05}", i % dirs));
        write_file(
            &p,
            i as u64,
            (i * 37) % 9000 + 1,
            0o644,
            1_650_000_000 + i as u64,
        );
    }
}

pub fn same(a: &Path, b: &Path) {
    if let Err(e) = dmover_store::verify::compare_trees(a, b) {
        panic!("trees differ: {e}");
    }
}

/// Every file under its final name in `dest` is byte-identical to its counterpart in
/// `src`; staging files (`.dmv.*`) are the only other files allowed. Returns the
/// number of complete files found.
pub fn no_partial_files(src: &Path, dest: &Path) -> usize {
    let mut complete = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(dest.join(&rel)) else {
            continue;
        };
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name();
            let r = rel.join(&name);
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(r);
            } else if ft.is_file() {
                if name.to_string_lossy().starts_with(".dmv.") {
                    continue;
                }
                let got = std::fs::read(dest.join(&r)).unwrap();
                let want = std::fs::read(src.join(&r))
                    .unwrap_or_else(|_| panic!("{} has no source", r.display()));
                assert!(
                    got == want,
                    "{} is visible under its final name but incomplete",
                    r.display()
                );
                complete += 1;
            }
        }
    }
    complete
}

pub fn staging_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().starts_with(".dmv.") {
                out.push(e.path());
            }
        }
    }
    out
}

pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// Whether this machine can make `dmover netlab` labs (root, /dev/net/tun, `ip`); when it
/// cannot, the test skips loudly, or fails when `DMOVER_REQUIRE_NETLAB=1` (CI sets it).
pub fn netlab_available(test: &str) -> bool {
    match dmover_netlab_available() {
        Ok(()) => true,
        Err(why) => {
            if std::env::var("DMOVER_REQUIRE_NETLAB").is_ok_and(|v| v == "1") {
                panic!("{test}: netlab unavailable but DMOVER_REQUIRE_NETLAB=1: {why}");
            }
            eprintln!("\n!!! SKIPPING {test}: netlab is unavailable here: {why} !!!\n");
            false
        }
    }
}

/// The same checks as `dmover_netlab::available()`, from outside the library.
pub fn dmover_netlab_available() -> Result<(), String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .unwrap_or_default();
    if uid != "0" {
        return Err("needs root".into());
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .is_err()
    {
        return Err("cannot open /dev/net/tun".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Err("`ip` is not installed".into());
    }
    Ok(())
}

/// The sizes of the regular files under `dir`, at any depth (symlinks not followed;
/// none when `dir` does not exist).
pub fn regular_file_sizes(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd {
        let p = e.unwrap().path();
        // Gone since it was listed (a staging file renamed into place meanwhile).
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            out.extend(regular_file_sizes(&p));
        } else if m.is_file() {
            out.push(m.len());
        }
    }
    out
}

/// Bytes of the regular files under `dir`.
pub fn walk_bytes(dir: &Path) -> u64 {
    regular_file_sizes(dir).iter().sum()
}

/// A `dmover serve` inside a netlab host, listening on port 7700 of all its addresses
/// (each host has its own ports); killed, and its state directory removed, when
/// dropped.
pub struct NsServer {
    child: Child,
    _state: tempfile::TempDir,
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `dmover serve --third-party --root ROOT --token-file TOKEN --tpc-address
/// ADVERTISE` in `host` of `topo`, and waits until it listens.
pub fn ns_serve(
    topo: &dmover_netlab::Topology,
    host: &str,
    root: &Path,
    token: &Path,
    advertise: &str,
) -> NsServer {
    ns_serve_with(topo, host, root, token, advertise, bin(), 7700)
}

/// [`ns_serve`] with the binary `exe`, on `port` (`advertise` names its port too).
pub fn ns_serve_with(
    topo: &dmover_netlab::Topology,
    host: &str,
    root: &Path,
    token: &Path,
    advertise: &str,
    exe: &str,
    port: u16,
) -> NsServer {
    let state = tempfile::Builder::new()
        .prefix("dmover-state-")
        .tempdir()
        .unwrap();
    let mut child = topo
        .host(host)
        .unwrap()
        .command(exe)
        .args(["serve", "--third-party", "--listen"])
        .arg(format!("0.0.0.0:{port}"))
        .arg("--root")
        .arg(root)
        .arg("--token-file")
        .arg(token)
        .arg("--state-dir")
        .arg(state.path())
        .args(["--tpc-address", advertise])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains(&format!(":{port}")), "{line:?}");
    NsServer {
        child,
        _state: state,
    }
}

/// Debian's chromium, if installed.
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// The DOM of the page at `url` after its scripts ran (3 s of virtual time), rendered
/// by `browser` headless with a profile under `dir`.
pub fn render_page(browser: &str, url: &str, dir: &Path) -> String {
    let profile = dir.join("chromium-profile");
    let started = std::time::Instant::now();
    let dom = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .output()
        .expect("running chromium");
    eprintln!("chromium rendered the page in {:?}", started.elapsed());
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

pub mod jobs;
