//! Issue 46, item 6: what manifests may cost a server. Each session's manifest is
//! bounded (a push's by `max_manifest_bytes`, a pull's and digests' — the ops a
//! read-only user can run — by the smaller `max_manifest_bytes_read`), and all of them
//! together by `manifest_memory`; the validator's copy of the names is counted. Small
//! budgets here: a manifest beyond them is refused with an error naming the limit, and
//! an honest session works afterwards (the budget given back).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{TOKEN, answer, connect, good_auth, hello, open};
use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_core::transfer::{Endpoint, Transfer, TransferSpec, Watch};
use dmover_proto::control::{Control, Digests, ManifestEnd, ManifestPart, Op};
use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT, Totals, entry_bytes};
use tokio_util::sync::CancellationToken;

fn entry(parent: u32, name: Vec<u8>, kind: EntryKind) -> Entry {
    Entry {
        parent,
        name,
        kind,
        mode: 0o644,
        mtime: Mtime { sec: 0, nsec: 0 },
    }
}

/// A manifest of the directory `src` and `files` files with 200-byte names.
fn manifest(files: usize) -> Vec<Entry> {
    let mut v = vec![entry(NO_PARENT, b"src".to_vec(), EntryKind::Dir)];
    for i in 0..files {
        let mut name = format!("{i:08}").into_bytes();
        name.resize(200, b'n');
        v.push(entry(0, name, EntryKind::File { size: 1 }));
    }
    v
}

/// A server of `root` (holding `src/a`) for the token, with `tweak` applied.
fn server(root: &std::path::Path, tweak: impl FnOnce(&mut ServerConfig)) -> Arc<Server> {
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/a"), b"a").unwrap();
    let mut cfg = ServerConfig::new(root);
    cfg.io_threads = 1;
    cfg.shared_token(TOKEN);
    tweak(&mut cfg);
    Server::new(cfg).unwrap()
}

/// An in-memory session asking for the digests of `src` against `entries`, sent in
/// parts of 100 entries, with its `ManifestEnd` if `end`; the channel and the task.
async fn digests(
    server: Arc<Server>,
    entries: &[Entry],
    end: bool,
) -> (
    dmover_net::control::ControlChannel<tokio::io::DuplexStream>,
    tokio::task::JoinHandle<dmover_core::Result<()>>,
) {
    let (mut ch, task) = connect(server);
    let op = Op::Digests(Digests {
        source: b"src".to_vec(),
    });
    let options = Control::Options(TransferOptions::default().session_options(false));
    for m in [hello("budget".into()), good_auth(), open(op), options] {
        ch.send(&m).await.unwrap();
    }
    for part in entries.chunks(100) {
        let part = Control::Manifest(ManifestPart {
            entries: part.to_vec(),
        });
        // A refused manifest's session stops reading.
        if ch.send(&part).await.is_err() {
            return (ch, task);
        }
    }
    if end {
        let totals = Totals::of(entries);
        let _ = ch.send(&Control::ManifestEnd(ManifestEnd { totals })).await;
    }
    (ch, task)
}

