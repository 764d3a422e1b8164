//! The client's configuration file (docs/client.md): `dmover/config.toml` in
//! `$XDG_CONFIG_HOME` (else `~/.config`), or the file `DMOVER_CONFIG` names. Host
//! profiles (`[host.NAME]`: the address and port to dial for the host NAME named on
//! the command line, the dmover user, a token file or a key, a few options of cp and
//! sync) and `[defaults]` (the job service's URL, the user, credential and options of
//! hosts without their own).
//!
//! What wins: a command-line flag (and a `USER@` in an endpoint), then the
//! environment (`DMOVER_TOKEN`, `DMOVER_KEY`, `DMOVER_USER`, `DMOVER_KNOWN_HOSTS`,
//! `DMOVER_SERVICE`), then the profile of the host, then `[defaults]`, then the
//! built-in default. A credential is one thing: a token or a key given on the command
//! line or in the environment replaces the profile's, whichever kind it is.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use dmover_core::access::ClientKey;
use dmover_core::session::ServerCredential;
use dmover_core::transfer::Endpoint;
use serde::{Deserialize, Deserializer};

use crate::env::Env;

/// The file's name in the configuration directory.
pub const FILE: &str = "dmover/config.toml";

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// `[defaults]`.
    #[serde(default)]
    pub defaults: Defaults,
    /// `[host.NAME]`, by NAME.
    #[serde(default)]
    pub host: BTreeMap<String, HostProfile>,
}

/// `[defaults]`: what holds for every host without its own, and a few options of cp
/// and sync.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// The job service's URL (below `--service` and `DMOVER_SERVICE`).
    #[serde(default, deserialize_with = "service_url")]
    pub service: Option<String>,
    /// The dmover user on servers.
    #[serde(default, deserialize_with = "user_name")]
    pub user: Option<String>,
    /// A token file (`--token-file`).
    pub token_file: Option<PathBuf>,
    /// An Ed25519 key (`--key`).
    pub key: Option<PathBuf>,
    /// The known-hosts file (`--known-hosts`).
    pub known_hosts: Option<PathBuf>,
    /// `-P`/`--streams`: pinned streams.
    #[serde(default, deserialize_with = "streams")]
    pub streams: Option<u16>,
    /// `--retries`.
    pub retries: Option<u32>,
    /// `--retry-wait`.
    #[serde(default, deserialize_with = "duration")]
    pub retry_wait: Option<Duration>,
    /// `--busy-wait`.
    #[serde(default, deserialize_with = "duration")]
    pub busy_wait: Option<Duration>,
}

/// `[host.NAME]`: a host named NAME on the command line (`NAME:PATH`,
/// `dmover://NAME/PATH`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostProfile {
    /// What to dial: a host name or an IP address [default: NAME].
    #[serde(default, deserialize_with = "address")]
    pub address: Option<String>,
    /// The port, unless the command line names one [default: 7700].
    #[serde(default, deserialize_with = "port")]
    pub port: Option<u16>,
    /// The dmover user on this server.
    #[serde(default, deserialize_with = "user_name")]
    pub user: Option<String>,
    /// The file of the token for this server (a dmover token, which is also the
    /// bearer token of its job service).
    pub token_file: Option<PathBuf>,
    /// An Ed25519 key for this server (`dmover credential key`).
    pub key: Option<PathBuf>,
    /// `-P`/`--streams` for copies with this server, before `[defaults]`'.
    #[serde(default, deserialize_with = "streams")]
    pub streams: Option<u16>,
    /// `--retries`, likewise.
    pub retries: Option<u32>,
    /// `--retry-wait`, likewise.
    #[serde(default, deserialize_with = "duration")]
    pub retry_wait: Option<Duration>,
    /// `--busy-wait`, likewise.
    #[serde(default, deserialize_with = "duration")]
    pub busy_wait: Option<Duration>,
}

/// An option of a copy from the profiles of its servers: the first of `routes` (the
/// destination's first, then the sources' in order) whose profile sets it.
pub fn host_option<T>(routes: &[Route], f: impl Fn(&HostProfile) -> Option<T>) -> Option<T> {
    routes.iter().find_map(|r| f(&r.host))
}

