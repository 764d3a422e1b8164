//! The REST API of the job service: JSON over HTTP/1.1 (axum on hyper), in plain text
//! on loopback or with the server's TLS identity elsewhere, every request
//! authenticated with a bearer token of one of the server's users.
//!
//! | request | answer |
//! |---|---|
//! | `POST /api/v1/jobs` (a [`JobSpec`]) | 201, the job |
//! | `GET /api/v1/jobs?limit=N&before=ID` | `{"jobs": [...], "next": ID or null}`, newest first |
//! | `GET /api/v1/jobs/{id}` | the job |
//! | `POST /api/v1/jobs/{id}/cancel` | the job (cancelled, or still running with `cancel_requested`) |
//! | `POST /api/v1/jobs/{id}/retry` | the job, queued again |
//! | `GET /api/v1/jobs/{id}/events` | NDJSON: the job, then again at each change, until it ends |
//!
//! Errors are `{"error": {"code": "...", "message": "..."}}` with the HTTP status:
//! 400 `bad_request`, 401 `unauthorized`, 404 `not_found` (also another user's job,
//! which a non-admin cannot tell from a missing one), 409 `conflict`, 413 `limit` (a
//! job naming more sources than `max_sources`), 429 `limit` (the user's cap on
//! unfinished jobs), 500 `internal`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dmover_core::access::User;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::model::{Job, JobId, JobSpec};
use crate::runner::{Service, SubmitError};
use crate::store::{Page, StoreError};

/// The most jobs one page lists.
pub const MAX_PAGE: u32 = 1000;

/// The jobs one page lists unless asked.
pub const DEFAULT_PAGE: u32 = 100;

/// Who may call the API: the server's users that have a token (not the monitoring
/// users of `metrics_users`), and which of them are admins.
#[derive(Debug, Default)]
pub struct Auth {
    /// `BLAKE3` of a token's client key (its verifier's stored key) → the user.
    tokens: RwLock<Vec<([u8; 32], String)>>,
    admins: BTreeSet<String>,
}

/// The user a request was authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user's name as configured.
    pub name: String,
    /// Sees and acts on every user's jobs.
    pub admin: bool,
}

impl Auth {
    /// The users with tokens among `users`; `admins` names the admins.
    pub fn new(users: &BTreeMap<String, User>, admins: &[String]) -> Auth {
        let auth = Auth {
            tokens: RwLock::default(),
            admins: admins.iter().cloned().collect(),
        };
        auth.replace(users);
        auth
    }

    /// Puts `users` in force (a reload).
    pub fn replace(&self, users: &BTreeMap<String, User>) {
        let tokens = users
            .values()
            .filter(|u| !u.metrics_only)
            .filter_map(|u| Some((u.token.as_ref()?.stored_key, u.name.clone())))
            .collect();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = tokens;
    }

    /// The caller an `Authorization: Bearer TOKEN` header proves.
    pub fn check(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let Some(h) = headers.get(header::AUTHORIZATION) else {
            return Err(unauthorized(
                "a bearer token of one of the server's users is needed (Authorization: Bearer TOKEN)",
            ));
        };
        let h = h
            .to_str()
            .map_err(|_| unauthorized("the Authorization header is not text"))?;
        let token = match h.trim().split_once(' ') {
            Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim(),
            _ => {
                return Err(unauthorized(
                    "the Authorization header must be: Bearer TOKEN",
                ));
            }
        };
        let stored = dmover_proto::auth::token_keys(token.as_bytes())
            .verifier
            .stored_key;
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner());
        let name = tokens
            .iter()
            .find(|(k, _)| *k == stored)
            .map(|(_, n)| n.clone())
            .ok_or_else(|| unauthorized("the token is not that of a user of this server"))?;
        Ok(Caller {
            admin: self.admins.contains(&name),
            name,
        })
    }
}

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn not_found(id: JobId) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no job {id}"))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => ApiError::not_found(id),
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            StoreError::Limit(m) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "limit", m),
            e => {
                tracing::error!("jobs API: {e}");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"dmover\""),
            );
        }
        r
    }
}

