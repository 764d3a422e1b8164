//! Under load: a server with more connections in set-up than its limit answers
//! "busy, retry after N s" before TLS (never a reset), and clients come back by
//! themselves until they get in.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Connections that sit in the server's set-up, sending nothing, until dropped.
fn hold(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

#[test]
fn a_busy_server_answers_busy_and_clients_come_back() {
    let t = tempfile::Builder::new()
        .prefix("dmover-load-")
        .tempdir()
        .unwrap();
    let src = t.path().join("src");
    make_small_files(&src, 24, 3);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let log = t.path().join("server.log");
    let srv = Server::start_with(
        &[
            "--root".as_ref(),
            root.as_os_str(),
            "--max-handshakes".as_ref(),
            "4".as_ref(),
        ],
        &root,
        Some(&log),
        None,
    );
    // Every set-up slot taken by a connection that says nothing.
    let held = hold(&srv.addr, 4);
    std::thread::sleep(Duration::from_millis(300));

    // A control preamble beyond the limit: the busy answer, then an orderly close
    // (what we sent behind the preamble is read, not answered with a reset).
    let mut probe = TcpStream::connect(&srv.addr).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut pre = b"DMOV\x01\x00".to_vec();
    pre.extend_from_slice(&dmover_proto::PROTOCOL_VERSION.to_be_bytes());
    probe.write_all(&pre).unwrap();
    probe.write_all(&[0x16; 300]).unwrap();
    let mut answer = [0u8; 8];
    probe.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[..5], b"DMOV\x01", "{answer:?}");
    assert!(answer[5] > 0, "busy: retry after N > 0 seconds: {answer:?}");
    assert_eq!(&answer[6..], &[0, 0], "{answer:?}");
    let mut rest = Vec::new();
    probe
        .read_to_end(&mut rest)
        .expect("an orderly close, not a reset");
    assert!(rest.is_empty(), "{rest:?}");

    // A client that will not wait fails at once, as a failure that may pass (4).
    let o = cp(&["--busy-wait", "0", s(&src), &srv.url("never")]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("is busy"), "{}", stderr(&o));

    // A client waiting for a busy server stops at once when interrupted.
    let mut waiting = std::process::Command::new(bin())
        .args(["cp", s(&src), &srv.url("interrupted")])
        .env("DMOVER_KNOWN_HOSTS", t.path().join("kh-interrupted"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &waiting.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut err = String::new();
    waiting
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = waiting.wait().unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("is busy"), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );

    // 24 clients at once, each answered busy while the slots are held, coming back
    // by themselves (no --retries) once they free.
    let started = Instant::now();
    let clients: Vec<_> = (0..24)
        .map(|i| {
            let (src, url) = (src.clone(), srv.url(&format!("dst{i}")));
            std::thread::spawn(move || {
                cp(&[
                    "-P",
                    "1",
                    "--io-threads",
                    "1",
                    "--buffers",
                    "4",
                    s(&src),
                    &url,
                ])
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    drop(held);
    let outs: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let took = started.elapsed();
    let mut busy = 0;
    for o in &outs {
        ok(o);
        let e = stderr(o);
        assert!(!e.contains("Broken pipe") && !e.contains("reset"), "{e}");
        busy += usize::from(e.contains("is busy"));
    }
    assert!(busy > 0, "no client was answered busy");
    for i in 0..24 {
        same(&src, &root.join(format!("dst{i}")));
    }
    let l = std::fs::read_to_string(&log).unwrap();
    assert!(l.contains("busy: answered"), "{l}");
    assert!(took < Duration::from_secs(50), "took {took:?}");
    eprintln!("24 clients done in {took:?}, {busy} of them answered busy at least once");
}

/// A server running all the sessions it may (`--max-sessions`) answers a new control
/// connection busy before TLS too; the client comes back and gets in when one ends.
#[test]
fn a_server_at_its_session_limit_answers_busy_and_the_client_comes_back() {
    let t = tempfile::Builder::new()
        .prefix("dmover-load-")
        .tempdir()
        .unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let big = t.path().join("big");
    write_file(&big, 7, 1 << 20, 0o644, 1_600_000_000);
    let small = t.path().join("small");
    make_small_files(&small, 5, 1);
    let log = t.path().join("server.log");
    let srv = Server::start_with(
        &[
            "--root".as_ref(),
            root.as_os_str(),
            "--max-sessions".as_ref(),
            "1".as_ref(),
            "--io-threads".as_ref(),
            "1".as_ref(),
            "--debug-chunk-delay-ms".as_ref(),
            "500".as_ref(),
        ],
        &root,
        Some(&log),
        None,
    );
    // Four chunks at 500 ms each on one disk thread: the only session for 2 s.
    let slow = {
        let (big, url) = (big.clone(), srv.url("big"));
        std::thread::spawn(move || cp(&["--chunk", "256K", s(&big), &url]))
    };
    std::thread::sleep(Duration::from_millis(500));
    let o = cp(&[s(&small), &srv.url("small")]);
    ok(&o);
    assert!(stderr(&o).contains("is busy"), "{}", stderr(&o));
    ok(&slow.join().unwrap());
    same(&big, &root.join("big"));
    same(&small, &root.join("small"));
    let l = std::fs::read_to_string(&log).unwrap();
    assert!(l.contains("1 sessions running"), "{l}");
}

/// A session refused after authentication because its user runs all the sessions the
/// server allows them (`max_sessions_per_user`) is one the server cannot take *yet*:
/// the client comes back by itself within `--busy-wait` (no `--retries`), so two
/// clients of the same user started at once both complete. A permanent refusal (a
/// wrong credential) is not retried.
#[test]
fn a_user_at_their_session_limit_is_taken_later_without_retries() {
    let t = tempfile::Builder::new()
        .prefix("dmover-load-")
        .tempdir()
        .unwrap();
    let data = t.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let src = t.path().join("src");
    for i in 0..6u64 {
        write_file(
            &src.join(format!("f{i}")),
            i,
            256 << 10,
            0o644,
            1_600_000_000,
        );
    }
    let cfg = t.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "max_sessions_per_user = 1\n[exports.data]\npath = \"{}\"\n\
             [users.alice]\ntoken = \"{}\"\nexports = {{ data = \"rw\" }}\n",
            s(&data),
            dmover_proto::auth::token_keys(b"alice-token")
                .verifier
                .to_text()
        ),
    )
    .unwrap();
    let (good, wrong) = (t.path().join("good"), t.path().join("wrong"));
    std::fs::write(&good, "alice-token\n").unwrap();
    std::fs::write(&wrong, "not-the-token\n").unwrap();
    let log = t.path().join("server.log");
    // Six chunks at 300 ms each on one disk thread: each push holds alice's one
    // session place for 1.8 s or more.
    let srv = Server::start_with(
        &[
            "--config".as_ref(),
            cfg.as_os_str(),
            "--io-threads".as_ref(),
            "1".as_ref(),
            "--debug-chunk-delay-ms".as_ref(),
            "300".as_ref(),
        ],
        &data,
        Some(&log),
        None,
    );
    let started = Instant::now();
    let clients: Vec<_> = (0..2)
        .map(|i| {
            let (src, url, good) = (src.clone(), srv.url(&format!("data/dst{i}")), good.clone());
            std::thread::spawn(move || {
                cp(&[
                    "--user",
                    "alice",
                    "--token-file",
                    s(&good),
                    "--chunk",
                    "256K",
                    s(&src),
                    &url,
                ])
            })
        })
        .collect();
    let outs: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let took = started.elapsed();
    let mut waited = 0;
    for o in &outs {
        ok(o);
        let e = stderr(o);
        if e.contains("already runs 1 sessions") {
            assert!(e.contains("trying again"), "{e}");
            waited += 1;
        }
    }
    assert_eq!(waited, 1, "one of the two came back for alice's place");
    for i in 0..2 {
        same(&src, &data.join(format!("dst{i}")));
    }
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let l = std::fs::read_to_string(&log).unwrap();
    assert!(l.contains("already runs 1 sessions"), "{l}");

    // A wrong credential is final: no wait, no second try.
    let started = Instant::now();
    let o = cp(&[
        "--user",
        "alice",
        "--token-file",
        s(&wrong),
        s(&src),
        &srv.url("data/never"),
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("trying again"), "{}", stderr(&o));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!data.join("never").exists());
}

/// The memory budget counts a session's buffers together: a pull with small chunks of
/// a tree of large files (a deep pool: ~160 MiB of 64 KiB buffers) takes its share,
/// not the whole budget, so a second session gets in at once (it once counted each
/// buffer as a whole MiB: 2560 buffers of 64 KiB took 2.5 GiB, all of a 256 MiB
/// budget, and the second session was refused busy).
#[test]
fn small_chunk_sessions_share_the_memory_budget() {
    let t = tempfile::Builder::new()
        .prefix("dmover-load-")
        .tempdir()
        .unwrap();
    let root = t.path().join("root");
    for i in 0..4 {
        write_file(
            &root.join(format!("tree/f{i}")),
            i,
            1 << 20,
            0o644,
            1_600_000_000,
        );
    }
    let srv = Server::start_with(
        &[
            "--root".as_ref(),
            root.as_os_str(),
            "--memory".as_ref(),
            "256M".as_ref(),
        ],
        &root,
        None,
        None,
    );
    // 4 MiB received at 8 Mbit/s (the client paces its reads): the first pull holds
    // its buffers for 4 s, while the server's disk is free for the second.
    let first_dst = t.path().join("first");
    std::fs::create_dir(&first_dst).unwrap();
    let first = {
        let (url, dst) = (srv.url("tree"), first_dst.clone());
        std::thread::spawn(move || {
            let o = cp(&[
                "-P",
                "1",
                "--chunk",
                "64K",
                "--bwlimit",
                "8mbit",
                &url,
                s(&dst),
            ]);
            (o, Instant::now())
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    // One file, unpaced: done long before the first pull, unless it had to wait for
    // the first pull's memory.
    let second_dst = t.path().join("second");
    std::fs::create_dir(&second_dst).unwrap();
    let o = cp(&[
        "-P",
        "1",
        "--chunk",
        "64K",
        &srv.url("tree/f0"),
        s(&second_dst),
    ]);
    let second_done = Instant::now();
    ok(&o);
    let (o, first_done) = first.join().unwrap();
    ok(&o);
    assert!(
        second_done < first_done,
        "the second pull waited for the first one's memory"
    );
    same(&root.join("tree"), &first_dst.join("tree"));
    same(&root.join("tree/f0"), &second_dst.join("f0"));
}
