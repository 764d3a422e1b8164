//! `dmover serve` resolved: the flags over the configuration file (a flag wins where
//! both say), the users and exports, the address to listen on and the checks that keep
//! an unauthenticated server on loopback, the metrics' access, the TLS identity (read,
//! or made and saved on first start), the limits and the test faults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use dmover_core::access::{ConfigFile, default_state_dir};
use dmover_core::server::{Faults, ServerConfig};
use dmover_net::tcp::SocketOptions;
use dmover_net::tls::{KeyOrigin, ServerIdentity};

use crate::args::{ServeArgs, usage};
use crate::env::Env;

/// A resolved `dmover serve`.
#[derive(Debug)]
pub struct ServeJob {
    /// The server's configuration, identity included.
    pub config: ServerConfig,
    /// Faults injected for tests.
    pub faults: Faults,
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The address was chosen (`--listen` or the config's), not the default: no
    /// falling back to IPv4 alone.
    pub listen_chosen: bool,
    /// Socket settings of accepted connections.
    pub socket: SocketOptions,
    /// Where metrics are served, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// The users whose bearer tokens may read the metrics (see
    /// [`crate::metrics::Access`]).
    pub metrics_tokens: MetricsTokens,
    /// Where the TLS key came from.
    pub key_origin: KeyOrigin,
    /// The exports as the start-up line names them (`name = path (read-only)`).
    pub exports: Vec<String>,
    /// Network threads.
    pub net_threads: usize,
    /// What a SIGHUP reads again.
    pub reload: Reload,
    /// The job service, with `--jobs` or `[jobs] enabled`.
    pub jobs: Option<JobsSetup>,
}

/// `dmover serve --check`: the configuration file and the flags resolved and checked
/// as a start would (the users' credentials, the exports' directories, the listen and
/// metrics addresses, the TLS files, the job service's settings) without binding or
/// writing anything. `Ok`: the line that says what it would serve; the keys written
/// the older way are warned about on stderr.
pub fn check(a: &ServeArgs, env: &Env) -> anyhow::Result<String> {
    let file = match &a.config {
        Some(p) => {
            let file = ConfigFile::load(p)?;
            for w in file.deprecated() {
                eprintln!("dmover: warning: config {}: {w}", p.display());
            }
            file
        }
        None => ConfigFile::default(),
    };
    let text = match &a.config {
        Some(p) => std::fs::read_to_string(p).unwrap_or_default(),
        None => String::new(),
    };
    let cfg = access(a, &file).map_err(|e| match section_of(&format!("{e:#}"), &text) {
        Some(at) => anyhow::anyhow!("{e:#} ({at})"),
        None => e,
    })?;
    for e in &cfg.exports {
        let line = text
            .lines()
            .position(|l| l.trim() == format!("[exports.{}]", e.name))
            .map_or(String::new(), |n| format!(" (line {})", n + 1));
        match std::fs::metadata(&e.path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "exports.{}{line}: path {} is not a directory",
                e.name,
                e.path.display()
            ),
            Err(err) => bail!("exports.{}{line}: path {}: {err}", e.name, e.path.display()),
        }
    }
    let authenticated = cfg.users.is_some();
    let (listen, _) = listen(a, &file, authenticated)?;
    metrics(a, &file, &cfg)?;
    tpc_peers(a, &file)?;
    jobs(a, &file, &cfg, env)?;
    let key = match (
        a.tls_cert.clone().or(file.tls_cert.clone()),
        a.tls_key.clone().or(file.tls_key.clone()),
    ) {
        (Some(c), Some(k)) => {
            ServerIdentity::from_files(&c, &k)?;
            format!("certificate {}", c.display())
        }
        (None, None) => {
            let dir: PathBuf =
                state_dir(a, &file, env).context("no state directory: pass --state-dir DIR")?;
            format!("key in {}", dir.display())
        }
        _ => bail!("tls_cert and tls_key go together"),
    };
    let what = match &a.config {
        Some(p) => format!("config {}", p.display()),
        None => "the flags".to_string(),
    };
    Ok(format!(
        "dmover: {what}: OK: {} exports, {} users, would listen on {listen}, {key}",
        cfg.exports.len(),
        cfg.users.as_ref().map_or(0, |u| u.len()),
    ))
}

