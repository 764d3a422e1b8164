//! `dmover serve`: serve a directory (`--root`) or the exports of a config file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use dmover_core::access::{ConfigFile, default_state_dir};
use dmover_core::server::{Faults, Server, ServerConfig};
use dmover_net::tcp::{self, SocketOptions};
use dmover_net::tls::{KeyOrigin, ServerIdentity};
use tokio_util::sync::CancellationToken;

use crate::args::{LogFormat, ServeArgs, usage};
use crate::env::Env;

/// Reads a token file, refusing an empty one.
pub fn read_token(f: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let t = std::fs::read(f).with_context(|| format!("reading token file {}", f.display()))?;
    if t.trim_ascii().is_empty() {
        bail!("token file {} is empty", f.display());
    }
    Ok(t)
}

/// A line for the operator on stderr: plain text, or with `--log-format json` a log
/// event like every other line there.
fn say(json: bool, msg: &str) {
    if json {
        tracing::info!("{msg}");
    } else {
        eprintln!("{msg}");
    }
}

pub fn run(a: ServeArgs, env: &Env, log_format: LogFormat) -> anyhow::Result<ExitCode> {
    let json = log_format == LogFormat::Json;
    let file = match &a.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let mut cfg = match (&a.root, &a.config) {
        (Some(root), _) => {
            let mut cfg = ServerConfig::new(root);
            if let Some(f) = &a.token_file {
                cfg.shared_token(&read_token(f)?);
            }
            // One shared credential: its users together get the whole session limit.
            cfg.max_sessions_per_user = usize::MAX;
            cfg
        }
        (None, Some(p)) => {
            let (exports, users) = file.access(p)?;
            let mut cfg = ServerConfig::new("");
            cfg.exports = exports;
            cfg.users = Some(users);
            cfg
        }
        (None, None) => return Err(usage("pass --root DIR or --config FILE")),
    };
    let authenticated = cfg.users.is_some();
    // By default an authenticated server listens on every address, IPv6 and IPv4 on
    // one socket ([::], dual stack), or on IPv4 alone where IPv6 is off; without
    // credentials it listens on loopback only.
    let chosen = a.listen.or(file.listen);
    let any_v4 = SocketAddr::from(([0, 0, 0, 0], dmover_proto::DEFAULT_PORT));
    let listen = chosen.unwrap_or_else(|| {
        if authenticated {
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, dmover_proto::DEFAULT_PORT))
        } else {
            SocketAddr::from(([127, 0, 0, 1], dmover_proto::DEFAULT_PORT))
        }
    });
    if !authenticated && !listen.ip().is_loopback() {
        return Err(usage(format!(
            "refusing to listen on {listen} without authentication: pass --token-file FILE \
             or --config FILE, or listen on loopback (127.0.0.1)"
        )));
    }

    // Metrics: loopback, or TLS and bearer tokens (docs/metrics.md).
    let metrics = a.metrics.or(file.metrics);
    let metrics_users = file.metrics_users.clone().unwrap_or_default();
    let metrics_tokens = crate::metrics::Access::tokens_of(&metrics_users, cfg.users.as_ref())
        .map_err(|e| usage(format!("config: {e}")))?;
    let open_metrics = metrics.filter(|m| !crate::metrics::is_local(m));
    if let (Some(m), true) = (open_metrics, metrics_tokens.is_empty()) {
        return Err(usage(format!(
            "refusing to serve metrics on {m}, which is not loopback: name the users whose \
             bearer tokens may read them in the config's metrics_users (the metrics then \
             take TLS with the server's key), or serve them on 127.0.0.1"
        )));
    }

    // The TLS identity: operator's files, else the key in the state directory.
    let (cert, key) = (
        a.tls_cert.clone().or(file.tls_cert.clone()),
        a.tls_key.clone().or(file.tls_key.clone()),
    );
    let (identity, origin) = match (cert, key) {
        (Some(c), Some(k)) => (ServerIdentity::from_files(&c, &k)?, KeyOrigin::Files),
        (None, None) => {
            let dir: PathBuf = a
                .state_dir
                .clone()
                .or(file.state_dir.clone())
                .or_else(|| default_state_dir(env.state_dir().as_deref()))
                .context("no state directory: pass --state-dir DIR")?;
            ServerIdentity::load_or_create(&dir)?
        }
        _ => bail!("tls_cert and tls_key go together"),
    };

    cfg.read_only = a.read_only;
    cfg.identity = Some(identity.clone());
    cfg.require_encryption = file.require_encryption;
    // Slowness injected for a test stays as slow as asked: its threads are pinned.
    let pinned = a.io_threads.map(usize::from).or(a
        .debug_chunk_delay_ms
        .map(|_| dmover_core::diskpool::DEFAULT_THREADS));
    (cfg.io_threads, cfg.io_threads_max) = dmover_core::diskpool::threads_from(pinned);
    cfg.max_sessions = a.max_sessions.or(file.max_sessions).unwrap_or(64);
    cfg.max_handshakes = a.max_handshakes.or(file.max_handshakes).unwrap_or(256);
    if let Some(n) = file.max_sessions_per_user {
        cfg.max_sessions_per_user = n;
    }
    if let Some(s) = file.handshake_timeout_secs {
        cfg.handshake_timeout = Duration::from_secs(s.max(1));
    }
    if let Some(s) = file.idle_timeout_secs {
        cfg.idle_timeout = Duration::from_secs(s.max(1));
    }
    if let Some(n) = file.max_manifest_entries {
        cfg.max_entries = n;
    }
    if let Some(n) = file.max_manifest_bytes {
        cfg.max_manifest_bytes = n;
    }
    cfg.tpc_address = a.tpc_address.clone().or(file.tpc_address.clone());
    if let Some(s) = file.tpc_capability_ttl_secs {
        cfg.tpc_capability_ttl =
            Duration::from_secs(s.clamp(1, dmover_proto::capability::MAX_TTL_SECS));
    }
    if a.third_party {
        for e in &mut cfg.exports {
            e.third_party = true;
        }
    }
    if a.preserve_owner {
        for e in &mut cfg.exports {
            e.preserve_owner = true;
        }
    }
    if a.all_xattrs {
        for e in &mut cfg.exports {
            e.xattrs_all = true;
        }
    }
    cfg.memory_budget = a.memory;
    let socket = SocketOptions {
        send_buffer: a.tcp_buffer.map(|b| b as usize),
        recv_buffer: a.tcp_buffer.map(|b| b as usize),
        congestion: a.congestion.clone(),
    };
    cfg.socket = socket.clone();
    let cut = match a.debug_cut_stream_after.as_deref() {
        None => None,
        Some(v) => {
            let (n, reset) = match v.strip_suffix(":reset") {
                Some(n) => (n, true),
                None => (v, false),
            };
            let n = dmover_proto::units::parse_size(n)
                .map_err(|e| anyhow::anyhow!("--debug-cut-stream-after: {e}"))?;
            Some((n, reset))
        }
    };
    let faults = Faults {
        link: cut.map(|c| dmover_net::fault::FaultPlan::new(Some(c))),
        chunk_delay: a
            .debug_chunk_delay_ms
            .or(a.debug_io_latency_ms)
            .map(Duration::from_millis),
    };
    let exports: Vec<String> = cfg
        .exports
        .iter()
        .map(|e| {
            let name = if e.name.is_empty() {
                String::new()
            } else {
                format!("{} = ", e.name)
            };
            format!(
                "{name}{}{}",
                e.path.display(),
                if e.read_only || a.read_only {
                    " (read-only)"
                } else {
                    ""
                }
            )
        })
        .collect();
    let server = Server::with_faults(cfg, faults)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.net_threads.map_or(cores, |n| n as usize))
        .thread_name("dmover-net")
        .enable_all()
        .build()
        .context("starting the network runtime")?;
    rt.block_on(async {
        let metrics = match metrics {
            None => None,
            Some(m) => {
                let l = tokio::net::TcpListener::bind(m)
                    .await
                    .with_context(|| format!("listening on {m} for metrics"))?;
                let bound = l.local_addr().context("reading the metrics address")?;
                let tls = if crate::metrics::is_local(&m) {
                    None
                } else {
                    Some(identity.acceptor()?)
                };
                Some((l, bound, tls))
            }
        };
        let listener = match tcp::listen(listen, &socket) {
            Err(e) if chosen.is_none() && listen.is_ipv6() => {
                tracing::info!("IPv6 unavailable ({e}); listening on IPv4 only");
                tcp::listen(any_v4, &socket)?
            }
            r => r?,
        };
        let bound = listener.local_addr().context("reading the bound address")?;
        // SIGINT or SIGTERM stops the server. The handlers are in place before anyone
        // learns the server is up.
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let notify = env.notify_socket.clone();
        let signal = |kind| tokio::signal::unix::signal(kind).ok();
        let mut int = signal(tokio::signal::unix::SignalKind::interrupt());
        let mut term = signal(tokio::signal::unix::SignalKind::terminate());
        // SIGHUP reloads the users and exports (see `reload`).
        if let Some(mut hup) = signal(tokio::signal::unix::SignalKind::hangup()) {
            let (server, a, started) = (server.clone(), a.clone(), file.clone());
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    reload(&server, &a, &started);
                }
            });
        }
        tokio::spawn(async move {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = recv(&mut int) => {}
                _ = recv(&mut term) => {}
            }
            sd_notify(notify.as_deref(), "STOPPING=1");
            stop.cancel();
        });
        // The first line on stdout, so scripts and tests learn the port when asked for
        // port 0; the key's fingerprint follows.
        println!("dmover: listening on {bound}");
        {
            use std::io::Write;
            // Whoever read the first line may have closed the pipe: not an error.
            let _ = writeln!(
                std::io::stdout(),
                "dmover: key fingerprint {}",
                identity.fingerprint()
            );
        }
        if let Some((l, bound, tls)) = metrics {
            let scheme = if tls.is_some() { "https" } else { "http" };
            {
                use std::io::Write;
                let _ = writeln!(std::io::stdout(), "dmover: metrics on {scheme}://{bound}/");
            }
            say(
                json,
                &format!(
                    "metrics on {scheme}://{bound}/metrics, transfers on {scheme}://{bound}/{}",
                    if metrics_tokens.is_empty() {
                        ""
                    } else {
                        " (bearer tokens of metrics_users)"
                    }
                ),
            );
            let access = crate::metrics::Access {
                tls,
                tokens: metrics_tokens,
            };
            tokio::spawn(crate::metrics::serve(
                l,
                server.monitor().clone(),
                access,
                shutdown.clone(),
            ));
        }
        match &origin {
            KeyOrigin::Created(p) => say(
                json,
                &format!("created a new server key in {}", p.display()),
            ),
            KeyOrigin::Loaded(p) => say(json, &format!("server key: {}", p.display())),
            KeyOrigin::Files | KeyOrigin::Ephemeral => {}
        }
        say(
            json,
            &format!(
                "serving {} on {bound} (TLS key {})",
                exports.join(", "),
                identity.fingerprint()
            ),
        );
        if !authenticated {
            let banner = "NO AUTHENTICATION: any local user can read and write the exports \
                          through this server (loopback only; use --token-file or --config \
                          to require credentials)";
            if !json {
                eprintln!("*** {banner} ***");
            }
            tracing::warn!("{banner}");
        }
        // Under systemd (Type=notify): started once the socket listens and SIGTERM is
        // handled.
        sd_notify(
            env.notify_socket.as_deref(),
            &format!("READY=1\nSTATUS=listening on {bound}"),
        );

        server.serve(listener, shutdown).await;
        say(json, "dmover: server stopped");
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// What a SIGHUP does: reads the configuration file again (`--config`; the token file
/// with `--root --token-file`) and puts its users and exports in force
/// ([`Server::reload`]): running sessions that lose their rights end with "credential
/// revoked", the others go on. A file that does not parse or check keeps the old
/// users and exports; either way the outcome is logged, and the server goes on.
fn reload(server: &Server, a: &ServeArgs, started: &ConfigFile) {
    let what = match (&a.root, &a.config, &a.token_file) {
        (Some(_), _, Some(f)) | (None, Some(f), _) => f.display().to_string(),
        _ => {
            tracing::warn!("SIGHUP: nothing to reload (no --config or --token-file)");
            return;
        }
    };
    let loaded = || -> anyhow::Result<_> {
        match (&a.root, &a.config, &a.token_file) {
            (Some(root), _, Some(f)) => {
                let mut cfg = ServerConfig::new(root);
                cfg.shared_token(&read_token(f)?);
                Ok((cfg.exports, cfg.users, None))
            }
            (None, Some(p), _) => {
                let file = ConfigFile::load(p)?;
                let (exports, users) = file.access(p)?;
                Ok((exports, Some(users), Some(file)))
            }
            _ => unreachable!("checked above"),
        }
    };
    let result = loaded().and_then(|(exports, users, file)| {
        let changed = server.reload(exports, users)?;
        Ok((changed, file))
    });
    match result {
        Ok((changed, file)) => {
            tracing::info!("reloaded {what}: {changed}");
            // Only the users and exports are reloaded; say so if more changed.
            if let Some(file) = file {
                let rest = |f: &ConfigFile| ConfigFile {
                    exports: Default::default(),
                    users: Default::default(),
                    ..f.clone()
                };
                if rest(&file) != rest(started) {
                    tracing::warn!(
                        "{what}: keys other than [exports] and [users] changed; they take \
                         effect when the server restarts"
                    );
                }
            }
        }
        Err(e) => tracing::error!(
            "reload of {what} failed, the users and exports stay as they were: {e:#}"
        ),
    }
}

/// Sends `state` (`READY=1`, `STOPPING=1`, ...) to the service manager's notification
/// socket `socket` (`NOTIFY_SOCKET`; `@name` is an abstract socket), as `sd_notify(3)`
/// does. Without a socket it does nothing; a failure is logged, never fatal: the
/// server serves either way.
pub fn sd_notify(socket: Option<&std::ffi::OsStr>, state: &str) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(socket) = socket else { return };
    let send = || -> std::io::Result<()> {
        let addr = match socket.as_bytes().strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
            None => SocketAddr::from_pathname(socket)?,
        };
        let sent = UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
        if sent != state.len() {
            return Err(std::io::Error::other("short write"));
        }
        Ok(())
    };
    if let Err(e) = send() {
        tracing::warn!(
            "could not notify the service manager at {} ({state:?}): {e}",
            socket.to_string_lossy()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn sd_notify_sends_to_a_path_or_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        sd_notify(Some(path.as_os_str()), "READY=1");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("dmover-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        sd_notify(Some(format!("@{name}").as_ref()), "STOPPING=1");
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        // Nobody listening, or no socket: nothing happens.
        sd_notify(Some(dir.path().join("none").as_os_str()), "READY=1");
        sd_notify(None, "READY=1");
    }
}
