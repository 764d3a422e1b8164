//! A monitoring user's token (`metrics_users`) reads the metrics only: it opens no
//! session on the control connection, not even a memory test (issue 46, item 9).

mod common;

use std::path::Path;

use common::{BINDING, NONCE, answer, connect, hello, open};
use dmover_core::access::ConfigFile;
use dmover_core::server::{Server, ServerConfig};
use dmover_proto::auth;
use dmover_proto::control::{Auth, Control, Credential, ErrorCode, MemDirection, MemTest, Op};

const MONITOR_TOKEN: &[u8] = b"a monitoring token of 32 bytes!!";

fn auth_as(user: &str, token: &[u8]) -> Control {
    let t = auth::transcript(&BINDING, user, &NONCE);
    Control::Auth(Auth {
        user: user.into(),
        credential: Credential::Token {
            proof: auth::client_token_proof(&auth::token_keys(token), &t),
        },
    })
}

#[tokio::test]
async fn a_metrics_token_opens_no_session() {
    let t = tempfile::tempdir().unwrap();
    let verifier = auth::token_keys(MONITOR_TOKEN).verifier.to_text();
    let text = format!(
        "metrics = \"127.0.0.1:0\"\nmetrics_users = [\"monitor\"]\n\
         [exports.data]\npath = \"{}\"\n\
         [users.monitor]\ntoken = \"{verifier}\"\n",
        t.path().display()
    );
    let file = ConfigFile::parse(&text, Path::new("server.toml")).unwrap();
    let (exports, users) = file.access(Path::new("server.toml")).unwrap();
    let mut cfg = ServerConfig::new(t.path());
    cfg.exports = exports;
    cfg.users = Some(users);
    let server = Server::new(cfg).unwrap();

    let (mut ch, task) = connect(server);
    let memtest = Op::MemTest(MemTest {
        direction: MemDirection::FromServer,
        millis: 100,
        zerocopy: false,
        congestion: String::new(),
    });
    // A valid memory test: before, the monitoring user got its `Session`.
    let Control::Open(mut asked) = open(memtest) else {
        unreachable!()
    };
    asked.chunk_size = 1 << 20;
    asked.features = dmover_proto::session::features::SUPPORTED;
    let asked = Control::Open(asked);
    for m in [
        hello("test".into()),
        auth_as("monitor", MONITOR_TOKEN),
        asked,
    ] {
        ch.send(&m).await.unwrap();
    }
    match answer(&mut ch).await {
        Some(Control::Error(e)) => assert_eq!(e.code, ErrorCode::Auth, "{e:?}"),
        other => panic!("the monitoring token opened a session: {other:?}"),
    }
    assert!(task.await.unwrap().is_err());

    // Given exports, a monitoring user is refused when the config loads.
    let with_exports = text + "exports = { data = \"rw\" }\n";
    let file = ConfigFile::parse(&with_exports, Path::new("server.toml")).unwrap();
    let e = file.access(Path::new("server.toml")).unwrap_err();
    assert!(e.to_string().contains("metrics_users"), "{e}");
}
