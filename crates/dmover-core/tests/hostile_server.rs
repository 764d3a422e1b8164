//! Hostile servers against a real client: a scripted server on loopback that speaks
//! the protocol (preamble, TLS, `Welcome`, `AuthOk`, `Session`) and then sends a pull
//! a manifest of its own choosing, as a malicious server would (scp's
//! CVE-2019-6111: a server choosing the names a client writes). And honest pulls from
//! a real server, which the client's checks must keep working.

use std::path::Path;
use std::time::Duration;

use dmover_core::client::Client;
use dmover_core::engine::Run;
use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_net::control::ControlChannel;
use dmover_net::link::SocketOptions;
use dmover_net::listen::Listener;
use dmover_net::tls::{ServerIdentity, Trust};
use dmover_proto::auth;
use dmover_proto::control::{
    AuthMethod, AuthOk, Control, Growth, MAX_FRAME, ManifestEnd, ManifestPart, MetaPart,
    SessionInfo, Welcome,
};
use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT, Totals};
use dmover_proto::preamble::{ConnKind, Preamble};
use dmover_proto::session::features;
use tokio_util::sync::CancellationToken;

fn entry(parent: u32, name: &str, kind: EntryKind) -> Entry {
    Entry {
        parent,
        name: name.as_bytes().to_vec(),
        kind,
        mode: 0o700,
        mtime: Mtime {
            sec: 1_700_000_000,
            nsec: 0,
        },
    }
}

/// A server on loopback that answers every pull with `parts` as its manifest (in
/// parts when the pull offered a streamed manifest, else the first part alone),
/// granting the base features offered and holding data connections open and
/// unanswered. Returns its address; it stops with `stop`.
async fn scripted_server(parts: Vec<Vec<Entry>>, stop: CancellationToken) -> String {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap().to_string();
    let listener = Listener::from(tcp);
    let tls = ServerIdentity::ephemeral()
        .unwrap()
        .mutual_acceptor()
        .unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        let opts = SocketOptions::default();
        loop {
            let (mut inc, _) = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.accept(&opts) => r.unwrap(),
            };
            let Ok(pre) = inc.read_preamble("client").await else {
                continue;
            };
            if pre.kind == ConnKind::Data {
                // Never challenged: the session ends before any data could flow.
                held.push(inc);
                continue;
            }
            let answer = Preamble::new(ConnKind::Control, pre.version);
            inc.write_preamble(answer, "client").await.unwrap();
            let tls = tls.accept(inc.into_control()).await.unwrap();
            let stream = dmover_net::ControlStream::Server(tls);
            // The session's id and salt, as early data (a known server) assumes.
            let master =
                dmover_net::tls::export(&stream, auth::SESSION_EXPORTER_LABEL, None).unwrap();
            let (id, salt) = auth::session_id(&master);
            let mut ch = ControlChannel::new(stream, "client", MAX_FRAME);
            let parts = parts.clone();
            tokio::spawn(async move {
                // Hello, Auth, Open (and Options): read, and answered as a server
                // without authentication does.
                let mut chunk_size = 1 << 20;
                loop {
                    match ch.recv().await {
                        Ok(Control::Hello(_)) => {
                            let w = Welcome {
                                software: "hostile".into(),
                                nonce: [1; 32],
                                auth: AuthMethod::None,
                            };
                            ch.send(&Control::Welcome(w)).await.unwrap();
                        }
                        Ok(Control::Auth(_)) => {
                            ch.send(&Control::AuthOk(AuthOk { proof: None }))
                                .await
                                .unwrap();
                        }
                        Ok(Control::Open(o)) => {
                            if o.chunk_size != 0 {
                                chunk_size = o.chunk_size;
                            }
                            // What every acceptor grants of what was offered.
                            let granted = o.features & features::BASE;
                            let info = SessionInfo {
                                id,
                                salt,
                                streams: 1,
                                chunk_size,
                                features: granted,
                            };
                            ch.send(&Control::Session(info)).await.unwrap();
                            let streamed = granted & features::STREAMED != 0;
                            let mut sent = Vec::new();
                            for (i, part) in parts.iter().enumerate() {
                                sent.extend(part.iter().cloned());
                                let totals = Totals::of(&sent);
                                let entries = part.clone();
                                ch.send(&Control::Manifest(ManifestPart { entries }))
                                    .await
                                    .unwrap();
                                let end = if streamed {
                                    let last = i + 1 == parts.len();
                                    Control::Grow(Growth {
                                        totals,
                                        chunks: 0,
                                        last,
                                    })
                                } else {
                                    Control::ManifestEnd(ManifestEnd { totals })
                                };
                                ch.send(&end).await.unwrap();
                                if !streamed {
                                    if granted & features::METADATA != 0 {
                                        let m = MetaPart {
                                            entries: Vec::new(),
                                            last: true,
                                        };
                                        ch.send(&Control::Meta(m)).await.unwrap();
                                    }
                                    break;
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            });
        }
    });
    addr
}

fn client(known_hosts: &Path) -> Client {
    let opts = TransferOptions {
        trust: Some(Trust::KnownHosts(known_hosts.to_path_buf())),
        chunk_size: 64 << 10,
        streams: 1,
        connect_timeout: Duration::from_secs(5),
        ..TransferOptions::default()
    };
    Client::new(opts, 1)
}

/// Every path below `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `dmover cp srv:x ~/` answered with a root named `.ssh` holding `authorized_keys`:
/// the client refuses the name it did not ask for, clearly, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_refuses_a_root_it_did_not_ask_for() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let stop = CancellationToken::new();
    let hostile = vec![
        entry(NO_PARENT, ".ssh", EntryKind::Dir),
        entry(0, "authorized_keys", EntryKind::File { size: 0 }),
    ];
    let addr = scripted_server(vec![hostile], stop.clone()).await;
    let c = client(&t.path().join("known_hosts"));
    for source in ["x", "x/", "x/.", "dir/x"] {
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            c.pull(
                &addr,
                &[source.as_bytes().to_vec()],
                home.as_os_str().as_encoded_bytes(),
                Run::new(),
            ),
        )
        .await
        .expect("the pull ends");
        let e = r
            .expect_err("a root not asked for must be refused")
            .to_string();
        assert!(
            e.contains("\".ssh\"") && e.contains("not a source this pull asked for"),
            "{source}: {e}"
        );
        assert!(listing(&home).is_empty(), "{source}: {:?}", listing(&home));
    }
    // An export's whole root (`srv:` or `srv:.`) is named by the server, but never
    // with a hidden name.
    for source in ["", "."] {
        let r = c
            .pull(
                &addr,
                &[source.as_bytes().to_vec()],
                home.as_os_str().as_encoded_bytes(),
                Run::new(),
            )
            .await;
        let e = r
            .expect_err("a hidden export root must be refused")
            .to_string();
        assert!(
            e.contains("not a source this pull asked for"),
            "{source:?}: {e}"
        );
        assert!(listing(&home).is_empty(), "{:?}", listing(&home));
    }
    stop.cancel();
}

