//! TLS 1.3 for the control channel: rustls with the aws-lc-rs provider.
//!
//! # The server's identity
//! A server has one ECDSA P-256 key pair, kept as PKCS#8 PEM in `server.key` in its
//! state directory (created with mode 0600 on first start). Its certificate is made
//! fresh at every start, self-signed by that key; what clients pin is the key, as the
//! SHA-256 of its SubjectPublicKeyInfo ([`spki_fingerprint`], `sha256:` + base64), so
//! a new certificate over the same key changes nothing. A server can instead present a
//! certificate chain and key from files (signed by a CA its clients trust).
//!
//! # The client's trust
//! - [`Trust::KnownHosts`]: like ssh's `known_hosts` with `StrictHostKeyChecking
//!   accept-new`: the first key a server presents is recorded, a different key later is
//!   refused with [`NetError::HostKeyChanged`], naming the file and line. The TLS
//!   handshake still checks that the server holds the private key of the certificate
//!   it presents (its handshake signature); the pin is checked right after the
//!   handshake, before the client sends anything.
//! - [`Trust::Ca`]: ordinary WebPKI verification against the CA certificates in a PEM
//!   file, with the host name (or IP address) the user named.
//!
//! # Servers dialing servers (mutual TLS)
//! A server that dials another server (a third-party transfer: data flows from server A
//! to server B) proves who it is with its own key: [`TlsConnector::with_identity`]
//! presents a [`ServerIdentity`]'s certificate as the TLS client certificate, and still
//! checks the dialed server by [`Trust`] as any client does. The accepting side uses
//! [`ServerIdentity::mutual_acceptor`], which asks for a client certificate but does
//! not require one: a client that presents none (every dmover client today) answers the
//! request with an empty certificate message and goes on as before. A certificate that
//! is presented is not judged by a CA or its validity dates (trust is decided by the
//! caller, by fingerprint, as with `known_hosts`); what the TLS handshake does check is
//! the client's CertificateVerify signature over the handshake, so the dialer proves it
//! holds the certificate's private key, not merely its bytes. After the handshake
//! [`peer_fingerprint`] gives the client key's fingerprint, in the same `sha256:`
//! format as the pins. [`ServerIdentity::acceptor`] is unchanged: it asks for nothing.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::control::ControlTcp;
use base64::Engine;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::NetError;
use crate::known_hosts;

pub use tokio_rustls::TlsAcceptor;

/// The crypto provider every TLS config here uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Seeds the crypto library's random generator on a background thread, once per
/// process. Its first use collects CPU-jitter entropy, ~50 ms of CPU here; a client
/// calls this before connecting so that the TLS handshake's key share does not wait
/// for it.
pub fn warm_up() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("dmover-rng-seed".into())
            .spawn(|| {
                let mut b = [0u8; 32];
                let _ = aws_lc_rs::rand::fill(&mut b);
            });
    });
}

/// Name of the key file in a server's state directory.
pub const KEY_FILE: &str = "server.key";

/// The fingerprint of a certificate's public key: `sha256:` and the base64 (no
/// padding) of the SHA-256 of its SubjectPublicKeyInfo.
pub fn spki_fingerprint(cert: &CertificateDer<'_>) -> Result<String, String> {
    let ee = webpki::EndEntityCert::try_from(cert).map_err(|e| format!("bad certificate: {e}"))?;
    let spki = ee.subject_public_key_info();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, spki.as_ref());
    Ok(format!(
        "sha256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
    ))
}

/// A server's certificate chain and private key.
#[derive(Debug)]
pub struct ServerIdentity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    fingerprint: String,
}

impl Clone for ServerIdentity {
    fn clone(&self) -> Self {
        ServerIdentity {
            certs: self.certs.clone(),
            key: self.key.clone_key(),
            fingerprint: self.fingerprint.clone(),
        }
    }
}

/// Where a server's key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    /// Made now and saved to this file.
    Created(PathBuf),
    /// Read from this file.
    Loaded(PathBuf),
    /// Made now, kept in memory only.
    Ephemeral,
    /// Certificate and key files given by the operator.
    Files,
}

impl ServerIdentity {
    fn self_signed(kp: rcgen::KeyPair) -> Result<Self, String> {
        let params =
            rcgen::CertificateParams::new(vec!["dmover".to_string()]).map_err(|e| e.to_string())?;
        let cert = params.self_signed(&kp).map_err(|e| e.to_string())?;
        let der = cert.der().clone();
        Ok(ServerIdentity {
            fingerprint: spki_fingerprint(&der)?,
            certs: vec![der],
            key: PrivateKeyDer::Pkcs8(kp.serialize_der().into()),
        })
    }

