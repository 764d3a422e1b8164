//! `dmover serve`, resolved ([`crate::resolve::serve`]): listens, announces itself,
//! serves until SIGINT or SIGTERM, reloads its users and exports on SIGHUP.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use dmover_core::access::ConfigFile;
use dmover_core::server::{Server, ServerConfig};
use dmover_net::listen::Listener;
use dmover_net::tls::{KeyOrigin, ServerIdentity};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::args::LogFormat;
use crate::env::Env;
use crate::resolve::{Reload, ServeJob};

/// A line for the operator on stderr: plain text, or with `--log-format json` a log
/// event like every other line there.
fn say(json: bool, msg: &str) {
    if json {
        tracing::info!("{msg}");
    } else {
        eprintln!("{msg}");
    }
}

/// Runs a resolved `dmover serve` until SIGINT or SIGTERM.
pub fn run(job: ServeJob, env: &Env, log_format: LogFormat) -> anyhow::Result<ExitCode> {
    let json = log_format == LogFormat::Json;
    let identity = job.config.identity.clone().context("a resolved identity")?;
    let authenticated = job.config.users.is_some();
    let users = job.config.users.clone().unwrap_or_default();
    let server = Server::with_faults(job.config, job.faults)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(job.net_threads)
        .thread_name("dmover-net")
        .enable_all()
        .build()
        .context("starting the network runtime")?;
    rt.block_on(async {
        let metrics = match job.metrics {
            None => None,
            Some(m) => Some(bind_metrics(m, &identity).await?),
        };
        let listener = match Listener::bind(job.listen, &job.socket) {
            Err(e) if !job.listen_chosen && job.listen.is_ipv6() => {
                tracing::info!("IPv6 unavailable ({e}); listening on IPv4 only");
                let any_v4 = SocketAddr::from(([0, 0, 0, 0], dmover_proto::DEFAULT_PORT));
                Listener::bind(any_v4, &job.socket)?
            }
            r => r?,
        };
        let bound = listener.local_addr().context("reading the bound address")?;
        // The job service's database and address, before anyone learns the server is
        // up: a locked or corrupt database stops the start.
        let jobs = match job.jobs {
            None => None,
            Some(j) => Some(open_jobs(j, &users, &identity).await?),
        };
        // SIGINT or SIGTERM stops the server. The handlers are in place before anyone
        // learns the server is up.
        let shutdown = CancellationToken::new();
        let auth = jobs.as_ref().map(|j| j.auth.clone());
        handle_signals(&server, job.reload, auth, &shutdown, env);
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
                    if job.metrics_tokens.is_empty() {
                        ""
                    } else {
                        " (bearer tokens of metrics_users)"
                    }
                ),
            );
            let access = crate::metrics::Access {
                tls,
                tokens: job.metrics_tokens,
                jobs: jobs.as_ref().map(|j| j.service.clone()),
            };
            tokio::spawn(crate::metrics::serve(
                l,
                server.monitor().clone(),
                access,
                shutdown.clone(),
            ));
        }
        if let Some(j) = jobs {
            start_jobs(j, json, &shutdown);
        }
        announce(
            json,
            &job.key_origin,
            &job.exports,
            bound,
            &identity,
            authenticated,
        );
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

/// The metrics' listener, its address and its TLS (none on loopback).
async fn bind_metrics(
    m: SocketAddr,
    identity: &ServerIdentity,
) -> anyhow::Result<(TcpListener, SocketAddr, Option<tokio_rustls::TlsAcceptor>)> {
    let l = TcpListener::bind(m)
        .await
        .with_context(|| format!("listening on {m} for metrics"))?;
    let bound = l.local_addr().context("reading the metrics address")?;
    let tls = if crate::metrics::is_local(&m) {
        None
    } else {
        Some(identity.acceptor()?)
    };
    Ok((l, bound, tls))
}

