//! The server's control frame limit: 64 KiB (`PRE_AUTH_MAX_FRAME`) until the
//! credential is verified, `control::MAX_FRAME` from then on, `Open` included (an
//! `Op::PullListed` carries a whole `--files-from` list). Driven in memory through
//! `Server::control_session`, as the fuzz target does.

mod common;

use common::{answer, connect, good_auth, hello, open, server};
use dmover_core::server::PRE_AUTH_MAX_FRAME;
use dmover_proto::control::{Auth, Control, Credential, ErrorCode, Op, PullListed};
use tokio::io::AsyncWriteExt;

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
/// session (a client knows an older server by the features it states, never by this
/// error's words: docs/protocol.md, "Versioning").
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

/// An `Open` of a known op with more after its last field (as a later client's `Open`
/// with a field this server does not know would be) is answered with a protocol error
/// too, not a closed connection (docs/protocol.md, "Versioning").
#[tokio::test]
async fn an_open_this_server_cannot_decode_is_answered_with_a_protocol_error() {
    let t = tempfile::tempdir().unwrap();
    let (mut ch, task) = connect(server(t.path()));
    for m in [hello("test".into()), good_auth()] {
        ch.send(&m).await.unwrap();
    }
    let mut frame = Vec::new();
    open(Op::Push {
        dest: b"x".to_vec(),
    })
    .encode(&mut frame)
    .unwrap();
    frame.push(1);
    let body = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&body.to_be_bytes());
    ch.get_mut().write_all(&frame).await.unwrap();
    match answer(&mut ch).await {
        Some(Control::Error(e)) => assert_eq!(e.code, ErrorCode::Protocol, "{e:?}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert!(task.await.unwrap().is_err());
}
