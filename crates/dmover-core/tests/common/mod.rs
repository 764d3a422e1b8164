//! A scripted client against a real [`Server`]'s control session, in memory
//! (`Server::control_session` over a duplex pipe, as the `server_session` fuzz target
//! drives it): the messages a hostile or an old client sends, one by one.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use dmover_core::server::{PRE_AUTH_MAX_FRAME, Server, ServerConfig};
use dmover_net::control::ControlChannel;
use dmover_proto::auth;
use dmover_proto::control::{
    Auth, Control, Credential, DataProtection, DirectIo, Hello, MAX_FRAME, Op, Open,
};
use tokio::io::{DuplexStream, duplex};

pub const TOKEN: &[u8] = b"frame limit token";
pub const BINDING: [u8; 32] = [7; 32];
pub const MASTER: [u8; 32] = [9; 32];
pub const NONCE: [u8; 32] = [3; 32];

/// A server of `export` for the token [`TOKEN`], one disk thread.
pub fn server(export: &std::path::Path) -> Arc<Server> {
    let mut cfg = ServerConfig::new(export);
    cfg.io_threads = 1;
    cfg.shared_token(TOKEN);
    Server::new(cfg).unwrap()
}

/// A client channel to `server`'s control session, and the session's task.
pub fn connect(
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

pub fn hello(software: String) -> Control {
    Control::Hello(Hello {
        software,
        nonce: NONCE,
    })
}

/// The [`TOKEN`]'s proof for this session.
pub fn good_auth() -> Control {
    let t = auth::transcript(&BINDING, "", &NONCE);
    Control::Auth(Auth {
        user: String::new(),
        credential: Credential::Token {
            proof: auth::client_token_proof(&auth::token_keys(TOKEN), &t),
        },
    })
}

pub fn open(op: Op) -> Control {
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
pub async fn answer(ch: &mut ControlChannel<DuplexStream>) -> Option<Control> {
    loop {
        match ch.recv_timeout(Duration::from_secs(20), "answer").await {
            Ok(Control::Welcome(_) | Control::AuthOk(_)) => {}
            Ok(m) => return Some(m),
            Err(_) => return None,
        }
    }
}
