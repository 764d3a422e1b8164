//! Connecting and authenticating: the control connection (with busy answers waited
//! out), TLS, the credential, and the first flight of a session or a request.

use std::time::Duration;

use dmover_net::control::ControlChannel;
use dmover_net::join::Dials;
use dmover_net::{ControlStream, NetError};
use dmover_proto::auth;
use dmover_proto::control::{
    Auth, AuthMethod, Control, Credential, ErrorCode, Hello, ManifestEnd, ManifestPart, Open,
    PruneReport, SessionOptions,
};
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::session::{Dial, SourceSession, Timing};
use dmover_proto::{PROTOCOL_VERSION, control};

use super::{Dialer, now};
use crate::drive;
use crate::error::{Error, Result};
use crate::session::{self, HANDSHAKE_TIMEOUT, SOFTWARE};

/// How long a client waits for a server's [`Op::Prune`] answer.
const PRUNE_WAIT: Duration = Duration::from_secs(3600);

/// The longest a client waits between two tries at a busy server.
pub const MAX_BUSY_BACKOFF: Duration = Duration::from_secs(8);

/// A control connection with TLS up and the first flight ready, not sent.
pub(crate) struct Connection {
    pub(crate) ch: ControlChannel<ControlStream>,
    /// Exported for the session key.
    pub(crate) master: [u8; 32],
    transcript: [u8; 32],
    /// The token's keys when the credential is a token proof.
    token: Option<auth::TokenKeys>,
    hello: Hello,
    auth: Auth,
    pub(crate) dials: Dials,
    /// The key the server proved it holds.
    pub(crate) server_key: String,
    /// That key was known before this connection (not pinned on first use now).
    key_known: bool,
}

impl Connection {
    /// The session id and salt a session of `streams` streams on this connection
    /// sends early data under (protocol version 8, docs/protocol.md "Early data"), or
    /// `None` when it waits for `Session` and `Go`: on a resume (what to send waits for
    /// the server's answer), and with a server whose key was pinned just now, on first
    /// use (it proves who it is, a token's proof in `AuthOk`, before it is sent any
    /// file's data).
    pub(crate) fn early(&self, resume: bool, streams: u16) -> Option<(u64, [u8; 32])> {
        (!resume && streams <= session::MAX_STREAMS && self.key_known)
            .then(|| auth::session_id(&self.master))
    }

    /// A push's source machine for `d` (from [`Connection::dial`]), early with
    /// `early` ([`Connection::early`]): its data streams join and the first chunks go
    /// out with the first flight, a round trip before `Session` and `Go` would have
    /// let them.
    pub(crate) fn push_machine(
        early: Option<(u64, [u8; 32])>,
        server: &str,
        timing: Timing,
        d: Dial,
    ) -> SourceSession<drive::Fault> {
        match early {
            Some((id, salt)) => {
                tracing::info!(
                    "early data: session {id:016x}'s streams join and send with the first flight"
                );
                SourceSession::dial_early(now(), server, timing, d, id, salt)
            }
            None => SourceSession::dial(now(), server, timing, d),
        }
    }

    /// The smallest round trip the control connection's TCP has seen (its handshake's
    /// and TLS's), if the kernel tells.
    pub(crate) fn rtt(&self) -> Option<Duration> {
        dmover_net::tcpinfo::min_rtt(self.ch.get_ref().get_ref().0.get_ref())
    }