/// The API's state: the service and who may call it.
#[derive(Debug)]
pub struct Api {
    /// The job service.
    pub service: Arc<Service>,
    /// The accepted tokens.
    pub auth: Arc<Auth>,
}

/// A page of jobs as the API answers it.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct JobPage {
    /// The jobs, newest first.
    pub jobs: Vec<Job>,
    /// `before` for the next page; `None`: this was the last.
    pub next: Option<JobId>,
}

/// The API's routes.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/api/v1/jobs", post(submit).get(list))
        .route("/api/v1/jobs/{id}", get(show))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .route("/api/v1/jobs/{id}/retry", post(retry))
        .route("/api/v1/jobs/{id}/events", get(events))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such API path")
        })
        .with_state(api)
}

type Answer = Result<Response, ApiError>;

fn json<T: Serialize>(status: StatusCode, v: &T) -> Answer {
    Ok((status, axum::Json(v)).into_response())
}

/// A job id from the path.
fn job_id(s: &str) -> Result<JobId, ApiError> {
    s.parse::<JobId>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad(format!("{s:?} is not a job id")))
}

/// Job `id`, if the caller may see it (its owner, or an admin).
async fn visible(api: &Api, caller: &Caller, id: JobId) -> Result<Job, ApiError> {
    let store = api.service.store().clone();
    let job = tokio::task::spawn_blocking(move || store.get(id))
        .await
        .map_err(|e| ApiError::from(StoreError::Db(e.to_string())))??;
    if job.owner != caller.name && !caller.admin {
        return Err(ApiError::not_found(id));
    }
    Ok(job)
}

async fn submit(State(api): State<Arc<Api>>, headers: HeaderMap, body: Bytes) -> Answer {
    let caller = api.auth.check(&headers)?;
    let spec: JobSpec = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad(format!("the job is not valid JSON of a job: {e}")))?;
    match api.service.submit(&caller.name, spec).await {
        Ok(job) => json(StatusCode::CREATED, &job),
        Err(SubmitError::Invalid(m)) => Err(ApiError::bad(m)),
        Err(SubmitError::Limit(m)) => Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "limit", m)),
        Err(SubmitError::TooLarge(m)) => {
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "limit", m))
        }
        Err(SubmitError::Store(e)) => Err(e.into()),
    }
}

/// `limit` and `before` from a query string.
fn page_query(q: Option<&str>) -> Result<(u32, Option<JobId>), ApiError> {
    let (mut limit, mut before) = (DEFAULT_PAGE, None);
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => {
                limit = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad(format!("limit must be between 1 and {MAX_PAGE}"))
                    })?;
            }
            "before" => before = Some(job_id(v)?),
            _ => return Err(ApiError::bad(format!("unknown query parameter {k:?}"))),
        }
    }
    Ok((limit, before))
}

async fn list(State(api): State<Arc<Api>>, headers: HeaderMap, RawQuery(q): RawQuery) -> Answer {
    let caller = api.auth.check(&headers)?;
    let (limit, before) = page_query(q.as_deref())?;
    let store = api.service.store().clone();
    let owner = (!caller.admin).then(|| caller.name.clone());
    // One more than asked tells whether there is a next page.
    let mut jobs = tokio::task::spawn_blocking(move || {
        store.list(Page {
            owner: owner.as_deref(),
            before,
            limit: limit + 1,
        })
    })
    .await
    .map_err(|e| ApiError::from(StoreError::Db(e.to_string())))??;
    let more = jobs.len() > limit as usize;
    jobs.truncate(limit as usize);
    let next = if more {
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    json(StatusCode::OK, &JobPage { jobs, next })
}

async fn show(State(api): State<Arc<Api>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let caller = api.auth.check(&headers)?;
    let job = visible(&api, &caller, job_id(&id)?).await?;
    json(StatusCode::OK, &job)
}

async fn cancel(State(api): State<Arc<Api>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let caller = api.auth.check(&headers)?;
    let job = visible(&api, &caller, job_id(&id)?).await?;
    let job = api.service.cancel(job.id, &caller.name).await?;
    json(StatusCode::OK, &job)
}

async fn retry(State(api): State<Arc<Api>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let caller = api.auth.check(&headers)?;
    let job = visible(&api, &caller, job_id(&id)?).await?;
    let job = api.service.retry(job.id).await?;
    json(StatusCode::OK, &job)
}

/// How long an event stream may stay silent before a heartbeat line (proxies and
/// clients with read time-outs keep the connection).
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// One line of an event stream.
#[derive(Debug, Serialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<&'a Job>,
}

