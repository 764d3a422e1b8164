//! A push whose manifest grows while the session runs (`Client::push_growing`, what
//! `sync --watch` ships with): a server in this process on loopback, parts sent as
//! files appear at the source, each part's files complete under their final names at
//! the server as soon as the part is reported durable (while the session goes on),
//! one connection for all of it; and a session cancelled mid-way leaves nothing
//! partial under a final name.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dmover_core::client::{Client, Growing};
use dmover_core::engine::Run;
use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const CHUNK: u32 = 64 << 10;

/// Deterministic bytes (an LCG), different per seed.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

struct Setup {
    t: tempfile::TempDir,
    addr: String,
    stop: CancellationToken,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Setup {
    fn src(&self) -> PathBuf {
        self.t.path().join("src")
    }

    fn mirror(&self) -> PathBuf {
        self.t.path().join("export/mirror")
    }

    fn client(&self) -> Client {
        let opts = TransferOptions {
            trust: Some(dmover_net::tls::Trust::KnownHosts(
                self.t.path().join("known_hosts"),
            )),
            chunk_size: CHUNK,
            streams: 2,
            continue_on_error: true,
            ..TransferOptions::default()
        };
        Client::new(opts, 1)
    }

    /// A growing push of the source into `mirror`, and the run that cancels it.
    async fn open(&self) -> (std::sync::Arc<Run>, Growing) {
        let run = Run::new();
        let src = self.src().into_os_string().into_encoded_bytes();
        let g = self
            .client()
            .push_growing(&src, &self.addr, b"mirror", run.clone())
            .await
            .unwrap();
        (run, g)
    }

    fn write(&self, rel: &str, seed: u64, n: usize) {
        let p = self.src().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes(seed, n)).unwrap();
    }

    /// `rel` at the mirror is the source's file, byte for byte, with its mode and mtime.
    fn same(&self, rel: &str) {
        let (a, b) = (self.src().join(rel), self.mirror().join(rel));
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap_or_else(|e| panic!("{rel} at the mirror: {e}")),
            "{rel}"
        );
        let (ma, mb) = (a.metadata().unwrap(), b.metadata().unwrap());
        assert_eq!(ma.mtime(), mb.mtime(), "{rel}");
        assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "{rel}");
    }
}

async fn setup() -> Setup {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("export")).unwrap();
    std::fs::create_dir_all(t.path().join("src")).unwrap();
    let srv = Server::new(ServerConfig::new(t.path().join("export"))).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move { srv.serve(l, s).await });
    Setup { t, addr, stop }
}

/// Names under `dir` (recursively) that are staging files.
fn staging_left(dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return left;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".dmv.") {
            left.push(name);
        } else if e.file_type().unwrap().is_dir() {
            left.extend(staging_left(&e.path()));
        }
    }
    left
}