/// The section of the user or export an error of the file names (`user alice: ...`),
/// with its line: `[users.alice] at line 12`.
fn section_of(error: &str, text: &str) -> Option<String> {
    [("user ", "users"), ("export ", "exports")]
        .into_iter()
        .find_map(|(word, table)| {
            let at = error.find(word)? + word.len();
            let name = error[at..].split([':', ' ']).next()?;
            let header = format!("[{table}.{name}]");
            let n = text.lines().position(|l| l.trim() == header)?;
            Some(format!("{header} at line {}", n + 1))
        })
}

/// The job service's settings, resolved (docs/jobs.md).
#[derive(Debug)]
pub struct JobsSetup {
    /// Its database.
    pub database: Database,
    /// The REST API's address.
    pub listen: SocketAddr,
    /// How jobs run, with the service's credential.
    pub runner: dmover_jobs::runner::RunnerConfig,
    /// What the store's claims and submissions enforce (link limit, per-user cap).
    pub policy: dmover_jobs::store::Policy,
    /// Users who see every user's jobs.
    pub admins: Vec<String>,
}

/// Where the job service keeps its jobs.
#[derive(Debug, Clone)]
pub enum Database {
    /// An SQLite file of its own.
    Sqlite(PathBuf),
    /// A PostgreSQL database shared with other services (the policy is set on the
    /// store when it opens).
    Postgres(dmover_jobs::store::pg::PgOptions),
}

/// Whether `s` names a PostgreSQL database.
fn is_postgres(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The job database `[jobs] database` or `--db` names.
fn database(
    named: Option<String>,
    agent: Option<String>,
    j: &dmover_core::access::JobsEntry,
    state: &std::path::Path,
    policy: dmover_jobs::store::Policy,
) -> anyhow::Result<Database> {
    let Some(named) = named.clone().filter(|n| is_postgres(n)) else {
        if j.database_schema.is_some()
            || j.database_password_file.is_some()
            || j.database_ca.is_some()
            || agent.is_some()
        {
            return Err(usage(
                "--agent and [jobs] database_schema, database_password_file and database_ca are \
                 for a \
                 PostgreSQL database (--db or database = \"postgres://…\")",
            ));
        }
        return Ok(Database::Sqlite(
            named.map_or_else(|| state.join("jobs.sqlite"), PathBuf::from),
        ));
    };
    let password = match &j.database_password_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading [jobs] database_password_file {}", f.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        None => None,
    };
    let defaults = dmover_jobs::store::pg::Lease::default();
    let lease = dmover_jobs::store::pg::Lease {
        heartbeat: j
            .heartbeat
            .map_or(defaults.heartbeat, |s| s.0.max(Duration::from_millis(100))),
        heartbeats: j.lease_heartbeats.unwrap_or(defaults.heartbeats).max(2),
    };
    let agent = match agent.or_else(|| j.agent.clone()) {
        Some(a) => a,
        None => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    };
    Ok(Database::Postgres(dmover_jobs::store::pg::PgOptions {
        url: named,
        password,
        schema: j.database_schema.clone(),
        agent,
        lease,
        policy,
        ca: j.database_ca.clone(),
    }))
}

/// The job API's address unless configured.
pub const JOBS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7780);

/// Users and their tokens' stored keys ([`crate::metrics::Access::tokens`]).
pub type MetricsTokens = Vec<(String, [u8; 32])>;

/// What a SIGHUP reads again: the config file, or `--root`'s token file.
#[derive(Debug, Clone)]
pub struct Reload {
    /// `--root`.
    pub root: Option<PathBuf>,
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
    /// The config file as it was at the start (to tell what a reload leaves alone).
    pub started: ConfigFile,
}

