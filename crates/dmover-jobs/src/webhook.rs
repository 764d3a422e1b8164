//! Webhooks: a job that names a URL (`options.notify`) has its ended record POSTed
//! there as JSON, retried, when it ends (done, failed, cancelled). A webhook is a way
//! to make the service connect somewhere, so only URLs under a prefix of the
//! configured allow-list (`[jobs] webhooks`) are accepted, checked when the job is
//! submitted and again before each delivery (a reload may have shortened the list).

use std::time::Duration;

use dmover_net::tls::{TlsConnector, Trust};
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::model::Job;

/// Deliveries tried per ended job.
pub const ATTEMPTS: u32 = 5;

/// How long one delivery may take (connect, TLS, request, answer).
const ATTEMPT_TIME: Duration = Duration::from_secs(10);

/// The allow-list and how deliveries are made.
#[derive(Debug, Clone)]
pub struct Webhooks {
    allowed: Vec<Target>,
    /// For `https://` URLs: WebPKI against these CAs.
    tls: Option<TlsConnector>,
    /// The wait before the second attempt; doubled before each later one.
    pub first_wait: Duration,
}

/// A URL split into what the allow-list compares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl Target {
    fn parse(url: &str) -> Result<(Target, Uri), String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("{url:?}: a webhook is an http:// or https:// URL")),
        };
        let auth = uri
            .authority()
            .ok_or_else(|| format!("{url:?} names no host"))?;
        if auth.as_str().contains('@') {
            return Err(format!("{url:?}: no user or password in a webhook URL"));
        }
        let target = Target {
            https,
            host: auth.host().to_ascii_lowercase(),
            port: auth.port_u16().unwrap_or(if https { 443 } else { 80 }),
            path: uri.path().to_string(),
        };
        Ok((target, uri))
    }

    /// Whether `self` (a URL) is under `prefix` (an allow-list entry): the same
    /// scheme, host and port, and a path that is the prefix's or below it.
    fn under(&self, prefix: &Target) -> bool {
        let path_ok = if prefix.path.ends_with('/') {
            self.path.starts_with(&prefix.path)
        } else {
            self.path == prefix.path || self.path.starts_with(&format!("{}/", prefix.path))
        };
        self.https == prefix.https
            && self.host == prefix.host
            && self.port == prefix.port
            && path_ok
    }
}

impl Webhooks {
    /// Webhooks to URLs under `allowed` (each `http[s]://HOST[:PORT]/PATH`), `https`
    /// ones verified against the CA certificates in `ca_file` (PEM).
    pub fn new(allowed: &[String], ca_file: Option<&std::path::Path>) -> Result<Webhooks, String> {
        let allowed = allowed
            .iter()
            .map(|u| Target::parse(u).map(|(t, _)| t))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = match ca_file {
            Some(f) if allowed.iter().any(|t| t.https) => Some(
                TlsConnector::new(Trust::Ca(f.to_path_buf()))
                    .map_err(|e| format!("the webhooks' CA file {}: {e}", f.display()))?,
            ),
            _ => None,
        };
        Ok(Webhooks {
            allowed,
            tls,
            first_wait: Duration::from_secs(1),
        })
    }

    /// None: every webhook refused.
    pub fn none() -> Webhooks {
        Webhooks {
            allowed: Vec::new(),
            tls: None,
            first_wait: Duration::from_secs(1),
        }
    }

    /// Whether a job may name `url`; the refusal says why.
    pub fn check(&self, url: &str) -> Result<(), String> {
        let (t, _) = Target::parse(url)?;
        if self.allowed.is_empty() {
            return Err("this job service sends no webhooks ([jobs] webhooks is empty)".into());
        }
        if !self.allowed.iter().any(|p| t.under(p)) {
            return Err(format!(
                "{url:?} is not under a URL of this job service's webhooks allow-list"
            ));
        }
        if t.https && self.tls.is_none() {
            return Err("https webhooks need [jobs] webhook_ca".into());
        }
        Ok(())
    }

