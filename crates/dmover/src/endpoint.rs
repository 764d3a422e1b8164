//! Parsing `SRC`/`DST` arguments: local paths, `HOST:PATH`, `dmover://HOST[:PORT]/PATH`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use dmover_proto::DEFAULT_PORT;

/// Where a copy argument points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A local path.
    Local(Vec<u8>),
    /// A path on a server, relative to its root.
    Remote {
        /// `host:port`, ready to connect to.
        server: String,
        /// The path on the server.
        path: Vec<u8>,
    },
}

/// `host` with the default port added if it has none (`[v6]` brackets kept).
pub(crate) fn with_port(host: &str) -> Result<String, String> {
    if host.is_empty() {
        return Err("empty host name".into());
    }
    if let Some(rest) = host.strip_prefix('[') {
        // [v6] or [v6]:port
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in {host:?}"))?;
        return match after {
            "" => Ok(format!("[{addr}]:{DEFAULT_PORT}")),
            p if p.starts_with(':') && p[1..].parse::<u16>().is_ok() => Ok(format!("[{addr}]{p}")),
            _ => Err(format!("invalid port in {host:?}")),
        };
    }
    match host.rsplit_once(':') {
        None => Ok(format!("{host}:{DEFAULT_PORT}")),
        Some((h, p)) if !h.is_empty() && !h.contains(':') && p.parse::<u16>().is_ok() => {
            Ok(host.to_string())
        }
        _ => Err(format!(
            "invalid host {host:?} (IPv6 addresses go in brackets: [::1]:7700)"
        )),
    }
}

/// Parses one copy argument.
pub fn parse(arg: &OsStr) -> Result<Endpoint, String> {
    let b = arg.as_bytes();
    if let Some(rest) = b.strip_prefix(b"dmover://") {
        let rest =
            std::str::from_utf8(rest).map_err(|_| "a dmover:// URL must be UTF-8".to_string())?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        return Ok(Endpoint::Remote {
            server: with_port(host)?,
            path: path.as_bytes().to_vec(),
        });
    }
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
            let host =
                std::str::from_utf8(&b[..i]).map_err(|_| "host names must be UTF-8".to_string())?;
            Ok(Endpoint::Remote {
                server: with_port(host)?,
                path: b[i + 1..].to_vec(),
            })
        }
        None => Ok(Endpoint::Local(b.to_vec())),
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
        let p = |s: &str| parse(OsStr::new(s));
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
        assert!(p("dmover:///x").is_err());
    }
}
