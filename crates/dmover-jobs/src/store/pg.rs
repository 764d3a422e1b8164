//! The job store on PostgreSQL ([`PgStore`]): several job services (one per DTN, each
//! an *agent*) share one database, as the cluster does (docs/cluster.md).
//!
//! - Each agent has a row in `agents` with an *epoch*, bumped each time a service
//!   starts under that name, and a heartbeat time (PostgreSQL's `now()`, never an
//!   agent's clock). A job an agent claims records the agent and its epoch.
//! - A lease is [`Lease::heartbeats`] heartbeats: a running job whose agent has not
//!   heartbeated within its lease (counted from the later of its last heartbeat and
//!   the database's own start, so a database restart reclaims nothing), or whose
//!   agent started again under a new epoch, is queued again by the next scan of any
//!   agent ([`JobStore::reclaim`]).
//! - Fencing: a run's progress and its end are written only where the job still names
//!   this agent and epoch; a run that lost its job is told ([`RunState::Lost`],
//!   [`StoreError::Lost`]) and stopped, and its end is not recorded.
//! - Claims are serialised by a transaction-level advisory lock: the claim's choice
//!   (fair share between users, link limits) reads every running job, so two agents
//!   choosing at once could both fill a link's last place; with the lock, one job is
//!   never handed to two agents and no limit is passed.
//! - One agent name is one live service: a session-level advisory lock on the name
//!   is held while the connection is (a second service under the same name is
//!   refused; a crashed one's lock goes with its connection).
//!
//! The trait is synchronous ([`JobStore`]); the store runs the asynchronous client
//! (tokio-postgres) on a runtime of its own, one thread, and callers block on it from
//! `spawn_blocking` (never from a runtime's worker). One connection per agent, made
//! again after the database was unreachable.

use std::sync::Mutex;
use std::time::Duration;

use tokio_postgres::{Client, NoTls, Row, Transaction};

use super::{CLAIM, JobStore, Page, Policy, RunState, StoreError, db_int, ending, parse_row};
use crate::model::{Counters, FileError, Job, JobId, JobKind, JobSpec, Outcome, State, now_ms};

/// The schema, one step per version (`dmover_schema.version` counts the steps
/// applied). The columns of `jobs` are SQLite's, plus the agent and epoch of a
/// running job.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE jobs (
        id BIGSERIAL PRIMARY KEY,
        owner TEXT NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        attempts BIGINT NOT NULL DEFAULT 0,
        tries BIGINT NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        queued_ms BIGINT NOT NULL,
        started_ms BIGINT,
        ended_ms BIGINT,
        not_before_ms BIGINT NOT NULL DEFAULT 0,
        bytes BIGINT NOT NULL DEFAULT 0,
        bytes_total BIGINT NOT NULL DEFAULT 0,
        bytes_resumed BIGINT NOT NULL DEFAULT 0,
        files_done BIGINT NOT NULL DEFAULT 0,
        files_failed BIGINT NOT NULL DEFAULT 0,
        files_total BIGINT NOT NULL DEFAULT 0,
        rate DOUBLE PRECISION NOT NULL DEFAULT 0,
        error TEXT,
        cancel_requested BOOLEAN NOT NULL DEFAULT false,
        priority INTEGER NOT NULL DEFAULT 3,
        link TEXT NOT NULL,
        webhook TEXT,
        webhook_error TEXT,
        agent TEXT,
        epoch BIGINT
    );
    CREATE INDEX jobs_queue ON jobs (state, not_before_ms, id);
    CREATE INDEX jobs_owner ON jobs (owner, id);
    CREATE INDEX jobs_owner_state ON jobs (owner, state);
    CREATE INDEX jobs_ended ON jobs (state, ended_ms);
    CREATE INDEX jobs_webhook ON jobs (webhook);
    CREATE INDEX jobs_agent ON jobs (agent) WHERE state = 'running';
    CREATE TABLE file_errors (
        seq BIGSERIAL PRIMARY KEY,
        job BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        path TEXT NOT NULL,
        error TEXT NOT NULL
    );
    CREATE INDEX file_errors_job ON file_errors (job);
    CREATE TABLE owners (
        owner TEXT PRIMARY KEY,
        last_claim BIGINT NOT NULL
    );
    CREATE TABLE agents (
        name TEXT PRIMARY KEY,
        epoch BIGINT NOT NULL,
        heartbeat_at TIMESTAMPTZ NOT NULL,
        lease_ms BIGINT NOT NULL,
        software TEXT NOT NULL
    );"];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The first key of dmover's advisory locks ("dmov"); the second names what is