    /// For a request that is not a session ([`Op::Grant`], [`Op::ThirdParty`]): sends
    /// the first flight and takes the answers up to `AuthOk`, checking the server's
    /// token proof; the channel is then the op's.
    pub(crate) async fn request(
        mut self,
        server: &str,
        open: Open,
        options: SessionOptions,
    ) -> Result<ControlChannel<ControlStream>> {
        let proof = self
            .token
            .as_ref()
            .map(|t| auth::server_token_proof(&t.verifier, &self.transcript));
        let anonymous = matches!(self.auth.credential, Credential::None);
        let ch = &mut self.ch;
        let first = [
            Control::Hello(self.hello),
            Control::Auth(self.auth),
            Control::Open(open),
            Control::Options(options),
        ];
        if let Err(e) = ch.send_all(&first).await {
            return Err(crate::session::peer_report(ch, Error::Net(e)).await);
        }
        let welcome = match ch.recv_timeout(HANDSHAKE_TIMEOUT, "welcome").await? {
            Control::Welcome(w) => w,
            other => return Err(session::unexpected(server, other, "Welcome")),
        };
        if anonymous && welcome.auth == AuthMethod::Required {
            return Err(Error::refused(
                ErrorCode::Auth,
                format!(
                    "{server} requires authentication: pass --key FILE (or DMOVER_KEY) or \
                     --token-file FILE (or DMOVER_TOKEN), and --user NAME if it has several users"
                ),
            ));
        }
        match ch.recv_timeout(HANDSHAKE_TIMEOUT, "authentication").await? {
            Control::AuthOk(ok) => {
                if let (AuthMethod::Required, Some(want)) = (welcome.auth, proof) {
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
            other => return Err(session::unexpected(server, other, "AuthOk")),
        }
        Ok(self.ch)
    }

    /// [`Op::Prune`] on this connection: the request, the manifest, the answer.
    pub(crate) async fn prune(
        self,
        server: &str,
        open: Open,
        options: SessionOptions,
        entries: &[Entry],
    ) -> Result<PruneReport> {
        let mut ch = self.request(server, open, options).await?;
        let sent = async {
            for r in dmover_proto::manifest::parts(entries) {
                ch.send(&Control::Manifest(ManifestPart {
                    entries: entries[r].to_vec(),
                }))
                .await?;
            }
            ch.send(&Control::ManifestEnd(ManifestEnd {
                totals: Totals::of(entries),
            }))
            .await
        };
        if let Err(e) = sent.await {
            return Err(crate::session::peer_report(&mut ch, Error::Net(e)).await);
        }
        // Walking (and deleting in) a large tree takes time, and the server sends
        // nothing meanwhile.
        match ch
            .recv_timeout(PRUNE_WAIT, "the destination's deletions")
            .await?
        {
            Control::Pruned(r) => Ok(r),
            other => Err(session::unexpected(server, other, "Pruned")),
        }
    }

    /// [`Op::Sums`] on this connection: the request and the answer (`Sums`).
    pub(crate) async fn sums(
        self,
        server: &str,
        open: Open,
        options: SessionOptions,
    ) -> Result<dmover_proto::control::SumsReport> {
        let mut ch = self.request(server, open, options).await?;
        // Reading a large file takes time, and the server sends nothing meanwhile.
        match ch.recv_timeout(PRUNE_WAIT, "the checksums").await? {
            Control::Sums(r) => Ok(r),
            other => Err(session::unexpected(server, other, "Sums")),
        }
    }

    /// [`Op::Rename`] on this connection: the request and the answer (`Done`).
    pub(crate) async fn rename(
        self,
        server: &str,
        open: Open,
        options: SessionOptions,
    ) -> Result<()> {
        let mut ch = self.request(server, open, options).await?;
        match ch.recv_timeout(HANDSHAKE_TIMEOUT, "the rename").await? {
            Control::Done(_) => Ok(()),
            other => Err(session::unexpected(server, other, "Done")),
        }
    }

    /// The dialer's first flight for `open` with `options`, and what it checks in the
    /// answers.
    pub(crate) fn dial(
        &mut self,
        open: Open,
        options: dmover_proto::control::SessionOptions,
    ) -> Dial {
        Dial {
            hello: self.hello.clone(),
            auth: self.auth.clone(),
            open,
            options,
            server_proof: self
                .token
                .as_ref()
                .map(|t| auth::server_token_proof(&t.verifier, &self.transcript)),
            // Set by the caller that has any (see `Client::limits`).
            limits: Default::default(),
        }
    }
}

/// What one try to connect came to.
enum Dialed {
    /// TLS is up.
    Up(Box<Connection>),
    /// The server answered busy: connect again after this long.
    Busy(Duration),
}

impl Dialer {
    /// Connects and sets up TLS; the data connections are dialed meanwhile. Nothing of
    /// the session has gone out yet ([`Connection::dial`]).
    ///
    /// A server that answers busy (too many connections in set-up) is connected to
    /// again after the time it asks for, doubled on each busy answer (at most
    /// [`MAX_BUSY_BACKOFF`]) and jittered up by half, for at most
    /// [`TransferOptions::busy_wait`] in all (the last wait cut to end there, for a last
    /// try; whatever [`TransferOptions::retries`] says); then the error is a refusal
    /// with [`ErrorCode::Busy`].
    ///
    /// A server dialing another for a third-party copy says only that it could not
    /// reach it ([`peer_unreachable`]); the cause goes to its log.
    pub(crate) async fn connect(&self, server: &str) -> Result<Connection> {
        let r = self.connect_busy_wait(server).await;
        match r {
            Err(e) if self.as_server.is_some() => {
                tracing::warn!("third-party copy: could not reach {server}: {e}");
                Err(peer_unreachable(server))
            }
            r => r,
        }
    }

    /// [`Dialer::connect`], every cause told.
    async fn connect_busy_wait(&self, server: &str) -> Result<Connection> {
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::ZERO;
        loop {
            let retry_after = match self.connect_once(server).await? {
                Dialed::Up(c) => return Ok(*c),
                Dialed::Busy(after) => after,
            };
            backoff = retry_after
                .max(backoff * 2)
                .min(MAX_BUSY_BACKOFF)
                .max(Duration::from_millis(100));
            let spent = started.elapsed();
            if spent >= self.opts.busy_wait {
                return Err(Error::refused(
                    ErrorCode::Busy,
                    format!(
                        "{server} is busy (too many connections in set-up); gave up after \
                         {:.0} s (--busy-wait {:.0}s)",
                        spent.as_secs_f64(),
                        self.opts.busy_wait.as_secs_f64()
                    ),
                ));
            }
            // The last wait ends at the bound, for one more try.
            let wait = backoff
                .mul_f64(1.0 + rand::random::<f64>() / 2.0)
                .min(self.opts.busy_wait - spent);
            tracing::warn!(
                "{server} is busy (too many connections in set-up); retrying in {:.1} s",
                wait.as_secs_f64()
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One try of [`Client::connect`].
    async fn connect_once(&self, server: &str) -> Result<Dialed> {
        dmover_net::tls::warm_up();
        let connector = self.connector()?;
        // The data connections need the server to be there, not the session: they
        // connect and collect their challenges while the control connection sets up,
        // from the same moment, so that a fresh push's streams can join as its first
        // flight goes out (dropped, and with them the connections, if this fails).
        let dials = self
            .data_dialer(server)
            .dial_ahead(self.opts.streams.min(session::MAX_STREAMS));
        // TLS starts right behind the preamble, which goes out with the ClientHello
        // (in a TCP Fast Open SYN, where the server offers it); the server's answer is
        // read (and checked) before the first TLS bytes.
        let stream = dmover_net::control::connect(server, self.opts.connect_timeout).await?;
        // A server dialing another keeps to its own handshake timeout.
        let handshake = self
            .as_server
            .as_ref()
            .map_or(HANDSHAKE_TIMEOUT, |s| s.handshake_timeout);
        let (tls, key_known) = match tokio::time::timeout(
            handshake,
            connector.connect_checked(stream, server),
        )
        .await
        {
            Err(_) => {
                return Err(Error::Net(NetError::Timeout {
                    peer: server.into(),
                    what: "TLS handshake",
                    secs: handshake.as_secs(),
                }));
            }
            Ok(Err(NetError::Tls { source, .. }))
                if dmover_net::control::Busy::of(&source).is_some() =>
            {
                let busy = dmover_net::control::Busy::of(&source).expect("checked");
                return Ok(Dialed::Busy(busy.retry_after));
            }
            Ok(Err(NetError::Tls { source, .. }))
                if source
                    .get_ref()
                    .is_some_and(|e| e.is::<dmover_net::control::VersionRefused>()) =>
            {
                return Err(Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "{server} speaks no protocol version this client knows (we speak {}..={PROTOCOL_VERSION})",
                        dmover_proto::MIN_PROTOCOL_VERSION
                    ),
                ));
            }
            // A connection may be made only at its first write: a server that is not
            // there shows here, and is said as a failed connect.
            Ok(Err(NetError::Tls { source, .. }))
                if dmover_net::control::never_connected(&source) =>
            {
                return Err(Error::Net(NetError::Io {
                    what: "connecting to",
                    peer: server.into(),
                    source,
                }));
            }
            Ok(r) => r?,
        };
        let server_key = dmover_net::tls::server_fingerprint(&tls).unwrap_or_default();
        let tls = ControlStream::Client(tls);
        let binding = dmover_net::tls::export(&tls, auth::AUTH_EXPORTER_LABEL, None)?;
        let master = dmover_net::tls::export(&tls, auth::SESSION_EXPORTER_LABEL, None)?;
        let ch = ControlChannel::new(tls, server, control::MAX_FRAME);
        let nonce: [u8; 32] = rand::random();
        // This server's own credential (a client's profile), else the options'.
        let (user, token, key) = self.opts.credential_for(server);
        let user = user.to_string();
        let transcript = auth::transcript(&binding, &user, &nonce);
        let token = token.map(auth::token_keys);
        // Whatever credential we have goes out at once; a server without
        // authentication ignores it.
        let credential = match (key, &token) {
            _ if self.as_server.is_some() => {
                Credential::Capability(self.as_server.as_ref().expect("checked").capability.clone())
            }
            (Some(key), _) => Credential::Key {
                public: key.public(),
                signature: key.sign(&auth::key_auth_message(&transcript)),
            },
            (None, Some(t)) => Credential::Token {
                proof: auth::client_token_proof(t, &transcript),
            },
            (None, None) => Credential::None,
        };
        Ok(Dialed::Up(Box::new(Connection {
            ch,
            master,
            transcript,
            token: token.filter(|_| matches!(credential, Credential::Token { .. })),
            hello: Hello {
                software: SOFTWARE.into(),
                nonce,
            },
            auth: Auth { user, credential },
            dials,
            server_key,
            key_known,
        })))
    }
}

/// A third-party copy's dialer could not set up its connection to the other server
/// `server` (connect, TLS, the pinned key, busy answers): the same words whatever the
/// cause, so that a client learns nothing of what answers at an address (refused,
/// silent, another service) by steering a server at it; the cause is in the dialer's
/// log. With the way out when the servers cannot reach each other.
pub(crate) fn peer_unreachable(server: &str) -> Error {
    Error::refused(
        ErrorCode::Unsupported,
        format!(
            "this server could not reach {server}, the peer server (the cause is in this \
             server's log); if only one of the two servers accepts connections, the other \
             mode may work (--tpc push or pull); if neither can reach the other, \
             --via-client relays the data through the client (slower: its link carries \
             the data twice)"
        ),
    )
}
