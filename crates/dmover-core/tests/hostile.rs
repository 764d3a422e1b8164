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
