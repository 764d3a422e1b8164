//! Where a transfer's sources and destination are: a local path, or a path on a server
//! named as `HOST:PATH` (scp's form) or `dmover://HOST[:PORT]/PATH`.
//!
//! | argument | endpoint |
//! |---|---|
//! | `run1/data`, `/abs/a:b`, `./x:y` | local (a colon after a slash is part of the path) |
//! | `dtn1:data/run1`, `dtn1:` | `dtn1:7700`, path `data/run1` (relative to its root) |
//! | `[::1]:x` | `[::1]:7700`, path `x` |
//! | `dmover://dtn1:9000/a/b` | `dtn1:9000`, path `a/b` |
//! | `dmover://127.0.0.1//etc` | `127.0.0.1:7700`, path `/etc` |
//!
//! With a user ([`Endpoint::parse_with_user`], scp's and URLs' form; a dmover user, the
//! server's, not an account on its host):
//!
//! | argument | endpoint | user |
//! |---|---|---|
//! | `alice@dtn1:data` | `dtn1:7700`, path `data` | `alice` |
//! | `dmover://alice@dtn1:9000/a` | `dtn1:9000`, path `a` | `alice` |
//! | `alice@[::1]:x` | `[::1]:7700`, path `x` | `alice` |
//! | `me@home`, `./a@b:c` | local | none |
//!
//! Paths are bytes (Unix file names need not be UTF-8); host and user names must be
//! UTF-8. A server's port defaults to [`dmover_proto::DEFAULT_PORT`].

use std::path::Path;

use dmover_proto::DEFAULT_PORT;

/// Where a source or the destination of a transfer is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A path on this machine.
    Local(Vec<u8>),
    /// A path on a server, relative to its root.
    Remote {
        /// `host:port`, ready to connect to.
        server: String,
        /// The path on the server.
        path: Vec<u8>,
    },
}

/// Why a `HOST:PATH` or `dmover://` argument does not name a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The host part is empty (`dmover:///x`).
    #[error("empty host name")]
    EmptyHost,
    /// An IPv6 address whose `[` is never closed.
    #[error("unclosed '[' in {0:?}")]
    UnclosedBracket(String),
    /// Something other than a port number after a bracketed address.
    #[error("invalid port in {0:?}")]
    BadPort(String),
    /// A host that is neither `name`, `name:port` nor a bracketed address.
    #[error("invalid host {0:?} (IPv6 addresses go in brackets: [::1]:7700)")]
    BadHost(String),
    /// A `dmover://` URL that is not UTF-8.
    #[error("a dmover:// URL must be UTF-8")]
    UrlNotUtf8,
    /// A `HOST:PATH` whose host is not UTF-8.
    #[error("host names must be UTF-8")]
    HostNotUtf8,
    /// A user before `@` that is empty, not UTF-8, or holds a `:` (no password goes
    /// in an endpoint), a space or a control character.
    #[error("invalid user name {0:?} before '@'")]
    BadUser(String),
    /// A `USER@` where [`Endpoint::parse`] takes none (the caller sets the user).
    #[error("a user ({0}@) is not taken here: give the endpoint without it")]
    UserNotTaken(String),
}

impl Endpoint {
    /// A local path.
    pub fn local(path: impl AsRef<Path>) -> Self {
        use std::os::unix::ffi::OsStrExt;
        Endpoint::Local(path.as_ref().as_os_str().as_bytes().to_vec())
    }

    /// `path` on `server` (`host`, `host:port` or `[v6]:port`; the default port is
    /// added when it has none).
    pub fn remote(server: &str, path: impl Into<Vec<u8>>) -> Result<Self, EndpointError> {
        Ok(Endpoint::Remote {
            server: with_port(server)?,
            path: path.into(),
        })
    }

    /// Parses one argument: `dmover://HOST[:PORT]/PATH`, `HOST:PATH` (a colon before
    /// any slash; `[v6]:PATH`), else a local path. A `USER@` before the host is
    /// refused ([`EndpointError::UserNotTaken`]): [`Endpoint::parse_with_user`] takes
    /// it.
    pub fn parse(arg: impl AsRef<[u8]>) -> Result<Self, EndpointError> {
        match Self::parse_with_user(arg)? {
            (e, None) => Ok(e),
            (_, Some(user)) => Err(EndpointError::UserNotTaken(user)),
        }
    }

