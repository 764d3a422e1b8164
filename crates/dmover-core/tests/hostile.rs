//! Hostile clients against a real server's control session (in memory, see
//! `common`): what a peer may make the server spend, and in which order the server
//! checks it.

mod common;

use std::collections::BTreeMap;

use common::{TOKEN, answer, connect, good_auth, hello, open};
use dmover_core::access::{ExportSpec, Rights};
use dmover_core::server::{Server, ServerConfig};
use dmover_proto::control::{Control, ErrorCode, Op, PullListed};

/// Exports `pub` and `priv`; the token's user has rights to `pub` only.
fn two_exports(t: &std::path::Path) -> std::sync::Arc<Server> {
    let export = |name: &str| {
        let path = t.join(name);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("a"), b"a").unwrap();
        ExportSpec {
            name: name.into(),
            path,
            read_only: false,
            third_party: false,
            bwlimit: None,
            preserve_owner: false,
            xattrs_all: false,
        }
    };
    let mut cfg = ServerConfig::new(t);
    cfg.exports = vec![export("pub"), export("priv")];
    cfg.io_threads = 1;
    cfg.shared_token(TOKEN);
    let user = cfg.users.as_mut().unwrap().get_mut("*").unwrap();
    user.exports = BTreeMap::from([("pub".to_string(), Rights::ReadWrite)]);
    Server::new(cfg).unwrap()
}

async fn pull_listed(server: std::sync::Arc<Server>, source: &[u8], list: Vec<u8>) -> Control {
    let (mut ch, task) = connect(server);
    let op = Op::PullListed(PullListed {
        sources: vec![source.to_vec()],
        rules: Vec::new(),
        report_skipped: false,
        list,
    });
    for m in [hello("hostile".into()), good_auth(), open(op)] {
        ch.send(&m).await.unwrap();
    }
    let a = answer(&mut ch).await.expect("an answer");
    drop(ch);
    let _ = task.await.unwrap();
    a
}

/// A `--files-from` list is parsed only after the user's rights to the sources are
/// checked: a user without rights learns nothing about the list and costs nothing.
#[tokio::test]
async fn a_pulls_list_is_read_after_the_rights_to_its_sources() {
    let t = tempfile::tempdir().unwrap();
    let server = two_exports(t.path());
    match pull_listed(server.clone(), b"priv/a", b"../x\n".to_vec()).await {
        Control::Error(e) => {
            assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
            assert!(!e.message.contains("leaves the source"), "{e:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // With the rights, the same list is refused for what it says.
    match pull_listed(server, b"pub/a", b"../x\n".to_vec()).await {
        Control::Error(e) => {
            assert_eq!(e.code, ErrorCode::Protocol, "{e:?}");
            assert!(e.message.contains("leaves the source"), "{e:?}");
        }
        other => panic!("expected the list refused, got {other:?}"),
    }
}

/// One line of 60 000 components (~120 KB, which once took a server to 7 GB) is
/// refused for its length, and the server goes on serving.
#[tokio::test]
async fn a_list_line_longer_than_a_path_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let server = two_exports(t.path());
    let mut list = "a/".repeat(60_000).into_bytes();
    list.push(b'\n');
    match pull_listed(server.clone(), b"pub/a", list).await {
        Control::Error(e) => {
            assert_eq!(e.code, ErrorCode::Protocol, "{e:?}");
            assert!(e.message.contains("line 1"), "{e:?}");
        }
        other => panic!("expected the list refused, got {other:?}"),
    }
    match pull_listed(server, b"pub/a", b"a\n".to_vec()).await {
        Control::Session(_) => {}
        other => panic!("an honest pull should get its session, got {other:?}"),
    }
}

/// A push whose manifest names dmover's own files: `name` below the root `d`, or the
/// push's destination itself (`dest`).
async fn push_naming(server: std::sync::Arc<Server>, dest: &[u8], name: &[u8]) -> Option<Control> {
    use dmover_proto::control::{ManifestEnd, ManifestPart, SessionOptions};
    use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT, Totals};
    let (mut ch, task) = connect(server);
    let entry = |parent, name: &[u8], kind| Entry {
        parent,
        name: name.to_vec(),
        kind,
        mode: 0o600,
        mtime: Mtime::default(),
    };
    let entries = vec![
        entry(NO_PARENT, b"d", EntryKind::Dir),
        entry(0, name, EntryKind::File { size: 0 }),
    ];
    let options = SessionOptions {
        resume: true,
        journal: true,
        fsync: false,
        verify: false,
        continue_on_error: false,
        heartbeat_ms: 0,
    };
    let totals = Totals::of(&entries);
    let mut push = open(Op::Push {
        dest: dest.to_vec(),
    });
    if let Control::Open(o) = &mut push {
        o.chunk_size = 1 << 20;
    }
    for m in [
        hello("hostile".into()),
        good_auth(),
        push,
        Control::Options(options),
        Control::Manifest(ManifestPart { entries }),
        Control::ManifestEnd(ManifestEnd { totals }),
    ] {
        ch.send(&m).await.unwrap();
    }
    let a = loop {
        match answer(&mut ch).await {
            Some(Control::Session(_) | Control::Limits(_)) => {}
            other => break other,
        }
    };
    drop(ch);
    let _ = task.await.unwrap();
    a
}

/// Every path below `dir`, relative, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
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

/// A pushed manifest may not name dmover's own files (`.dmv.*`: a journal read back on
/// `--resume`, a staging file another transfer takes up), below its root nor as its
/// destination: refused, and nothing is written.
#[tokio::test]
async fn a_push_may_not_name_dmovers_own_files() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let server = common::server(&root);
    for (dest, name) in [
        (&b""[..], &b".dmv.journal.0000000000000001"[..]),
        (b"", b".dmv.0123456789abcdef.f"),
        (b".dmv.journal.0000000000000002", b"f"),
    ] {
        match push_naming(server.clone(), dest, name).await {
            Some(Control::Error(e)) => {
                assert_eq!(e.code, ErrorCode::PermissionDenied, "{e:?}");
                assert!(e.message.contains("dmover's own"), "{e:?}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(listing(&root).is_empty(), "{:?}", listing(&root));
    }
}
