//! `dmover serve`: serve a directory.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use dmover_core::server::{Server, ServerConfig};
use dmover_net::tcp::{self, SocketOptions};
use tokio_util::sync::CancellationToken;

use crate::args::ServeArgs;

pub fn run(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let token = match &a.token_file {
        Some(f) => {
            let t =
                std::fs::read(f).with_context(|| format!("reading token file {}", f.display()))?;
            if t.trim_ascii().is_empty() {
                bail!("token file {} is empty", f.display());
            }
            Some(t)
        }
        None => None,
    };
    let listen = a.listen.unwrap_or_else(|| {
        let ip = if token.is_some() {
            [0, 0, 0, 0]
        } else {
            [127, 0, 0, 1]
        };
        SocketAddr::from((ip, dmover_proto::DEFAULT_PORT))
    });
    if token.is_none() && !listen.ip().is_loopback() {
        bail!(
            "refusing to listen on {listen} without authentication: pass --token-file FILE, \
             or listen on loopback (127.0.0.1)"
        );
    }
    if token.is_none() {
        tracing::warn!(
            "no token: any local user can read and write {} through this server",
            a.root.display()
        );
    }
    let socket = SocketOptions {
        send_buffer: a.tcp_buffer.map(|b| b as usize),
        recv_buffer: a.tcp_buffer.map(|b| b as usize),
        congestion: a.congestion.clone(),
    };
    let mut cfg = ServerConfig::new(&a.root);
    cfg.read_only = a.read_only;
    cfg.token = token;
    cfg.io_threads = a.io_threads as usize;
    cfg.max_sessions = a.max_sessions;
    cfg.memory_budget = a.memory;
    cfg.socket = socket.clone();
    cfg.chunk_delay = a.debug_chunk_delay_ms.map(Duration::from_millis);
    let server = Server::new(cfg)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.net_threads.map_or(cores, |n| n as usize))
        .thread_name("dmover-net")
        .enable_all()
        .build()
        .context("starting the network runtime")?;
    rt.block_on(async {
        let listener = tcp::listen(listen, &socket)?;
        let bound = listener.local_addr().context("reading the bound address")?;
        // One line on stdout, so scripts and tests learn the port when asked for port 0.
        println!("dmover: listening on {bound}");
        eprintln!(
            "serving {} on {bound}{}{}",
            a.root.display(),
            if a.read_only { " (read-only)" } else { "" },
            if a.token_file.is_some() { "" } else { " (no authentication: loopback only)" }
        );
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            stop.cancel();
        });
        server.serve(listener, shutdown).await;
        eprintln!("dmover: server stopped");
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
