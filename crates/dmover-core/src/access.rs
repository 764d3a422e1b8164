//! Who may do what on a server: exports (named roots), users with their credentials
//! and rights, the server's configuration file, and the client's key files.
//!
//! # Configuration file (`dmover serve --config FILE`, TOML)
//! Every key, with its default, is in docs/config.md (its example is
//! packaging/server.toml, which a test parses with [`ConfigFile`]).
//! ```toml
//! listen = "[::]:7700"             # optional (the default with users); --listen overrides
//! state_dir = "/var/lib/dmover"    # optional; where the server key lives
//! # tls_cert = "/etc/dmover/cert.pem"   # optional: a CA-signed chain and its key
//! # tls_key = "/etc/dmover/key.pem"     # instead of the key in state_dir
//! require_encryption = false       # refuse sessions without --encrypt
//! max_sessions = 64                # all users together
//! max_sessions_per_user = 8
//! max_handshakes = 256             # connections in set-up; more answered busy
//! max_unauthenticated_per_address = 64  # per source address (0: no limit)
//! handshake_timeout = "30s"       # connection to session, and each data join
//! idle_timeout = "2m"              # a data stream without progress
//! max_manifest_entries = 50000000
//! max_manifest_bytes = "8G"        # a push's: entries, names, link targets, checks
//! max_manifest_bytes_read = "256M" # a pull's or digests' (read-only users)
//! # manifest_memory = "4G"         # all sessions together (default: RAM/4, at most 4G)
//!
//! [exports.data]
//! path = "/data"
//! read_only = false                # optional: read-only for everyone
//! bwlimit = "10gbit"               # optional: per session on it (a rate with a unit)
//! preserve_owner = false           # optional: pushed files keep their numeric owner (root server)
//! xattrs = "user"                  # optional: "all" carries every xattr namespace
//!
//! [users.alice]
//! token = "dmover-token-v2:…"      # from `dmover credential token FILE`
//! keys = ["ed25519:…"]             # from `dmover credential key FILE`
//! exports = { data = "rw" }        # "ro" or "rw"
//! bwlimit = "1gbit"                # optional: per session of the user
//! ```
//! A user named `*` matches any user name. Paths on a server with named exports start
//! with the export's name (`data/run1`); a server with one unnamed export (`--root`)
//! takes paths relative to it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_lc_rs::signature::{self, Ed25519KeyPair, KeyPair};
use base64::Engine;
use dmover_proto::auth::TokenVerifier;
use serde::Deserialize;

use crate::error::{Error, Result};

/// Prefix of a public key in the configuration.
pub const ED25519_PREFIX: &str = "ed25519:";

/// A directory a server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    /// Its name, the first component of paths naming it (`""`: the only export, and
    /// paths are relative to it).
    pub name: String,
    /// The directory.
    pub path: PathBuf,
    /// Nobody may write to it.
    pub read_only: bool,
    /// Third-party copies may read from or write to it (docs/third-party.md).
    pub third_party: bool,
    /// Bandwidth limit of each session on it, in bytes per second.
    pub bwlimit: Option<u64>,
    /// Files pushed to it get the source's numeric owner, when the server runs as
    /// root (off by default: a user with write rights could otherwise make files of
    /// any owner, setuid ones among them).
    pub preserve_owner: bool,
    /// Every extended-attribute namespace travels (`xattrs = "all"`): pushed files
    /// get `trusted.*`, `security.*` and the rest as the client sent them (what the
    /// server's rights let it set), and pulls send them; otherwise `user.*` and POSIX
    /// ACLs only.
    pub xattrs_all: bool,
}

/// What a user may do with an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Rights {
    /// Read (pull) only.
    #[serde(rename = "ro")]
    ReadOnly,
    /// Read and write (push too).
    #[serde(rename = "rw")]
    ReadWrite,
}

/// A user and how they prove who they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The name (`*`: any name).
    pub name: String,
    /// The verifier of the user's token, if they have one.
    pub token: Option<TokenVerifier>,
    /// The user's Ed25519 public keys.
    pub keys: Vec<[u8; 32]>,
    /// Rights per export name.
    pub exports: BTreeMap<String, Rights>,
    /// Bandwidth limit of each of the user's sessions, in bytes per second.
    pub bwlimit: Option<u64>,
    /// A monitoring user (named in `metrics_users`): its token reads the metrics and
    /// opens no session (issue 46, item 9).
    pub metrics_only: bool,
}

/// The identity a session runs as, after authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The user's name as configured (`*` for a shared token; empty without
    /// authentication).
    pub user: String,
    /// The name the client gave (`user` unless it matched `*`).
    pub login: String,
    /// The credential the client proved.
    pub proven: Proven,
    /// Rights per export name.
    pub exports: BTreeMap<String, Rights>,
    /// Granted by a third-party capability: the one session it allows.
    pub scope: Option<dmover_proto::capability::Scope>,
}

