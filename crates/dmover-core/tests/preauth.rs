//! Connections before authentication against a real server on loopback (issue 46,
//! items 12 and 5): every refusal is an answer and an orderly close, never a reset
//! that could cost the client the answer; and one source address that opens
//! connections and stalls them cannot keep a client from another address out.
//! Sources are spread over 127.0.0.0/8 (each socket bound to its own 127.0.0.x).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_core::transfer::{Endpoint, Transfer, TransferSpec, Watch};
use dmover_proto::preamble::{self, ConnKind, Preamble};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

/// A server of `root` with `cfg` on 127.0.0.1; its address.
async fn start(cfg: ServerConfig, stop: &CancellationToken) -> (Arc<Server>, SocketAddr) {
    let server = Server::new(cfg).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (s, stop) = (server.clone(), stop.clone());
    tokio::spawn(async move { s.serve(l, stop).await });
    (server, addr)
}

/// A connection to `server` from source address 127.0.0.`host`.
async fn connect_from(host: u8, server: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from(([127, 0, 0, host], 0))).unwrap();
    s.connect(server).await.unwrap()
}

fn preamble(kind: ConnKind, version: u16) -> [u8; preamble::LEN] {
    Preamble {
        kind,
        version,
        busy: None,
    }
    .encode()
}

/// Sends `first` and a few KiB behind it (as a client's TLS ClientHello follows its
/// preamble unanswered), then reads until the server closes: what it answered, or
/// the error (a reset).
async fn send_and_read_all(mut s: TcpStream, first: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(first).await?;
    s.write_all(&[0x16; 3000]).await?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got))
        .await
        .expect("the server closes the connection")?;
    Ok(got)
}

/// A data connection that sent its preamble and got its challenge: it holds a set-up
/// place (or an overflow place) until its join's time runs out.
async fn stalled_data(host: u8, server: SocketAddr) -> TcpStream {
    let mut s = connect_from(host, server).await;
    s.write_all(&preamble(ConnKind::Data, dmover_proto::PROTOCOL_VERSION))
        .await
        .unwrap();
    let mut challenge = [0u8; 32];
    s.read_exact(&mut challenge).await.unwrap();
    s
}

/// Item 12's cause: a connection beyond the set-up places and their overflow was
/// closed at once, unanswered, its preamble and TLS hello unread: a reset. Now it is
/// answered busy and closed in order; a control connection whose protocol version is
/// refused and one whose preamble is not dmover's are closed in order too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_get_their_answer_and_no_reset() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(t.path());
    cfg.io_threads = 1;
    cfg.io_threads_max = 1;
    cfg.max_handshakes = 1;
    let stop = CancellationToken::new();
    let (_server, addr) = start(cfg, &stop).await;
    // One set-up place and the 256 overflow places, taken by data connections whose
    // join never comes, from eight addresses (33 each, within any address's limit).
    let overflow = dmover_core::server::OVERFLOW_MIN;
    let mut held = Vec::new();
    for i in 0..=overflow {
        held.push(stalled_data(2 + (i % 8) as u8, addr).await);
    }

    // A control connection beyond them all: the busy answer, whole, then an orderly
    // close.
    let probe = connect_from(20, addr).await;
    let pre = preamble(ConnKind::Control, dmover_proto::PROTOCOL_VERSION);
    let got = send_and_read_all(probe, &pre)
        .await
        .expect("a busy answer and an orderly close, not a reset");
    assert_eq!(got.len(), preamble::LEN, "{got:?}");
    let answer = Preamble::decode(got[..].try_into().unwrap()).unwrap();
    assert!(answer.busy.is_some(), "{answer:?}");
    // A data connection beyond them: the same answer (its client dials again), an
    // orderly close.
    let probe = connect_from(21, addr).await;
    let pre = preamble(ConnKind::Data, dmover_proto::PROTOCOL_VERSION);
    let got = send_and_read_all(probe, &pre)
        .await
        .expect("an orderly close, not a reset");
    assert_eq!(got.len(), preamble::LEN, "{got:?}");
    // One that has sent nothing yet (a client slow under load) is answered busy too.
    let mut slow = connect_from(24, addr).await;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut got))
        .await
        .unwrap()
        .expect("an orderly close");
    assert_eq!(got.len(), preamble::LEN, "{got:?}");
    let answer = Preamble::decode(got[..].try_into().unwrap()).unwrap();
    assert!(answer.busy.is_some(), "{answer:?}");
    drop(held);

    // Within the limits: a version the server refuses is answered (version 0) and
    // the connection closed in order; a preamble that is not dmover's is closed in
    // order.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let probe = connect_from(22, addr).await;
    let got = send_and_read_all(probe, &preamble(ConnKind::Control, 1))
        .await
        .expect("the version answer and an orderly close, not a reset");
    assert_eq!(got.len(), preamble::LEN, "{got:?}");
    let answer = Preamble::decode(got[..].try_into().unwrap()).unwrap();
    assert_eq!((answer.version, answer.busy), (0, None), "{answer:?}");
    let probe = connect_from(23, addr).await;
    let got = send_and_read_all(probe, b"GET / HTTP/1.1\r\n")
        .await
        .expect("an orderly close, not a reset");
    assert!(got.is_empty(), "{got:?}");
    stop.cancel();
}