/// locked (a hash of the schema's and the agent's names).
const LOCK_KEY: i32 = 0x646d_6f76;

/// The columns [`row_job`] reads, in order (SQLite's [`super::COLUMNS`]).
const COLUMNS: &str = super::COLUMNS;

/// An agent's lease: how often it heartbeats, and how many heartbeats a lease lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The time between heartbeats.
    pub heartbeat: Duration,
    /// Heartbeats a lease lasts (at least 2: one late heartbeat reclaims nothing).
    pub heartbeats: u32,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            heartbeat: Duration::from_secs(5),
            heartbeats: 6,
        }
    }
}

impl Lease {
    /// The lease's length.
    pub fn length(&self) -> Duration {
        self.heartbeat.saturating_mul(self.heartbeats.max(2))
    }
}

/// How to reach the database and who this agent is.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// A libpq-style URL (`postgres://user@host/db`) or key-value string.
    pub url: String,
    /// The database user's password, if not in the URL (read from a file by the
    /// caller; never written into the URL, which errors and logs may show).
    pub password: Option<String>,
    /// The PostgreSQL schema that holds this cluster's tables (several clusters share
    /// one database in schemas of their own); `None`: the user's default.
    pub schema: Option<String>,
    /// This agent's name (unique among the services sharing the database).
    pub agent: String,
    /// Its lease.
    pub lease: Lease,
    /// The scheduling policy (the same in every agent).
    pub policy: Policy,
    /// CA certificates (PEM) that sign the database server's certificate: the
    /// connection is then TLS, the server's name checked against it, and never made
    /// in clear (`sslmode=require` whatever the URL says). `None`: no TLS (a URL asking
    /// for it is refused at connect).
    pub ca: Option<std::path::PathBuf>,
}

/// Jobs in a PostgreSQL database shared by agents.
pub struct PgStore {
    opts: PgOptions,
    rt: Option<tokio::runtime::Runtime>,
    /// The connection (`None` after it broke: made again by the next call).
    conn: Mutex<Option<Client>>,
    /// This service's epoch under its agent name.
    epoch: i64,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("agent", &self.opts.agent)
            .field("schema", &self.opts.schema)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Dropped anywhere, a runtime's worker included.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn db(e: tokio_postgres::Error) -> StoreError {
    // The server's own words where it said something (the default Display says only
    // "db error").
    if let Some(d) = e.as_db_error() {
        return StoreError::Db(format!("PostgreSQL: {}", d.message()));
    }
    let mut msg = format!("PostgreSQL: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    StoreError::Db(msg)
}

/// Whether `name` may name a schema unquoted (lower-case letters, digits, `_`).
fn plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 63
}

impl PgStore {
    /// Connects, migrates the schema to [`SCHEMA_VERSION`] (one agent at a time),
    /// takes the agent's name and starts its new epoch.
    pub fn open(opts: PgOptions) -> Result<PgStore, StoreError> {
        if let Some(s) = opts.schema.as_deref().filter(|s| !plain_name(s)) {
            return Err(StoreError::Db(format!(
                "schema {s:?}: use lower-case letters, digits and _ (at most 63)"
            )));
        }
        if opts.agent.is_empty() {
            return Err(StoreError::Db("the agent's name is empty".into()));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dmover-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Db(format!("starting the PostgreSQL client: {e}")))?;
        let mut store = PgStore {
            opts,
            rt: Some(rt),
            conn: Mutex::new(None),
            epoch: 0,
        };
        store.epoch = store.block_on(store.start())?;
        Ok(store)
    }