/// Which of a user's credentials a session proved: checked again when the users are
/// reloaded ([`Grant::recheck`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proven {
    /// None (a server without authentication).
    Nothing,
    /// The token this verifier checks.
    Token(TokenVerifier),
    /// The private half of this Ed25519 public key.
    Key([u8; 32]),
    /// A third-party capability, by its nonce (the user named in it, no credential
    /// of theirs).
    Capability([u8; 16]),
}

impl Grant {
    /// The grant `users` (reloaded) give this session now: the same user entry, the
    /// credential it proved still that user's, and the entry's rights as they are now;
    /// or why not.
    pub fn recheck(&self, users: &BTreeMap<String, User>) -> std::result::Result<Grant, String> {
        let Some(user) = users.get(&self.login).or_else(|| users.get("*")) else {
            return Err(format!("user {:?} was removed", self.user));
        };
        if user.name != self.user {
            return Err(format!(
                "user {:?} is now configured as {:?}",
                self.login, user.name
            ));
        }
        let kept = match &self.proven {
            Proven::Nothing | Proven::Capability(_) => true,
            Proven::Token(v) => user.token.as_ref() == Some(v),
            Proven::Key(k) => user.keys.contains(k),
        };
        if !kept {
            let what = match self.proven {
                Proven::Key(_) => "key",
                _ => "token",
            };
            return Err(format!("the {what} of user {:?} changed", self.user));
        }
        Ok(Grant {
            exports: user.exports.clone(),
            ..self.clone()
        })
    }
}

/// The users of a server: `None` is the loopback-only mode without authentication.
pub type Users = Option<BTreeMap<String, User>>;

/// Parses `ed25519:BASE64` (32 bytes; padding optional).
pub fn parse_public_key(s: &str) -> Option<[u8; 32]> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const B64: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    B64.decode(s.trim().strip_prefix(ED25519_PREFIX)?)
        .ok()?
        .try_into()
        .ok()
}

/// Formats a public key as the configuration wants it.
pub fn format_public_key(k: &[u8; 32]) -> String {
    format!(
        "{ED25519_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(k)
    )
}

/// Checks an Ed25519 signature.
pub fn verify_signature(public: &[u8; 32], msg: &[u8], sig: &[u8]) -> bool {
    signature::UnparsedPublicKey::new(&signature::ED25519, public)
        .verify(msg, sig)
        .is_ok()
}

/// A client's Ed25519 key.
#[derive(Clone)]
pub struct ClientKey(Arc<Ed25519KeyPair>);

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientKey({})", format_public_key(&self.public()))
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn key_err(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::refused(
        dmover_proto::control::ErrorCode::Auth,
        format!("key file {}: {message}", path.display()),
    )
}

impl ClientKey {
    /// Generates a key, writes it to `path` (PKCS#8 PEM, mode 0600, never over an
    /// existing file) and its public half to `path.pub`.
    pub fn generate(path: &Path) -> Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| key_err(path, e))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| key_err(path, e))?;
        f.write_all(pem("PRIVATE KEY", doc.as_ref()).as_bytes())
            .map_err(|e| key_err(path, e))?;
        let key = Self::from_der(doc.as_ref(), path)?;
        let mut pub_path = path.as_os_str().to_owned();
        pub_path.push(".pub");
        std::fs::write(&pub_path, format!("{}\n", format_public_key(&key.public())))
            .map_err(|e| key_err(Path::new(&pub_path), e))?;
        Ok(key)
    }

    fn from_der(der: &[u8], path: &Path) -> Result<Self> {
        let kp = Ed25519KeyPair::from_pkcs8(der)
            .or_else(|_| Ed25519KeyPair::from_pkcs8_maybe_unchecked(der))
            .map_err(|e| key_err(path, format!("not an Ed25519 PKCS#8 key ({e})")))?;
        Ok(ClientKey(Arc::new(kp)))
    }

    /// Loads a key written by [`ClientKey::generate`] (any PKCS#8 Ed25519 PEM).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| key_err(path, e))?;
        let body: String = text
            .lines()
            .skip_while(|l| !l.starts_with("-----BEGIN PRIVATE KEY-----"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.trim())
            .map_err(|_| key_err(path, "no PEM \"PRIVATE KEY\" block"))?;
        Self::from_der(&der, path)
    }

    /// The public key.
    pub fn public(&self) -> [u8; 32] {
        self.0
            .public_key()
            .as_ref()
            .try_into()
            .expect("Ed25519 public keys are 32 bytes")
    }

    /// Signs `msg`.
    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.0.sign(msg).as_ref().to_vec()
    }
}