/// `dmover serve`.
pub fn serve(a: &ServeArgs, env: &Env) -> anyhow::Result<ServeJob> {
    // A config that does not parse, or whose exports and users do not hold, exits 2
    // as `--check` does (a usage error: the file is the server's command line).
    let file = match &a.config {
        Some(p) => {
            let file = ConfigFile::load(p).map_err(|e| usage(format!("{e:#}")))?;
            for w in file.deprecated() {
                tracing::warn!("config {}: {w}", p.display());
            }
            file
        }
        None => ConfigFile::default(),
    };
    let mut cfg = access(a, &file).map_err(|e| match e.downcast::<crate::args::UsageError>() {
        Ok(u) => u.into(),
        Err(e) if a.config.is_some() => usage(format!("{e:#}")),
        Err(e) => e,
    })?;
    let authenticated = cfg.users.is_some();
    let (listen, listen_chosen) = listen(a, &file, authenticated)?;
    let (metrics, metrics_tokens) = metrics(a, &file, &cfg)?;
    let (identity, key_origin) = identity(a, &file, env)?;
    cfg.read_only = a.read_only || file.read_only;
    cfg.identity = Some(identity);
    cfg.require_encryption = file.require_encryption;
    limits(&mut cfg, a, &file);
    cfg.tpc_peers = tpc_peers(a, &file)?;
    let tcp_buffer = a.tcp_buffer.or(file.tcp_buffer.map(|b| b.bytes));
    let socket = SocketOptions {
        send_buffer: tcp_buffer.map(|b| b as usize),
        recv_buffer: tcp_buffer.map(|b| b as usize),
        congestion: a.congestion.clone().or(file.congestion.clone()),
    };
    cfg.socket = socket.clone();
    let faults = faults(a)?;
    let jobs = jobs(a, &file, &cfg, env)?;
    let exports = cfg
        .exports
        .iter()
        .map(|e| {
            let name = if e.name.is_empty() {
                String::new()
            } else {
                format!("{} = ", e.name)
            };
            let ro = if e.read_only || a.read_only || file.read_only {
                " (read-only)"
            } else {
                ""
            };
            format!("{name}{}{ro}", e.path.display())
        })
        .collect();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Ok(ServeJob {
        config: cfg,
        faults,
        listen,
        listen_chosen,
        socket,
        metrics,
        metrics_tokens,
        key_origin,
        exports,
        net_threads: a
            .net_threads
            .or(file.net_threads)
            .map_or(cores, usize::from),
        reload: Reload {
            root: a.root.clone(),
            config: a.config.clone(),
            token_file: a.token_file.clone(),
            started: file,
        },
        jobs,
    })
}

/// The job service: `--jobs` or `[jobs] enabled`, its database and credential. It
/// needs the server's users (its API takes their tokens), and refuses a `[jobs]`
/// name that is not a user as admin.
fn jobs(
    a: &ServeArgs,
    file: &ConfigFile,
    cfg: &ServerConfig,
    env: &Env,
) -> anyhow::Result<Option<JobsSetup>> {
    let j = file.jobs.clone().unwrap_or_default();
    if !(a.jobs || j.enabled) {
        return Ok(None);
    }
    let Some(users) = &cfg.users else {
        return Err(usage(
            "the job service takes bearer tokens of the server's users: pass --token-file \
             FILE or --config FILE with users",
        ));
    };
    if let Some(n) = j.admins.iter().find(|n| !users.contains_key(*n)) {
        return Err(usage(format!(
            "config: [jobs] admins names {n:?}, which is not a user"
        )));
    }
    let state: PathBuf = state_dir(a, file, env)
        .context("no state directory for the job database: pass --state-dir DIR")?;
    let token = j.token_file.as_deref().map(super::token_file).transpose()?;
    let key = j
        .key_file
        .as_deref()
        .map(dmover_core::access::ClientKey::load)
        .transpose()?;
    let known_hosts = j
        .known_hosts
        .clone()
        .unwrap_or_else(|| state.join("jobs_known_hosts"));
    let defaults = dmover_jobs::runner::RunnerConfig::default();
    let policy = dmover_jobs::store::Policy::default();
    let at_least_1s =
        |v: Option<Duration>, d: Duration| v.map_or(d, |s| s.max(Duration::from_secs(1)));
    let runner = dmover_jobs::runner::RunnerConfig {
        concurrency: j.concurrency.unwrap_or(defaults.concurrency).max(1),
        retries: j.retries.unwrap_or(defaults.retries),
        retry_wait: at_least_1s(j.retry_wait(), defaults.retry_wait),
        max_retry_wait: at_least_1s(j.max_retry_wait(), defaults.max_retry_wait),
        deadline: at_least_1s(j.deadline(), defaults.deadline),
        max_sources: j.max_sources.unwrap_or(defaults.max_sources).max(1),
        keep_finished: match j.keep_finished() {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => defaults.keep_finished,
        },
        options: dmover_core::session::TransferOptions {
            token,
            key,
            user: j.user.clone().unwrap_or_default(),
            trust: Some(dmover_net::tls::Trust::KnownHosts(known_hosts)),
            ..Default::default()
        },
        webhooks: dmover_jobs::webhook::Webhooks::new(&j.webhooks, j.webhook_ca.as_deref())
            .map_err(|e| usage(format!("config: [jobs] webhooks: {e}")))?,
        ..defaults
    };
    let policy = dmover_jobs::store::Policy {
        link_concurrency: j.link_concurrency.unwrap_or(policy.link_concurrency).max(1),
        max_unfinished_per_user: j
            .max_unfinished_per_user
            .or(policy.max_unfinished_per_user)
            .filter(|n| *n > 0),
    };
    let named = a.db.clone().or_else(|| {
        j.database
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned())
    });
    Ok(Some(JobsSetup {
        database: database(named, a.agent.clone(), &j, &state, policy)?,
        listen: a.jobs_listen.or(j.listen).unwrap_or(JOBS_LISTEN),
        runner,
        policy,
        admins: j.admins,
    }))
}