/// Two roots for one source asked for, the second of a name not asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_refuses_an_extra_root() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let stop = CancellationToken::new();
    let hostile = vec![
        entry(NO_PARENT, "x", EntryKind::File { size: 0 }),
        entry(NO_PARENT, ".bashrc", EntryKind::File { size: 0 }),
    ];
    let addr = scripted_server(vec![hostile], stop.clone()).await;
    let c = client(&t.path().join("known_hosts"));
    let e = c
        .pull(
            &addr,
            &[b"x".to_vec()],
            dest.as_os_str().as_encoded_bytes(),
            Run::new(),
        )
        .await
        .expect_err("an extra root must be refused")
        .to_string();
    assert!(e.contains("\".bashrc\""), "{e}");
    assert!(listing(&dest).is_empty(), "{:?}", listing(&dest));
    stop.cancel();
}

/// A streamed manifest whose first part is the root asked for and whose later part
/// adds another root: refused, and nothing of the later part is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_refuses_a_root_in_a_later_part() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let stop = CancellationToken::new();
    let parts = vec![
        vec![entry(NO_PARENT, "x", EntryKind::Dir)],
        vec![
            entry(NO_PARENT, ".ssh", EntryKind::Dir),
            entry(1, "authorized_keys", EntryKind::File { size: 0 }),
        ],
    ];
    let addr = scripted_server(parts, stop.clone()).await;
    let c = client(&t.path().join("known_hosts"));
    let e = c
        .pull(
            &addr,
            &[b"x".to_vec()],
            dest.as_os_str().as_encoded_bytes(),
            Run::new(),
        )
        .await
        .expect_err("a root in a later part must be refused")
        .to_string();
    assert!(e.contains("\".ssh\"") && e.contains("later part"), "{e}");
    assert!(!dest.join(".ssh").exists(), "{:?}", listing(&dest));
    stop.cancel();
}

/// A real server on loopback serving `root` (no authentication).
async fn honest_server(root: &Path, stop: CancellationToken) -> String {
    let srv = Server::new(ServerConfig::new(root)).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { srv.serve(l, stop).await });
    addr
}

