//! Remote access (`dmover_core::remote`): a server in this process on loopback, a tree
//! read in place through request-driven sessions and compared with the local bytes;
//! the cache, concurrent readers, a quiet spell longer than the idle limit, and a
//! server that dies or goes silent (through a TCP proxy this test controls).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmover_core::client::Client;
use dmover_core::remote::{Remote, RemoteOptions};
use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_proto::manifest::EntryKind;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const CHUNK: u32 = 64 << 10;

/// Deterministic bytes (an LCG), different per file.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

/// The files of the tree: big ones over several chunks with a partial last one, and
/// small ones that share chunks.
const FILES: &[(&str, usize)] = &[
    ("big", 3 * CHUNK as usize + 12_345),
    ("a", 100),
    ("b", 5_000),
    ("sub/mid", 70_000),
    ("sub/c", 1),
    ("sub/exact", CHUNK as usize),
    ("empty", 0),
    ("z", 40_000),
];

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
    fn local(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.t.path().join("root/tree").join(rel)).unwrap()
    }

    fn client(&self, tune: impl FnOnce(&mut TransferOptions)) -> Client {
        let mut opts = TransferOptions {
            trust: Some(dmover_net::tls::Trust::KnownHosts(self.known_hosts())),
            chunk_size: CHUNK,
            streams: 2,
            ..TransferOptions::default()
        };
        tune(&mut opts);
        Client::new(opts, 1)
    }

    fn known_hosts(&self) -> PathBuf {
        self.t.path().join("known_hosts")
    }
}

async fn setup() -> Setup {
    setup_with(|_| {}).await
}

async fn setup_with(tune: impl FnOnce(&mut ServerConfig)) -> Setup {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    for (i, (name, n)) in FILES.iter().enumerate() {
        let p = root.join("tree").join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes(i as u64, *n)).unwrap();
    }
    let mut cfg = ServerConfig::new(&root);
    // Two sessions at once (a 64 KiB buffer counts as 1 MiB of the budget).
    cfg.memory_budget = 8 << 30;
    tune(&mut cfg);
    let srv = Server::new(cfg).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move { srv.serve(l, s).await });
    Setup { t, addr, stop }
}

/// A TCP proxy in front of the server: `kill` drops every connection, `freeze` stops
/// moving bytes and keeps the connections open (a silent server).
struct Proxy {
    addr: String,
    kill: CancellationToken,
    freeze: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill.cancel();
    }
}

async fn proxy(target: String) -> Proxy {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (kill, freeze) = (CancellationToken::new(), CancellationToken::new());
    let (k, f) = (kill.clone(), freeze.clone());
    tokio::spawn(async move {
        loop {
            let (mut c, _) = tokio::select! {
                _ = k.cancelled() => return,
                r = l.accept() => r.unwrap(),
            };
            let (k, f, target) = (k.clone(), f.clone(), target.clone());
            tokio::spawn(async move {
                let Ok(mut s) = TcpStream::connect(&target).await else {
                    return;
                };
                tokio::select! {
                    _ = k.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut c, &mut s) => {}
                    // Frozen: nothing moves, the connections stay open.
                    _ = f.cancelled() => k.cancelled().await,
                }
            });
        }
    });
    Proxy { addr, kill, freeze }
}

