//! The API's client (`dmover submit`, `jobs`, `job`, `cancel`, `retry`, and tests):
//! one HTTP/1.1 request per connection (hyper), over TLS for `https://` (the service's
//! key pinned on first use in a known-hosts file, as for a server) or plain for
//! `http://` (loopback).

use std::path::PathBuf;

use dmover_net::tls::{TlsConnector, Trust};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use crate::api::JobPage;
use crate::model::{Job, JobId, JobSpec};

/// Why a request did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://HOST:PORT` or `https://HOST:PORT`.
    #[error("job service URL {0:?}: expected http://HOST:PORT (loopback) or https://HOST:PORT")]
    BadUrl(String),
    /// The service could not be reached or the exchange broke.
    #[error("cannot reach the job service at {url}: {why}")]
    Unreachable {
        /// The service.
        url: String,
        /// Why.
        why: String,
    },
    /// The service answered with an error.
    #[error("the job service refused: {message} (HTTP {status}, {code})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error's code (`unauthorized`, `not_found`, ...).
        code: String,
        /// Its message.
        message: String,
    },
    /// The answer is not what the API answers.
    #[error("the job service at {url} answered something else than its API: {why}")]
    BadAnswer {
        /// The service.
        url: String,
        /// What was wrong.
        why: String,
    },
}

/// A client of one job service.
#[derive(Debug, Clone)]
pub struct ApiClient {
    url: String,
    /// `host:port`.
    authority: String,
    tls: Option<TlsConnector>,
    token: Option<String>,
}

impl ApiClient {
    /// A client of the service at `url`, sending `token` as its bearer token and
    /// pinning an `https://` service's key in `known_hosts`.
    pub fn new(
        url: &str,
        token: Option<String>,
        known_hosts: PathBuf,
    ) -> Result<ApiClient, ClientError> {
        let bad = || ClientError::BadUrl(url.to_string());
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad());
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(bad());
        }
        let tls = match tls {
            false => None,
            true => Some(
                TlsConnector::new(Trust::KnownHosts(known_hosts)).map_err(|e| {
                    ClientError::Unreachable {
                        url: url.into(),
                        why: e.to_string(),
                    }
                })?,
            ),
        };
        Ok(ApiClient {
            url: url.trim_end_matches('/').to_string(),
            authority: authority.to_string(),
            tls,
            token: token.map(|t| t.trim().to_string()),
        })
    }

    /// Sends one request; answers the status and the body parsed as JSON.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), ClientError> {
        let res = self.send(method, path, body).await?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| self.unreachable(e.to_string()))?
            .to_bytes();
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| ClientError::BadAnswer {
                url: self.url.clone(),
                why: format!("HTTP {status}, not JSON: {e}"),
            })?;
        Ok((status, value))
    }

    fn unreachable(&self, why: String) -> ClientError {
        ClientError::Unreachable {
            url: self.url.clone(),
            why,
        }
    }

    /// Sends one request on a connection of its own; the answer's body streams in as
    /// it is read (the connection lives until then).
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.authority);
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let bytes = match body {
            Some(b) => {
                req = req.header(hyper::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(b).map_err(|e| self.unreachable(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| self.unreachable(e.to_string()))?;
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => send_on(TokioIo::new(tcp), req).await,
            Some(tls) => {
                let s = tls
                    .connect(tcp, &self.authority)
                    .await
                    .map_err(|e| self.unreachable(e.to_string()))?;
                send_on(TokioIo::new(s), req).await
            }
        }
        .map_err(|e| self.unreachable(e))
    }

    /// Follows job `id`'s event stream: `on` sees the job as it is, then at each
    /// change of its record; returns the ended job.
    pub async fn events(&self, id: JobId, mut on: impl FnMut(&Job)) -> Result<Job, ClientError> {
        let res = self
            .send("GET", &format!("/api/v1/jobs/{id}/events"), None)
            .await?;
        let status = res.status().as_u16();
        let mut body = res.into_body();
        if status != 200 {
            let bytes = body
                .collect()
                .await
                .map_err(|e| self.unreachable(e.to_string()))?
                .to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            return Err(api_error(status, &v));
        }
        let bad = |why: String| ClientError::BadAnswer {
            url: self.url.clone(),
            why,
        };
        let (mut pending, mut last) = (Vec::new(), None::<Job>);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.unreachable(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                let v: serde_json::Value =
                    serde_json::from_slice(&line).map_err(|e| bad(format!("an event: {e}")))?;
                if v["type"] == "job" {
                    let job: Job = serde_json::from_value(v["job"].clone())
                        .map_err(|e| bad(format!("an event's job: {e}")))?;
                    on(&job);
                    last = Some(job);
                }
            }
        }
        match last {
            Some(j) if j.state.is_end() => Ok(j),
            _ => Err(bad(format!(
                "the event stream of job {id} ended before the job did (purged, or the \
                 service stopped)"
            ))),
        }
    }

    /// A request whose success is a `T`; an error answer becomes [`ClientError::Api`].
    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let (status, v) = self.request(method, path, body).await?;
        if !(200..300).contains(&status) {
            return Err(api_error(status, &v));
        }
        serde_json::from_value(v).map_err(|e| ClientError::BadAnswer {
            url: self.url.clone(),
            why: e.to_string(),
        })
    }

    /// Submits a job.
    pub async fn submit(&self, spec: &JobSpec) -> Result<Job, ClientError> {
        let body = serde_json::to_value(spec).map_err(|e| ClientError::BadAnswer {
            url: self.url.clone(),
            why: e.to_string(),
        })?;
        self.call("POST", "/api/v1/jobs", Some(&body)).await
    }

    /// A page of jobs, newest first.
    pub async fn list(&self, limit: u32, before: Option<JobId>) -> Result<JobPage, ClientError> {
        let mut path = format!("/api/v1/jobs?limit={limit}");
        if let Some(b) = before {
            path.push_str(&format!("&before={b}"));
        }
        self.call("GET", &path, None).await
    }

    /// One job.
    pub async fn job(&self, id: JobId) -> Result<Job, ClientError> {
        self.call("GET", &format!("/api/v1/jobs/{id}"), None).await
    }

    /// Cancels a job.
    pub async fn cancel(&self, id: JobId) -> Result<Job, ClientError> {
        self.call("POST", &format!("/api/v1/jobs/{id}/cancel"), None)
            .await
    }

    /// Queues a failed or cancelled job again.
    pub async fn retry(&self, id: JobId) -> Result<Job, ClientError> {
        self.call("POST", &format!("/api/v1/jobs/{id}/retry"), None)
            .await
    }
}

/// The API's error answer `v` with `status`.
fn api_error(status: u16, v: &serde_json::Value) -> ClientError {
    let e = &v["error"];
    ClientError::Api {
        status,
        code: e["code"].as_str().unwrap_or("unknown").to_string(),
        message: e["message"].as_str().unwrap_or("(no message)").to_string(),
    }
}

/// Sends `req` over `io`; the connection is driven by a task of its own until the
/// answer's body has been read (or dropped).
async fn send_on<IO>(
    io: TokioIo<IO>,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    send.send_request(req).await.map_err(|e| e.to_string())
}