fn rels(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|s| s.as_bytes().to_vec()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_part_is_complete_at_the_server_when_reported_durable() {
    let s = setup().await;
    let (_run, mut g) = s.open().await;
    // Part 1: a file over several chunks with a partial last one, small files that
    // share a chunk, a file in a new directory.
    s.write("big", 1, 3 * CHUNK as usize + 777);
    s.write("a", 2, 100);
    s.write("b", 3, 5_000);
    s.write("d/e/f", 4, 70_000);
    let p = g.send(&rels(&["big", "a", "b", "d/e/f", "missing"]));
    assert_eq!(p.paths, rels(&["big", "a", "b", "d/e/f"]));
    assert_eq!(
        (p.files, p.bytes),
        (4, (3 * CHUNK + 777 + 100 + 5_000 + 70_000) as u64)
    );
    tokio::time::timeout(Duration::from_secs(20), p.durable)
        .await
        .expect("part 1 durable in time")
        .expect("the session goes on");
    for rel in ["big", "a", "b", "d/e/f"] {
        s.same(rel);
    }
    // A part's new directories take their mode (plus u+rwx) at once, not at the end.
    let mode = |p: PathBuf| p.metadata().unwrap().mode() & 0o777;
    assert_eq!(
        mode(s.mirror().join("d/e")),
        mode(s.src().join("d/e")) | 0o700
    );
    assert!(!g.ended(), "the session stays open between parts");
    assert!(g.has(b"big") && g.has(b"d/e") && !g.has(b"c"));
    // Part 2, a while later (the streams idle meanwhile): an empty file, a symlink, a
    // file in a directory of part 1, an empty directory, a file already sent (left out:
    // it needs a session of its own).
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.write("empty", 5, 0);
    std::os::unix::fs::symlink("d/e/f", s.src().join("link")).unwrap();
    s.write("d/g", 6, 4_000);
    std::fs::create_dir(s.src().join("hollow")).unwrap();
    std::fs::set_permissions(s.src().join("d/g"), std::fs::Permissions::from_mode(0o640)).unwrap();
    // Extended attributes travel with the part (where the file system takes them).
    let xattrs = rustix::fs::lsetxattr(
        s.src().join("d/g"),
        "user.dmover.test",
        b"part 2",
        rustix::fs::XattrFlags::empty(),
    )
    .is_ok();
    let p = g.send(&rels(&["empty", "link", "d/g", "hollow", "a"]));
    assert_eq!(p.paths, rels(&["empty", "link", "d/g", "hollow"]));
    tokio::time::timeout(Duration::from_secs(20), p.durable)
        .await
        .expect("part 2 durable in time")
        .expect("the session goes on");
    for rel in ["empty", "d/g"] {
        s.same(rel);
    }
    assert_eq!(
        std::fs::read_link(s.mirror().join("link")).unwrap(),
        Path::new("d/e/f")
    );
    assert!(s.mirror().join("hollow").is_dir());
    if xattrs {
        let mut v = [0u8; 16];
        let n = rustix::fs::lgetxattr(s.mirror().join("d/g"), "user.dmover.test", &mut v)
            .expect("the attribute arrived with the file");
        assert_eq!(&v[..n], b"part 2");
    }
    // A part of nothing new is answered too.
    let p = g.send(&rels(&["a"]));
    assert!(p.paths.is_empty());
    tokio::time::timeout(Duration::from_secs(20), p.durable)
        .await
        .unwrap()
        .unwrap();
    let r = g.finish().await.unwrap();
    assert_eq!(r.summary.files, 6, "{r:?}");
    assert_eq!(r.summary.symlinks, 1, "{r:?}");
    assert_eq!(
        r.bytes_sent,
        (3 * CHUNK + 777 + 100 + 5_000 + 70_000 + 4_000) as u64
    );
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    // The end gives directories their modes and mtimes; nothing is left behind.
    for d in ["", "d", "d/e", "hollow"] {
        let (a, b) = (s.src().join(d), s.mirror().join(d));
        let (ma, mb) = (a.metadata().unwrap(), b.metadata().unwrap());
        assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "dir {d:?}");
        assert_eq!(ma.mtime(), mb.mtime(), "dir {d:?}");
    }
    assert!(staging_left(&s.t.path().join("export")).is_empty());
    assert!(
        !std::fs::read_dir(s.t.path().join("export"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("journal")),
        "the journal is removed at the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_growing_session_leaves_nothing_partial() {
    let s = setup().await;
    let (run, mut g) = s.open().await;
    s.write("first", 1, 10_000);
    let p = g.send(&rels(&["first"]));
    tokio::time::timeout(Duration::from_secs(20), p.durable)
        .await
        .unwrap()
        .unwrap();
    // A large part, cancelled while it flows.
    for i in 0..8 {
        s.write(&format!("big{i}"), 10 + i, 8 << 20);
    }
    let names: Vec<String> = (0..8).map(|i| format!("big{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let p = g.send(&rels(&refs));
    tokio::time::sleep(Duration::from_millis(20)).await;
    run.fail(dmover_core::Error::Aborted);
    assert!(
        tokio::time::timeout(Duration::from_secs(20), p.durable)
            .await
            .expect("told in time")
            .is_err(),
        "a part of a failed session is never reported durable"
    );
    assert!(g.wait().await.is_err());
    s.same("first");
    // Whatever arrived of the large part is whole; the rest is not there at all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in &names {
        if s.mirror().join(n).exists() {
            s.same(n);
        }
    }
}