    /// [`Endpoint::parse`], and the user named before the host, if any:
    /// `USER@HOST:PATH` (scp's form: the user ends at the last `@` before the host's
    /// `:`) or `dmover://USER@HOST[:PORT]/PATH`. An argument whose part after the `@`
    /// is no `HOST:PATH` is a local path (`me@home`, `a@b/c:d`).
    pub fn parse_with_user(arg: impl AsRef<[u8]>) -> Result<(Self, Option<String>), EndpointError> {
        let b = arg.as_ref();
        if let Some(rest) = b.strip_prefix(b"dmover://") {
            let rest = std::str::from_utf8(rest).map_err(|_| EndpointError::UrlNotUtf8)?;
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            let (user, host) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(user_name(u.as_bytes())?), h),
                None => (None, authority),
            };
            let e = Endpoint::Remote {
                server: with_port(host)?,
                path: path.as_bytes().to_vec(),
            };
            return Ok((e, user));
        }
        // scp style: `USER@` before the host, which ends at its `:` (a bracketed
        // address starts with `[`); a `/` first makes it a local path.
        let head = b
            .iter()
            .position(|&c| matches!(c, b':' | b'/' | b'['))
            .unwrap_or(b.len());
        if let Some(at) = b[..head].iter().rposition(|&c| c == b'@') {
            let e = Self::parse_plain(&b[at + 1..])?;
            if e.is_remote() {
                return Ok((e, Some(user_name(&b[..at])?)));
            }
        }
        Ok((Self::parse_plain(b)?, None))
    }

    /// [`Endpoint::parse`] of an argument with no user.
    fn parse_plain(b: &[u8]) -> Result<Self, EndpointError> {
        // scp style: a colon before any slash, e.g. "dtn1:data/run1" or "[::1]:data".
        let colon = if b.first() == Some(&b'[') {
            b.iter()
                .position(|&c| c == b']')
                .map(|i| i + 1)
                .filter(|&i| b.get(i) == Some(&b':'))
        } else {
            b.iter()
                .position(|&c| c == b':' || c == b'/')
                .filter(|&i| b[i] == b':' && i > 0)
        };
        match colon {
            Some(i) => {
                let host = std::str::from_utf8(&b[..i]).map_err(|_| EndpointError::HostNotUtf8)?;
                Ok(Endpoint::Remote {
                    server: with_port(host)?,
                    path: b[i + 1..].to_vec(),
                })
            }
            None => Ok(Endpoint::Local(b.to_vec())),
        }
    }

    /// Whether this is a path on a server.
    pub fn is_remote(&self) -> bool {
        matches!(self, Endpoint::Remote { .. })
    }

    /// The server (`host:port`) of a remote endpoint.
    pub fn server(&self) -> Option<&str> {
        match self {
            Endpoint::Remote { server, .. } => Some(server),
            Endpoint::Local(_) => None,
        }
    }

    /// The path: local, or on the server.
    pub fn path(&self) -> &[u8] {
        match self {
            Endpoint::Local(p) | Endpoint::Remote { path: p, .. } => p,
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Endpoint::parse(s)
    }
}

impl std::fmt::Display for Endpoint {
    /// `dmover://HOST:PORT/PATH` or the local path (bytes that are not UTF-8 shown
    /// lossily).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Local(p) => f.write_str(&String::from_utf8_lossy(p)),
            Endpoint::Remote { server, path } => {
                write!(f, "dmover://{server}/{}", String::from_utf8_lossy(path))
            }
        }
    }
}

/// The user of a `USER@`: UTF-8, not empty, no `:` (a password does not go in an
/// endpoint), space or control character.
fn user_name(u: &[u8]) -> Result<String, EndpointError> {
    let bad = || EndpointError::BadUser(String::from_utf8_lossy(u).into_owned());
    let u = std::str::from_utf8(u).map_err(|_| bad())?;
    if u.is_empty()
        || u.chars()
            .any(|c| c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(bad());
    }
    Ok(u.to_string())
}