/// The job service, ready to start: its store open (and locked), its API's address
/// bound.
struct Jobs {
    service: Arc<dmover_jobs::runner::Service>,
    auth: Arc<dmover_jobs::api::Auth>,
    listener: TcpListener,
    bound: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Opens the job database and binds the API (TLS with the server's key unless on
/// loopback).
async fn open_jobs(
    j: crate::resolve::JobsSetup,
    users: &std::collections::BTreeMap<String, dmover_core::access::User>,
    identity: &ServerIdentity,
) -> anyhow::Result<Jobs> {
    let (db, policy) = (j.database.clone(), j.policy);
    let store: Arc<dyn dmover_jobs::store::JobStore> =
        tokio::task::spawn_blocking(move || match db {
            crate::resolve::Database::Sqlite(path) => dmover_jobs::store::SqliteStore::open(&path)
                .map(|s| Arc::new(s.with_policy(policy)) as Arc<_>),
            crate::resolve::Database::Postgres(o) => {
                let (agent, schema) = (o.agent.clone(), o.schema.clone());
                let s = dmover_jobs::store::pg::PgStore::open(o)?;
                tracing::info!(
                    "jobs: on PostgreSQL as agent {agent} (epoch {}){}",
                    s.epoch(),
                    schema.map(|s| format!(", schema {s}")).unwrap_or_default()
                );
                Ok(Arc::new(s) as Arc<_>)
            }
        })
        .await
        .context("opening the job database")??;
    let listener = TcpListener::bind(j.listen)
        .await
        .with_context(|| format!("listening on {} for the job service", j.listen))?;
    let bound = listener
        .local_addr()
        .context("reading the job service's address")?;
    let tls = if bound.ip().is_loopback() {
        None
    } else {
        Some(identity.acceptor()?)
    };
    Ok(Jobs {
        service: dmover_jobs::runner::Service::new(store, j.runner),
        auth: Arc::new(dmover_jobs::api::Auth::new(users, &j.admins)),
        listener,
        bound,
        tls,
    })
}

/// Starts the runner and the API; says where on stdout (`dmover: jobs on URL`).
fn start_jobs(j: Jobs, json: bool, shutdown: &CancellationToken) {
    let scheme = if j.tls.is_some() { "https" } else { "http" };
    {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "dmover: jobs on {scheme}://{}", j.bound);
    }
    say(
        json,
        &format!(
            "job service on {scheme}://{} (bearer tokens of the server's users)",
            j.bound
        ),
    );
    let api = Arc::new(dmover_jobs::api::Api {
        service: j.service.clone(),
        auth: j.auth,
    });
    tokio::spawn(dmover_jobs::api::serve(
        j.listener,
        j.tls,
        dmover_jobs::api::router(api),
        shutdown.clone(),
    ));
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = j.service.run(stop).await {
            tracing::error!("the job service stopped: {e}");
        }
    });
}

/// SIGHUP reloads the users and exports ([`reload`]), and the job API's users with
/// them; SIGINT or SIGTERM tells the service manager and cancels `shutdown`.
fn handle_signals(
    server: &Arc<Server>,
    reload_of: Reload,
    jobs_auth: Option<Arc<dmover_jobs::api::Auth>>,
    shutdown: &CancellationToken,
    env: &Env,
) {
    let stop = shutdown.clone();
    let notify = env.notify_socket.clone();
    let signal = |kind| tokio::signal::unix::signal(kind).ok();
    let mut int = signal(tokio::signal::unix::SignalKind::interrupt());
    let mut term = signal(tokio::signal::unix::SignalKind::terminate());
    if let Some(mut hup) = signal(tokio::signal::unix::SignalKind::hangup()) {
        let server = server.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reload(&server, &reload_of, jobs_auth.as_deref());
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
}

/// The operator's lines once the server listens: where its key is, what it serves,
/// and a warning when it requires no credentials.
fn announce(
    json: bool,
    origin: &KeyOrigin,
    exports: &[String],
    bound: SocketAddr,
    identity: &ServerIdentity,
    authenticated: bool,
) {
    match origin {
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
}

/// What a SIGHUP does: reads the configuration file again (`--config`; the token file
/// with `--root --token-file`) and puts its users and exports in force
/// ([`Server::reload`]): running sessions that lose their rights end with "credential
/// revoked", the others go on. A file that does not parse or check keeps the old
/// users and exports; either way the outcome is logged, and the server goes on.
fn reload(server: &Server, a: &Reload, jobs_auth: Option<&dmover_jobs::api::Auth>) {
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
                cfg.shared_token(&crate::resolve::token_file(f)?);
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
        let for_jobs = users.clone();
        let changed = server.reload(exports, users)?;
        if let (Some(auth), Some(users)) = (jobs_auth, &for_jobs) {
            auth.replace(users);
        }
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
                if rest(&file) != rest(&a.started) {
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