fn service_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    if !(s.starts_with("http://") || s.starts_with("https://")) {
        return Err(serde::de::Error::custom(format!(
            "service {s:?}: a URL, http://HOST:PORT or https://HOST:PORT"
        )));
    }
    Ok(Some(s))
}

fn user_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty()
        || s.chars()
            .any(|c| c == ':' || c == '@' || c.is_whitespace() || c.is_control())
    {
        return Err(serde::de::Error::custom(format!(
            "user {s:?}: a dmover user name (not empty; no ':', '@', space or control character)"
        )));
    }
    Ok(Some(s))
}

fn streams<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let n = i64::deserialize(d)?;
    match u16::try_from(n) {
        Ok(n) if (1..=128).contains(&n) => Ok(Some(n)),
        _ => Err(serde::de::Error::custom(format!(
            "streams = {n}: from 1 to 128"
        ))),
    }
}

fn port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let n = i64::deserialize(d)?;
    match u16::try_from(n) {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(serde::de::Error::custom(format!(
            "port = {n}: from 1 to 65535"
        ))),
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    dmover_proto::units::parse_duration(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// An address as it goes before `:PORT`: a host name, an IPv4 address, or an IPv6
/// address in brackets (given with or without them).
fn address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    let inner = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(&s);
    let (ok, dialed) = if inner.contains(':') {
        (
            inner.parse::<std::net::Ipv6Addr>().is_ok(),
            format!("[{inner}]"),
        )
    } else {
        let name = |c: char| c.is_ascii_alphanumeric() || "-._".contains(c);
        (
            inner == s && !s.is_empty() && s.chars().all(name),
            s.clone(),
        )
    };
    if !ok {
        return Err(serde::de::Error::custom(format!(
            "address {s:?}: a host name or an IP address, without a port (that is `port`)"
        )));
    }
    Ok(Some(dialed))
}

/// The configuration file read: its path and what it says, its paths made absolute.
#[derive(Debug)]
pub struct Profiles {
    /// The file.
    pub path: PathBuf,
    /// What it says.
    pub file: ClientConfig,
}

/// The configuration file dmover reads: `DMOVER_CONFIG`'s, else
/// `dmover/config.toml` in the configuration directory (and whether it was named).
pub fn path(env: &Env) -> Option<(PathBuf, bool)> {
    match &env.config {
        Some(p) => Some((p.clone(), true)),
        None => env.config_dir().map(|d| (d.join(FILE), false)),
    }
}

/// The configuration file, if there is one (a file `DMOVER_CONFIG` names must be
/// there). A file that does not parse is a usage error naming the key and its line.
pub fn load(env: &Env) -> anyhow::Result<Option<Profiles>> {
    let Some((path, named)) = path(env) else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => return Ok(None),
        // The default place in a home this user cannot enter (`sudo -u`, a service
        // account with another's HOME): as if there were no file, said once.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !named => {
            eprintln!(
                "dmover: warning: config {}: {e}; going on without the client configuration",
                path.display()
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(crate::args::usage(format!(
                "config {}: {e}",
                path.display()
            )));
        }
    };
    let mut file: ClientConfig = toml::from_str(&text).map_err(|e| {
        crate::args::usage(format!(
            "config {}: {}",
            path.display(),
            e.to_string().trim_end()
        ))
    })?;
    // `~/` is the home directory; a relative path is the file's directory's.
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let fix = |p: &mut Option<PathBuf>| {
        if let Some(x) = p.as_mut() {
            *x = absolute(x, &dir, env.home.as_deref());
        }
    };
    let d = &mut file.defaults;
    fix(&mut d.token_file);
    fix(&mut d.key);
    fix(&mut d.known_hosts);
    for h in file.host.values_mut() {
        fix(&mut h.token_file);
        fix(&mut h.key);
    }
    Ok(Some(Profiles { path, file }))
}