/// `GET /api/v1/jobs/{id}/events`: NDJSON (`application/x-ndjson`), one line per
/// change of the job's record as the store has it — the first its state now — and
/// `{"type":"heartbeat"}` after [`HEARTBEAT`] of quiet; the stream ends after the line
/// of an ended job (done, failed, cancelled), at once for a job that has ended.
async fn events(State(api): State<Arc<Api>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let caller = api.auth.check(&headers)?;
    // Subscribed before the first read: no change falls between the two.
    let changes = api.service.changes();
    let job = visible(&api, &caller, job_id(&id)?).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(stream_events(api.clone(), job, changes, tx));
    let mut r = Response::new(axum::body::Body::new(Lines(rx)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/x-ndjson"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(r)
}

/// Sends `job`'s lines into `tx` until it ends, the store loses it, or the client
/// goes (`tx` closed).
async fn stream_events(
    api: Arc<Api>,
    mut job: Job,
    mut changes: tokio::sync::broadcast::Receiver<JobId>,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) {
    let line = |kind, job: Option<&Job>| {
        let mut l = serde_json::to_vec(&EventLine { kind, job }).unwrap_or_default();
        l.push(b'\n');
        Bytes::from(l)
    };
    let id = job.id;
    if tx.send(line("job", Some(&job))).await.is_err() {
        return;
    }
    while !job.state.is_end() {
        let heard = tokio::select! {
            r = changes.recv() => r,
            _ = tokio::time::sleep(HEARTBEAT) => {
                if tx.send(line("heartbeat", None)).await.is_err() {
                    return;
                }
                continue;
            }
            _ = tx.closed() => return,
        };
        match heard {
            Ok(changed) if changed != id => continue,
            // Lagged: some change may have been this job's.
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
        let store = api.service.store().clone();
        let now = match tokio::task::spawn_blocking(move || store.get(id)).await {
            Ok(Ok(j)) => j,
            // Purged, or the store failed: the stream ends (the client reads the job
            // again to learn which).
            _ => return,
        };
        if serde_json::to_value(&now).ok() == serde_json::to_value(&job).ok() {
            continue;
        }
        job = now;
        if tx.send(line("job", Some(&job))).await.is_err() {
            return;
        }
    }
}

/// A response body of the lines sent into a channel; it ends when the sender does.
struct Lines(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Lines {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// Time a connection has to send a request's head.
const HEAD_TIME: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown`: HTTP/1.1, with TLS when `tls` is set.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    shutdown: CancellationToken,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("jobs API: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (app, tls, stop) = (app.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            let service = TowerToHyperService::new(app);
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(HEAD_TIME);
            let served = match tls {
                None => {
                    let conn = http.serve_connection(TokioIo::new(tcp), service);
                    tokio::select! { r = conn => r, _ = stop.cancelled() => Ok(()) }
                }
                Some(tls) => match tokio::time::timeout(HEAD_TIME, tls.accept(tcp)).await {
                    Ok(Ok(s)) => {
                        let conn = http.serve_connection(TokioIo::new(s), service);
                        tokio::select! { r = conn => r, _ = stop.cancelled() => Ok(()) }
                    }
                    Ok(Err(e)) => {
                        tracing::debug!("jobs API: {peer}: TLS: {e}");
                        Ok(())
                    }
                    Err(_) => Ok(()),
                },
            };
            if let Err(e) = served {
                tracing::debug!("jobs API: {peer}: {e}");
            }
        });
    }
}
