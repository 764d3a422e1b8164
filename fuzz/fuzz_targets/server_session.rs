//! The server's session state machine, driven in memory: `Server::control_session`
//! (everything after TLS: Hello/Welcome, Auth/AuthOk, Open, manifest, Go, ...) runs
//! against a client that sends an arbitrary sequence of messages and raw bytes, and
//! sometimes a correct token proof. Checks: the server never panics, always ends once
//! the client is gone, and with authentication required it never says `AuthOk` or
//! opens a session for a client that did not prove the token.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dmover_core::server::{PRE_AUTH_MAX_FRAME, Server, ServerConfig};
use dmover_fuzz::{arbitrary_control, bytes};
use dmover_net::control::ControlChannel;
use dmover_proto::auth;
use dmover_proto::control::{
    Auth, Control, Credential, DataProtection, DirectIo, Hello, MAX_FRAME, Op, Open,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncWriteExt, duplex};

const TOKEN: &[u8] = b"fuzz token";
const BINDING: [u8; 32] = [7; 32];
const MASTER: [u8; 32] = [9; 32];

struct World {
    rt: tokio::runtime::Runtime,
    open: Arc<Server>,
    authed: Arc<Server>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dmover-fuzz-session-{}", std::process::id()));
        let export = dir.join("export");
        std::fs::create_dir_all(export.join("d")).unwrap();
        std::fs::write(export.join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::write(export.join("d/b"), b"b").unwrap();
        let _ = std::os::unix::fs::symlink("/etc", export.join("out"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let mut cfg = ServerConfig::new(&export);
        cfg.io_threads = 2;
        cfg.memory_budget = 256 << 20;
        let (open, authed) = rt.block_on(async {
            let open = Server::new(cfg.clone()).unwrap();
            cfg.shared_token(TOKEN);
            (open, Server::new(cfg).unwrap())
        });
        World { rt, open, authed }
    })
}

enum Step {
    Msg(Control),
    Raw(Vec<u8>),
    GoodAuth,
}

fn step(u: &mut Unstructured<'_>) -> Result<Step> {
    Ok(match u.int_in_range(0..=9u8)? {
        0..=3 => Step::Msg(arbitrary_control(u)?),
        4 => Step::Raw(bytes(u, 64)?),
        5 | 6 => Step::GoodAuth,
        7 => Step::Msg(Control::Hello(Hello {
            software: "fuzz".into(),
            nonce: u.arbitrary()?,
        })),
        _ => Step::Msg(Control::Open(Open {
            op: if u.arbitrary()? {
                Op::Push {
                    dest: (*u.choose(&[&b""[..], b"new", b"d", b"../x", b"out/x"])?).to_vec(),
                }
            } else {
                Op::Pull {
                    sources: vec![
                        (*u.choose(&[&b""[..], b"a", b"d", b"out", b"out/", b"/etc"])?).to_vec(),
                    ],
                }
            },
            streams: u.int_in_range(0..=4)?,
            chunk_size: *u.choose(&[0, 64 << 10, 1 << 20, 12345])?,
            checksum: u.arbitrary()?,
            direct_io: DirectIo::Never,
            protection: DataProtection::Authenticated,
            features: u.arbitrary()?,
        })),
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(authed) = u.arbitrary::<bool>() else {
        return;
    };
    let mut steps = Vec::new();
    while steps.len() < 12 {
        match step(&mut u) {
            Ok(s) => steps.push(s),
            Err(_) => break,
        }
    }
    let w = world();
    let server = if authed {
        w.authed.clone()
    } else {
        w.open.clone()
    };
    w.rt.block_on(async move {
        let (client, server_io) = duplex(1 << 16);
        let task = tokio::spawn(async move {
            let ch = ControlChannel::unauthenticated(server_io, "fuzz", PRE_AUTH_MAX_FRAME);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            server
                .control_session(ch, BINDING, MASTER, deadline, None)
                .await
        });
        let mut ch = ControlChannel::new(client, "server", MAX_FRAME);
        let mut client_nonce = None;
        let mut proved = false;
        'steps: for s in steps {
            let sent = match s {
                Step::Msg(m) => {
                    if let Control::Hello(h) = &m {
                        client_nonce = Some(h.nonce);
                    }
                    ch.send(&m).await.is_ok()
                }
                Step::Raw(b) => ch.get_mut().write_all(&b).await.is_ok(),
                Step::GoodAuth => {
                    let Some(c) = client_nonce else {
                        continue;
                    };
                    let t = auth::transcript(&BINDING, "", &c);
                    let proof = auth::client_token_proof(&auth::token_keys(TOKEN), &t);
                    proved = true;
                    ch.send(&Control::Auth(Auth {
                        user: String::new(),
                        credential: Credential::Token { proof },
                    }))
                    .await
                    .is_ok()
                }
            };
            if !sent {
                break;
            }
            // Whatever the server answers, within a (virtual) moment.
            loop {
                match tokio::time::timeout(Duration::from_millis(50), ch.recv()).await {
                    Ok(Ok(msg)) => match msg {
                        Control::AuthOk(_) | Control::Session(_) => {
                            assert!(!authed || proved, "{} without a valid proof", msg.name())
                        }
                        _ => {}
                    },
                    Ok(Err(_)) => break 'steps,
                    Err(_) => break,
                }
            }
        }
        drop(ch);
        // Disk work runs on real threads while the runtime's clock is virtual (it jumps
        // ahead whenever the runtime idles), so the wait is counted in both: up to a
        // virtual day and at least ten real seconds.
        let mut task = task;
        let started = std::time::Instant::now();
        let mut virtual_secs = 0u64;
        let joined = loop {
            match tokio::time::timeout(Duration::from_secs(60), &mut task).await {
                Ok(r) => break r,
                Err(_) => {
                    virtual_secs += 60;
                    if virtual_secs > 86_400 && started.elapsed() > Duration::from_secs(10) {
                        panic!("the session did not end after the client left");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    });
});