/// [`load`], once per process (the environment is read once): the commands that
/// resolve several endpoints read the file once.
pub fn loaded(env: &Env) -> anyhow::Result<Option<&'static Profiles>> {
    static LOADED: std::sync::OnceLock<Option<Profiles>> = std::sync::OnceLock::new();
    if let Some(p) = LOADED.get() {
        return Ok(p.as_ref());
    }
    let p = load(env)?;
    Ok(LOADED.get_or_init(|| p).as_ref())
}

/// `p` with a leading `~/` the home directory, and relative to `dir` if relative.
fn absolute(p: &Path, dir: &Path, home: Option<&Path>) -> PathBuf {
    if let (Ok(rest), Some(home)) = (p.strip_prefix("~"), home) {
        return home.join(rest);
    }
    dir.join(p)
}

/// Whether an endpoint argument names its port (`dmover://HOST:PORT/...`; scp's
/// `HOST:PATH` never does).
fn names_port(arg: &[u8]) -> bool {
    let Some(rest) = arg.strip_prefix(b"dmover://") else {
        return false;
    };
    let authority = rest.split(|&b| b == b'/').next().unwrap_or_default();
    let host = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    match host.iter().rposition(|&b| b == b']') {
        Some(close) => host.get(close + 1) == Some(&b':'),
        None => host.contains(&b':'),
    }
}

/// `host:port` split, brackets of an IPv6 address dropped from the host.
fn split(server: &str) -> (&str, &str) {
    let (h, p) = server.rsplit_once(':').unwrap_or((server, ""));
    (h.trim_start_matches('[').trim_end_matches(']'), p)
}

/// A server of the command line as a profile routes it.
#[derive(Debug, Clone)]
pub struct Route {
    /// What is dialed (`host:port`).
    pub server: String,
    /// The profile's name.
    pub name: String,
    /// The profile.
    pub host: HostProfile,
    /// The endpoint's `USER@`, if any.
    pub named_user: Option<String>,
}

impl Profiles {
    /// The profile of host `name`: `[host.NAME]`, else the one whose address is
    /// `name`.
    pub fn host(&self, name: &str) -> Option<(&str, &HostProfile)> {
        if let Some((n, h)) = self.file.host.get_key_value(name) {
            return Some((n, h));
        }
        self.file.host.iter().find_map(|(n, h)| {
            h.address
                .as_deref()
                .is_some_and(|a| a.trim_start_matches('[').trim_end_matches(']') == name)
                .then_some((n.as_str(), h))
        })
    }

    /// Routes endpoint `e`, parsed from `arg` with user `user`, by the profile named
    /// as its host: its server becomes the profile's address and port (a port the
    /// argument names stays). `None`: local, or no profile for the host.
    pub fn route(&self, arg: &[u8], e: &mut Endpoint, user: Option<&str>) -> Option<Route> {
        let Endpoint::Remote { server, .. } = e else {
            return None;
        };
        let (host, port) = split(server);
        let (name, profile) = self.file.host.get_key_value(host)?;
        let port = match profile.port {
            Some(p) if !names_port(arg) => p.to_string(),
            _ => port.to_string(),
        };
        let address = profile.address.clone().unwrap_or_else(|| {
            if host.contains(':') {
                format!("[{host}]")
            } else {
                host.to_string()
            }
        });
        *server = format!("{address}:{port}");
        Some(Route {
            server: server.clone(),
            name: name.clone(),
            host: profile.clone(),
            named_user: user.map(str::to_string),
        })
    }
}

/// The credential files that were warned about in this process.
static WARNED: std::sync::Mutex<Option<HashSet<PathBuf>>> = std::sync::Mutex::new(None);

/// What is wrong with the mode of credential file `f`, if anything: any permission
/// for its group or others.
pub fn loose_mode(f: &Path) -> Option<String> {
    let mode = std::fs::metadata(f).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "credential file {} is open to its group or others (mode {mode:o}): chmod \
             600 {}",
            f.display(),
            f.display()
        )
    })
}

/// Warns (once per file) when credential file `f` is readable by others.
pub fn warn_mode(f: &Path) {
    let Some(w) = loose_mode(f) else { return };
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned
        .get_or_insert_with(HashSet::new)
        .insert(f.to_path_buf())
    {
        eprintln!("dmover: warning: {w}");
    }
}