/// The exports and users: `--root` (with `--token-file`'s shared token), or the
/// config file's.
fn access(a: &ServeArgs, file: &ConfigFile) -> anyhow::Result<ServerConfig> {
    match (&a.root, &a.config) {
        (Some(root), _) => {
            let mut cfg = ServerConfig::new(root);
            if let Some(f) = &a.token_file {
                let token = super::token_file(f)?;
                let bits = dmover_proto::auth::token_bits(&token);
                if bits < dmover_proto::auth::MIN_TOKEN_BITS {
                    // Only guesses over the network can find it (no verifier of it is
                    // written anywhere), so a warning, not a refusal.
                    tracing::warn!(
                        "the token in {} holds at most {bits} bits of entropy: make one \
                         with `dmover credential token FILE`",
                        f.display()
                    );
                }
                cfg.shared_token(&token);
            }
            // One shared credential: its users together get the whole session limit.
            cfg.max_sessions_per_user = usize::MAX;
            Ok(cfg)
        }
        (None, Some(p)) => {
            let (exports, users) = file.access(p)?;
            let mut cfg = ServerConfig::new("");
            cfg.exports = exports;
            cfg.users = Some(users);
            Ok(cfg)
        }
        (None, None) => Err(usage("pass --root DIR or --config FILE")),
    }
}

/// The address to listen on, and whether it was chosen. By default an authenticated
/// server listens on every address, IPv6 and IPv4 on one socket (`[::]`, dual stack;
/// IPv4 alone where IPv6 is off); without credentials it listens on loopback only,
/// and a chosen address that is not loopback is refused.
fn listen(
    a: &ServeArgs,
    file: &ConfigFile,
    authenticated: bool,
) -> anyhow::Result<(SocketAddr, bool)> {
    let chosen = a.listen.or(file.listen);
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
    Ok((listen, chosen.is_some()))
}

/// The metrics' address and the users whose bearer tokens may read them: loopback,
/// or TLS and tokens (docs/metrics.md).
fn metrics(
    a: &ServeArgs,
    file: &ConfigFile,
    cfg: &ServerConfig,
) -> anyhow::Result<(Option<SocketAddr>, MetricsTokens)> {
    let metrics = a.metrics.or(file.metrics);
    let metrics_users = file.metrics_users.clone().unwrap_or_default();
    let tokens = crate::metrics::Access::tokens_of(&metrics_users, cfg.users.as_ref())
        .map_err(|e| usage(format!("config: {e}")))?;
    let open = metrics.filter(|m| !crate::metrics::is_local(m));
    if let (Some(m), true) = (open, tokens.is_empty()) {
        return Err(usage(format!(
            "refusing to serve metrics on {m}, which is not loopback: name the users whose \
             bearer tokens may read them in the config's metrics_users (the metrics then \
             take TLS with the server's key), or serve them on 127.0.0.1"
        )));
    }
    Ok((metrics, tokens))
}

/// The state directory: `--state-dir`, else the config's `state_dir`, else the default
/// (`None` when there is none).
fn state_dir(a: &ServeArgs, file: &ConfigFile, env: &Env) -> Option<PathBuf> {
    a.state_dir
        .clone()
        .or(file.state_dir.clone())
        .or_else(|| default_state_dir(env.state_dir().as_deref()))
}