    /// A key pair that lives as long as the process (demos, tests).
    pub fn ephemeral() -> Result<Self, NetError> {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| NetError::file("generating", Path::new("a server key"), e))?;
        Self::self_signed(kp)
            .map_err(|e| NetError::file("generating", Path::new("a server key"), e))
    }

    /// Loads the key pair in `state_dir`, creating the directory (mode 0700) and the key
    /// (mode 0600) if absent.
    pub fn load_or_create(state_dir: &Path) -> Result<(Self, KeyOrigin), NetError> {
        let path = state_dir.join(KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(pem) => {
                let kp = rcgen::KeyPair::from_pem(&pem)
                    .map_err(|e| NetError::file("reading the key", &path, e))?;
                let id = Self::self_signed(kp).map_err(|e| NetError::file("using", &path, e))?;
                Ok((id, KeyOrigin::Loaded(path)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(state_dir)
                    .map_err(|e| NetError::file("creating", state_dir, e))?;
                let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                    .map_err(|e| NetError::file("generating", &path, e))?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(|e| NetError::file("creating", &path, e))?;
                f.write_all(kp.serialize_pem().as_bytes())
                    .and_then(|_| f.sync_all())
                    .map_err(|e| NetError::file("writing", &path, e))?;
                let id = Self::self_signed(kp).map_err(|e| NetError::file("using", &path, e))?;
                Ok((id, KeyOrigin::Created(path)))
            }
            Err(e) => Err(NetError::file("reading", &path, e)),
        }
    }

    /// A certificate chain (PEM, leaf first) and its private key (PEM).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, NetError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| NetError::file("reading", cert, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| NetError::file("reading", cert, e))?;
        let Some(leaf) = certs.first() else {
            return Err(NetError::file(
                "reading",
                cert,
                "no certificate in the file",
            ));
        };
        let fingerprint = spki_fingerprint(leaf).map_err(|e| NetError::file("reading", cert, e))?;
        let key =
            PrivateKeyDer::from_pem_file(key).map_err(|e| NetError::file("reading", key, e))?;
        Ok(ServerIdentity {
            certs,
            key,
            fingerprint,
        })
    }

    /// The fingerprint clients pin.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The leaf certificate (DER).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.certs[0]
    }

    /// The private key (to sign capabilities, [`crate::capability`]).
    pub(crate) fn private_key(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// A TLS 1.3 acceptor presenting this identity.
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, NetError> {
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|b| {
                b.with_no_client_auth()
                    .with_single_cert(self.certs.clone(), self.key.clone_key())
            })
            .map_err(|e| NetError::file("using", Path::new("the server key"), e))?;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }

    /// A TLS 1.3 acceptor presenting this identity that also asks the client for a
    /// certificate, optionally: clients that present none are served as by
    /// [`ServerIdentity::acceptor`]; one that presents a certificate must prove it holds
    /// its key (its CertificateVerify signature is checked), and [`peer_fingerprint`]
    /// names that key after the handshake. Any self-signed or CA-issued certificate is
    /// taken; whether its key is trusted is the caller's decision.
    pub fn mutual_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, NetError> {
        let p = provider();
        let cfg = rustls::ServerConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|b| {
                b.with_client_cert_verifier(Arc::new(AnyClientKey(p)))
                    .with_single_cert(self.certs.clone(), self.key.clone_key())
            })
            .map_err(|e| NetError::file("using", Path::new("the server key"), e))?;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }
}

/// The fingerprint ([`spki_fingerprint`]) of the key a client proved it holds during
/// the TLS handshake on a [`ServerIdentity::mutual_acceptor`], or `None` when the
/// client presented no certificate (or the acceptor did not ask for one).
pub fn peer_fingerprint<IO>(stream: &tokio_rustls::server::TlsStream<IO>) -> Option<String> {
    let cert = stream.get_ref().1.peer_certificates()?.first()?;
    spki_fingerprint(cert).ok()
}

/// A client certificate verifier that offers client authentication without requiring
/// it, takes any well-formed certificate (no CA, no validity dates: trust is decided by
/// fingerprint, later), and checks the handshake signature against the certificate's
/// key, so the client proves possession of the private key.
#[derive(Debug)]
struct AnyClientKey(Arc<CryptoProvider>);

impl ClientCertVerifier for AnyClientKey {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Parsed here so that a certificate whose key cannot be read is refused now,
        // and `peer_fingerprint` can always compute one later.
        webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// How a client decides to trust a server's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Pin on first use in this known-hosts file.
    KnownHosts(PathBuf),
    /// WebPKI verification against the CA certificates in this PEM file.
    Ca(PathBuf),
    /// Exactly the key with this fingerprint, which someone the caller trusts vouched
    /// for (a third-party copy's peer, as the steering client pinned it).
    Key(String),
}