/// The credential of a profile's (or `[defaults]`') `token_file` and `key`, the key
/// first; each file's mode checked ([`warn_mode`]).
pub fn credential(
    token_file: Option<&Path>,
    key: Option<&Path>,
) -> anyhow::Result<(Option<Vec<u8>>, Option<ClientKey>)> {
    if let Some(k) = key {
        warn_mode(k);
        return Ok((None, Some(ClientKey::load(k)?)));
    }
    if let Some(t) = token_file {
        warn_mode(t);
        return Ok((Some(super::token_file(t)?), None));
    }
    Ok((None, None))
}

/// What `--user`, `--token-file`, `--key` and the environment give, against which the
/// profiles' users and credentials are weighed.
#[derive(Debug, Clone, Copy)]
pub struct Given<'a> {
    /// `--user`.
    pub user: Option<&'a str>,
    /// A token or a key came from the command line or the environment.
    pub credential: bool,
}

/// Each routed server's own user and credential: its `USER@`, else `--user`, else
/// `DMOVER_USER`, else the profile's, else `[defaults]`'; the command line's or the
/// environment's credential if any, else the profile's, else `[defaults]`'
/// (`global`: the options' own, which hold those of the command line, the environment
/// and `[defaults]`).
pub fn per_server(
    routes: &[Route],
    given: Given<'_>,
    env: &Env,
    defaults: &Defaults,
    global: &ServerCredential,
) -> anyhow::Result<Vec<(String, ServerCredential)>> {
    let mut out = Vec::new();
    for r in routes {
        let user = r
            .named_user
            .clone()
            .or(given.user.map(str::to_string))
            .or(env.user.clone())
            .or(r.host.user.clone())
            .or(defaults.user.clone())
            .unwrap_or_default();
        let (token, key) =
            if given.credential || (r.host.token_file.is_none() && r.host.key.is_none()) {
                (global.token.clone(), global.key.clone())
            } else {
                credential(r.host.token_file.as_deref(), r.host.key.as_deref())
                    .with_context(|| format!("[host.{}]", r.name))?
            };
        out.push((r.server.clone(), ServerCredential { user, token, key }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClientConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_file_parses_and_bad_keys_name_their_line() {
        let c = parse(
            "[defaults]\nservice = \"https://dtn1:7702\"\nstreams = 8\nretry_wait = \"2s\"\n\
             [host.dtn1]\naddress = \"dtn1.example.org\"\nport = 7701\nuser = \"alice\"\n\
             token_file = \"~/t\"\n[host.v6]\naddress = \"::1\"\n",
        )
        .unwrap();
        assert_eq!(c.defaults.streams, Some(8));
        assert_eq!(c.defaults.retry_wait, Some(Duration::from_secs(2)));
        assert_eq!(c.host["dtn1"].port, Some(7701));
        assert_eq!(c.host["v6"].address.as_deref(), Some("[::1]"));
        for (text, words) in [
            ("[defaults]\nstreems = 3\n", ["line 2", "streems"]),
            ("[host.a]\nport = 1\naddres = \"x\"\n", ["line 3", "addres"]),
            ("[host.a]\nport = 0\n", ["line 2", "port = 0"]),
            ("[defaults]\nretry_wait = \"5\"\n", ["line 2", "unit"]),
            (
                "[host.a]\naddress = \"h:7\"\n",
                ["line 2", "without a port"],
            ),
            ("[defaults]\nservice = \"dtn1\"\n", ["line 2", "a URL"]),
            ("[defaults]\nstreams = 500\n", ["line 2", "1 to 128"]),
            ("[hosts.a]\n", ["line 1", "hosts"]),
        ] {
            let e = parse(text).unwrap_err();
            for w in words {
                assert!(e.contains(w), "{text}: no {w:?} in {e}");
            }
        }
    }

    #[test]
    fn profiles_route_hosts_and_a_named_port_stays() {
        let file = parse(
            "[host.dtn1]\naddress = \"10.0.0.1\"\nport = 7701\n[host.plain]\n\
             [host.six]\naddress = \"::1\"\n",
        )
        .unwrap();
        let p = Profiles {
            path: "c".into(),
            file,
        };
        let route = |arg: &str| {
            let (mut e, user) = Endpoint::parse_with_user(arg).unwrap();
            let r = p.route(arg.as_bytes(), &mut e, user.as_deref());
            (
                e.server().unwrap_or_default().to_string(),
                r.map(|r| r.name),
            )
        };
        assert_eq!(
            route("dtn1:x"),
            ("10.0.0.1:7701".into(), Some("dtn1".into()))
        );
        assert_eq!(
            route("a@dtn1:x"),
            ("10.0.0.1:7701".into(), Some("dtn1".into()))
        );
        assert_eq!(
            route("dmover://dtn1/x"),
            ("10.0.0.1:7701".into(), Some("dtn1".into()))
        );
        assert_eq!(
            route("dmover://u@dtn1:9/x"),
            ("10.0.0.1:9".into(), Some("dtn1".into()))
        );
        assert_eq!(
            route("plain:x"),
            ("plain:7700".into(), Some("plain".into()))
        );
        assert_eq!(route("six:x"), ("[::1]:7700".into(), Some("six".into())));
        assert_eq!(route("other:x"), ("other:7700".into(), None));
        assert_eq!(route("local"), (String::new(), None));
        assert!(names_port(b"dmover://[::1]:7/x") && !names_port(b"dmover://[::1]/x"));
        assert_eq!(p.host("10.0.0.1").map(|h| h.0), Some("dtn1"));
        assert_eq!(p.host("::1").map(|h| h.0), Some("six"));
    }

    /// docs/client.md's example parses, and it has a row for every key.
    #[test]
    fn the_docs_example_parses_and_every_key_has_a_row() {
        let doc = include_str!("../../../../docs/client.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|r| r.split("```").next())
            .unwrap();
        let c = parse(example).unwrap();
        assert_eq!(c.host["hpc"].address.as_deref(), Some("10.20.0.5"));
        let keys = [
            ("[defaults]", "service = \"https://h:1\""),
            ("[defaults]", "user = \"u\""),
            ("[defaults]", "token_file = \"t\""),
            ("[defaults]", "key = \"k\""),
            ("[defaults]", "known_hosts = \"kh\""),
            ("[defaults]", "streams = 2"),
            ("[defaults]", "retries = 2"),
            ("[defaults]", "retry_wait = \"1s\""),
            ("[defaults]", "busy_wait = \"1s\""),
            ("[host.h]", "address = \"h\""),
            ("[host.h]", "port = 1"),
            ("[host.h]", "user = \"u\""),
            ("[host.h]", "token_file = \"t\""),
            ("[host.h]", "key = \"k\""),
            ("[host.h]", "streams = 2"),
            ("[host.h]", "retries = 2"),
            ("[host.h]", "retry_wait = \"1s\""),
            ("[host.h]", "busy_wait = \"1s\""),
        ];
        for (table, line) in keys {
            parse(&format!("{table}\n{line}\n")).unwrap();
            let key = line.split(' ').next().unwrap();
            assert!(
                doc.contains(&format!("| `{key}` |")),
                "docs/client.md: no row for {key}"
            );
        }
        // Every key the parser knows is above: one more is refused as unknown.
        for table in ["[defaults]", "[host.h]"] {
            let e = parse(&format!("{table}\nzzz = 1\n")).unwrap_err();
            let expected = e.split("expected one of ").nth(1).unwrap_or_default();
            let known = expected.matches('`').count() / 2;
            let listed = keys.iter().filter(|(t, _)| *t == table).count();
            assert_eq!(known, listed, "{table}: {e}");
        }
    }

    #[test]
    fn paths_are_made_absolute() {
        let home = Path::new("/home/u");
        let dir = Path::new("/etc/x");
        assert_eq!(
            absolute(Path::new("~/t"), dir, Some(home)),
            Path::new("/home/u/t")
        );
        assert_eq!(
            absolute(Path::new("t"), dir, Some(home)),
            Path::new("/etc/x/t")
        );
        assert_eq!(absolute(Path::new("/a/t"), dir, None), Path::new("/a/t"));
    }
}
