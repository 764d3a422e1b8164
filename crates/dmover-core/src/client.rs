//! The client: connects to a server, authenticates, and pushes or pulls a dataset.

use std::sync::Arc;

use dmover_net::control::{ControlChannel, read_preamble, write_preamble};
use dmover_net::known_hosts;
use dmover_net::stream::DataIo;
use dmover_net::tcp;
use dmover_net::tls::{TlsConnector, Trust};
use dmover_net::{ControlStream, NetError};
use dmover_proto::auth::{self, Role};
use dmover_proto::control::{
    Auth, AuthMethod, Control, Credential, ErrorCode, Hello, Op, Open, SessionInfo, Summary,
};
use dmover_proto::data::{DataHello, JOIN_PROOF_LEN, JoinStatus};
use dmover_proto::manifest::{Entry, NO_PARENT, Totals};
use dmover_proto::preamble::{ConnKind, Preamble};
use dmover_proto::{PROTOCOL_VERSION, control};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::diskpool::DiskPool;
use crate::engine::{self, DataStream, Run};
use crate::error::{Error, Result};
use crate::paths::{self, Base};
use crate::pool::Pool;
use crate::session::{self, HANDSHAKE_TIMEOUT, TransferOptions, unexpected};
use crate::sink::{Sink, SinkOptions};
use crate::source::{Source, SourceOptions};
use crate::tree::Tree;
use crate::walk;

/// The software name sent in greetings.
pub const SOFTWARE: &str = concat!("dmover ", env!("CARGO_PKG_VERSION"));

/// What a finished transfer reports.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// What the destination did.
    pub summary: Summary,
    /// What the source's manifest held.
    pub totals: Totals,
    /// Data streams used.
    pub streams: u16,
    /// Chunk size used.
    pub chunk_size: u32,
    /// Entries the source walk skipped (special files, vanished files).
    pub skipped: u64,
}

/// A client with its own disk threads.
#[derive(Debug)]
pub struct Client {
    disk: Arc<DiskPool>,
    opts: TransferOptions,
}

struct Connected {
    ch: ControlChannel<ControlStream>,
    session: SessionInfo,
    /// The session key (see [`dmover_proto::auth::session_key`]).
    key: [u8; 32],
}

/// A data connection's side of the join: preamble and hello, the server's challenge,
/// our proof, its status and proof.
async fn join(io: &mut TcpStream, server: &str, hello: &DataHello, key: &[u8; 32]) -> Result<()> {
    let pre = Preamble {
        kind: ConnKind::Data,
        version: PROTOCOL_VERSION,
    };
    let mut first = Vec::with_capacity(64);
    first.extend_from_slice(&pre.encode());
    first.extend_from_slice(&hello.encode());
    let w = |e| Error::Net(NetError::io("writing to", server, e));
    let r = |e| Error::Net(NetError::io("reading from", server, e));
    io.write_all(&first).await.map_err(w)?;
    let mut challenge = [0u8; JOIN_PROOF_LEN];
    io.read_exact(&mut challenge).await.map_err(r)?;
    let proof = auth::join_proof(
        key,
        Role::Client,
        hello.session,
        hello.stream,
        &hello.nonce,
        &challenge,
    );
    io.write_all(&proof).await.map_err(w)?;
    let status = io.read_u8().await.map_err(r)?;
    match JoinStatus::decode(status).map_err(|e| NetError::proto(server, e))? {
        JoinStatus::Accepted => {}
        refused => {
            return Err(Error::protocol(
                server,
                format!("data stream {} refused: {refused:?}", hello.stream),
            ));
        }
    }
    let mut theirs = [0u8; JOIN_PROOF_LEN];
    io.read_exact(&mut theirs).await.map_err(r)?;
    let want = auth::join_proof(
        key,
        Role::Server,
        hello.session,
        hello.stream,
        &hello.nonce,
        &challenge,
    );
    if !auth::proofs_equal(&want, &theirs) {
        return Err(Error::refused(
            ErrorCode::Auth,
            format!(
                "{server}: the data port could not prove it belongs to the session; refusing it"
            ),
        ));
    }
    Ok(())
}

impl Client {
    /// A client with `io_threads` disk threads.
    pub fn new(opts: TransferOptions, io_threads: usize) -> Self {
        Client {
            disk: Arc::new(DiskPool::new(io_threads, "dmover-disk")),
            opts,
        }
    }