/// Accepts any certificate whose key signed the handshake; the key is pinned after the
/// handshake (see the module docs).
#[derive(Debug)]
struct PinAfterHandshake(Arc<CryptoProvider>);

impl ServerCertVerifier for PinAfterHandshake {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
pub fn host_of(server: &str) -> &str {
    if let Some(rest) = server.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match server.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.parse::<u16>().is_ok() => h,
        _ => server,
    }
}

/// A client's TLS settings.
#[derive(Clone)]
pub struct TlsConnector {
    inner: tokio_rustls::TlsConnector,
    trust: Trust,
    /// The fingerprint of the identity presented as client certificate, if any.
    presents: Option<String>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("trust", &self.trust)
            .field("presents", &self.presents)
            .finish()
    }
}

impl TlsConnector {
    /// TLS 1.3 with `trust`, presenting no client certificate.
    pub fn new(trust: Trust) -> Result<Self, NetError> {
        Self::build(trust, None)
    }

    /// TLS 1.3 with `trust` that presents `identity` (its certificate chain, proving
    /// its key in the handshake) as the client certificate when the server asks for one
    /// ([`ServerIdentity::mutual_acceptor`]): how a server dialing another server says
    /// who it is. The dialed server is checked by `trust` exactly as by [`Self::new`].
    pub fn with_identity(trust: Trust, identity: &ServerIdentity) -> Result<Self, NetError> {
        Self::build(trust, Some(identity))
    }

    fn build(trust: Trust, identity: Option<&ServerIdentity>) -> Result<Self, NetError> {
        let p = provider();
        let builder = rustls::ClientConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::file("setting up", Path::new("TLS"), e))?;
        let cfg = match &trust {
            Trust::KnownHosts(_) | Trust::Key(_) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinAfterHandshake(p))),
            Trust::Ca(file) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(file)
                    .map_err(|e| NetError::file("reading the CA file", file, e))?
                {
                    let c = c.map_err(|e| NetError::file("reading the CA file", file, e))?;
                    roots
                        .add(c)
                        .map_err(|e| NetError::file("reading the CA file", file, e))?;
                }
                if roots.is_empty() {
                    return Err(NetError::file(
                        "reading the CA file",
                        file,
                        "no certificate in it",
                    ));
                }
                builder.with_root_certificates(roots)
            }
        };
        let cfg = match identity {
            None => cfg.with_no_client_auth(),
            Some(id) => cfg
                .with_client_auth_cert(id.certs.clone(), id.key.clone_key())
                .map_err(|e| NetError::file("using", Path::new("the server key"), e))?,
        };
        Ok(TlsConnector {
            inner: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            trust,
            presents: identity.map(|id| id.fingerprint.clone()),
        })
    }

    /// How this client trusts servers.
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The fingerprint of the identity this connector presents as client certificate
    /// ([`Self::with_identity`]), `None` for an ordinary client.
    pub fn presents(&self) -> Option<&str> {
        self.presents.as_deref()
    }

    /// Runs the TLS handshake with `server` (`host:port`, as the user named it) over
    /// `tcp` and checks the server's key (pinned or CA-verified).
    pub async fn connect(
        &self,
        tcp: impl Into<ControlTcp>,
        server: &str,
    ) -> Result<tokio_rustls::client::TlsStream<ControlTcp>, NetError> {
        Ok(self.connect_checked(tcp, server).await?.0)
    }

    /// [`TlsConnector::connect`], also telling whether the server's key was known
    /// before this connection (pinned earlier, CA-verified, or the one vouched for):
    /// `false` when it was pinned now, on first use, so that nothing but TLS says yet
    /// who the server is.
    pub async fn connect_checked(
        &self,
        tcp: impl Into<ControlTcp>,
        server: &str,
    ) -> Result<(tokio_rustls::client::TlsStream<ControlTcp>, bool), NetError> {
        let tcp = tcp.into();
        let host = host_of(server);
        let name = ServerName::try_from(host.to_string()).map_err(|e| NetError::Tls {
            peer: server.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        })?;
        let tls = self
            .inner
            .connect(name, tcp)
            .await
            .map_err(|source| NetError::Tls {
                peer: server.to_string(),
                source,
            })?;
        let mut known = true;
        if let Trust::KnownHosts(_) | Trust::Key(_) = &self.trust {
            let cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or_else(|| NetError::Tls {
                    peer: server.to_string(),
                    source: std::io::Error::other("the server presented no certificate"),
                })?;
            let fp = spki_fingerprint(cert).map_err(|e| NetError::Tls {
                peer: server.to_string(),
                source: std::io::Error::other(e),
            })?;
            match &self.trust {
                Trust::KnownHosts(file) => {
                    if let known_hosts::Pin::Added = known_hosts::check(file, server, &fp)? {
                        known = false;
                        tracing::warn!(
                            "pinned the key of {server} ({fp}) in {} on first use",
                            file.display()
                        );
                    }
                }
                Trust::Key(want) if *want != fp => {
                    return Err(NetError::Tls {
                        peer: server.to_string(),
                        source: std::io::Error::other(format!(
                            "the server presented the key {fp}, not {want}"
                        )),
                    });
                }
                _ => {}
            }
        }
        Ok((tls, known))
    }
}