/// Item 5: one address opens many control connections, sends their preambles and
/// stalls them before TLS. It gets at most half the session places and at most its
/// limit of connections in set-up (the rest answered busy), and a client from
/// another address still gets in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_stalling_its_set_up_leaves_room_for_others() {
    let t = tempfile::tempdir().unwrap();
    let (root, src) = (t.path().join("root"), t.path().join("src"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..5u8 {
        std::fs::write(src.join(format!("f{i}")), vec![i; 10_000]).unwrap();
    }
    let mut cfg = ServerConfig::new(&root);
    cfg.io_threads = 1;
    cfg.io_threads_max = 1;
    let (max_sessions, cap) = (cfg.max_sessions, cfg.max_unauthenticated_per_address);
    assert_eq!(
        (max_sessions, cap),
        (64, 64),
        "the defaults this test is about"
    );
    let stop = CancellationToken::new();
    let (_server, addr) = start(cfg, &stop).await;

    // 100 control connections from 127.0.0.2, each with its preamble sent, no TLS.
    let (mut taken, mut busy, mut stalled) = (0, 0, Vec::new());
    for _ in 0..100 {
        let mut s = connect_from(2, addr).await;
        s.write_all(&preamble(ConnKind::Control, dmover_proto::PROTOCOL_VERSION))
            .await
            .unwrap();
        let mut answer = [0u8; preamble::LEN];
        s.read_exact(&mut answer).await.unwrap();
        match Preamble::decode(&answer).unwrap().busy {
            Some(_) => busy += 1,
            None => {
                taken += 1;
                stalled.push(s);
            }
        }
    }
    assert_eq!(taken, max_sessions / 2, "half the session places at most");
    assert_eq!(busy, 100 - max_sessions / 2);

    // A client from 127.0.0.1 pushes at once, without waiting out the stalled ones
    // (the handshake timeout, 30 s).
    let started = Instant::now();
    let options = TransferOptions {
        trust: Some(dmover_net::tls::Trust::KnownHosts(t.path().join("kh"))),
        streams: 2,
        busy_wait: Duration::from_secs(5),
        ..TransferOptions::default()
    };
    let spec = TransferSpec::copy(
        vec![Endpoint::local(&src)],
        Endpoint::remote(&addr.to_string(), "dest").unwrap(),
    )
    .options(options);
    let done = Transfer::new(spec)
        .unwrap()
        .run(Watch::every(Duration::from_millis(50)), |_| {})
        .await
        .expect("the honest client's push completes");
    assert_eq!(done.report.summary.files, 5, "{:?}", done.report);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(
        std::fs::read(root.join("dest/f3")).unwrap(),
        vec![3; 10_000]
    );

    // The stalled address is still refused; another address is not.
    let s = connect_from(2, addr).await;
    let got = send_and_read_all(
        s,
        &preamble(ConnKind::Control, dmover_proto::PROTOCOL_VERSION),
    )
    .await
    .unwrap();
    assert!(
        Preamble::decode(got[..8].try_into().unwrap())
            .unwrap()
            .busy
            .is_some()
    );
    let mut s = connect_from(3, addr).await;
    s.write_all(&preamble(ConnKind::Control, dmover_proto::PROTOCOL_VERSION))
        .await
        .unwrap();
    let mut answer = [0u8; preamble::LEN];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(Preamble::decode(&answer).unwrap().busy, None);
    drop(stalled);
    stop.cancel();
}

/// Item 5's preamble deadline: a connection that never sends its 8-byte preamble is
/// answered busy ("retry after") and closed after [`PREAMBLE_WAIT`] (10 s), well
/// before the handshake timeout (30 s by default), and its set-up place comes free.
/// Tokio's clock is paused: while the server waits on the silent socket the runtime
/// is idle and the clock jumps to the server's next deadline, so the test takes no
/// real 10 s and the deadline it observes is the server's, not the machine's load.
#[tokio::test(start_paused = true)]
async fn a_connection_that_never_sends_its_preamble_is_closed_at_the_deadline() {
    use dmover_core::server::PREAMBLE_WAIT;
    let t = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let mut cfg = ServerConfig::new(t.path());
    // One set-up place: the silent connection holds it until the deadline.
    cfg.max_handshakes = 1;
    assert!(cfg.handshake_timeout > PREAMBLE_WAIT);
    let (_server, addr) = start(cfg, &stop).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut got = Vec::new();
    // Nothing is sent; the server closes the connection (read_to_end ends).
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut got))
        .await
        .expect("the server closes a connection without a preamble")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= PREAMBLE_WAIT && took < PREAMBLE_WAIT + Duration::from_secs(2),
        "closed after {took:?}"
    );
    assert_eq!(got.len(), preamble::LEN, "{got:?}");
    let answer = Preamble::decode(got[..].try_into().unwrap()).unwrap();
    assert!(answer.busy.is_some(), "{answer:?}");
    // The set-up place came free: the next client's preamble is answered at once.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&preamble(ConnKind::Control, dmover_proto::PROTOCOL_VERSION))
        .await
        .unwrap();
    let mut answer = [0u8; preamble::LEN];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(Preamble::decode(&answer).unwrap().busy, None);
    stop.cancel();
}