/// The configuration file's contents (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Address to listen on.
    pub listen: Option<SocketAddr>,
    /// Directory of the server's key.
    pub state_dir: Option<PathBuf>,
    /// A certificate chain (PEM) to present instead of the self-signed one.
    pub tls_cert: Option<PathBuf>,
    /// The key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// Refuse sessions whose data streams are not encrypted.
    #[serde(default)]
    pub require_encryption: bool,
    /// Sessions at once, all users together.
    pub max_sessions: Option<usize>,
    /// Sessions at once per user.
    pub max_sessions_per_user: Option<usize>,
    /// Connections in set-up (before their session or join) at once.
    pub max_handshakes: Option<usize>,
    /// Connections one source address may have before authenticating or joining (0:
    /// no limit).
    pub max_unauthenticated_per_address: Option<usize>,
    /// Refuse pushes on every export (`--read-only`).
    #[serde(default)]
    pub read_only: bool,
    /// Memory for chunk buffers shared by all sessions (`--memory`).
    pub memory: Option<Size>,
    /// Disk I/O threads, pinned (`--io-threads`).
    pub io_threads: Option<u16>,
    /// Network threads (`--net-threads`).
    pub net_threads: Option<u16>,
    /// Socket buffer size of accepted connections (`--tcp-buffer`).
    pub tcp_buffer: Option<Size>,
    /// TCP congestion control when the client names none (`--congestion`).
    pub congestion: Option<String>,
    /// From connecting to an open session, and for each data join.
    pub handshake_timeout: Option<Span>,
    /// Seconds of `handshake_timeout`, as older configs wrote it.
    pub handshake_timeout_secs: Option<u64>,
    /// How long a data stream may go without progress.
    pub idle_timeout: Option<Span>,
    /// Seconds of `idle_timeout`, as older configs wrote it.
    pub idle_timeout_secs: Option<u64>,
    /// Most manifest entries per session.
    pub max_manifest_entries: Option<u64>,
    /// Most memory a push's or a prune's manifest may take.
    pub max_manifest_bytes: Option<Size>,
    /// Most memory the manifest of a pull or of digests may take.
    pub max_manifest_bytes_read: Option<Size>,
    /// Memory all sessions' manifests may take together.
    pub manifest_memory: Option<Size>,
    /// The address other servers dial for third-party copies, the one the
    /// capabilities this server issues name (docs/third-party.md).
    pub tpc_address: Option<String>,
    /// Key fingerprints of the servers this one may dial for third-party copies.
    pub tpc_peers: Option<Vec<String>>,
    /// How long a third-party capability this server issues stays valid.
    pub tpc_capability_ttl: Option<Span>,
    /// Seconds of `tpc_capability_ttl`, as older configs wrote it.
    pub tpc_capability_ttl_secs: Option<u64>,
    /// Address of the metrics, the live page and its JSON (`--metrics`).
    pub metrics: Option<SocketAddr>,
    /// Users whose bearer tokens may read the metrics; needed for a metrics address
    /// that is not loopback (which then also takes TLS).
    pub metrics_users: Option<Vec<String>>,
    /// Exports by name.
    #[serde(default)]
    pub exports: BTreeMap<String, ExportEntry>,
    /// Users by name.
    #[serde(default)]
    pub users: BTreeMap<String, UserEntry>,
    /// The job service beside the server (`dmover serve --jobs`; docs/jobs.md).
    pub jobs: Option<JobsEntry>,
}

