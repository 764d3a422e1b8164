//! `dmover serve --metrics ADDR`: the server's Prometheus metrics (`/metrics`), a live
//! page of its transfers (`/`) and the JSON the page reads (`/api/transfers`), over a
//! small HTTP/1.1 server (GET and HEAD, one request per connection), in plain text on
//! loopback or with the server's TLS identity and bearer tokens elsewhere
//! (docs/metrics.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dmover_core::access::User;
use dmover_core::monitor::Monitor;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The page: plain HTML, inline script and style, no external resource.
const PAGE: &str = include_str!("metrics.html");

/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 32;

/// Time a connection has to send its request and take the answer.
const CONNECTION_TIME: Duration = Duration::from_secs(10);

/// Largest request head accepted.
const MAX_HEAD: usize = 16 << 10;

/// Who may read the metrics, and over what.
pub struct Access {
    /// TLS with the server's identity; `None`: plain HTTP (loopback only).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The users whose bearer tokens are accepted, with their verifiers' stored keys;
    /// empty: no token needed (loopback only).
    pub tokens: Vec<(String, [u8; 32])>,
    /// The job service (`serve --jobs`), whose metrics follow the server's.
    pub jobs: Option<Arc<dmover_jobs::runner::Service>>,
}

impl Access {
    /// The users named in `names`, each of which must be configured with a token.
    pub fn tokens_of(
        names: &[String],
        users: Option<&std::collections::BTreeMap<String, User>>,
    ) -> Result<Vec<(String, [u8; 32])>, String> {
        let mut out = Vec::new();
        for n in names {
            let user = users
                .and_then(|u| u.get(n))
                .ok_or_else(|| format!("metrics_users names {n:?}, which is not a user"))?;
            let v = user.token.as_ref().ok_or_else(|| {
                format!("metrics_users names {n:?}, who has no token (bearer tokens only)")
            })?;
            out.push((n.clone(), v.stored_key));
        }
        Ok(out)
    }
}

/// Whether `addr` may serve metrics without TLS and tokens.
pub fn is_local(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Serves until `shutdown`, sampling the sessions' rates once a second (and the
/// network busy time every [`dmover_core::monitor::NET_TICK`]).
pub async fn serve(
    listener: TcpListener,
    monitor: Arc<Monitor>,
    access: Access,
    shutdown: CancellationToken,
) {
    let access = Arc::new(access);
    let sampler = {
        let (monitor, shutdown) = (monitor.clone(), shutdown.clone());
        async move {
            // Network busy time every tick, the rates every second.
            let mut tick = tokio::time::interval(dmover_core::monitor::NET_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let per_second = (Duration::from_secs(1).as_millis()
                / dmover_core::monitor::NET_TICK.as_millis())
            .max(1);
            let mut n = 0u128;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {
                        monitor.tick();
                        if n % per_second == 0 {
                            monitor.sample();
                        }
                        n += 1;
                    }
                }
            }
        }
    };
    tokio::spawn(sampler);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("metrics: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (monitor, access) = (monitor.clone(), access.clone());
        tokio::spawn(async move {
            let r =
                tokio::time::timeout(CONNECTION_TIME, connection(stream, &monitor, &access)).await;
            if let Ok(Err(e)) = r {
                tracing::debug!("metrics: {peer}: {e}");
            }
            drop(permit);
        });
    }
}

async fn connection(
    stream: TcpStream,
    monitor: &Arc<Monitor>,
    access: &Access,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    match &access.tls {
        None => exchange(stream, monitor, access).await,
        Some(tls) => {
            let s = tls.accept(stream).await?;
            exchange(s, monitor, access).await
        }
    }
}

/// A request, as far as routing needs it.
struct Request {
    head: bool,
    path: String,
    authorization: Option<String>,
    /// The `Host` header, if any.
    host: Option<String>,
}

/// Reads one request head; `Ok(None)`: malformed or too large (answered 400).
async fn read_request<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 48];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("");
                let path = req.path.unwrap_or("/");
                let path = path.split(['?', '#']).next().unwrap_or("/").to_string();
                let header = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                        .map(str::to_string)
                };
                let (authorization, host) = (header("authorization"), header("host"));
                return Ok(Some(Request {
                    head: method == "HEAD",
                    path: if method == "GET" || method == "HEAD" {
                        path
                    } else {
                        String::new()
                    },
                    authorization,
                    host,
                }));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return Ok(None),
        }
    }
}

