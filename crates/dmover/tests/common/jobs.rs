//! The job service as a process, for the tests: started, its URLs read from its
//! stdout, and driven with the CLI.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::bin;

/// A child process, killed (SIGKILL) and reaped when dropped.
pub struct Proc(pub Child);

impl Proc {
    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `c` (a `dmover serve` running the job service) started: the process, the job
/// service's URL (from its `dmover: jobs on URL` line) and the metrics' address (if
/// it has one).
pub fn service_on(c: &mut Command) -> (Proc, String, String) {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Proc(child);
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let mut metrics = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "no jobs line");
        if let Some(m) = line.trim().strip_prefix("dmover: metrics on http://") {
            metrics = m.trim_end_matches('/').to_string();
        }
        if let Some(url) = line.trim().strip_prefix("dmover: jobs on ") {
            // Keep reading stdout so the server never blocks on it.
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            return (child, url.to_string(), metrics);
        }
    }
}

/// C: `dmover serve --root ROOT --token-file TOKEN --jobs --metrics` with its state in
/// `state`, started ([`service_on`]).
pub fn start_service(root: &Path, token: &Path, state: &Path) -> (Proc, String, String) {
    service_on(&mut service(root, token, state))
}

/// `dmover serve --jobs` on loopback, exporting `root` to the token in `token`, its
/// state in `state`.
pub fn service(root: &Path, token: &Path, state: &Path) -> Command {
    let mut c = Command::new(bin());
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--jobs",
        "--metrics",
        "127.0.0.1:0",
        "--jobs-listen",
    ])
    .arg("127.0.0.1:0")
    .arg("--root")
    .arg(root)
    .arg("--token-file")
    .arg(token)
    .arg("--state-dir")
    .arg(state);
    c
}

/// `dmover ARGS` against `url` with the token in `token` (if any).
pub fn dm(url: &str, token: Option<&Path>, kh: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .args(["--service", url, "--known-hosts"])
        .arg(kh)
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_SERVICE");
    if let Some(t) = token {
        c.arg("--token-file").arg(t);
    }
    c.output().unwrap()
}

pub fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `dmover job ID --json` until `until` holds (at most 60 s).
pub fn wait(
    url: &str,
    token: &Path,
    kh: &Path,
    id: &str,
    until: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let j = json_of(&dm(url, Some(token), kh, &["job", id, "--json"]));
        if until(&j) {
            return j;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{j}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