/// The server's answer to a digests request: an error's message, or `Ok`.
async fn digests_answer(server: Arc<Server>, entries: &[Entry]) -> Result<(), String> {
    let (mut ch, task) = digests(server, entries, true).await;
    let a = answer(&mut ch).await;
    drop(ch);
    let _ = task.await;
    match a {
        Some(Control::Pruned(_)) => Ok(()),
        Some(Control::Error(e)) => Err(e.message),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// Waits until the server's manifests hold `at_least` (and at most `at_most`) bytes.
async fn held(server: &Server, at_least: u64, at_most: u64) -> u64 {
    let waited = tokio::time::Instant::now();
    loop {
        let n = server.manifest_memory_in_use();
        if n >= at_least && n <= at_most {
            return n;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "manifests hold {n} bytes, not {at_least}..={at_most}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The validator's copy of the names is part of what an entry costs.
#[test]
fn an_entrys_cost_counts_its_name_twice() {
    let e = &manifest(1)[1];
    let fixed = std::mem::size_of::<Entry>() as u64;
    assert!(entry_bytes(e) >= fixed + 2 * 200, "{}", entry_bytes(e));
}

/// A read-only op's manifest (digests) beyond `max_manifest_bytes_read` is refused,
/// naming the limit, although it is far below a push's limit; a small one is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_beyond_the_read_limit_are_refused_and_a_small_request_is_answered() {
    let t = tempfile::tempdir().unwrap();
    let srv = server(t.path(), |c| c.max_manifest_bytes_read = 64 << 10);
    // About 1000 × 500 bytes: 0.5 MiB.
    let e = digests_answer(srv.clone(), &manifest(1000))
        .await
        .unwrap_err();
    assert!(e.contains("max_manifest_bytes_read"), "{e}");
    held(&srv, 0, 0).await;
    digests_answer(srv.clone(), &manifest(3)).await.unwrap();
    held(&srv, 0, 0).await;
}

/// `manifest_memory` bounds all sessions' manifests together: while one session holds
/// most of it, another's manifest that does not fit beside it is refused as busy,
/// saying so; once the first ends its share is given back and the second is answered.
/// A manifest larger than the whole budget is refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_manifest_memory_is_shared_and_given_back() {
    let t = tempfile::tempdir().unwrap();
    let srv = server(t.path(), |c| {
        c.manifest_memory = 1 << 20;
        c.max_manifest_bytes_read = 64 << 20;
    });
    let big = manifest(1500); // about 0.75 MiB
    let half = manifest(1200); // about 0.6 MiB
    let big_bytes: u64 = big.iter().map(entry_bytes).sum();
    assert!(big_bytes > 700 << 10 && big_bytes < 1 << 20, "{big_bytes}");
    // The first session sends its manifest and waits (no ManifestEnd).
    let (first, first_task) = digests(srv.clone(), &big, false).await;
    held(&srv, big_bytes, big_bytes).await;
    let e = digests_answer(srv.clone(), &half).await.unwrap_err();
    assert!(e.contains("in use by other sessions"), "{e}");
    assert!(e.contains("manifest_memory"), "{e}");
    // The refused session gave back what it had taken.
    held(&srv, big_bytes, big_bytes).await;
    drop(first);
    let _ = first_task.await;
    held(&srv, 0, 0).await;
    digests_answer(srv.clone(), &half).await.unwrap();
    // Larger than the whole budget.
    let e = digests_answer(srv.clone(), &manifest(2500))
        .await
        .unwrap_err();
    assert!(e.contains("more than this server's manifest memory"), "{e}");
    held(&srv, 0, 0).await;
    digests_answer(srv.clone(), &manifest(3)).await.unwrap();
}

/// On a real server over loopback: a push whose manifest does not fit the server's
/// manifest memory fails with the server's reason, and so does a pull whose walk is
/// beyond `max_manifest_bytes_read`; a small push and a small pull then work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_and_pulls_beyond_the_budgets_fail_clearly_and_small_ones_work() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let stop = CancellationToken::new();
    let mut cfg = ServerConfig::new(&root);
    cfg.manifest_memory = 256 << 10;
    cfg.max_manifest_bytes_read = 128 << 10;
    std::fs::create_dir_all(root.join("many")).unwrap();
    std::fs::create_dir_all(root.join("few")).unwrap();
    std::fs::create_dir_all(root.join("in")).unwrap();
    for i in 0..2000 {
        std::fs::write(
            root.join(format!("many/file-with-a-longish-name-{i:05}")),
            b"x",
        )
        .unwrap();
    }
    std::fs::write(root.join("few/f"), b"few").unwrap();
    let srv = Server::new(cfg).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let (s, st) = (srv.clone(), stop.clone());
    tokio::spawn(async move { s.serve(l, st).await });
    let local = t.path().join("local");
    std::fs::create_dir_all(local.join("many")).unwrap();
    for i in 0..2000 {
        std::fs::write(
            local.join(format!("many/file-with-a-longish-name-{i:05}")),
            b"x",
        )
        .unwrap();
    }
    std::fs::create_dir_all(local.join("few")).unwrap();
    std::fs::write(local.join("few/g"), b"g").unwrap();
    let kh = t.path().join("kh");
    let copy = |from: Endpoint, to: Endpoint| {
        let options = TransferOptions {
            trust: Some(dmover_net::tls::Trust::KnownHosts(kh.clone())),
            streams: 2,
            busy_wait: Duration::from_secs(1),
            ..TransferOptions::default()
        };
        let spec = TransferSpec::copy(vec![from], to).options(options);
        async move {
            Transfer::new(spec)
                .unwrap()
                .run(Watch::every(Duration::from_millis(50)), |_| {})
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let remote = |p: &str| Endpoint::remote(&addr.to_string(), p).unwrap();
    let e = copy(Endpoint::local(local.join("many")), remote("in"))
        .await
        .unwrap_err();
    assert!(e.contains("manifest memory"), "{e}");
    assert!(!root.join("in/many").exists());
    held(&srv, 0, 0).await;
    let pulled = t.path().join("pulled");
    std::fs::create_dir(&pulled).unwrap();
    let e = copy(remote("many"), Endpoint::local(&pulled))
        .await
        .unwrap_err();
    assert!(e.contains("max_manifest_bytes_read"), "{e}");
    held(&srv, 0, 0).await;
    copy(Endpoint::local(local.join("few")), remote("in"))
        .await
        .unwrap();
    assert_eq!(std::fs::read(root.join("in/few/g")).unwrap(), b"g");
    copy(remote("few"), Endpoint::local(&pulled)).await.unwrap();
    assert_eq!(std::fs::read(pulled.join("few/f")).unwrap(), b"few");
    held(&srv, 0, 0).await;
    stop.cancel();
}