/// `host` with the default port added if it has none (`[v6]` brackets kept).
pub fn with_port(host: &str) -> Result<String, EndpointError> {
    if host.is_empty() {
        return Err(EndpointError::EmptyHost);
    }
    if host.contains('@') {
        // A user goes through `Endpoint::parse_with_user`, never into an address.
        return Err(EndpointError::BadHost(host.into()));
    }
    if let Some(rest) = host.strip_prefix('[') {
        // [v6] or [v6]:port
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| EndpointError::UnclosedBracket(host.into()))?;
        return match after {
            "" => Ok(format!("[{addr}]:{DEFAULT_PORT}")),
            p if p.starts_with(':') && p[1..].parse::<u16>().is_ok() => Ok(format!("[{addr}]{p}")),
            _ => Err(EndpointError::BadPort(host.into())),
        };
    }
    match host.rsplit_once(':') {
        None => Ok(format!("{host}:{DEFAULT_PORT}")),
        Some((h, p)) if !h.is_empty() && !h.contains(':') && p.parse::<u16>().is_ok() => {
            Ok(host.to_string())
        }
        _ => Err(EndpointError::BadHost(host.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(server: &str, path: &str) -> Endpoint {
        Endpoint::Remote {
            server: server.into(),
            path: path.as_bytes().to_vec(),
        }
    }

    #[test]
    fn forms() {
        fn p(s: impl AsRef<[u8]>) -> Result<Endpoint, EndpointError> {
            Endpoint::parse(s)
        }
        assert_eq!(p("dtn1:data/x"), Ok(remote("dtn1:7700", "data/x")));
        assert_eq!(p("dtn1:"), Ok(remote("dtn1:7700", "")));
        assert_eq!(p("dmover://dtn1:9000/a/b"), Ok(remote("dtn1:9000", "a/b")));
        assert_eq!(p("dmover://dtn1"), Ok(remote("dtn1:7700", "")));
        assert_eq!(p("dmover://[::1]:7701/x"), Ok(remote("[::1]:7701", "x")));
        assert_eq!(p("[::1]:x"), Ok(remote("[::1]:7700", "x")));
        assert_eq!(
            p("dmover://127.0.0.1//etc"),
            Ok(remote("127.0.0.1:7700", "/etc"))
        );
        assert_eq!(p("./a:b"), Ok(Endpoint::Local(b"./a:b".to_vec())));
        assert_eq!(p("/abs/a:b"), Ok(Endpoint::Local(b"/abs/a:b".to_vec())));
        assert_eq!(p("plain"), Ok(Endpoint::Local(b"plain".to_vec())));
        assert!(p("dmover://h:notaport/x").is_err());
        assert_eq!(p("dmover:///x"), Err(EndpointError::EmptyHost));
        assert_eq!(p(b"dmover://\xff/x"), Err(EndpointError::UrlNotUtf8));
        assert_eq!(p(b"\xff:x"), Err(EndpointError::HostNotUtf8));
    }

    #[test]
    fn users() {
        fn p(s: impl AsRef<[u8]>) -> Result<(Endpoint, Option<String>), EndpointError> {
            Endpoint::parse_with_user(s)
        }
        let alice = Some("alice".to_string());
        assert_eq!(
            p("alice@dtn1:data"),
            Ok((remote("dtn1:7700", "data"), alice.clone()))
        );
        assert_eq!(
            p("alice@dtn1:"),
            Ok((remote("dtn1:7700", ""), alice.clone()))
        );
        assert_eq!(
            p("dmover://alice@dtn1:9000/a/b"),
            Ok((remote("dtn1:9000", "a/b"), alice.clone()))
        );
        assert_eq!(
            p("dmover://alice@dtn1"),
            Ok((remote("dtn1:7700", ""), alice.clone()))
        );
        assert_eq!(
            p("alice@[::1]:x"),
            Ok((remote("[::1]:7700", "x"), alice.clone()))
        );
        assert_eq!(
            p("dmover://alice@[::1]:7701/x"),
            Ok((remote("[::1]:7701", "x"), alice.clone()))
        );
        // The last `@` before the host ends the user.
        assert_eq!(
            p("a@b.org@dtn1:x"),
            Ok((remote("dtn1:7700", "x"), Some("a@b.org".into())))
        );
        assert_eq!(p("dtn1:x"), Ok((remote("dtn1:7700", "x"), None)));
        // Local paths with an `@`.
        for local in ["me@home", "./a@b:c", "a@b/c:d", "/x/u@h:p", "dir/f@2"] {
            assert_eq!(
                p(local),
                Ok((Endpoint::Local(local.as_bytes().to_vec()), None)),
                "{local}"
            );
        }
        // A path on the server may hold `@`.
        assert_eq!(p("dtn1:a@b"), Ok((remote("dtn1:7700", "a@b"), None)));
        // scp reads this one the same way: host `a`, path `b@dtn1:x`.
        assert_eq!(p("a:b@dtn1:x"), Ok((remote("a:7700", "b@dtn1:x"), None)));
        assert_eq!(
            p("dmover://u:pw@dtn1/x"),
            Err(EndpointError::BadUser("u:pw".into()))
        );
        assert_eq!(p("@dtn1:x"), Err(EndpointError::BadUser(String::new())));
        assert_eq!(
            p(b"\xff@dtn1:x"),
            Err(EndpointError::BadUser("\u{fffd}".into()))
        );
        // `parse` takes no user: the caller sets it, a user in an address would be a
        // host name.
        assert_eq!(
            Endpoint::parse("alice@dtn1:x"),
            Err(EndpointError::UserNotTaken("alice".into()))
        );
        assert!(matches!(with_port("a@b"), Err(EndpointError::BadHost(_))));
        assert!(Endpoint::remote("a@b", "x").is_err());
    }

    #[test]
    fn errors_read_as_they_did_in_the_cli() {
        let e = |h: &str| with_port(h).unwrap_err().to_string();
        assert_eq!(e(""), "empty host name");
        assert_eq!(e("[::1"), "unclosed '[' in \"[::1\"");
        assert_eq!(e("[::1]x"), "invalid port in \"[::1]x\"");
        assert_eq!(
            e("::1"),
            "invalid host \"::1\" (IPv6 addresses go in brackets: [::1]:7700)"
        );
    }

    #[test]
    fn constructors_and_display() {
        let r = Endpoint::remote("dtn1", "a/b").unwrap();
        assert_eq!(r, remote("dtn1:7700", "a/b"));
        assert_eq!(r.to_string(), "dmover://dtn1:7700/a/b");
        assert_eq!(r.server(), Some("dtn1:7700"));
        assert!(r.is_remote());
        let l = Endpoint::local("/tmp/x");
        assert_eq!(l.path(), b"/tmp/x");
        assert_eq!(l.to_string(), "/tmp/x");
        assert_eq!("h:p".parse::<Endpoint>(), Ok(remote("h:7700", "p")));
    }
}