/// A size in the configuration file: a string with a unit as on the command line
/// (`"2G"`, [`dmover_proto::units::parse_size`]), or a bare integer of bytes as older
/// configs wrote it ([`ConfigFile::deprecated`] names the new spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// The size in bytes.
    pub bytes: u64,
    /// Written as a bare integer.
    pub bare: bool,
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size with a unit, e.g. \"2G\" or \"512M\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Size, E> {
                u64::try_from(v)
                    .map(|bytes| Size { bytes, bare: true })
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_u64<E: serde::de::Error>(self, bytes: u64) -> std::result::Result<Size, E> {
                Ok(Size { bytes, bare: true })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Size, E> {
                dmover_proto::units::parse_size(v)
                    .map(|bytes| Size { bytes, bare: false })
                    .map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration in the configuration file: a string with a unit as on the command line
/// (`"30s"`, `"2m"`; [`dmover_proto::units::parse_duration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub std::time::Duration);

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Span;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration with a unit, e.g. \"30s\" or \"2m\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Span, E> {
                dmover_proto::units::parse_duration(v)
                    .map(Span)
                    .map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// `bytes` in the largest binary unit that writes it whole (`8589934592` → `8G`).
fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// `secs` in the largest unit that writes it whole (`3600` → `1h`).
fn secs_text(secs: u64) -> String {
    match secs {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The `[jobs]` section: the job service's settings (docs/jobs.md, docs/config.md).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsEntry {
    /// Run the job service (as `--jobs` does).
    #[serde(default)]
    pub enabled: bool,
    /// Address of its REST API [default: 127.0.0.1:7780]; not loopback: TLS.
    pub listen: Option<SocketAddr>,
    /// The SQLite database [default: `jobs.sqlite` in the state directory], or a
    /// PostgreSQL database shared by several services (`postgres://USER@HOST/DB`;
    /// docs/cluster.md).
    pub database: Option<PathBuf>,
    /// PostgreSQL: a file holding the database user's password (kept out of the URL
    /// and this file; readable by the service's user only).
    pub database_password_file: Option<PathBuf>,
    /// PostgreSQL: CA certificates (PEM) that sign the database server's
    /// certificate; the connection is then TLS, never in clear.
    pub database_ca: Option<PathBuf>,
    /// PostgreSQL: the schema holding this cluster's tables (several clusters share
    /// one database in schemas of their own) [default: the database user's].
    pub database_schema: Option<String>,
    /// PostgreSQL: this service's name among the services sharing the database
    /// [default: the host's name].
    pub agent: Option<String>,
    /// PostgreSQL: the time between this service's heartbeats [default: 5s].
    pub heartbeat: Option<Span>,
    /// PostgreSQL: heartbeats a lease lasts: a service silent this long loses its
    /// running jobs to the others [default: 6; at least 2].
    pub lease_heartbeats: Option<u32>,
    /// Jobs run at once [default: 4].
    pub concurrency: Option<usize>,
    /// Runs after the first a job may take after failures that may pass [default: 3].
    pub retries: Option<u32>,
    /// The wait before the first retry, doubled for each next [default: 30s].
    pub retry_wait: Option<Span>,
    /// Seconds of `retry_wait`, as older configs wrote it.
    pub retry_wait_secs: Option<u64>,
    /// The longest wait between retries [default: 1h].
    pub max_retry_wait: Option<Span>,
    /// Seconds of `max_retry_wait`, as older configs wrote it.
    pub max_retry_wait_secs: Option<u64>,
    /// A job not done this long after submission fails [default: 1d].
    pub deadline: Option<Span>,
    /// Seconds of `deadline`, as older configs wrote it.
    pub deadline_secs: Option<u64>,
    /// Jobs running at once on one link (source server, destination server)
    /// [default: 4].
    pub link_concurrency: Option<u32>,
    /// Unfinished (queued or running) jobs one user may have; 0: no cap [default:
    /// 1000].
    pub max_unfinished_per_user: Option<u32>,
    /// Sources one job may name [default: 1000].
    pub max_sources: Option<usize>,
    /// How long a finished job is kept, then deleted; "0": kept [default: 30d].
    pub keep_finished: Option<Span>,
    /// Days of `keep_finished`, as older configs wrote it.
    pub keep_finished_days: Option<u64>,
    /// Users who see and act on every user's jobs.
    #[serde(default)]
    pub admins: Vec<String>,
    /// URLs (`http[s]://HOST[:PORT]/PATH`) under which jobs may name a webhook
    /// (`notify`) [default: none, every webhook refused].
    #[serde(default)]
    pub webhooks: Vec<String>,
    /// CA certificates (PEM) that sign `https` webhook receivers.
    pub webhook_ca: Option<PathBuf>,
    /// The service's own credential on the servers it steers: a token file...
    pub token_file: Option<PathBuf>,
    /// ...or an Ed25519 key file (`dmover credential key`).
    pub key_file: Option<PathBuf>,
    /// The user name the service logs in as [default: none, as `dmover cp` without
    /// `--user`].
    pub user: Option<String>,
    /// Where it pins the servers' keys [default: `jobs_known_hosts` in the state
    /// directory].
    pub known_hosts: Option<PathBuf>,
}

/// An export in the configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportEntry {
    /// The directory.
    pub path: PathBuf,
    /// Read-only for everyone.
    #[serde(default)]
    pub read_only: bool,
    /// Third-party copies may use it (off by default).
    #[serde(default)]
    pub third_party: bool,
    /// Bandwidth limit of each session on it: a rate with a unit (`1gbit`, `100MB/s`).
    pub bwlimit: Option<String>,
    /// Pushed files keep the source's numeric owner (server run as root; off by
    /// default).
    #[serde(default)]
    pub preserve_owner: bool,
    /// Which extended attributes travel: `"user"` (`user.*` and POSIX ACLs, the
    /// default) or `"all"` (every namespace).
    pub xattrs: Option<String>,
}

/// A user in the configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// A token verifier (`dmover-token-v2:…`).
    pub token: Option<String>,
    /// Public keys (`ed25519:…`).
    #[serde(default)]
    pub keys: Vec<String>,
    /// Rights per export.
    #[serde(default)]
    pub exports: BTreeMap<String, Rights>,
    /// Bandwidth limit of each of the user's sessions: a rate with a unit.
    pub bwlimit: Option<String>,
}

/// Parses a `bwlimit` key: a rate with a unit ([`dmover_proto::units::parse_rate`]),
/// above zero, as bytes per second.
pub fn parse_bwlimit(s: &str) -> std::result::Result<u64, String> {
    let bits = dmover_proto::units::parse_rate(s)?;
    if bits < 8 {
        return Err(format!(
            "bandwidth limit {s:?} is below one byte per second (leave it out for no limit)"
        ));
    }
    Ok(bits / 8)
}

/// A configuration error, naming the file and the entry.
fn config_err(file: &Path, what: impl std::fmt::Display) -> Error {
    Error::refused(
        dmover_proto::control::ErrorCode::Unsupported,
        format!("config {}: {what}", file.display()),
    )
}

/// A duration key, or its older `_secs` spelling.
fn either(span: Option<Span>, secs: Option<u64>) -> Option<std::time::Duration> {
    span.map(|s| s.0)
        .or(secs.map(std::time::Duration::from_secs))
}

impl JobsEntry {
    /// `retry_wait`, or the older `retry_wait_secs`.
    pub fn retry_wait(&self) -> Option<std::time::Duration> {
        either(self.retry_wait, self.retry_wait_secs)
    }

    /// `max_retry_wait`, or the older `max_retry_wait_secs`.
    pub fn max_retry_wait(&self) -> Option<std::time::Duration> {
        either(self.max_retry_wait, self.max_retry_wait_secs)
    }

    /// `deadline`, or the older `deadline_secs`.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        either(self.deadline, self.deadline_secs)
    }

    /// `keep_finished`, or the older `keep_finished_days` (zero: kept for good).
    pub fn keep_finished(&self) -> Option<std::time::Duration> {
        self.keep_finished.map(|s| s.0).or(self
            .keep_finished_days
            .map(|d| std::time::Duration::from_secs(d.saturating_mul(86_400))))
    }

    /// The new and old spellings of its duration keys, and whether both are given.
    fn doubled(&self) -> [(&'static str, &'static str, bool); 4] {
        [
            (
                "retry_wait",
                "retry_wait_secs",
                self.retry_wait.is_some() && self.retry_wait_secs.is_some(),
            ),
            (
                "max_retry_wait",
                "max_retry_wait_secs",
                self.max_retry_wait.is_some() && self.max_retry_wait_secs.is_some(),
            ),
            (
                "deadline",
                "deadline_secs",
                self.deadline.is_some() && self.deadline_secs.is_some(),
            ),
            (
                "keep_finished",
                "keep_finished_days",
                self.keep_finished.is_some() && self.keep_finished_days.is_some(),
            ),
        ]
    }
}