/// The fingerprint of the key the server proved it holds on a client connection.
pub fn server_fingerprint<IO>(stream: &tokio_rustls::client::TlsStream<IO>) -> Option<String> {
    let cert = stream.get_ref().1.peer_certificates()?.first()?;
    spki_fingerprint(cert).ok()
}

/// Exports 32 bytes of keying material from the control connection's TLS session
/// (RFC 8446 §7.5); both ends get the same bytes, nobody else can.
pub fn export(
    stream: &crate::ControlStream,
    label: &[u8],
    context: Option<&[u8]>,
) -> Result<[u8; 32], NetError> {
    let out = [0u8; 32];
    let r = match stream {
        tokio_rustls::TlsStream::Client(s) => {
            s.get_ref().1.export_keying_material(out, label, context)
        }
        tokio_rustls::TlsStream::Server(s) => {
            s.get_ref().1.export_keying_material(out, label, context)
        }
    };
    r.map_err(|e| NetError::Tls {
        peer: String::new(),
        source: std::io::Error::other(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::sign::CertifiedKey;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// What the accepting side saw of one connection: the handshake's outcome and,
    /// when it succeeded, the client's key fingerprint.
    type Accepted = Result<Option<String>, std::io::Error>;

    /// Accepts one connection on `acceptor`, reports what it saw, and on success
    /// answers the client's byte with `ok`.
    async fn serve_once(listener: &TcpListener, acceptor: TlsAcceptor) -> Accepted {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(ControlTcp::new(tcp)).await?;
        let fp = peer_fingerprint(&tls);
        eprintln!(
            "accepted: {:?} handshake, client key {fp:?}",
            tls.get_ref().1.handshake_kind()
        );
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await?;
        tls.write_all(b"ok").await?;
        tls.shutdown().await?;
        Ok(fp)
    }

    /// Connects with `c`, sends a byte and reads the answer (`ok` when accepted).
    async fn talk(c: &TlsConnector, addr: &str) -> Result<Vec<u8>, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let mut tls = c.connect(tcp, addr).await.map_err(|e| e.to_string())?;
        tls.write_all(b"?").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        let mut b = Vec::new();
        tls.read_to_end(&mut b).await.map_err(|e| e.to_string())?;
        Ok(b)
    }

    /// One connection from `c` to a server accepting with `acceptor`: (server side,
    /// client side).
    async fn exchange(
        c: &TlsConnector,
        acceptor: TlsAcceptor,
    ) -> (Accepted, Result<Vec<u8>, String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move { serve_once(&listener, acceptor).await });
        let client = tokio::time::timeout(std::time::Duration::from_secs(30), talk(c, &addr))
            .await
            .expect("the client ends");
        (server.await.unwrap(), client)
    }

    fn known_hosts(dir: &tempfile::TempDir) -> Trust {
        Trust::KnownHosts(dir.path().join("known_hosts"))
    }

    #[tokio::test]
    async fn a_dialing_server_is_seen_by_its_key_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let b = ServerIdentity::ephemeral().unwrap();
        let a = ServerIdentity::ephemeral().unwrap();
        let c = TlsConnector::with_identity(known_hosts(&dir), &a).unwrap();
        assert_eq!(c.presents(), Some(a.fingerprint()));
        // Twice on one acceptor: the second connection resumes the first's session
        // (a "Resumed" handshake, printed; rustls keeps the client's certificate in the
        // session), and must still name the key.
        let acceptor = b.mutual_acceptor().unwrap();
        for _ in 0..2 {
            let (seen, answer) = exchange(&c, acceptor.clone()).await;
            assert_eq!(seen.unwrap().as_deref(), Some(a.fingerprint()));
            assert_eq!(answer.unwrap(), b"ok");
        }
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert!(a.fingerprint().starts_with("sha256:"));
    }

    #[tokio::test]
    async fn a_client_presenting_nothing_is_none_and_still_served() {
        let dir = tempfile::tempdir().unwrap();
        let b = ServerIdentity::ephemeral().unwrap();
        let c = TlsConnector::new(known_hosts(&dir)).unwrap();
        assert_eq!(c.presents(), None);
        let (seen, answer) = exchange(&c, b.mutual_acceptor().unwrap()).await;
        assert_eq!(seen.unwrap(), None);
        assert_eq!(answer.unwrap(), b"ok");
        // And the ordinary acceptor, which asks for nothing, sees nothing even from a
        // client that has an identity to present.
        let a = ServerIdentity::ephemeral().unwrap();
        let c = TlsConnector::with_identity(known_hosts(&dir), &a).unwrap();
        let (seen, answer) = exchange(&c, b.acceptor().unwrap()).await;
        assert_eq!(seen.unwrap(), None);
        assert_eq!(answer.unwrap(), b"ok");
    }

    #[tokio::test]
    async fn a_dialing_server_still_pins_the_server_it_dials() {
        let dir = tempfile::tempdir().unwrap();
        let a = ServerIdentity::ephemeral().unwrap();
        let c = TlsConnector::with_identity(known_hosts(&dir), &a).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let first = ServerIdentity::ephemeral().unwrap();
        let other = ServerIdentity::ephemeral().unwrap();
        let server = tokio::spawn(async move {
            let s1 = serve_once(&listener, first.mutual_acceptor().unwrap()).await;
            let s2 = serve_once(&listener, other.mutual_acceptor().unwrap()).await;
            (s1, s2)
        });
        assert_eq!(talk(&c, &addr).await.unwrap(), b"ok");
        let e = talk(&c, &addr).await.unwrap_err();
        assert!(e.contains("changed") || e.contains("known_hosts"), "{e}");
        let (s1, _) = server.await.unwrap();
        assert_eq!(s1.unwrap().as_deref(), Some(a.fingerprint()));
    }

    /// Presents a fixed certificate and signs with a fixed key, matching or not.
    #[derive(Debug)]
    struct Fixed(Arc<CertifiedKey>);

    impl rustls::client::ResolvesClientCert for Fixed {
        fn resolve(
            &self,
            _root_hint_subjects: &[&[u8]],
            _sigschemes: &[SignatureScheme],
        ) -> Option<Arc<CertifiedKey>> {
            Some(self.0.clone())
        }

        fn has_certs(&self) -> bool {
            true
        }
    }

    /// A connector presenting `cert`'s certificate while signing with `key`'s key
    /// (rustls's own `with_client_auth_cert` refuses a mismatch; a resolver does not).
    fn presenting(
        cert: &ServerIdentity,
        key: &ServerIdentity,
        dir: &tempfile::TempDir,
    ) -> TlsConnector {
        let p = provider();
        let signer = p
            .key_provider
            .load_private_key(key.key.clone_key())
            .unwrap();
        let ck = CertifiedKey::new(cert.certs.clone(), signer);
        let cfg = rustls::ClientConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinAfterHandshake(p)))
            .with_client_cert_resolver(Arc::new(Fixed(Arc::new(ck))));
        TlsConnector {
            inner: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            trust: known_hosts(dir),
            presents: Some(cert.fingerprint().to_string()),
        }
    }

    #[tokio::test]
    async fn a_certificate_without_its_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let b = ServerIdentity::ephemeral().unwrap();
        let victim = ServerIdentity::ephemeral().unwrap();
        let thief = ServerIdentity::ephemeral().unwrap();
        // The control: the same resolver with the matching key is accepted.
        let honest = presenting(&victim, &victim, &dir);
        let (seen, answer) = exchange(&honest, b.mutual_acceptor().unwrap()).await;
        assert_eq!(seen.unwrap().as_deref(), Some(victim.fingerprint()));
        assert_eq!(answer.unwrap(), b"ok");
        // The victim's certificate, signed for by the thief's key: the acceptor checks
        // the CertificateVerify signature against the certificate and refuses.
        let forged = presenting(&victim, &thief, &dir);
        let (seen, answer) = exchange(&forged, b.mutual_acceptor().unwrap()).await;
        let e = seen.expect_err("a certificate without its key is refused");
        eprintln!("acceptor: {e}; client: {answer:?}");
        assert!(
            e.to_string().to_lowercase().contains("signature")
                || e.to_string().to_lowercase().contains("decrypt"),
            "{e}"
        );
        assert!(answer.is_err(), "the client got {answer:?}");
    }
}
