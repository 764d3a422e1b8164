//! The server's control frame limit: 64 KiB (`PRE_AUTH_MAX_FRAME`) until the
//! credential is verified, `control::MAX_FRAME` from then on, `Open` included (an
//! `Op::PullListed` carries a whole `--files-from` list). Driven in memory through
//! `Server::control_session`, as the fuzz target does.

use std::sync::Arc;
use std::time::Duration;

use dmover_core::server::{PRE_AUTH_MAX_FRAME, Server, ServerConfig};
use dmover_net::control::ControlChannel;
use dmover_proto::auth;
use dmover_proto::control::{
    Auth, Control, Credential, DataProtection, DirectIo, ErrorCode, Hello, MAX_FRAME, Op, Open,
    PullListed,
};
use tokio::io::{AsyncWriteExt, DuplexStream, duplex};

const TOKEN: &[u8] = b"frame limit token";
const BINDING: [u8; 32] = [7; 32];
const MASTER: [u8; 32] = [9; 32];
const NONCE: [u8; 32] = [3; 32];

fn server(export: &std::path::Path) -> Arc<Server> {
    let mut cfg = ServerConfig::new(export);
    cfg.io_threads = 1;
    cfg.shared_token(TOKEN);
    Server::new(cfg).unwrap()
}

/// A client channel to `server`'s control session, and the session's task.
fn connect(
    server: Arc<Server>,
) -> (
    ControlChannel<DuplexStream>,
    tokio::task::JoinHandle<dmover_core::Result<()>>,
) {
    let (client, server_io) = duplex(1 << 16);
    let task = tokio::spawn(async move {
        let ch = ControlChannel::unauthenticated(server_io, "client", PRE_AUTH_MAX_FRAME);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        server
            .control_session(ch, BINDING, MASTER, deadline, None)
            .await
    });
    (ControlChannel::new(client, "server", MAX_FRAME), task)
}

fn hello(software: String) -> Control {
    Control::Hello(Hello {
        software,
        nonce: NONCE,
    })
}

fn good_auth() -> Control {
    let t = auth::transcript(&BINDING, "", &NONCE);
    Control::Auth(Auth {
        user: String::new(),
        credential: Credential::Token {
            proof: auth::client_token_proof(&auth::token_keys(TOKEN), &t),
        },
    })
}

fn open(op: Op) -> Control {
    Control::Open(Open {
        op,
        streams: 1,
        chunk_size: 0,
        checksum: true,
        direct_io: DirectIo::Never,
        protection: DataProtection::Authenticated,
        features: 0,
    })
}

/// What the server sends until it answers something other than `Welcome`/`AuthOk`
/// or closes: that message, or `None`.
async fn answer(ch: &mut ControlChannel<DuplexStream>) -> Option<Control> {
    loop {
        match ch.recv_timeout(Duration::from_secs(20), "answer").await {
            Ok(Control::Welcome(_) | Control::AuthOk(_)) => {}
            Ok(m) => return Some(m),
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn open_after_authentication_may_exceed_the_pre_auth_limit() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("a"), b"a").unwrap();
    let (mut ch, task) = connect(server(t.path()));
    // A list of 100 KiB (a comment) and a line leaving the source: the server reads
    // the whole `Open` and refuses the list, naming why.
    let mut list = format!("# {}\n", "p".repeat(100 << 10)).into_bytes();
    list.extend_from_slice(b"../x\n");
    let op = Op::PullListed(PullListed {
        sources: vec![b"a".to_vec()],
        rules: Vec::new(),
        report_skipped: false,
        list,
    });
    for m in [hello("test".into()), good_auth(), open(op)] {
        ch.send(&m).await.unwrap();
    }
    match answer(&mut ch).await {
        Some(Control::Error(e)) => {
            assert_eq!(e.code, ErrorCode::Protocol, "{e:?}");
            assert!(e.message.contains("leaves the source"), "{e:?}");
        }
        other => panic!("expected the list refused, got {other:?}"),
    }
    drop(ch);
    assert!(task.await.unwrap().is_err());
}

#[tokio::test]
async fn unauthenticated_frames_stay_limited() {
    let t = tempfile::tempdir().unwrap();
    // A 100 KiB `Hello`: refused from its length prefix, before any credential.
    let (mut ch, task) = connect(server(t.path()));
    ch.send(&hello("h".repeat(100 << 10))).await.unwrap();
    assert!(
        !matches!(answer(&mut ch).await, Some(Control::AuthOk(_))),
        "no session for an oversized hello"
    );
    let e = task.await.unwrap().unwrap_err();
    assert!(
        e.to_string().contains(&PRE_AUTH_MAX_FRAME.to_string()),
        "{e}"
    );

    // A wrong credential followed by a large `Open`: the limit is never raised.
    let (mut ch, task) = connect(server(t.path()));
    let bad = Control::Auth(Auth {
        user: String::new(),
        credential: Credential::Token { proof: [0; 32] },
    });
    let op = Op::PullListed(PullListed {
        sources: vec![b"a".to_vec()],
        rules: Vec::new(),
        report_skipped: false,
        list: vec![b'#'; 100 << 10],
    });
    for m in [hello("test".into()), bad, open(op)] {
        if ch.send(&m).await.is_err() {
            break;
        }
    }
    match answer(&mut ch).await {
        Some(Control::Error(e)) => assert_eq!(e.code, ErrorCode::Auth, "{e:?}"),
        other => panic!("expected an authentication failure, got {other:?}"),
    }
    assert!(task.await.unwrap().is_err());
}

/// What a server older than an op sees: an `Open` whose op variant it does not know.
/// It fails to decode it, says so (`Error{Protocol}`, the decoder's words) and ends the
/// session (a client then says the server must be upgraded).
#[tokio::test]
async fn an_unknown_op_is_answered_with_a_protocol_error() {
    let t = tempfile::tempdir().unwrap();
    let (mut ch, task) = connect(server(t.path()));
    for m in [hello("test".into()), good_auth()] {
        ch.send(&m).await.unwrap();
    }
    // Control::Open (4), op variant 200 (unknown), then the rest of an `Open`.
    let body = [4u8, 200, 1, 0x61, 1, 0, 1, 0, 2, 0];
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    ch.get_mut().write_all(&frame).await.unwrap();
    match answer(&mut ch).await {
        Some(Control::Error(e)) => {
            assert_eq!(e.code, ErrorCode::Protocol, "{e:?}");
            assert!(e.message.contains("malformed control message"), "{e:?}");
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    let e = task.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("malformed control message"), "{e}");
}
