//! Two dmover servers in this process on loopback (A holds the data, B receives it),
//! a job store in a temporary state directory and a job service over them.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmover_core::access::User;
use dmover_core::server::{Faults, Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_jobs::api::{Api, Auth, router, serve};
use dmover_jobs::model::{Job, JobId, JobOptions, JobSpec, State};
use dmover_jobs::runner::{RunnerConfig, Service};
use dmover_jobs::store::{JobStore, SqliteStore};
use tokio_util::sync::CancellationToken;

/// The servers, their runtime and the temporary directory.
pub struct Lab {
    pub dir: tempfile::TempDir,
    pub a: String,
    pub b: String,
    pub a_root: PathBuf,
    pub b_root: PathBuf,
    pub rt: tokio::runtime::Runtime,
    stop: CancellationToken,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `seed`'s bytes, `len` of them, pseudo-random.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

impl Lab {
    /// Servers A and B; every chunk A reads waits `a_delay` (a run that lasts).
    pub fn new(a_delay: Option<Duration>) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let (a_root, b_root) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(a_root.join("data")).unwrap();
        // The jobs copy into B's directory `in`.
        std::fs::create_dir_all(b_root.join("in")).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stop = CancellationToken::new();
        let start = |root: &Path, delay: Option<Duration>| {
            let mut cfg = ServerConfig::new(root);
            cfg.exports[0].third_party = true;
            (cfg.io_threads, cfg.io_threads_max) = (2, 2);
            let faults = Faults {
                chunk_delay: delay,
                ..Faults::default()
            };
            let server = Server::with_faults(cfg, faults).unwrap();
            let stop = stop.clone();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = l.local_addr().unwrap().to_string();
                tokio::spawn(async move { server.serve(l, stop).await });
                addr
            })
        };
        let a = start(&a_root, a_delay);
        let b = start(&b_root, None);
        Lab {
            dir,
            a,
            b,
            a_root,
            b_root,
            rt,
            stop,
        }
    }

    /// The job database's path.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("state/jobs.sqlite")
    }

    /// The runner's settings for tests: quick retries, frequent progress.
    pub fn runner_config(&self) -> RunnerConfig {
        RunnerConfig {
            concurrency: 2,
            retries: 2,
            retry_wait: Duration::from_millis(50),
            max_retry_wait: Duration::from_millis(200),
            deadline: Duration::from_secs(120),
            options: TransferOptions {
                trust: Some(dmover_net::tls::Trust::KnownHosts(
                    self.dir.path().join("state/known_hosts"),
                )),
                chunk_size: 64 << 10,
                streams: 2,
                ..TransferOptions::default()
            },
            progress_interval: Duration::from_millis(20),
            disk_threads: Some(1),
            ..RunnerConfig::default()
        }
    }

    /// A job copying `sources` (paths on A) into `dest` on B.
    pub fn spec(&self, sources: &[&str], dest: &str) -> JobSpec {
        JobSpec {
            sources: sources
                .iter()
                .map(|s| format!("dmover://{}/{s}", self.a))
                .collect(),
            destination: format!("dmover://{}/{dest}", self.b),
            options: JobOptions::default(),
        }
    }
}

/// A job service running on a runtime of its own (so that a test can drop it whole,
/// as a crash would).
pub struct Running {
    pub service: Arc<Service>,
    pub rt: tokio::runtime::Runtime,
    pub stop: CancellationToken,
}

impl Running {
    /// Opens the store at `db` and starts the service.
    pub fn start(db: &Path, cfg: RunnerConfig) -> Running {
        Running::with_store(Arc::new(SqliteStore::open(db).unwrap()), cfg)
    }

    /// Starts the service on `store`.
    pub fn with_store(store: Arc<dyn JobStore>, cfg: RunnerConfig) -> Running {
        let service = Service::new(store, cfg);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stop = CancellationToken::new();
        rt.spawn(service.clone().run(stop.clone()));
        Running { service, rt, stop }
    }

    /// Polls job `id` until `until` holds (at most 60 s).
    pub fn wait(&self, id: JobId, what: &str, until: impl Fn(&Job) -> bool) -> Job {
        let t = Instant::now();
        loop {
            let j = self.service.store().get(id).unwrap();
            if until(&j) {
                return j;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "{what}: {j:#?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Polls job `id` until it has ended.
    pub fn wait_end(&self, id: JobId) -> Job {
        self.wait(id, "the job's end", |j| j.state.is_end())
    }

    /// Stops the service as a crash would: its runtime dropped at once, nothing
    /// recorded; returns when its store is closed.
    pub fn crash(self) {
        let Running { service, rt, stop } = self;
        drop(stop);
        rt.shutdown_timeout(Duration::from_secs(10));
        drop(service);
    }

    /// Stops it cleanly.
    pub fn stop(self) {
        self.stop.cancel();
        self.rt.shutdown_timeout(Duration::from_secs(10));
    }
}

/// Files below `dir` whose names start `.dmv.` (staging files, journals).
pub fn staging(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().starts_with(".dmv.") {
                out.push(e.path());
            }
        }
    }
    out
}

/// Whether a job is done.
pub fn done(j: &Job) -> bool {
    j.state == State::Done
}

/// A user of the API's tests, with a token (a monitoring user with `metrics_only`).
pub fn user(name: &str, token: &str, metrics_only: bool) -> (String, User) {
    let u = User {
        name: name.into(),
        token: Some(dmover_proto::auth::token_keys(token.as_bytes()).verifier),
        keys: Vec::new(),
        exports: BTreeMap::new(),
        bwlimit: None,
        metrics_only,
    };
    (name.to_string(), u)
}

/// The API of `svc` on a loopback port (TLS with `tls`); its URL. Its users: alice,
/// bob and root (an admin) with tokens `NAME-token`, and mon, a monitoring user.
pub fn start_api(svc: &Running, tls: Option<tokio_rustls::TlsAcceptor>) -> String {
    let users = BTreeMap::from([
        user("alice", "alice-token", false),
        user("bob", "bob-token", false),
        user("root", "root-token", false),
        user("mon", "mon-token", true),
    ]);
    let api = Arc::new(Api {
        service: svc.service.clone(),
        auth: Arc::new(Auth::new(&users, &["root".to_string()])),
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let stop: CancellationToken = svc.stop.clone();
    svc.rt.block_on(async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(l, tls, router(api), stop));
        format!("{scheme}://{addr}")
    })
}

/// The body of an HTTP/1.1 answer sent with `Transfer-Encoding: chunked`, decoded.
pub fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            panic!("a chunk size line: {:?}", String::from_utf8_lossy(raw));
        };
        let size = std::str::from_utf8(&raw[..eol]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// `GET path` with `token` on a connection of its own, read to its end: the status,
/// the headers (names in lower case) and the body (decoded when chunked).
pub fn get_all(addr: &str, path: &str, token: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_answer(&raw)
}

/// An HTTP/1.1 answer read to its end: the status, the headers (names in lower case)
/// and the body (decoded when chunked).
pub fn parse_answer(raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an answer's head");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    (status, headers, body)
}

pub mod pg;