impl ConfigFile {
    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io("reading", path.display().to_string(), e))?;
        Self::parse(&text, path)
    }

    /// Parses configuration text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| config_err(path, e))?;
        for (new, old) in [
            (
                "handshake_timeout",
                file.handshake_timeout.is_some() && file.handshake_timeout_secs.is_some(),
            ),
            (
                "idle_timeout",
                file.idle_timeout.is_some() && file.idle_timeout_secs.is_some(),
            ),
            (
                "tpc_capability_ttl",
                file.tpc_capability_ttl.is_some() && file.tpc_capability_ttl_secs.is_some(),
            ),
        ] {
            if old {
                return Err(config_err(
                    path,
                    format!("{new} and {new}_secs say the same: keep {new}"),
                ));
            }
        }
        for (new, old, both) in file.jobs.iter().flat_map(JobsEntry::doubled) {
            if both {
                return Err(config_err(
                    path,
                    format!("[jobs] {new} and {old} say the same: keep {new}"),
                ));
            }
        }
        if let Some(m) = file.memory.filter(|m| m.bytes < 2 << 20) {
            return Err(config_err(
                path,
                format!(
                    "memory = {}: too little, sessions need two chunk buffers, at least \"2M\"",
                    m.bytes
                ),
            ));
        }
        for (key, n) in [
            ("io_threads", file.io_threads),
            ("net_threads", file.net_threads),
        ] {
            if let Some(n) = n.filter(|n| !(1..=256).contains(n)) {
                return Err(config_err(path, format!("{key} = {n}: from 1 to 256")));
            }
        }
        Ok(file)
    }

    /// The keys written the older way, each with its new spelling: sizes as bare
    /// integers of bytes (`max_manifest_bytes = 8589934592` is now
    /// `max_manifest_bytes = "8G"`) and durations as `*_secs` integers
    /// (`idle_timeout_secs = 120` is now `idle_timeout = "2m"`). Both are still
    /// accepted; the server warns at start.
    pub fn deprecated(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (key, size) in [
            ("memory", self.memory),
            ("tcp_buffer", self.tcp_buffer),
            ("max_manifest_bytes", self.max_manifest_bytes),
            ("max_manifest_bytes_read", self.max_manifest_bytes_read),
            ("manifest_memory", self.manifest_memory),
        ] {
            if let Some(s) = size.filter(|s| s.bare) {
                out.push(format!(
                    "{key} = {}: a bare number of bytes; write {key} = \"{}\"",
                    s.bytes,
                    size_text(s.bytes)
                ));
            }
        }
        for (key, secs) in [
            ("handshake_timeout", self.handshake_timeout_secs),
            ("idle_timeout", self.idle_timeout_secs),
            ("tpc_capability_ttl", self.tpc_capability_ttl_secs),
        ] {
            if let Some(s) = secs {
                out.push(format!(
                    "{key}_secs = {s}: seconds as a bare number; write {key} = \"{}\"",
                    secs_text(s)
                ));
            }
        }
        if let Some(j) = &self.jobs {
            for (key, secs) in [
                ("retry_wait", j.retry_wait_secs),
                ("max_retry_wait", j.max_retry_wait_secs),
                ("deadline", j.deadline_secs),
            ] {
                if let Some(s) = secs {
                    out.push(format!(
                        "[jobs] {key}_secs = {s}: seconds as a bare number; write {key} = \"{}\"",
                        secs_text(s)
                    ));
                }
            }
            if let Some(d) = j.keep_finished_days {
                let new = if d == 0 {
                    "0".to_string()
                } else {
                    format!("{d}d")
                };
                out.push(format!(
                    "[jobs] keep_finished_days = {d}: days as a bare number; write \
                     keep_finished = \"{new}\""
                ));
            }
        }
        out
    }

    /// `handshake_timeout`, or the older `handshake_timeout_secs`.
    pub fn handshake_timeout(&self) -> Option<std::time::Duration> {
        either(self.handshake_timeout, self.handshake_timeout_secs)
    }

    /// `idle_timeout`, or the older `idle_timeout_secs`.
    pub fn idle_timeout(&self) -> Option<std::time::Duration> {
        either(self.idle_timeout, self.idle_timeout_secs)
    }

    /// `tpc_capability_ttl`, or the older `tpc_capability_ttl_secs`.
    pub fn tpc_capability_ttl(&self) -> Option<std::time::Duration> {
        either(self.tpc_capability_ttl, self.tpc_capability_ttl_secs)
    }

    /// The exports and users it describes, checked: every export a user names exists,
    /// every user has a credential, tokens and keys parse, export names are single
    /// path components.
    pub fn access(&self, path: &Path) -> Result<(Vec<ExportSpec>, BTreeMap<String, User>)> {
        if self.exports.is_empty() {
            return Err(config_err(path, "no [exports.NAME] section"));
        }
        if self.users.is_empty() {
            return Err(config_err(
                path,
                "no [users.NAME] section (without users, use --root on loopback)",
            ));
        }
        let mut exports = Vec::new();
        for (name, e) in &self.exports {
            if dmover_proto::manifest::validate_name(name.as_bytes()).is_err() {
                return Err(config_err(
                    path,
                    format!("export name {name:?} must be one path component"),
                ));
            }
            let bwlimit = e
                .bwlimit
                .as_deref()
                .map(parse_bwlimit)
                .transpose()
                .map_err(|why| config_err(path, format!("export {name}: bwlimit: {why}")))?;
            let xattrs_all = match e.xattrs.as_deref() {
                None | Some("user") => false,
                Some("all") => true,
                Some(other) => {
                    return Err(config_err(
                        path,
                        format!("export {name}: xattrs: {other:?} is not \"user\" or \"all\""),
                    ));
                }
            };
            exports.push(ExportSpec {
                name: name.clone(),
                path: e.path.clone(),
                read_only: e.read_only,
                third_party: e.third_party,
                bwlimit,
                preserve_owner: e.preserve_owner,
                xattrs_all,
            });
        }
        let mut users = BTreeMap::new();
        for (name, u) in &self.users {
            let token = match &u.token {
                Some(t) => Some(TokenVerifier::from_text(t).ok_or_else(|| {
                    config_err(
                        path,
                        format!("user {name}: token must be a dmover-token-v2:… verifier (dmover credential token)"),
                    )
                })?),
                None => None,
            };
            let keys = u
                .keys
                .iter()
                .map(|k| {
                    parse_public_key(k).ok_or_else(|| {
                        config_err(
                            path,
                            format!("user {name}: {k:?} is not an ed25519:BASE64 public key"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            if token.is_none() && keys.is_empty() {
                return Err(config_err(
                    path,
                    format!("user {name} has neither a token nor a key"),
                ));
            }
            let metrics_only = self
                .metrics_users
                .as_ref()
                .is_some_and(|m| m.contains(name));
            if metrics_only && !u.exports.is_empty() {
                return Err(config_err(
                    path,
                    format!(
                        "user {name} is in metrics_users, whose tokens read the metrics \
                         only: give it no exports (transfers need a user of their own)"
                    ),
                ));
            }
            for export in u.exports.keys() {
                if !self.exports.contains_key(export) {
                    return Err(config_err(
                        path,
                        format!("user {name}: no export named {export:?}"),
                    ));
                }
            }
            let bwlimit = u
                .bwlimit
                .as_deref()
                .map(parse_bwlimit)
                .transpose()
                .map_err(|why| config_err(path, format!("user {name}: bwlimit: {why}")))?;
            users.insert(
                name.clone(),
                User {
                    name: name.clone(),
                    token,
                    keys,
                    exports: u.exports.clone(),
                    bwlimit,
                    metrics_only,
                },
            );
        }
        Ok((exports, users))
    }
}

/// The default state directory: `/var/lib/dmover` for root, else `dmover` in the
/// user's state directory `user_state_dir` (`$XDG_STATE_HOME`, else
/// `$HOME/.local/state`, as the caller resolved it), if there is one.
pub fn default_state_dir(user_state_dir: Option<&Path>) -> Option<PathBuf> {
    if rustix::process::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/dmover"));
    }
    user_state_dir.map(|p| p.join("dmover"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_take_units_and_older_integers_are_named() {
        let p = Path::new("t.toml");
        let f = ConfigFile::parse(
            "memory = \"512M\"\nmax_manifest_bytes = 8589934592\nmanifest_memory = 1536\n\
             idle_timeout = \"2m\"\nhandshake_timeout_secs = 30\ntpc_capability_ttl_secs = 3600\n",
            p,
        )
        .unwrap();
        assert_eq!(f.memory.map(|m| m.bytes), Some(512 << 20));
        assert_eq!(f.max_manifest_bytes.map(|m| m.bytes), Some(8 << 30));
        assert_eq!(f.idle_timeout(), Some(std::time::Duration::from_secs(120)));
        assert_eq!(
            f.handshake_timeout(),
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(
            f.deprecated(),
            [
                "max_manifest_bytes = 8589934592: a bare number of bytes; write max_manifest_bytes = \"8G\"",
                "manifest_memory = 1536: a bare number of bytes; write manifest_memory = \"1536B\"",
                "handshake_timeout_secs = 30: seconds as a bare number; write handshake_timeout = \"30s\"",
                "tpc_capability_ttl_secs = 3600: seconds as a bare number; write tpc_capability_ttl = \"1h\"",
            ]
        );
        for (bad, words) in [
            ("idle_timeout = 120", "a duration with a unit"),
            ("memory = \"2 apples\"", "memory"),
            ("memory = \"1M\"", "at least \"2M\""),
            ("io_threads = 0", "from 1 to 256"),
            (
                "idle_timeout = \"1s\"\nidle_timeout_secs = 1",
                "keep idle_timeout",
            ),
        ] {
            let e = ConfigFile::parse(bad, p).unwrap_err().to_string();
            assert!(e.contains(words), "{bad}: {e}");
        }
    }

    #[test]
    fn the_job_services_durations_take_units_and_older_integers_are_named() {
        let p = Path::new("t.toml");
        let secs = std::time::Duration::from_secs;
        let f = ConfigFile::parse(
            "[jobs]\nretry_wait = \"5s\"\nmax_retry_wait = \"10m\"\ndeadline = \"2d\"\n\
             keep_finished = \"0\"\n",
            p,
        )
        .unwrap();
        let j = f.jobs.clone().unwrap();
        assert_eq!(
            (
                j.retry_wait(),
                j.max_retry_wait(),
                j.deadline(),
                j.keep_finished()
            ),
            (
                Some(secs(5)),
                Some(secs(600)),
                Some(secs(2 * 86_400)),
                Some(secs(0))
            )
        );
        assert!(f.deprecated().is_empty());
        let f = ConfigFile::parse(
            "[jobs]\nretry_wait_secs = 30\ndeadline_secs = 86400\nkeep_finished_days = 7\n",
            p,
        )
        .unwrap();
        let j = f.jobs.clone().unwrap();
        assert_eq!(
            (j.retry_wait(), j.deadline(), j.keep_finished()),
            (Some(secs(30)), Some(secs(86_400)), Some(secs(7 * 86_400)))
        );
        assert_eq!(
            f.deprecated(),
            [
                "[jobs] retry_wait_secs = 30: seconds as a bare number; write retry_wait = \"30s\"",
                "[jobs] deadline_secs = 86400: seconds as a bare number; write deadline = \"24h\"",
                "[jobs] keep_finished_days = 7: days as a bare number; write keep_finished = \"7d\"",
            ]
        );
        for (bad, words) in [
            ("[jobs]\nretry_wait = 30", "a duration with a unit"),
            (
                "[jobs]\ndeadline = \"1h\"\ndeadline_secs = 60",
                "keep deadline",
            ),
        ] {
            let e = ConfigFile::parse(bad, p).unwrap_err().to_string();
            assert!(e.contains(words), "{bad}: {e}");
        }
    }

    #[test]
    fn a_config_file_parses_and_is_checked() {
        let v = dmover_proto::auth::token_keys(b"t").verifier.to_text();
        let dir = tempfile::tempdir().unwrap();
        let key = ClientKey::generate(&dir.path().join("k")).unwrap();
        let pubtext = std::fs::read_to_string(dir.path().join("k.pub")).unwrap();
        assert_eq!(parse_public_key(&pubtext), Some(key.public()));
        assert_eq!(
            ClientKey::load(&dir.path().join("k")).unwrap().public(),
            key.public()
        );
        let sig = key.sign(b"m");
        assert!(verify_signature(&key.public(), b"m", &sig));
        assert!(!verify_signature(&key.public(), b"n", &sig));
        let text = format!(
            "max_sessions_per_user = 2\n[exports.data]\npath = \"/d\"\n[exports.pub]\npath = \"/p\"\nread_only = true\n\
             [users.alice]\ntoken = \"{v}\"\nkeys = [\"{}\"]\nexports = {{ data = \"rw\", pub = \"ro\" }}\n",
            pubtext.trim()
        );
        let p = Path::new("test.toml");
        let cfg = ConfigFile::parse(&text, p).unwrap();
        let (exports, users) = cfg.access(p).unwrap();
        assert_eq!(exports.len(), 2);
        assert!(exports[1].read_only);
        let alice = &users["alice"];
        assert_eq!(alice.exports["data"], Rights::ReadWrite);
        assert_eq!(alice.keys, vec![key.public()]);
        assert_eq!((alice.bwlimit, exports[0].bwlimit), (None, None));
        // Bandwidth limits: rates with units, as bytes per second.
        let limited = text
            .replace(
                "read_only = true\n",
                "read_only = true\nbwlimit = \"60MB/s\"\n",
            )
            .replace("exports = {", "bwlimit = \"1Gbit\"\nexports = {");
        let (exports, users) = ConfigFile::parse(&limited, p).unwrap().access(p).unwrap();
        assert_eq!(exports[1].bwlimit, Some(60_000_000));
        assert_eq!(users["alice"].bwlimit, Some(125_000_000));
        // Which xattrs travel: "user" (the default) or "all".
        assert!(!exports[0].xattrs_all && !exports[1].xattrs_all);
        let all = text.replace("path = \"/d\"\n", "path = \"/d\"\nxattrs = \"all\"\n");
        let (exports, _) = ConfigFile::parse(&all, p).unwrap().access(p).unwrap();
        assert!(exports[0].xattrs_all && !exports[1].xattrs_all);
        let user = text.replace("path = \"/d\"\n", "path = \"/d\"\nxattrs = \"user\"\n");
        let (exports, _) = ConfigFile::parse(&user, p).unwrap().access(p).unwrap();
        assert!(!exports[0].xattrs_all);
        let bad = text.replace("path = \"/d\"\n", "path = \"/d\"\nxattrs = \"trusted\"\n");
        let e = ConfigFile::parse(&bad, p)
            .and_then(|c| c.access(p).map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("export data: xattrs"), "{e}");
        for (bad, why) in [
            (
                "bwlimit = \"fast\"",
                "user alice: bwlimit: rate \"fast\" is not a number",
            ),
            ("bwlimit = \"100\"", "needs a unit"),
            ("bwlimit = \"1gb\"", "bits or bytes"),
            ("bwlimit = \"0gbit\"", "leave it out for no limit"),
        ] {
            let t = limited.replace("bwlimit = \"1Gbit\"", bad);
            let e = ConfigFile::parse(&t, p)
                .and_then(|c| c.access(p).map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(why) && e.contains("test.toml"), "{bad}: {e}");
        }
        for bad in [
            text.replace("data = \"rw\"", "nope = \"rw\""),
            text.replace("\"rw\"", "\"rx\""),
            text.replace("dmover-token-v2", "dmover-token-v1"),
            text.replace("max_sessions_per_user", "max_session_per_user"),
        ] {
            let r = ConfigFile::parse(&bad, p).and_then(|c| c.access(p).map(|_| ()));
            assert!(r.is_err(), "{bad}");
        }
    }

    #[test]
    fn a_grant_is_checked_again_against_reloaded_users() {
        let v = |t: &[u8]| dmover_proto::auth::token_keys(t).verifier;
        let user = |name: &str, token: Option<&[u8]>, keys: Vec<[u8; 32]>| User {
            name: name.into(),
            token: token.map(v),
            keys,
            exports: BTreeMap::from([("data".to_string(), Rights::ReadWrite)]),
            bwlimit: None,
            metrics_only: false,
        };
        let users = |us: Vec<User>| -> BTreeMap<String, User> {
            us.into_iter().map(|u| (u.name.clone(), u)).collect()
        };
        let token = Grant {
            user: "a".into(),
            login: "a".into(),
            proven: Proven::Token(v(b"t")),
            exports: BTreeMap::new(),
            scope: None,
        };
        let key = Grant {
            proven: Proven::Key([7; 32]),
            ..token.clone()
        };
        let both = users(vec![user("a", Some(b"t"), vec![[7; 32]])]);
        // Still allowed, with the rights as they are now.
        assert_eq!(token.recheck(&both).unwrap().exports.len(), 1);
        assert!(key.recheck(&both).is_ok());
        // The key removed: key sessions end, token sessions go on.
        let no_key = users(vec![user("a", Some(b"t"), vec![])]);
        assert!(key.recheck(&no_key).unwrap_err().contains("key"));
        assert!(token.recheck(&no_key).is_ok());
        // A new token.
        let new = users(vec![user("a", Some(b"u"), vec![[7; 32]])]);
        assert!(token.recheck(&new).unwrap_err().contains("token"));
        // Gone, or now matched by `*` only.
        let other = users(vec![user("b", Some(b"t"), vec![])]);
        assert!(token.recheck(&other).unwrap_err().contains("removed"));
        let star = users(vec![user("*", Some(b"t"), vec![])]);
        assert!(token.recheck(&star).is_err());
        // A `*` session stays `*`.
        let shared = Grant {
            user: "*".into(),
            ..token.clone()
        };
        assert!(shared.recheck(&star).is_ok());
    }
}