    /// POSTs `job` (as the API shows it) to `url`, up to [`ATTEMPTS`] times while the
    /// answer is not 2xx and may change (no connection, 5xx, 408, 429), waiting
    /// [`Webhooks::first_wait`] and then twice as long before each next try. Returns
    /// the attempts made, or why it gave up.
    pub async fn deliver(&self, url: &str, job: &Job) -> Result<u32, String> {
        self.check(url)?;
        let body = Bytes::from(serde_json::to_vec(job).map_err(|e| e.to_string())?);
        let mut wait = self.first_wait;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            if attempt > 1 {
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
            }
            match tokio::time::timeout(ATTEMPT_TIME, self.post(url, job, body.clone())).await {
                Ok(Ok(status)) if (200..300).contains(&status) => return Ok(attempt),
                Ok(Ok(status)) if ![408, 429].contains(&status) && status < 500 => {
                    return Err(format!("{url} answered HTTP {status}"));
                }
                Ok(Ok(status)) => last = format!("HTTP {status}"),
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("no answer within {} s", ATTEMPT_TIME.as_secs()),
            }
            tracing::debug!(
                "jobs: webhook of job {} to {url}, attempt {attempt}: {last}",
                job.id
            );
        }
        Err(format!("{url}: {last} ({ATTEMPTS} attempts)"))
    }

    async fn post(&self, url: &str, job: &Job, body: Bytes) -> Result<u16, String> {
        let (t, uri) = Target::parse(url)?;
        let authority = format!("{}:{}", t.host, t.port);
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let req = hyper::Request::post(path)
            .header(
                hyper::header::HOST,
                uri.authority().map_or("", |a| a.as_str()),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("dmover/", env!("CARGO_PKG_VERSION")),
            )
            .header("X-Dmover-Job", job.id.to_string())
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let tcp = tokio::net::TcpStream::connect(&authority)
            .await
            .map_err(|e| e.to_string())?;
        let res = match (&self.tls, t.https) {
            (Some(tls), true) => {
                let s = tls
                    .connect(tcp, &authority)
                    .await
                    .map_err(|e| e.to_string())?;
                send(TokioIo::new(s), req).await?
            }
            (None, true) => return Err("https webhooks need [jobs] webhook_ca".into()),
            (_, false) => send(TokioIo::new(tcp), req).await?,
        };
        Ok(res)
    }
}

/// Sends `req` over `io`; the answer's status (its body read and dropped).
async fn send<IO>(io: TokioIo<IO>, req: hyper::Request<Full<Bytes>>) -> Result<u16, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut tx, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let res = tx.send_request(req).await.map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let _ = res.into_body().collect().await;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_urls_under_the_allow_list_pass() {
        let w = Webhooks::new(
            &[
                "http://127.0.0.1:9000/hooks/".into(),
                "http://portal.example:8080/dmover".into(),
            ],
            None,
        )
        .unwrap();
        for ok in [
            "http://127.0.0.1:9000/hooks/",
            "http://127.0.0.1:9000/hooks/job?x=1",
            "http://PORTAL.example:8080/dmover",
            "http://portal.example:8080/dmover/a",
        ] {
            assert_eq!(w.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://127.0.0.1:9001/hooks/",
            "http://127.0.0.1:9000/hookss",
            "http://127.0.0.1:9000/",
            "http://127.0.0.2:9000/hooks/",
            "https://127.0.0.1:9000/hooks/",
            "http://portal.example:8080/dmoverx",
            "http://portal.example/dmover",
            "http://user:pw@127.0.0.1:9000/hooks/",
            "ftp://127.0.0.1:9000/hooks/",
            "not a url",
        ] {
            assert!(w.check(bad).is_err(), "{bad}");
        }
        assert!(
            Webhooks::none()
                .check("http://127.0.0.1:9000/hooks/")
                .is_err()
        );
        // An https entry without CAs: refused when named.
        let w = Webhooks::new(&["https://portal.example/h/".into()], None).unwrap();
        assert!(
            w.check("https://portal.example/h/1")
                .unwrap_err()
                .contains("webhook_ca")
        );
    }
}
