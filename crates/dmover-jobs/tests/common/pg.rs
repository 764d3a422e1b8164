//! A real PostgreSQL server for the tests (Debian's `postgresql` package): `initdb`
//! into a temporary directory and `postgres` on a loopback port, as the `postgres`
//! user when the tests run as root. A small shell supervises it: it stops the server
//! and deletes the directory when the test process ends, however it ends (its
//! standard input is the test process's pipe), and stops and starts it on request.
//!
//! Without PostgreSQL installed the tests that need it say so and pass, unless
//! `DMOVER_REQUIRE_POSTGRES` is set (CI sets it, and installs the package).

#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One PostgreSQL server.
pub struct PgServer {
    pub port: u16,
    bin: PathBuf,
    control: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    _child: Child,
}

/// The directory of PostgreSQL's programs: `DMOVER_PG_BIN`, else Debian's newest
/// `/usr/lib/postgresql/N/bin`, else `postgres` on the PATH.
fn bin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DMOVER_PG_BIN") {
        return Some(PathBuf::from(d));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    if let Some((_, b)) = found.pop() {
        return Some(b);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("postgres").exists() && d.join("initdb").exists())
    })
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `prog` from `bin` as PostgreSQL's own user (when root; PostgreSQL refuses root).
fn as_pg(bin: &Path, prog: &str) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(bin.join(prog));
        c
    } else {
        Command::new(bin.join(prog))
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Why there is no server: skipped (said on stderr), or a failure when one is
/// required.
fn unavailable(why: &str) -> Option<PgServer> {
    assert!(
        std::env::var_os("DMOVER_REQUIRE_POSTGRES").is_none(),
        "PostgreSQL is required (DMOVER_REQUIRE_POSTGRES) but {why}"
    );
    eprintln!("skipped: {why} (Debian: apt-get install postgresql)");
    None
}

impl PgServer {
    /// A new server of this test's own (stopped and deleted when it is dropped or
    /// the process ends), or `None` where PostgreSQL is not installed.
    pub fn start() -> Option<PgServer> {
        PgServer::start_with(&[])
    }

    /// [`PgServer::start`] with more settings (`-c NAME=VALUE` each).
    pub fn start_with(settings: &[(&str, &str)]) -> Option<PgServer> {
        let Some(bin) = bin_dir() else {
            return unavailable("PostgreSQL is not installed");
        };
        let root = tempfile::Builder::new()
            .prefix("dmover-pg-")
            .tempdir()
            .unwrap()
            .keep();
        let data = root.join("data");
        if is_root() {
            std::os::unix::fs::chown(&root, Some(pg_uid()), None).unwrap();
        }
        // In the directory: the test's own may be closed to PostgreSQL's user.
        let out = as_pg(&bin, "initdb")
            .current_dir(&root)
            .arg("-D")
            .arg(&data)
            .args(["-U", "dmover", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .unwrap();
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&root);
            return unavailable(&format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port = free_port();
        // Test settings: no fsync (the tests do not test PostgreSQL's durability),
        // the socket in the directory, loopback only.
        let mut postgres = format!("'{}'", bin.join("postgres").display());
        if is_root() {
            postgres =
                format!("setpriv --reuid=postgres --regid=postgres --init-groups -- {postgres}");
        }
        let extra: String = settings
            .iter()
            .map(|(k, v)| format!(" -c '{k}={v}'"))
            .collect();
        let script = format!(
            "root=\"$1\"
             run() {{ {postgres} -D \"$root/data\" -p {port} -k \"$root\" \
               -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200{extra} \
               >>\"$root/log\" 2>&1 & pid=$!; }}
             run
             while read cmd; do
               case $cmd in
                 stop) kill -INT $pid; wait $pid; echo stopped;;
                 start) run; echo started;;
               esac
             done
             kill -INT $pid 2>/dev/null; wait $pid; rm -rf \"$root\""
        );
        let mut child = Command::new("sh")
            .current_dir(&root)
            .args(["-c", &script, "sh"])
            .arg(&root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let control = (
            child.stdin.take().unwrap(),
            BufReader::new(child.stdout.take().unwrap()),
        );
        let s = PgServer {
            port,
            bin,
            control: Mutex::new(control),
            _child: child,
        };
        s.wait_ready(&root);
        Some(s)
    }

    /// The server of this test binary (started once), or `None` without PostgreSQL.
    pub fn shared() -> Option<&'static PgServer> {
        static PG: OnceLock<Option<PgServer>> = OnceLock::new();
        PG.get_or_init(PgServer::start).as_ref()
    }

    /// A URL for user `dmover` on database `postgres`.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=dmover dbname=postgres connect_timeout=5",
            self.port
        )
    }

    fn wait_ready(&self, root: &Path) {
        let t = Instant::now();
        loop {
            let ok = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "PostgreSQL did not start: {}",
                std::fs::read_to_string(root.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn say(&self, cmd: &str, answer: &str) {
        let mut c = self.control.lock().unwrap();
        writeln!(c.0, "{cmd}").unwrap();
        c.0.flush().unwrap();
        let mut line = String::new();
        c.1.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), answer);
    }

    /// Stops the server (a fast shutdown: connections are closed).
    pub fn stop(&self) {
        self.say("stop", "stopped");
    }

    /// Starts it again and waits until it accepts connections.
    pub fn restart(&self) {
        self.say("start", "started");
        let t = Instant::now();
        while !Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "PostgreSQL did not restart"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn pg_uid() -> u32 {
    let out = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

impl PgServer {
    /// The URL form (`postgres://dmover@127.0.0.1:PORT/postgres`), as a config file
    /// names it.
    pub fn postgres_url(&self) -> String {
        format!("postgres://dmover@127.0.0.1:{}/postgres", self.port)
    }
}