    /// This agent's name.
    pub fn agent(&self) -> &str {
        &self.opts.agent
    }

    /// This service's epoch under its name.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.as_ref().expect("live until dropped").block_on(f)
    }

    /// A new connection, in this cluster's schema, holding the agent's name.
    async fn connect(&self) -> Result<Client, StoreError> {
        let mut config: tokio_postgres::Config = self.opts.url.parse().map_err(db)?;
        if let Some(p) = &self.opts.password {
            config.password(p);
        }
        let client = match &self.opts.ca {
            None => connect_with(&config, NoTls).await?,
            Some(ca) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                connect_with(&config, tls::MakeTls::new(ca)?).await?
            }
        };
        if let Some(s) = &self.opts.schema {
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {s}; SET search_path TO {s}"
                ))
                .await
                .map_err(db)?;
        }
        let name = format!(
            "{}/{}",
            self.opts.schema.as_deref().unwrap_or(""),
            self.opts.agent
        );
        let held: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext($2))",
                &[&LOCK_KEY, &name],
            )
            .await
            .map_err(db)?
            .get(0);
        if !held {
            return Err(StoreError::AgentInUse(self.opts.agent.clone()));
        }
        Ok(client)
    }

    /// The first connection: migrations, then the agent's new epoch.
    async fn start(&self) -> Result<i64, StoreError> {
        let mut client = self.connect().await?;
        migrate(&mut client).await?;
        let lease_ms = i64::try_from(self.opts.lease.length().as_millis()).unwrap_or(i64::MAX);
        let epoch: i64 = client
            .query_one(
                "INSERT INTO agents (name, epoch, heartbeat_at, lease_ms, software) \
                 VALUES ($1, 1, now(), $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET epoch = agents.epoch + 1, \
                 heartbeat_at = now(), lease_ms = excluded.lease_ms, software = excluded.software \
                 RETURNING epoch",
                &[
                    &self.opts.agent,
                    &lease_ms,
                    &concat!("dmover ", env!("CARGO_PKG_VERSION")),
                ],
            )
            .await
            .map_err(db)?
            .get(0);
        *self.lock() = Some(client);
        Ok(epoch)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Client>> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` in a transaction on the connection (made again if it broke; a
    /// connection that breaks during `f` is dropped, and the error returned).
    fn tx<T>(
        &self,
        f: impl AsyncFnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut guard = self.lock();
        self.block_on(async {
            if guard.as_ref().is_none_or(Client::is_closed) {
                *guard = None;
                *guard = Some(self.connect().await?);
            }
            let client = guard.as_mut().expect("connected");
            let out = async {
                let tx = client.transaction().await.map_err(db)?;
                let out = f(&tx).await?;
                tx.commit().await.map_err(db)?;
                Ok(out)
            }
            .await;
            // A connection that broke is made again by the next call.
            if out.is_err() && guard.as_ref().is_some_and(Client::is_closed) {
                *guard = None;
            }
            out
        })
    }

    /// Fails unless `job` is running under this agent and epoch.
    fn held(&self, job: &Job, agent: Option<&str>, epoch: Option<i64>) -> Result<(), StoreError> {
        if job.state == State::Running
            && agent == Some(self.opts.agent.as_str())
            && epoch == Some(self.epoch)
        {
            return Ok(());
        }
        Err(StoreError::Lost(format!(
            "job {} is no longer this service's (agent {}, epoch {}): {}",
            job.id,
            self.opts.agent,
            self.epoch,
            match agent {
                Some(a) if job.state == State::Running => format!("agent {a} runs it now"),
                _ => format!("it is {} now", job.state.as_str()),
            }
        )))
    }
}

/// Connects with `tls` (within [`CONNECT_TIMEOUT`]) and runs the connection on this
/// runtime until it ends.
async fn connect_with<T>(config: &tokio_postgres::Config, tls: T) -> Result<Client, StoreError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls))
        .await
        .map_err(|_| {
            StoreError::Db(format!(
                "PostgreSQL did not answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(db)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!("jobs: the PostgreSQL connection ended: {e}");
        }
    });
    Ok(client)
}

/// TLS to PostgreSQL with rustls (the process's provider), trusting a CA file. No
/// channel binding: SCRAM-SHA-256 without `-PLUS` (PostgreSQL's default
/// `channel_binding=prefer` accepts it).
mod tls {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};

    use super::StoreError;

    /// Makes a TLS connection per database connection.
    #[derive(Clone)]
    pub struct MakeTls(Arc<rustls::ClientConfig>);

    impl MakeTls {
        /// Trusting the CA certificates in `ca`.
        pub fn new(ca: &std::path::Path) -> Result<MakeTls, StoreError> {
            let bad = |e: &dyn std::fmt::Display| {
                StoreError::Db(format!("the database's CA file {}: {e}", ca.display()))
            };
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| bad(&e))? {
                roots.add(c.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
            }
            if roots.is_empty() {
                return Err(bad(&"no certificate in it"));
            }
            let cfg = rustls::ClientConfig::builder_with_provider(dmover_net::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(&e))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(MakeTls(Arc::new(cfg)))
        }
    }

    /// One connection's TLS set-up: the server's name to check.
    pub struct Connect {
        cfg: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    }

    impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for MakeTls {
        type Stream = Stream<S>;
        type TlsConnect = Connect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
            let name = ServerName::try_from(domain.to_string())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(Connect {
                cfg: self.0.clone(),
                name,
            })
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for Connect {
        type Stream = Stream<S>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

        fn connect(self, stream: S) -> Self::Future {
            let connector = tokio_rustls::TlsConnector::from(self.cfg);
            Box::pin(async move { Ok(Stream(connector.connect(self.name, stream).await?)) })
        }
    }

    /// A TLS stream to the database.
    pub struct Stream<S>(tokio_rustls::client::TlsStream<S>);

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }
}

/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Applies the migrations the database lacks, under a lock (agents starting at once
/// migrate once).
async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(db)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[&LOCK_KEY],
    )
    .await
    .map_err(db)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS dmover_schema (version BIGINT NOT NULL)")
        .await
        .map_err(db)?;
    let found: i64 = tx
        .query_opt("SELECT version FROM dmover_schema", &[])
        .await
        .map_err(db)?
        .map_or(0, |r| r.get(0));
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: "the PostgreSQL jobs schema".into(),
            found,
            known: SCHEMA_VERSION,
        });
    }
    for step in MIGRATIONS.iter().skip(found.max(0) as usize) {
        tx.batch_execute(step).await.map_err(db)?;
    }
    tx.execute("DELETE FROM dmover_schema", &[])
        .await
        .map_err(db)?;
    tx.execute(
        "INSERT INTO dmover_schema (version) VALUES ($1)",
        &[&SCHEMA_VERSION],
    )
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)
}

/// Reads a job row ([`COLUMNS`], then `agent`, `epoch`); its file errors are read
/// apart.
fn row_job(r: &Row) -> Result<(Job, Option<String>, Option<i64>), StoreError> {
    let id: JobId = r.get(0);
    let (kind, state, spec, webhook) = parse_row(
        id,
        r.get(2),
        r.get(3),
        r.get(4),
        r.get::<_, Option<&str>>(23),
    )?;
    let u = |i: usize| r.get::<_, i64>(i).max(0) as u64;
    let job = Job {
        id,
        owner: r.get(1),
        kind,
        state,
        spec,
        attempts: u(5) as u32,
        tries: u(6) as u32,
        created_ms: r.get(7),
        queued_ms: r.get(8),
        started_ms: r.get(9),
        ended_ms: r.get(10),
        not_before_ms: r.get(11),
        bytes: u(12),
        bytes_total: u(13),
        bytes_resumed: u(14),
        files_done: u(15),
        files_failed: u(16),
        files_total: u(17),
        rate: r.get(18),
        error: r.get(19),
        file_errors: Vec::new(),
        cancel_requested: r.get(20),
        priority: r.get::<_, i32>(21).clamp(0, 255) as u8,
        link: r.get(22),
        webhook,
        webhook_error: r.get(24),
    };
    Ok((job, r.get(25), r.get(26)))
}

/// Job `id` with its file errors, and its agent and epoch; `lock`: `FOR UPDATE`.
async fn load_held(
    tx: &Transaction<'_>,
    id: JobId,
    lock: bool,
) -> Result<(Job, Option<String>, Option<i64>), StoreError> {
    let q = format!(
        "SELECT {COLUMNS}, agent, epoch FROM jobs WHERE id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let row = tx.query_opt(&q, &[&id]).await.map_err(db)?;
    let (mut job, agent, epoch) = row_job(&row.ok_or(StoreError::NotFound(id))?)?;
    job.file_errors = tx
        .query(
            "SELECT path, error FROM file_errors WHERE job = $1 ORDER BY seq",
            &[&id],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| FileError {
            path: r.get(0),
            error: r.get(1),
        })
        .collect();
    Ok((job, agent, epoch))
}

async fn load(tx: &Transaction<'_>, id: JobId) -> Result<Job, StoreError> {
    Ok(load_held(tx, id, false).await?.0)
}

/// Marks `job`'s webhook pending, if it names one: it has just ended.
async fn webhook_due(tx: &Transaction<'_>, job: &Job) -> Result<(), StoreError> {
    if job.spec.options.notify.is_some() {
        tx.execute(
            "UPDATE jobs SET webhook = 'pending', webhook_error = NULL WHERE id = $1",
            &[&job.id],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

async fn set_counters(tx: &Transaction<'_>, id: JobId, c: &Counters) -> Result<u64, StoreError> {
    tx.execute(
        "UPDATE jobs SET bytes = $2, bytes_total = $3, files_done = $4, files_total = $5, \
         rate = $6, bytes_resumed = $7 WHERE id = $1",
        &[
            &id,
            &db_int(c.bytes),
            &db_int(c.bytes_total),
            &db_int(c.files_done),
            &db_int(c.files_total),
            &c.rate,
            &db_int(c.bytes_resumed),
        ],
    )
    .await
    .map_err(db)
}

/// Queues again (or cancels, if that was asked) the running jobs `rows` names.
async fn requeue(tx: &Transaction<'_>, rows: &[Row], why: &str) -> Result<Vec<JobId>, StoreError> {
    let mut ids = Vec::with_capacity(rows.len());
    for r in rows {
        let (id, cancelled): (JobId, bool) = (r.get(0), r.get(1));
        ids.push(id);
        if cancelled {
            tx.execute(
                "UPDATE jobs SET state = 'cancelled', ended_ms = $2, cancel_requested = false, \
                 agent = NULL, epoch = NULL WHERE id = $1",
                &[&id, &now_ms()],
            )
            .await
            .map_err(db)?;
            webhook_due(tx, &load(tx, id).await?).await?;
        } else {
            tx.execute(
                "UPDATE jobs SET state = 'queued', not_before_ms = 0, error = $2, \
                 agent = NULL, epoch = NULL WHERE id = $1",
                &[&id, &why],
            )
            .await
            .map_err(db)?;
        }
    }
    Ok(ids)
}

impl JobStore for PgStore {
    fn submit(&self, owner: &str, kind: JobKind, spec: &JobSpec) -> Result<Job, StoreError> {
        let (link, priority) = (
            crate::model::link_of(spec),
            i32::from(spec.options.priority()),
        );
        let spec = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let cap = self.opts.policy.max_unfinished_per_user;
        self.tx(async |tx| {
            if let Some(cap) = cap {
                let n: i64 = tx
                    .query_one(
                        "SELECT COUNT(*) FROM jobs WHERE owner = $1 AND state IN ('queued', 'running')",
                        &[&owner],
                    )
                    .await
                    .map_err(db)?
                    .get(0);
                if n >= i64::from(cap) {
                    return Err(super::too_many(owner, n, cap));
                }
            }
            let id: JobId = tx
                .query_one(
                    "INSERT INTO jobs (owner, kind, state, spec, created_ms, queued_ms, priority, link) \
                     VALUES ($1, $2, 'queued', $3, $4, $4, $5, $6) RETURNING id",
                    &[&owner, &kind.as_str(), &spec, &now_ms(), &priority, &link],
                )
                .await
                .map_err(db)?
                .get(0);
            load(tx, id).await
        })
    }

    fn get(&self, id: JobId) -> Result<Job, StoreError> {
        self.tx(async |tx| load(tx, id).await)
    }

    fn list(&self, page: Page<'_>) -> Result<Vec<Job>, StoreError> {
        self.tx(async |tx| {
            let rows = tx
                .query(
                    "SELECT id FROM jobs WHERE ($1::TEXT IS NULL OR owner = $1) \
                     AND ($2::BIGINT IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
                    &[&page.owner, &page.before, &i64::from(page.limit)],
                )
                .await
                .map_err(db)?;
            let mut jobs = Vec::with_capacity(rows.len());
            for r in rows {
                jobs.push(load(tx, r.get(0)).await?);
            }
            Ok(jobs)
        })
    }

    fn claim(&self, now_ms: i64) -> Result<Option<Job>, StoreError> {
        let limit = i64::from(self.opts.policy.link_concurrency.max(1));
        let (agent, epoch) = (self.opts.agent.as_str(), self.epoch);
        self.tx(async |tx| {
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext(current_schema() || '.claim'))",
                &[&LOCK_KEY],
            )
            .await
            .map_err(db)?;
            let mine = tx
                .query_opt(
                    "SELECT 1 FROM agents WHERE name = $1 AND epoch = $2",
                    &[&agent, &epoch],
                )
                .await
                .map_err(db)?;
            if mine.is_none() {
                return Err(StoreError::Lost(format!(
                    "agent {agent}: another service started under this name (epoch {epoch} \
                     is over); this one claims nothing more"
                )));
            }
            let claim = CLAIM.replace("?1", "$1").replace("?2", "$2");
            let Some(row) = tx.query_opt(&claim, &[&now_ms, &limit]).await.map_err(db)? else {
                return Ok(None);
            };
            let id: JobId = row.get(0);
            tx.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, tries = tries + 1, \
                 started_ms = $2, ended_ms = NULL, agent = $3, epoch = $4 WHERE id = $1",
                &[&id, &now_ms, &agent, &epoch],
            )
            .await
            .map_err(db)?;
            tx.execute(
                "INSERT INTO owners (owner, last_claim) \
                 SELECT owner, (SELECT COALESCE(MAX(last_claim), 0) + 1 FROM owners) \
                 FROM jobs WHERE id = $1 \
                 ON CONFLICT (owner) DO UPDATE SET last_claim = excluded.last_claim",
                &[&id],
            )
            .await
            .map_err(db)?;
            load(tx, id).await.map(Some)
        })
    }

    fn progress(&self, id: JobId, c: &Counters) -> Result<RunState, StoreError> {
        let (agent, epoch) = (self.opts.agent.as_str(), self.epoch);
        self.tx(async |tx| {
            let row = tx
                .query_opt(
                    "UPDATE jobs SET bytes = $2, bytes_total = $3, files_done = $4, \
                     files_total = $5, rate = $6, bytes_resumed = $7 \
                     WHERE id = $1 AND state = 'running' AND agent = $8 AND epoch = $9 \
                     RETURNING cancel_requested",
                    &[
                        &id,
                        &db_int(c.bytes),
                        &db_int(c.bytes_total),
                        &db_int(c.files_done),
                        &db_int(c.files_total),
                        &c.rate,
                        &db_int(c.bytes_resumed),
                        &agent,
                        &epoch,
                    ],
                )
                .await
                .map_err(db)?;
            Ok(match row.map(|r| r.get::<_, bool>(0)) {
                None => RunState::Lost,
                Some(false) => RunState::Running,
                Some(true) => RunState::CancelAsked,
            })
        })
    }

    fn finish(&self, id: JobId, outcome: &Outcome) -> Result<Job, StoreError> {
        self.tx(async |tx| {
            let (job, agent, epoch) = load_held(tx, id, true).await?;
            self.held(&job, agent.as_deref(), epoch)?;
            let e = ending(&job, outcome, now_ms());
            set_counters(tx, id, e.counters).await?;
            tx.execute("DELETE FROM file_errors WHERE job = $1", &[&id])
                .await
                .map_err(db)?;
            for f in e.files {
                tx.execute(
                    "INSERT INTO file_errors (job, path, error) VALUES ($1, $2, $3)",
                    &[&id, &f.path, &f.error],
                )
                .await
                .map_err(db)?;
            }
            tx.execute(
                "UPDATE jobs SET state = $2, error = $3, not_before_ms = $4, ended_ms = $5, \
                 files_failed = $6, cancel_requested = false, agent = NULL, epoch = NULL \
                 WHERE id = $1",
                &[
                    &id,
                    &e.state.as_str(),
                    &e.error,
                    &e.not_before,
                    &e.ended,
                    &(e.files.len() as i64),
                ],
            )
            .await
            .map_err(db)?;
            if e.recurs {
                tx.execute(
                    "UPDATE jobs SET tries = 0, queued_ms = $2 WHERE id = $1",
                    &[&id, &e.not_before],
                )
                .await
                .map_err(db)?;
            }
            if e.webhook_due() {
                webhook_due(tx, &job).await?;
            }
            load(tx, id).await
        })
    }

    fn cancel(&self, id: JobId) -> Result<Job, StoreError> {
        self.tx(async |tx| {
            let (job, _, _) = load_held(tx, id, true).await?;
            match job.state {
                State::Queued => {
                    tx.execute(
                        "UPDATE jobs SET state = 'cancelled', ended_ms = $2 WHERE id = $1",
                        &[&id, &now_ms()],
                    )
                    .await
                    .map_err(db)?;
                    webhook_due(tx, &job).await?;
                }
                State::Running => {
                    tx.execute(
                        "UPDATE jobs SET cancel_requested = true WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .map_err(db)?;
                }
                s => return Err(super::nothing_to_cancel(id, s)),
            }
            load(tx, id).await
        })
    }

    fn retry(&self, id: JobId) -> Result<Job, StoreError> {
        self.tx(async |tx| {
            let (job, _, _) = load_held(tx, id, true).await?;
            if !matches!(job.state, State::Failed | State::Cancelled) {
                return Err(super::not_retryable(id, job.state));
            }
            tx.execute(
                "UPDATE jobs SET state = 'queued', tries = 0, not_before_ms = 0, ended_ms = NULL, \
                 error = NULL, queued_ms = $2, webhook = NULL, webhook_error = NULL WHERE id = $1",
                &[&id, &now_ms()],
            )
            .await
            .map_err(db)?;
            load(tx, id).await
        })
    }

    /// At start, on a shared store: what any agent's scan does (this agent's jobs of
    /// an earlier epoch are among them: its last service stopped).
    fn recover(&self) -> Result<Vec<JobId>, StoreError> {
        self.reclaim()
    }

    fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError> {
        self.tx(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT MIN(not_before_ms) FROM jobs WHERE state = 'queued' AND not_before_ms > $1",
                    &[&after_ms],
                )
                .await
                .map_err(db)?
                .get(0))
        })
    }

    fn purge(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.tx(async |tx| {
            let n = tx
                .execute(
                    "DELETE FROM jobs WHERE state IN ('done', 'failed', 'cancelled') AND ended_ms < $1",
                    &[&before_ms],
                )
                .await
                .map_err(db)?;
            tx.execute(
                "DELETE FROM owners WHERE owner NOT IN (SELECT owner FROM jobs)",
                &[],
            )
            .await
            .map_err(db)?;
            Ok(n)
        })
    }

    fn counts(&self) -> Result<Vec<(State, u64)>, StoreError> {
        self.tx(async |tx| {
            tx.query("SELECT state, COUNT(*) FROM jobs GROUP BY state", &[])
                .await
                .map_err(db)?
                .iter()
                .map(|r| {
                    let s: &str = r.get(0);
                    let state = State::parse(s).ok_or_else(|| {
                        StoreError::Db(format!("a job in an unknown state {s:?}"))
                    })?;
                    Ok((state, r.get::<_, i64>(1).max(0) as u64))
                })
                .collect()
        })
    }

    fn webhooks_pending(&self, limit: usize) -> Result<Vec<Job>, StoreError> {
        self.tx(async |tx| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = tx
                .query(
                    "SELECT id FROM jobs WHERE webhook = 'pending' ORDER BY ended_ms, id LIMIT $1",
                    &[&limit],
                )
                .await
                .map_err(db)?;
            let mut jobs = Vec::with_capacity(rows.len());
            for r in rows {
                jobs.push(load(tx, r.get(0)).await?);
            }
            Ok(jobs)
        })
    }

    fn webhook_result(&self, id: JobId, result: Result<(), String>) -> Result<(), StoreError> {
        let (state, error) = match result {
            Ok(()) => (crate::model::WebhookState::Delivered, None),
            Err(e) => (crate::model::WebhookState::Failed, Some(e)),
        };
        self.tx(async |tx| {
            tx.execute(
                "UPDATE jobs SET webhook = $2, webhook_error = $3 \
                 WHERE id = $1 AND webhook = 'pending'",
                &[&id, &state.as_str(), &error],
            )
            .await
            .map_err(db)?;
            Ok(())
        })
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        Some(self.opts.lease.heartbeat)
    }

    fn heartbeat(&self) -> Result<(), StoreError> {
        let (agent, epoch) = (self.opts.agent.as_str(), self.epoch);
        let n = self.tx(async |tx| {
            tx.execute(
                "UPDATE agents SET heartbeat_at = now() WHERE name = $1 AND epoch = $2",
                &[&agent, &epoch],
            )
            .await
            .map_err(db)
        })?;
        if n == 0 {
            return Err(StoreError::Lost(format!(
                "agent {agent}: another service started under this name (epoch {epoch} is over)"
            )));
        }
        Ok(())
    }

    fn reclaim(&self) -> Result<Vec<JobId>, StoreError> {
        self.tx(async |tx| {
            // A lease counts from the later of the agent's last heartbeat and the
            // database's start: agents cannot heartbeat while it is down.
            let rows = tx
                .query(
                    "SELECT j.id, j.cancel_requested, j.agent FROM jobs j \
                     LEFT JOIN agents a ON a.name = j.agent \
                     WHERE j.state = 'running' AND (a.name IS NULL OR a.epoch <> j.epoch \
                       OR GREATEST(a.heartbeat_at, pg_postmaster_start_time()) \
                          + a.lease_ms * INTERVAL '1 millisecond' < now()) \
                     ORDER BY j.id FOR UPDATE OF j SKIP LOCKED",
                    &[],
                )
                .await
                .map_err(db)?;
            if let Some(r) = rows.first() {
                tracing::info!(
                    "jobs: {} running job(s) of agents whose lease ran out (agent {}, …) queued again",
                    rows.len(),
                    r.get::<_, Option<&str>>(2).unwrap_or("?")
                );
            }
            requeue(
                tx,
                &rows,
                "the agent running it stopped (its lease ran out) during the run; resumed",
            )
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain() {
        assert!(plain_name("dtn_cluster_1"));
        assert!(!plain_name("Cluster"));
        assert!(!plain_name("a;drop"));
        assert!(!plain_name(""));
        assert!(!plain_name("1x"));
        assert_eq!(Lease::default().length(), Duration::from_secs(30));
        let one = Lease {
            heartbeat: Duration::from_millis(100),
            heartbeats: 1,
        };
        assert_eq!(one.length(), Duration::from_millis(200), "at least two");
    }
}