    fn buffers(&self, streams: u16) -> usize {
        self.opts
            .buffers
            .unwrap_or_else(|| session::default_buffers(streams, self.disk.threads()))
    }

    fn source_buffers(&self, source: &Source, s: &SessionInfo) -> usize {
        self.opts.buffers.unwrap_or_else(|| {
            session::source_buffers(
                source.tree().entries(),
                s.chunk_size,
                s.streams,
                self.disk.threads(),
            )
        })
    }

    /// The TLS settings for connecting.
    fn connector(&self) -> Result<TlsConnector> {
        let trust = match &self.opts.trust {
            Some(t) => t.clone(),
            None => Trust::KnownHosts(known_hosts::default_path().ok_or_else(|| {
                Error::refused(
                    ErrorCode::Unsupported,
                    "no home directory for the known-hosts file: set DMOVER_KNOWN_HOSTS or pass --known-hosts",
                )
            })?),
        };
        Ok(TlsConnector::new(trust)?)
    }

    /// Connects, authenticates and opens a session for `op`.
    async fn open(&self, server: &str, op: Op, chunk_size: u32) -> Result<Connected> {
        let connector = self.connector()?;
        let mut stream = tcp::connect(
            server,
            &tcp::SocketOptions::default(),
            self.opts.connect_timeout,
        )
        .await?;
        write_preamble(
            &mut stream,
            Preamble {
                kind: ConnKind::Control,
                version: PROTOCOL_VERSION,
            },
            server,
        )
        .await?;
        let timeout = |what| NetError::Timeout {
            peer: server.into(),
            what,
            secs: HANDSHAKE_TIMEOUT.as_secs(),
        };
        let answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_preamble(&mut stream, server))
            .await
            .map_err(|_| timeout("greeting"))??;
        if answer.version == 0 {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!(
                    "{server} speaks no protocol version this client knows (we speak {}..={PROTOCOL_VERSION})",
                    dmover_proto::MIN_PROTOCOL_VERSION
                ),
            ));
        }
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(stream, server))
            .await
            .map_err(|_| timeout("TLS handshake"))??;
        let tls = ControlStream::Client(tls);
        let binding = dmover_net::tls::export(&tls, auth::AUTH_EXPORTER_LABEL, None)?;
        let master = dmover_net::tls::export(&tls, auth::SESSION_EXPORTER_LABEL, None)?;
        let mut ch = ControlChannel::new(tls, server, control::MAX_FRAME);
        let nonce: [u8; 32] = rand::random();
        ch.send(&Control::Hello(Hello {
            software: SOFTWARE.into(),
            nonce,
        }))
        .await?;
        let welcome = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "welcome").await? {
            Control::Welcome(w) => w,
            other => return Err(unexpected(server, other, "Welcome")),
        };
        let user = self.opts.user.clone();
        let transcript = auth::transcript(&binding, &user, &nonce, &welcome.nonce);
        let token = self.opts.token.as_deref().map(auth::token_keys);
        let credential = match (welcome.auth, &self.opts.key, &token) {
            (AuthMethod::None, _, _) => Credential::None,
            (AuthMethod::Required, Some(key), _) => Credential::Key {
                public: key.public(),
                signature: key.sign(&auth::key_auth_message(&transcript)),
            },
            (AuthMethod::Required, None, Some(t)) => Credential::Token {
                proof: auth::client_token_proof(t, &transcript),
            },
            (AuthMethod::Required, None, None) => {
                return Err(Error::refused(
                    ErrorCode::Auth,
                    format!(
                        "{server} requires authentication: pass --key FILE (or DMOVER_KEY) or \
                         --token-file FILE (or DMOVER_TOKEN), and --user NAME if it has several users"
                    ),
                ));
            }
        };
        let sent_token = matches!(credential, Credential::Token { .. });
        ch.send(&Control::Auth(Auth { user, credential })).await?;
        match ch.recv_timeout(HANDSHAKE_TIMEOUT, "authentication").await? {
            Control::AuthOk(ok) => {
                if let (true, Some(t)) = (sent_token, &token) {
                    let want = auth::server_token_proof(&t.verifier, &transcript);
                    if !ok.proof.is_some_and(|p| auth::proofs_equal(&p, &want)) {
                        return Err(Error::refused(
                            ErrorCode::Auth,
                            format!(
                                "{server} could not prove it knows the token; refusing to talk to it"
                            ),
                        ));
                    }
                }
            }
            other => return Err(unexpected(server, other, "AuthOk")),
        }
        ch.send(&Control::Open(Open {
            op,
            streams: self.opts.streams,
            chunk_size,
            checksum: self.opts.checksum,
            direct_io: self.opts.direct_io,
            protection: self.opts.protection,
        }))
        .await?;
        let session = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "session").await? {
            Control::Session(s) => s,
            other => return Err(unexpected(server, other, "Session")),
        };
        if session.streams == 0 {
            return Err(Error::protocol(server, "session with zero streams"));
        }
        dmover_proto::layout::validate_chunk_size(session.chunk_size)
            .map_err(|e| Error::Net(NetError::proto(server, e)))?;
        let key = auth::session_key(&master, session.id, &session.salt);
        Ok(Connected { ch, session, key })
    }

    /// Opens the session's data streams, all at once, each proving it belongs to the
    /// session (see [`dmover_proto::data`]).
    async fn open_streams(
        &self,
        server: &str,
        s: &SessionInfo,
        key: [u8; 32],
    ) -> Result<Vec<DataStream<DataIo>>> {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..s.streams {
            let (server, socket, timeout, key, protection, idle) = (
                server.to_string(),
                self.opts.socket.clone(),
                self.opts.connect_timeout,
                key,
                self.opts.protection,
                self.opts.idle_timeout,
            );
            let hello = DataHello {
                session: s.id,
                stream: i,
                nonce: rand::random(),
            };
            set.spawn(async move {
                let mut io = tcp::connect(&server, &socket, timeout).await?;
                let joined =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, join(&mut io, &server, &hello, &key))
                        .await
                        .map_err(|_| NetError::Timeout {
                            peer: server.clone(),
                            what: "data stream join",
                            secs: HANDSHAKE_TIMEOUT.as_secs(),
                        })?;
                joined?;
                let io = DataIo::new(io, protection, &key, i, Role::Client, Some(idle));
                Ok::<_, Error>((i, DataStream { io, peer: server }))
            });
        }
        let mut streams = Vec::with_capacity(s.streams as usize);
        while let Some(r) = set.join_next().await {
            let r = r.map_err(|e| {
                Error::refused(ErrorCode::Aborted, format!("stream setup failed: {e}"))
            })?;
            streams.push(r?);
        }
        streams.sort_by_key(|(i, _)| *i);
        Ok(streams.into_iter().map(|(_, s)| s).collect())
    }

    /// Copies local `sources` into `dest` on `server` (`host:port`).
    pub async fn push(
        &self,
        sources: &[Vec<u8>],
        server: &str,
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        let roots = sources
            .iter()
            .map(|p| paths::source_root(&Base::Local, p, b""))
            .collect::<Result<Vec<_>>>()?;
        let walked = self
            .disk
            .run(move || walk::walk(roots))
            .await
            .ok_or(Error::Aborted)??;
        let skipped = walked.skipped;
        let chunk = match self.opts.chunk_size {
            0 => session::auto_chunk(walked.tree.entries()),
            c => c,
        };
        let mut conn = self
            .open(
                server,
                Op::Push {
                    dest: dest.to_vec(),
                },
                chunk,
            )
            .await?;
        let s = conn.session.clone();
        let source = Arc::new(Source::new(
            walked.tree,
            s.chunk_size,
            SourceOptions {
                checksum: self.opts.checksum,
                direct_io: self.opts.direct_io,
                chunk_delay: None,
            },
        )?);
        let totals = Totals::of(source.tree().entries());
        run.progress
            .total
            .store(totals.bytes, std::sync::atomic::Ordering::Relaxed);
        // Streams connect while the manifest goes out.
        let (streams, sent) = tokio::join!(
            self.open_streams(server, &s, conn.key),
            session::send_manifest(&mut conn.ch, source.tree().entries())
        );
        sent?;
        let streams = match streams {
            Ok(s) => s,
            Err(e) => return Err(explain(&mut conn.ch, e).await),
        };
        match conn.ch.recv().await? {
            Control::Go => {}
            other => return Err(unexpected(server, other, "Go")),
        }
        let pool = Pool::new(self.source_buffers(&source, &s), s.chunk_size as usize);
        let disk = self.disk.clone();
        let sent = session::watch_control(
            &mut conn.ch,
            &run,
            engine::send(&disk, source, pool, streams, run.clone()),
        )
        .await;
        let early = match sent {
            Ok((_, early)) => early,
            // A data stream broke: the server usually says why (say, a record that
            // failed authentication), which beats our "broken pipe".
            Err(e @ Error::Net(_)) => {
                let e = explain(&mut conn.ch, e).await;
                if !matches!(e, Error::Remote { .. }) {
                    let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                }
                return Err(e);
            }
            Err(e) => {
                if !matches!(e, Error::Remote { .. }) {
                    let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                }
                return Err(e);
            }
        };
        let done = match early {
            Some(m) => m,
            None => conn.ch.recv().await?,
        };
        let summary = match done {
            Control::Done(summary) => summary,
            other => return Err(unexpected(server, other, "Done")),
        };
        Ok(Report {
            summary,
            totals,
            streams: s.streams,
            chunk_size: s.chunk_size,
            skipped,
        })
    }

    /// Copies `sources` on `server` into the local `dest`.
    pub async fn pull(
        &self,
        server: &str,
        sources: &[Vec<u8>],
        dest: &[u8],
        run: Arc<Run>,
    ) -> Result<Report> {
        let mut conn = self
            .open(
                server,
                Op::Pull {
                    sources: sources.to_vec(),
                },
                self.opts.chunk_size,
            )
            .await?;
        let s = conn.session.clone();
        let (streams, entries) = tokio::join!(
            self.open_streams(server, &s, conn.key),
            session::recv_manifest(&mut conn.ch, session::MAX_ENTRIES)
        );
        let entries = entries?;
        let streams = match streams {
            Ok(s) => s,
            Err(e) => return Err(explain(&mut conn.ch, e).await),
        };
        let totals = Totals::of(&entries);
        run.progress
            .total
            .store(totals.bytes, std::sync::atomic::Ordering::Relaxed);
        let dest = dest.to_vec();
        let opts = SinkOptions {
            checksum: self.opts.checksum,
            direct_io: self.opts.direct_io,
            fsync: self.opts.fsync,
            chunk_delay: None,
        };
        let prepared = self
            .disk
            .run(move || prepare_sink(&Base::Local, &dest, entries, s.chunk_size, s.id, opts))
            .await
            .ok_or(Error::Aborted)?;
        let sink = match prepared {
            Ok(sink) => Arc::new(sink),
            Err(e) => {
                let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                return Err(e);
            }
        };
        conn.ch.send(&Control::Go).await?;
        let pool = Pool::new(self.buffers(s.streams), s.chunk_size as usize);
        let disk = self.disk.clone();
        let result = session::watch_control(
            &mut conn.ch,
            &run,
            engine::receive(&disk, sink, pool, streams, run.clone()),
        )
        .await;
        match result {
            Ok((summary, _)) => {
                conn.ch.send(&Control::Done(summary)).await?;
                Ok(Report {
                    summary,
                    totals,
                    streams: s.streams,
                    chunk_size: s.chunk_size,
                    skipped: 0,
                })
            }
            Err(e) => {
                let _ = conn.ch.send(&Control::Error(e.to_msg())).await;
                Err(e)
            }
        }
    }
}

/// A data stream failed to join: if the server said why on the control channel (it
/// refuses a session by closing it, so its streams are then unknown), report that.
async fn explain<S: AsyncRead + AsyncWrite + Unpin>(ch: &mut ControlChannel<S>, e: Error) -> Error {
    match tokio::time::timeout(std::time::Duration::from_secs(2), ch.recv()).await {
        Ok(Ok(Control::Error(m))) => Error::Remote {
            peer: ch.peer().to_string(),
            code: m.code,
            message: m.message,
        },
        _ => e,
    }
}

/// Binds an incoming manifest to its destination and creates its directories.
pub(crate) fn prepare_sink(
    base: &Base,
    dest: &[u8],
    entries: Vec<Entry>,
    chunk_size: u32,
    session: u64,
    opts: SinkOptions,
) -> Result<Sink> {
    let roots: Vec<(u32, &Entry)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.parent == NO_PARENT)
        .map(|(i, e)| (i as u32, e))
        .collect();
    let bound = paths::resolve_dest(base, dest, &roots)?;
    let sink = Sink::new(Tree::new(entries, bound), chunk_size, session, opts)?;
    sink.prepare()?;
    Ok(sink)
}