/// The TLS identity: the operator's files, else the key in the state directory (made
/// there on first start).
fn identity(
    a: &ServeArgs,
    file: &ConfigFile,
    env: &Env,
) -> anyhow::Result<(ServerIdentity, KeyOrigin)> {
    let (cert, key) = (
        a.tls_cert.clone().or(file.tls_cert.clone()),
        a.tls_key.clone().or(file.tls_key.clone()),
    );
    Ok(match (cert, key) {
        (Some(c), Some(k)) => (ServerIdentity::from_files(&c, &k)?, KeyOrigin::Files),
        (None, None) => {
            let dir: PathBuf =
                state_dir(a, file, env).context("no state directory: pass --state-dir DIR")?;
            ServerIdentity::load_or_create(&dir)?
        }
        _ => bail!("tls_cert and tls_key go together"),
    })
}

/// Threads, sessions, timeouts, manifest bounds, third-party settings and the
/// exports' flags, from the flags over the file.
fn limits(cfg: &mut ServerConfig, a: &ServeArgs, file: &ConfigFile) {
    // Slowness injected for a test stays as slow as asked: its threads are pinned.
    let pinned = a.io_threads.or(file.io_threads).map(usize::from).or(a
        .debug_chunk_delay_ms
        .map(|_| dmover_core::diskpool::DEFAULT_THREADS));
    (cfg.io_threads, cfg.io_threads_max) = dmover_core::diskpool::threads_from(pinned);
    cfg.max_sessions = a.max_sessions.or(file.max_sessions).unwrap_or(64);
    cfg.max_handshakes = a.max_handshakes.or(file.max_handshakes).unwrap_or(256);
    if let Some(n) = a
        .max_unauthenticated_per_address
        .or(file.max_unauthenticated_per_address)
    {
        cfg.max_unauthenticated_per_address = n;
    }
    if let Some(n) = file.max_sessions_per_user {
        cfg.max_sessions_per_user = n;
    }
    if let Some(d) = file.handshake_timeout() {
        cfg.handshake_timeout = d.max(Duration::from_secs(1));
    }
    if let Some(d) = file.idle_timeout() {
        cfg.idle_timeout = d.max(Duration::from_secs(1));
    }
    if let Some(n) = file.max_manifest_entries {
        cfg.max_entries = n;
    }
    if let Some(n) = file.max_manifest_bytes {
        cfg.max_manifest_bytes = n.bytes;
    }
    let bytes = |s: Option<dmover_core::access::Size>| s.map(|s| s.bytes);
    if let Some(n) = a
        .max_manifest_bytes_read
        .or(bytes(file.max_manifest_bytes_read))
    {
        cfg.max_manifest_bytes_read = n;
    }
    if let Some(n) = a.manifest_memory.or(bytes(file.manifest_memory)) {
        cfg.manifest_memory = n;
    }
    cfg.tpc_address = a.tpc_address.clone().or(file.tpc_address.clone());

    if let Some(d) = file.tpc_capability_ttl() {
        cfg.tpc_capability_ttl = d.clamp(
            Duration::from_secs(1),
            Duration::from_secs(dmover_proto::capability::MAX_TTL_SECS),
        );
    }
    for e in &mut cfg.exports {
        e.third_party |= a.third_party;
        e.preserve_owner |= a.preserve_owner;
        e.xattrs_all |= a.all_xattrs;
    }
    cfg.memory_budget = a
        .memory
        .or(file.memory.map(|m| m.bytes))
        .unwrap_or(DEFAULT_MEMORY);
}

/// `--memory` and `memory` unless given: 2 GiB of chunk buffers.
const DEFAULT_MEMORY: u64 = 2 << 30;

/// `--debug-cut-stream-after`, `--debug-chunk-delay-ms`, `--debug-io-latency-ms`.
/// The servers this one may dial for third-party copies: `--tpc-peer` and config
/// `tpc_peers` together, each a key fingerprint.
fn tpc_peers(a: &ServeArgs, file: &ConfigFile) -> anyhow::Result<Vec<String>> {
    let peers: Vec<String> = a
        .tpc_peers
        .iter()
        .chain(file.tpc_peers.iter().flatten())
        .cloned()
        .collect();
    if let Some(bad) = peers.iter().find(|k| !k.starts_with("sha256:")) {
        return Err(usage(format!(
            "tpc_peers: {bad:?} is not a key fingerprint (sha256:...)"
        )));
    }
    Ok(peers)
}

fn faults(a: &ServeArgs) -> anyhow::Result<Faults> {
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
    Ok(Faults {
        link: cut.map(|c| dmover_net::fault::FaultPlan::new(Some(c))),
        chunk_delay: a
            .debug_chunk_delay_ms
            .or(a.debug_io_latency_ms)
            .map(Duration::from_millis),
    })
}