/// Whether a request naming `host` may be answered by a plain-HTTP (loopback) server:
/// the host must be a loopback name or address. A web page whose own name an attacker
/// re-points at 127.0.0.1 (DNS rebinding) makes the browser send that name, so it is
/// refused, and the page cannot read this server's transfers. A request without `Host`
/// does not come from a browser.
fn host_is_local(host: Option<&str>) -> bool {
    let Some(h) = host.map(str::trim) else {
        return true;
    };
    // Without the port: `name:port`, `[v6]:port`, `[v6]`.
    let name = if let Some(rest) = h.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        h.rsplit_once(':').map_or(h, |(n, _)| n)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `authorization` carries one of the accepted bearer tokens (always, when no
/// token is needed).
fn authorized(access: &Access, authorization: Option<&str>) -> bool {
    if access.tokens.is_empty() {
        return true;
    }
    let Some(h) = authorization else { return false };
    let Some((scheme, token)) = h.trim().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    let stored = dmover_proto::auth::token_keys(token.trim().as_bytes())
        .verifier
        .stored_key;
    // Compared in constant time, against every user (no early exit).
    let mut found = false;
    for (_, k) in &access.tokens {
        let diff = k
            .iter()
            .zip(stored.iter())
            .fold(0u8, |d, (a, b)| d | (a ^ b));
        found |= diff == 0;
    }
    found
}

/// Jobs the page lists: the newest of every user.
const PAGE_JOBS: u32 = 100;

/// `/api/jobs`: the newest jobs of every user, for the page (`{"jobs": [...],
/// "counts": {"queued": N, ...}, "now_unix": T}`).
fn jobs_json(
    service: &dmover_jobs::runner::Service,
) -> Result<Vec<u8>, dmover_jobs::store::StoreError> {
    let store = service.store();
    let jobs = store.list(dmover_jobs::store::Page {
        owner: None,
        before: None,
        limit: PAGE_JOBS,
    })?;
    let counts: std::collections::BTreeMap<&str, u64> = store
        .counts()?
        .into_iter()
        .map(|(s, n)| (s.as_str(), n))
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let body = serde_json::json!({ "jobs": jobs, "counts": counts, "now_unix": now });
    Ok(serde_json::to_vec(&body).unwrap_or_default())
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    monitor: &Arc<Monitor>,
    access: &Access,
) -> std::io::Result<()> {
    let req = read_request(&mut s).await?;
    let (status, ctype, body): (&str, &str, Vec<u8>) = match &req {
        None => ("400 Bad Request", "text/plain", b"bad request\n".to_vec()),
        Some(r) if access.tls.is_none() && !host_is_local(r.host.as_deref()) => (
            "421 Misdirected Request",
            "text/plain",
            b"this server answers only requests for a loopback host\n".to_vec(),
        ),
        Some(r) if r.path.is_empty() => (
            "405 Method Not Allowed",
            "text/plain",
            b"GET or HEAD only\n".to_vec(),
        ),
        // The page holds no data (its script asks /api/transfers, with the token).
        Some(r) if r.path == "/" || r.path == "/index.html" => (
            "200 OK",
            "text/html; charset=utf-8",
            PAGE.as_bytes().to_vec(),
        ),
        Some(r) if r.path == "/api/jobs" && access.jobs.is_some() => {
            if authorized(access, r.authorization.as_deref()) {
                let service = access.jobs.clone().expect("checked above");
                match tokio::task::spawn_blocking(move || jobs_json(&service)).await {
                    Ok(Ok(body)) => ("200 OK", "application/json", body),
                    Ok(Err(e)) => {
                        tracing::warn!("metrics: the job store: {e}");
                        (
                            "500 Internal Server Error",
                            "text/plain",
                            b"the job store failed\n".to_vec(),
                        )
                    }
                    Err(e) => return Err(std::io::Error::other(e.to_string())),
                }
            } else {
                (
                    "401 Unauthorized",
                    "text/plain",
                    b"a bearer token of a user in metrics_users is needed\n".to_vec(),
                )
            }
        }
        Some(r) if r.path == "/metrics" || r.path == "/api/transfers" => {
            if !authorized(access, r.authorization.as_deref()) {
                (
                    "401 Unauthorized",
                    "text/plain",
                    b"a bearer token of a user in metrics_users is needed\n".to_vec(),
                )
            } else if r.path == "/metrics" {
                let mut text = monitor.prometheus();
                if let Some(service) = access.jobs.clone() {
                    let jobs = tokio::task::spawn_blocking(move || {
                        dmover_jobs::metrics::of_service(&service)
                    })
                    .await;
                    match jobs {
                        Ok(Ok(t)) => text.push_str(&t),
                        Ok(Err(e)) => tracing::warn!("metrics: the job store: {e}"),
                        Err(e) => tracing::warn!("metrics: the job store: {e}"),
                    }
                }
                (
                    "200 OK",
                    dmover_core::monitor::PROMETHEUS_CONTENT_TYPE,
                    text.into_bytes(),
                )
            } else {
                let body = serde_json::to_vec(&transfers_json(&monitor.transfers()))
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                ("200 OK", "application/json", body)
            }
        }
        Some(_) => ("404 Not Found", "text/plain", b"not found\n".to_vec()),
    };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("401") {
        head.push_str("WWW-Authenticate: Bearer realm=\"dmover\"\r\n");
    }
    if ctype.starts_with("text/html") {
        head.push_str(
            "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; \
             style-src 'unsafe-inline'; connect-src 'self'\r\n",
        );
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await?;
    if !req.as_ref().is_some_and(|r| r.head) {
        s.write_all(&body).await?;
    }
    s.flush().await?;
    let _ = s.shutdown().await;
    Ok(())
}

/// `/api/transfers`' object: the monitor's view with the schema's version and
/// dmover's first (docs/json.md).
fn transfers_json(t: &dmover_core::monitor::Transfers) -> serde_json::Value {
    let mut j = serde_json::json!({
        "schema": crate::output::SCHEMA,
        "version": crate::output::VERSION,
    });
    if let (Some(head), Ok(serde_json::Value::Object(view))) =
        (j.as_object_mut(), serde_json::to_value(t))
    {
        head.extend(view);
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(tokens: &[&str]) -> Access {
        Access {
            jobs: None,
            tls: None,
            tokens: tokens
                .iter()
                .map(|t| {
                    let v = dmover_proto::auth::token_keys(t.as_bytes()).verifier;
                    ("u".to_string(), v.stored_key)
                })
                .collect(),
        }
    }

    #[test]
    fn plain_http_answers_only_loopback_hosts() {
        for ok in [
            None,
            Some("localhost"),
            Some("LOCALHOST:9100"),
            Some("127.0.0.1:9100"),
            Some("127.1.2.3"),
            Some("[::1]:9100"),
            Some("[::1]"),
        ] {
            assert!(host_is_local(ok), "{ok:?}");
        }
        for bad in [
            Some("evil.example:9100"),
            Some("evil.example"),
            Some("10.0.0.1:9100"),
            Some("localhost.evil.example"),
            Some("127.0.0.1.nip.io:9100"),
            Some(""),
        ] {
            assert!(!host_is_local(bad), "{bad:?}");
        }
    }

    #[test]
    fn bearer_tokens_are_checked_when_configured() {
        assert!(authorized(&access(&[]), None));
        let a = access(&["sekrit", "other"]);
        assert!(!authorized(&a, None));
        assert!(authorized(&a, Some("Bearer sekrit")));
        assert!(authorized(&a, Some("bearer other")));
        assert!(authorized(&a, Some("Bearer sekrit\n")));
        assert!(!authorized(&a, Some("Bearer wrong")));
        assert!(!authorized(&a, Some("Basic sekrit")));
        assert!(!authorized(&a, Some("sekrit")));
    }

    #[test]
    fn the_page_is_self_contained() {
        assert!(PAGE.contains("api/transfers"));
        for external in ["http://", "https://", "<script src", "<link"] {
            assert!(!PAGE.contains(external), "the page loads {external}");
        }
    }
}