/// Honest pulls keep working: a file, a directory (also as `d/` and `d/.`), several
/// sources, an export's whole root, and a `sync` (whose root takes the mirror's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_pulls_of_every_shape_still_work() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir_all(root.join("d/sub")).unwrap();
    std::fs::write(root.join("f"), b"file").unwrap();
    std::fs::write(root.join("d/sub/g"), b"deep").unwrap();
    std::fs::write(root.join(".hidden"), b"dot").unwrap();
    let stop = CancellationToken::new();
    let addr = honest_server(&root, stop.clone()).await;
    let c = client(&t.path().join("known_hosts"));
    let cases: &[(&[&str], &[&str])] = &[
        (&["f"], &["f"]),
        (&["d"], &["d", "d/sub", "d/sub/g"]),
        (&["d/"], &["d", "d/sub", "d/sub/g"]),
        (&["d/."], &["d", "d/sub", "d/sub/g"]),
        (&["d/sub/g", "f", ".hidden"], &[".hidden", "f", "g"]),
        (
            &["."],
            &[
                "export",
                "export/.hidden",
                "export/d",
                "export/d/sub",
                "export/d/sub/g",
                "export/f",
            ],
        ),
    ];
    for (i, (sources, want)) in cases.iter().enumerate() {
        let dest = t.path().join(format!("dest{i}"));
        std::fs::create_dir(&dest).unwrap();
        let sources: Vec<Vec<u8>> = sources.iter().map(|s| s.as_bytes().to_vec()).collect();
        c.pull(
            &addr,
            &sources,
            dest.as_os_str().as_encoded_bytes(),
            Run::new(),
        )
        .await
        .unwrap_or_else(|e| panic!("{sources:?}: {e}"));
        assert_eq!(listing(&dest), *want, "{sources:?}");
    }
    // `dmover sync srv:d/ mirror`: the root is `d` at the server, `mirror` here.
    let mirror = t.path().join("mirror");
    let sync = c.with_options(TransferOptions {
        trust: Some(Trust::KnownHosts(t.path().join("known_hosts"))),
        chunk_size: 64 << 10,
        streams: 1,
        mirror: true,
        ..TransferOptions::default()
    });
    for _ in 0..2 {
        sync.pull(
            &addr,
            &[b"d/".to_vec()],
            mirror.as_os_str().as_encoded_bytes(),
            Run::new(),
        )
        .await
        .unwrap();
        assert_eq!(listing(&mirror), ["sub", "sub/g"]);
    }
    stop.cancel();
}

/// A pull's manifest may not name dmover's own files (`.dmv.*`) below the root asked
/// for: refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_refuses_dmovers_own_names() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let stop = CancellationToken::new();
    let hostile = vec![
        entry(NO_PARENT, "x", EntryKind::Dir),
        entry(0, "ok", EntryKind::File { size: 0 }),
        entry(
            0,
            ".dmv.journal.0000000000000001",
            EntryKind::File { size: 0 },
        ),
    ];
    let addr = scripted_server(vec![hostile], stop.clone()).await;
    let c = client(&t.path().join("known_hosts"));
    let e = c
        .pull(
            &addr,
            &[b"x".to_vec()],
            dest.as_os_str().as_encoded_bytes(),
            Run::new(),
        )
        .await
        .expect_err("a .dmv. name must be refused")
        .to_string();
    assert!(
        e.contains(".dmv.journal.") && e.contains("dmover's own"),
        "{e}"
    );
    assert!(listing(&dest).is_empty(), "{:?}", listing(&dest));
    stop.cancel();
}

/// A copy relayed through this client (`--via-client`) from a hostile source server
/// to an honest destination: A's root not asked for is refused before B is sent
/// anything, and B's export stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refuses_a_root_the_source_was_not_asked_for() {
    use dmover_core::client::ThirdPartyCopy;
    use dmover_proto::control::TpcMode;
    let t = tempfile::tempdir().unwrap();
    let b_root = t.path().join("b");
    std::fs::create_dir(&b_root).unwrap();
    let stop = CancellationToken::new();
    let hostile = vec![
        entry(NO_PARENT, ".ssh", EntryKind::Dir),
        entry(0, "authorized_keys", EntryKind::File { size: 0 }),
    ];
    let a = scripted_server(vec![hostile], stop.clone()).await;
    let b = honest_server(&b_root, stop.clone()).await;
    let c = client(&t.path().join("known_hosts"));
    let copy = ThirdPartyCopy {
        mode: TpcMode::Push,
        source_server: a,
        sources: vec![b"x".to_vec()],
        dest_server: b,
        dest: Vec::new(),
    };
    let e = tokio::time::timeout(Duration::from_secs(30), c.relay(&copy, 8, Run::new()))
        .await
        .expect("the relay ends")
        .expect_err("a root not asked for must be refused")
        .to_string();
    assert!(e.contains("not a source this pull asked for"), "{e}");
    assert!(listing(&b_root).is_empty(), "{:?}", listing(&b_root));
    stop.cancel();
}