/// Reads of `len` at `off` of `rel` through `r` equal the local bytes.
async fn check(r: &Remote, s: &Setup, rel: &str, off: u64, len: u64) {
    let e = r.lookup(&format!("tree/{rel}")).unwrap();
    let local = s.local(rel);
    let got = r.read_at(e, off, len).await.unwrap();
    let from = (off as usize).min(local.len());
    let to = (off.saturating_add(len) as usize).min(local.len());
    assert_eq!(got.len(), to - from, "{rel} at {off}+{len}");
    assert!(got == local[from..to], "{rel} at {off}+{len}: bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_reads_of_a_tree_equal_the_local_bytes() {
    let s = setup().await;
    let c = s.client(|_| {});
    let r = Remote::open(&c, &s.addr, b"tree").await.unwrap();
    // The manifest: stat and list.
    let root = r.lookup("tree").unwrap();
    assert_eq!(r.roots(), &[root]);
    assert!(matches!(r.stat(root).unwrap().kind, EntryKind::Dir));
    let mut names: Vec<String> = r
        .list(root)
        .iter()
        .map(|&i| String::from_utf8_lossy(&r.stat(i).unwrap().name).into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b", "big", "empty", "sub", "z"]);
    for (name, n) in FILES {
        let e = r.lookup(&format!("tree/{name}")).unwrap();
        assert_eq!(r.stat(e).unwrap().file_size(), *n as u64, "{name}");
        assert_eq!(r.path(e), format!("tree/{name}"));
    }
    assert!(r.lookup("tree/nope").is_none());
    // Whole files, ranges across chunk boundaries, the last partial chunk, past the end.
    let cs = u64::from(CHUNK);
    for (name, _) in FILES {
        check(&r, &s, name, 0, u64::MAX).await;
    }
    let r2 = Remote::open_with(
        &c,
        &s.addr,
        b"tree",
        RemoteOptions {
            cache_bytes: 2 * cs,
            read_ahead: 0,
        },
    )
    .await
    .unwrap();
    for (off, len) in [
        (cs - 10, 20),
        (2 * cs - 1, cs + 2),
        (3 * cs, 12_345),
        (3 * cs + 12_000, 10_000),
        (3 * cs + 12_345, 1),
        (0, 1),
        (17, 3 * cs),
    ] {
        check(&r2, &s, "big", off, len).await;
    }
    // Random ranges of random files, through a cache of two chunks (evictions).
    let mut x = 12345u64;
    let mut next = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        x >> 20
    };
    for _ in 0..150 {
        let (name, n) = FILES[(next() % FILES.len() as u64) as usize];
        let off = next() % (n as u64 + 10);
        let len = next() % (cs + 5000);
        check(&r2, &s, name, off, len).await;
    }
    let st = r2.stats();
    assert!(st.evicted > 0, "{st:?}");
    assert!(
        st.parts_wanted > 10 && st.parts_received == st.parts_wanted,
        "{st:?}"
    );
    // Concurrent readers of one session.
    let r = Arc::new(r);
    let s = Arc::new(s);
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (r, s) = (r.clone(), s.clone());
        tasks.push(tokio::spawn(async move {
            let mut x = t + 1;
            for _ in 0..40 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                let (name, n) = FILES[((x >> 33) % FILES.len() as u64) as usize];
                let off = (x >> 13) % (n as u64 + 1);
                check(&r, &s, name, off, 3 * cs / 2).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(r).unwrap().close().await.unwrap();
    r2.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_read_costs_no_request() {
    let s = setup().await;
    let c = s.client(|_| {});
    let opts = RemoteOptions {
        read_ahead: 0,
        ..RemoteOptions::default()
    };
    // One file opened by itself: the manifest is that file.
    let r = Remote::open_with(&c, &s.addr, b"tree/big", opts)
        .await
        .unwrap();
    let e = r.lookup("big").unwrap();
    assert_eq!(r.roots(), &[e]);
    let cs = u64::from(CHUNK);
    let local = s.local("big");
    // A small read that is not sequential asks for its bytes alone: a part of each
    // chunk it touches (feature PARTS).
    let first = r.read_at(e, cs - 100, 200).await.unwrap();
    assert_eq!(first, local[cs as usize - 100..cs as usize + 100]);
    let st = r.stats();
    assert_eq!(
        (
            st.requests,
            st.chunks_wanted,
            st.parts_wanted,
            st.parts_received
        ),
        (1, 0, 2, 2)
    );
    for _ in 0..3 {
        assert_eq!(r.read_at(e, cs - 100, 200).await.unwrap(), first);
        assert_eq!(r.read_at(e, cs, 50).await.unwrap(), first[100..150]);
    }
    let st = r.stats();
    assert_eq!((st.requests, st.parts_wanted), (1, 2));
    assert_eq!(st.cache_hits, 3 * 3);
    // A read of over half a chunk asks for the chunk, which is kept too.
    let big = r.read_at(e, 2 * cs + 5, cs / 2 + 100).await.unwrap();
    assert_eq!(
        big,
        local[2 * cs as usize + 5..2 * cs as usize + 5 + cs as usize / 2 + 100]
    );
    for _ in 0..2 {
        assert_eq!(r.read_at(e, 2 * cs + 5, cs / 2 + 100).await.unwrap(), big);
        assert_eq!(
            r.read_at(e, 2 * cs + 1000, 10).await.unwrap(),
            big[995..1005]
        );
    }
    let st = r.stats();
    assert_eq!(
        (
            st.requests,
            st.chunks_wanted,
            st.chunks_received,
            st.parts_wanted
        ),
        (2, 1, 1, 2)
    );
    assert_eq!(st.cache_hits, 3 * 3 + 2 * 2);
    r.close().await.unwrap();

    // Read-ahead: a sequential read of chunk 0 also asks for the next ones, and the
    // reads of those cost no request of their own.
    let opts = RemoteOptions {
        read_ahead: 2,
        ..RemoteOptions::default()
    };
    let r = Remote::open_with(&c, &s.addr, b"tree/big", opts)
        .await
        .unwrap();
    let a = r.read_at(e, 0, cs).await.unwrap();
    assert_eq!(r.stats().chunks_wanted, 3);
    let b = r.read_at(e, cs, cs).await.unwrap();
    assert_eq!(a, local[..cs as usize]);
    assert_eq!(b, local[cs as usize..2 * cs as usize]);
    // The second read found chunk 1 in the cache or on its way; it asked only for
    // chunk 3 (read-ahead within the file's four chunks).
    let st = r.stats();
    assert_eq!((st.requests, st.chunks_wanted), (2, 4));
    r.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_spell_longer_than_the_idle_limit_keeps_the_session() {
    let s = setup().await;
    // An idle limit of 2 s: short enough for a quick test, long enough for a loaded
    // machine to answer a request within it.
    let c = s.client(|o| o.idle_timeout = Duration::from_secs(2));
    let r = Remote::open(&c, &s.addr, b"tree").await.unwrap();
    check(&r, &s, "a", 0, 100).await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    check(&r, &s, "big", 70_000, 100_000).await;
    r.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_reads_within_the_bound() {
    let s = setup().await;
    let p = proxy(s.addr.clone()).await;
    let c = s.client(|o| o.heartbeat = Duration::from_millis(250));
    let r = Remote::open(&c, &p.addr, b"tree").await.unwrap();
    let bound = r.bound();
    assert_eq!(bound, Duration::from_secs(3));
    check(&r, &s, "b", 0, 5000).await;
    p.kill.cancel();
    let t = Instant::now();
    let e = r.read_at(r.lookup("tree/big").unwrap(), 0, 10).await;
    assert!(e.is_err(), "a read after the server died");
    assert!(
        t.elapsed() <= bound + Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
    // Later reads fail at once, cached or not; close reports the failure.
    let t = Instant::now();
    assert!(r.read_at(r.lookup("tree/b").unwrap(), 0, 10).await.is_err());
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(r.close().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_fails_a_waiting_read_within_the_bound() {
    let s = setup().await;
    let p = proxy(s.addr.clone()).await;
    let c = s.client(|o| o.heartbeat = Duration::from_millis(250));
    let r = Remote::open(&c, &p.addr, b"tree").await.unwrap();
    let bound = r.bound();
    check(&r, &s, "a", 0, 100).await;
    p.freeze.cancel();
    let t = Instant::now();
    // Chunk 1 of the big file: no read asked for it or anything near.
    let big = r.lookup("tree/big").unwrap();
    let e = r.read_at(big, u64::from(CHUNK), 10).await.unwrap_err();
    let took = t.elapsed();
    assert!(took <= bound + Duration::from_secs(3), "{took:?}: {e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_in_deletes_one_tree_and_gives_the_mtime_back() {
    let s = setup().await;
    let c = s.client(|_| {});
    let root = s.t.path().join("root");
    // `tree` holds the user's files; `tree/bench` a tree to remove, `tree/bench2` a
    // sibling whose name starts the same.
    for p in ["bench/r/x", "bench/w/y", "bench2/keep"] {
        let p = root.join("tree").join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"data").unwrap();
    }
    let mtime = c.dir_mtime(&s.addr, b"tree").await.unwrap();
    let before: Vec<_> = {
        let mut v: Vec<_> = std::fs::read_dir(root.join("tree"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        c.remove_in(&s.addr, b"tree", b"bench", mtime)
            .await
            .unwrap(),
        5
    );
    assert!(!root.join("tree/bench").exists());
    assert!(root.join("tree/bench2/keep").exists());
    for (name, _) in FILES {
        assert!(root.join("tree").join(name).exists(), "{name} was deleted");
    }
    let mut after: Vec<_> = std::fs::read_dir(root.join("tree"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    after.sort();
    assert_eq!(after.len() + 1, before.len());
    assert_eq!(c.dir_mtime(&s.addr, b"tree").await.unwrap(), mtime);
    // Nothing there: nothing to do. Names that are not one component: refused; a
    // pattern's characters are the name's own (nothing is named so: nothing goes).
    assert_eq!(
        c.remove_in(&s.addr, b"tree", b"bench", mtime)
            .await
            .unwrap(),
        0
    );
    for bad in [&b""[..], b".", b"..", b"sub/c"] {
        assert!(
            c.remove_in(&s.addr, b"tree", bad, mtime).await.is_err(),
            "{bad:?}"
        );
    }
    for literal in [&b"*"[..], b"b?", b"[ab]", b"\\b"] {
        assert_eq!(
            c.remove_in(&s.addr, b"tree", literal, mtime).await.unwrap(),
            0,
            "{literal:?}"
        );
    }
    assert!(root.join("tree/sub/c").exists() && root.join("tree/b").exists());
    // In the export's root too (a prune of the root that names one entry), nothing
    // else there goes; a file is not a directory.
    std::fs::create_dir(root.join("gone")).unwrap();
    std::fs::write(root.join("gone/f"), b"x").unwrap();
    assert_eq!(c.remove_in(&s.addr, b"", b"gone", mtime).await.unwrap(), 2);
    assert!(!root.join("gone").exists());
    assert!(root.join("tree/big").exists());
    assert!(c.dir_mtime(&s.addr, b"tree/big").await.is_err());
}

/// `Client::rename_remote` (`Op::Rename`): rename(2) on the server, an existing file
/// replaced, a non-empty directory not; both paths confined beneath the export (`..`,
/// absolute paths and a symlink leading out refused, nothing moved); staging names
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_remote_renames_within_the_export_only() {
    let s = setup().await;
    let c = s.client(|_| {});
    let root = s.t.path().join("root");
    let tree = root.join("tree");
    let outside = s.t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, tree.join("out")).unwrap();
    std::os::unix::fs::symlink("../../outside", tree.join("out-rel")).unwrap();
    std::fs::write(tree.join(".dmv.0123.x"), b"staging").unwrap();
    // A file, over an existing one, into another directory, and a directory.
    let a = std::fs::read(tree.join("a")).unwrap();
    c.rename_remote(&s.addr, b"tree/a", b"tree/b")
        .await
        .unwrap();
    assert!(!tree.join("a").exists());
    assert_eq!(std::fs::read(tree.join("b")).unwrap(), a);
    c.rename_remote(&s.addr, b"tree/b", b"tree/sub/b2")
        .await
        .unwrap();
    assert_eq!(std::fs::read(tree.join("sub/b2")).unwrap(), a);
    c.rename_remote(&s.addr, b"tree/sub", b"tree/sub-moved")
        .await
        .unwrap();
    assert_eq!(std::fs::read(tree.join("sub-moved/b2")).unwrap(), a);
    // A missing source; a non-empty directory as the target.
    let e = c
        .rename_remote(&s.addr, b"tree/nothing", b"tree/x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), dmover_proto::control::ErrorCode::NotFound, "{e}");
    std::fs::create_dir(tree.join("full")).unwrap();
    std::fs::write(tree.join("full/f"), b"f").unwrap();
    std::fs::create_dir(tree.join("emptied")).unwrap();
    assert!(
        c.rename_remote(&s.addr, b"tree/emptied", b"tree/full")
            .await
            .is_err()
    );
    assert!(tree.join("full/f").exists() && tree.join("emptied").exists());
    // Escapes: nothing moves, nothing appears outside.
    for (from, to) in [
        (&b"tree/z"[..], &b"tree/../z"[..]),
        (b"tree/z", b"../z"),
        (b"tree/z", b"/tmp/z"),
        (b"/etc/hostname", b"tree/hostname"),
        (b"tree/z", b"tree/out/z"),
        (b"tree/z", b"tree/out-rel/z"),
        (b"tree/out/z", b"tree/z2"),
        (b"tree/.dmv.0123.x", b"tree/y"),
        (b"tree/z", b"tree/.dmv.0123.z"),
        (b"tree/z", b""),
        (b"", b"tree/r"),
    ] {
        let e = c.rename_remote(&s.addr, from, to).await.unwrap_err();
        let code = e.code();
        assert!(
            matches!(
                code,
                dmover_proto::control::ErrorCode::PathEscape
                    | dmover_proto::control::ErrorCode::PermissionDenied
            ),
            "{from:?} -> {to:?}: {code:?} {e}"
        );
        assert!(tree.join("z").exists(), "{from:?} -> {to:?} moved it");
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    assert!(tree.join(".dmv.0123.x").exists());
}

/// A read-only server refuses `rename_remote` and `remove_entry` before touching
/// anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_refuses_renames_and_removals() {
    let s = setup_with(|cfg| cfg.read_only = true).await;
    let c = s.client(|_| {});
    let tree = s.t.path().join("root/tree");
    let e = c
        .rename_remote(&s.addr, b"tree/a", b"tree/b")
        .await
        .unwrap_err();
    assert_eq!(e.code(), dmover_proto::control::ErrorCode::ReadOnly, "{e}");
    let e = c.remove_entry(&s.addr, b"tree/a", false).await.unwrap_err();
    assert_eq!(e.code(), dmover_proto::control::ErrorCode::ReadOnly, "{e}");
    assert!(tree.join("a").exists() && tree.join("b").exists());
}

/// `Client::remove_entry`: unlink(2) and rmdir(2) of one entry, with their errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_entry_removes_one_entry_as_unlink_and_rmdir() {
    let s = setup().await;
    let c = s.client(|_| {});
    let tree = s.t.path().join("root/tree");
    std::fs::create_dir(tree.join("e")).unwrap();
    let errno = |e: dmover_core::Error| {
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(x) = src {
            if let Some(n) = x
                .downcast_ref::<std::io::Error>()
                .and_then(|i| i.raw_os_error())
            {
                return Some(n);
            }
            src = x.source();
        }
        None
    };
    c.remove_entry(&s.addr, b"tree/a", false).await.unwrap();
    assert!(!tree.join("a").exists() && tree.join("b").exists());
    let e = c.remove_entry(&s.addr, b"tree/a", false).await.unwrap_err();
    assert_eq!(e.code(), dmover_proto::control::ErrorCode::NotFound, "{e}");
    let e = c
        .remove_entry(&s.addr, b"tree/sub", false)
        .await
        .unwrap_err();
    assert_eq!(errno(e), Some(libc::EISDIR));
    let e = c
        .remove_entry(&s.addr, b"tree/sub", true)
        .await
        .unwrap_err();
    assert_eq!(errno(e), Some(libc::ENOTEMPTY));
    let e = c.remove_entry(&s.addr, b"tree/b", true).await.unwrap_err();
    assert_eq!(errno(e), Some(libc::ENOTDIR));
    assert!(tree.join("sub/c").exists() && tree.join("b").exists());
    c.remove_entry(&s.addr, b"tree/e", true).await.unwrap();
    assert!(!tree.join("e").exists());
    // Entries directly in the export's root: one named entry goes, nothing else.
    let root = s.t.path().join("root");
    std::fs::write(root.join("top"), b"x").unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    let e = c.remove_entry(&s.addr, b"tree", true).await.unwrap_err();
    assert_eq!(errno(e), Some(libc::ENOTEMPTY));
    c.remove_entry(&s.addr, b"top", false).await.unwrap();
    c.remove_entry(&s.addr, b"empty", true).await.unwrap();
    assert!(!root.join("top").exists() && !root.join("empty").exists());
    assert!(tree.join("b").exists() && tree.join("sub/c").exists());
}

/// `StagedFile`: written at any offsets, uploaded whole (and again after more writes,
/// replacing the server's file), an existing file fetched into one and rewritten; no
/// staging file left on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_file_is_uploaded_whole() {
    use dmover_core::remote::StagedFile;
    let s = setup().await;
    let c = s.client(|_| {});
    let tree = s.t.path().join("root/tree");
    let local = tempfile::tempdir().unwrap();
    let f = StagedFile::create(local.path(), &s.addr, b"tree/new", 0o640).unwrap();
    f.write_at(b"world", 6).unwrap();
    f.write_at(b"hello ", 0).unwrap();
    assert!(!tree.join("new").exists(), "before the upload");
    f.upload(&c, dmover_core::engine::Run::new()).await.unwrap();
    assert_eq!(std::fs::read(tree.join("new")).unwrap(), b"hello world");
    f.write_at(b"!", 11).unwrap();
    f.close(&c).await.unwrap();
    assert_eq!(std::fs::read(tree.join("new")).unwrap(), b"hello world!");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tree.join("new"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o640);
    }
    // Rewrite an existing file: fetched, patched, uploaded over it.
    let r = Remote::open(&c, &s.addr, b"tree").await.unwrap();
    let big = r.lookup("tree/big").unwrap();
    let len = r.stat(big).unwrap().file_size();
    let f = StagedFile::create(local.path(), &s.addr, b"tree/big", 0o644).unwrap();
    f.fetch(&r, big, len, Duration::from_secs(30))
        .await
        .unwrap();
    f.write_at(b"PATCH", 100).unwrap();
    f.close(&c).await.unwrap();
    let _ = r.close().await;
    let mut want = bytes(0, FILES[0].1);
    want[100..105].copy_from_slice(b"PATCH");
    assert_eq!(std::fs::read(tree.join("big")).unwrap(), want);
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
    let staged: Vec<_> = std::fs::read_dir(&tree)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".dmv."))
        .collect();
    assert!(staged.is_empty(), "{staged:?}");
}

/// A name holding a pattern's characters is removed alone (the prune's patterns escape
/// them): its look-alikes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_wildcards_are_removed_alone() {
    let s = setup().await;
    let dir = s.t.path().join("root/tree/odd");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["a*[1]?\\b", "ax1yb", "a\\b"] {
        std::fs::write(dir.join(name), b"x").unwrap();
    }
    let c = s.client(|_| {});
    c.remove_entry(&s.addr, b"tree/odd/a*[1]?\\b", false)
        .await
        .unwrap();
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["a\\b", "ax1yb"]);
    c.remove_entry(&s.addr, b"tree/odd/a\\b", false)
        .await
        .unwrap();
    assert!(!dir.join("a\\b").exists() && dir.join("ax1yb").exists());
}
