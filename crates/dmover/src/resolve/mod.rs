//! The resolve step (ripgrep's LowArgs → HiArgs): what clap parsed ([`crate::args`],
//! [`crate::cli`]) and the environment captured once ([`Env`]) become the library's
//! option structs — [`TransferOptions`] and this side's disk threads
//! ([`ClientSetup`]), a checked [`dmover_core::Transfer`] for `cp` and `sync`
//! ([`copy`]), a watch's or a mount's settings ([`watch`], [`mount`]), a server's
//! configuration ([`serve`]). Here, and only here, files named on the command line are
//! read (tokens, keys, `--files-from`, a server's config and TLS key) and the options
//! that contradict each other are refused with the messages users see (exit code 2,
//! [`crate::args::UsageError`]). The commands take the result and run; none of them
//! reads an argument that needs resolving.

mod copy;
mod mount;
pub mod profile;
mod serve;

pub use copy::{Copy, CopyOut, Stdio, Sync, WatchJob, copy, copy_out, filter_rules, stdio, sync};
// `dmover bench remote`'s chunk through a mount.
#[cfg(feature = "lab")]
pub use mount::MOUNT_CHUNK;
pub use mount::{MountJob, mount};
pub use serve::{Database, JobsSetup, Reload, ServeJob, check as serve_check, serve};

use std::path::Path;

use anyhow::{Context, bail};
use dmover_core::DirectIo;
use dmover_core::access::ClientKey;
use dmover_core::client::Client;
use dmover_core::session::TransferOptions;
use dmover_net::tcp::SocketOptions;
use dmover_net::tls::Trust;
use dmover_proto::control::DataProtection;

use crate::args::TransferArgs;
use crate::env::Env;

/// A client's resolved settings: its sessions' options and its disk threads.
#[derive(Debug, Clone)]
pub struct ClientSetup {
    /// `[defaults]` of the client's configuration file (docs/client.md), if any.
    pub defaults: profile::Defaults,
    /// The sessions' options.
    pub options: TransferOptions,
    /// `--io-threads`: pinned disk threads; `None`: elastic (docs/tuning.md, "Disk
    /// threads").
    pub io_threads: Option<u16>,
}

impl ClientSetup {
    /// A client with these options and disk threads.
    pub fn client(&self) -> Client {
        let (start, max) = dmover_core::diskpool::threads_from(self.disk_threads());
        Client::elastic(self.options.clone(), start, max)
    }

    /// The disk threads pinned, if they are.
    pub fn disk_threads(&self) -> Option<usize> {
        self.io_threads.map(usize::from)
    }

    /// A network runtime sized for these options' streams ([`runtime`]).
    pub fn runtime(&self) -> anyhow::Result<tokio::runtime::Runtime> {
        runtime(self.options.streams)
    }
}

/// The options shared by everything that moves data: streams, chunks, I/O, sockets,
/// credentials (`--token-file`, else `DMOVER_TOKEN`; `--key`; else the client
/// config's `[defaults]`), trust (`--ca`, else `--known-hosts`, else the config's,
/// else the default known-hosts file), data protection. The config's host profiles
/// apply to the servers an endpoint names ([`route`], [`ClientSetup::users`]).
pub fn client(a: &TransferArgs, env: &Env) -> anyhow::Result<ClientSetup> {
    let defaults = profile::loaded(env)?
        .map(|p| p.file.defaults.clone())
        .unwrap_or_default();
    let mut token = token(a.token_file.as_deref(), env)?;
    let mut key = a.key.as_deref().map(ClientKey::load).transpose()?;
    if token.is_none() && key.is_none() {
        (token, key) = profile::credential(defaults.token_file.as_deref(), defaults.key.as_deref())
            .context("the client config's [defaults]")?;
    }
    let trust = match (&a.ca, &a.known_hosts) {
        (Some(ca), _) => Some(Trust::Ca(ca.clone())),
        (None, Some(kh)) => Some(Trust::KnownHosts(kh.clone())),
        (None, None) => defaults
            .known_hosts
            .clone()
            .or_else(|| env.known_hosts())
            .map(Trust::KnownHosts),
    };
    let streams = a.streams.or(defaults.streams);
    let options = TransferOptions {
        streams: streams.unwrap_or(dmover_core::session::TUNED_MAX),
        tune: streams.is_none(),
        chunk_size: a.chunk,
        checksum: !a.no_checksum,
        direct_io: match (a.direct_io, a.buffered_io) {
            (true, _) => DirectIo::Always,
            (_, true) => DirectIo::Never,
            _ => DirectIo::Auto,
        },
        fsync: a.fsync,
        buffers: a.buffers.map(|b| b as usize),
        socket: SocketOptions {
            send_buffer: a.tcp_buffer.map(|b| b as usize),
            recv_buffer: a.tcp_buffer.map(|b| b as usize),
            congestion: a.congestion.clone(),
        },
        bwlimit: a.bwlimit,
        token,
        key,
        user: user(a.user.as_deref(), &[], env)?,
        trust,
        protection: if a.encrypt {
            DataProtection::Encrypted
        } else if a.plain_data {
            DataProtection::Plain
        } else {
            DataProtection::Authenticated
        },
        ..TransferOptions::default()
    };
    Ok(ClientSetup {
        defaults,
        options,
        io_threads: a.io_threads,
    })
}

impl ClientSetup {
    /// Sets the user on the servers ([`user`], else `[defaults]`' user), each server
    /// a profile routed ([`route`]) its own user and credential
    /// ([`profile::per_server`]), and the streams a profile pins
    /// ([`profile::host_option`]) unless `-P` does.
    pub fn users(
        &mut self,
        a: &TransferArgs,
        named: &[String],
        routes: &[profile::Route],
        env: &Env,
    ) -> anyhow::Result<()> {
        let opts = &mut self.options;
        opts.user = user(a.user.as_deref(), named, env)?;
        if opts.user.is_empty() {
            opts.user = self.defaults.user.clone().unwrap_or_default();
        }
        let given = profile::Given {
            user: a.user.as_deref(),
            credential: a.token_file.is_some() || a.key.is_some() || env.token.is_some(),
        };
        let global = dmover_core::session::ServerCredential {
            user: opts.user.clone(),
            token: opts.token.clone(),
            key: opts.key.clone(),
        };
        for (server, c) in profile::per_server(routes, given, env, &self.defaults, &global)? {
            opts.per_server.insert(server, c);
        }
        // A profile's streams go before [defaults]' (which `client` applied).
        if a.streams.is_none() {
            if let Some(n) = profile::host_option(routes, |h| h.streams) {
                opts.streams = n;
                opts.tune = false;
            }
        }
        Ok(())
    }
}

/// `dmover tune HOST[:PORT]`: its client, and HOST routed by the client config's
/// profile of it (read as `dmover://HOST[:PORT]`) with its user and credential.
pub fn tune(
    mut a: crate::tune::TuneArgs,
    env: &Env,
) -> anyhow::Result<(crate::tune::TuneArgs, ClientSetup)> {
    let mut client = client(&a.transfer, env)?;
    let arg = format!("dmover://{}", a.host);
    let mut routes = Vec::new();
    // A HOST that does not parse is refused by the command, in its words.
    if let Ok(mut e) = dmover_core::transfer::Endpoint::parse(&arg) {
        if let Some(r) = route(arg.as_bytes(), &mut e, None, env)? {
            a.host = r.server.clone();
            routes.push(r);
        }
    }
    client.users(&a.transfer, &[], &routes, env)?;
    Ok((a, client))
}

/// Routes endpoint `e` (parsed from `arg`, with the user `user` it names) by the
/// client config's profile of its host, if there is one ([`profile::Profiles::route`]).
pub fn route(
    arg: &[u8],
    e: &mut dmover_core::transfer::Endpoint,
    user: Option<&str>,
    env: &Env,
) -> anyhow::Result<Option<profile::Route>> {
    Ok(profile::loaded(env)?.and_then(|p| p.route(arg, e, user)))
}

/// The user name on the servers: the `USER@` the endpoints name (`named`, one per
/// endpoint that names one), else `--user` (`flag`), else `DMOVER_USER`, else none
/// (""). Endpoints that name two users, or a `--user` other than theirs, are a usage
/// error: a transfer runs as one dmover user.
pub fn user(flag: Option<&str>, named: &[String], env: &Env) -> anyhow::Result<String> {
    let mut named = named.iter();
    let first = named.next();
    if let (Some(a), Some(b)) = (first, named.find(|u| Some(*u) != first)) {
        return Err(crate::args::usage(format!(
            "the endpoints name two users, {a}@ and {b}@: a transfer runs as one dmover user"
        )));
    }
    match (first, flag) {
        (Some(u), Some(f)) if u != f => Err(crate::args::usage(format!(
            "--user {f} and {u}@ name different users: give one"
        ))),
        (Some(u), _) => Ok(u.clone()),
        (None, Some(f)) => Ok(f.to_string()),
        (None, None) => Ok(env.user.clone().unwrap_or_default()),
    }
}

/// The token for a server: from `file`, else `DMOVER_TOKEN`, else none; an empty one
/// is refused.
pub fn token(file: Option<&Path>, env: &Env) -> anyhow::Result<Option<Vec<u8>>> {
    let token = match file {
        Some(f) => {
            Some(std::fs::read(f).with_context(|| format!("reading token file {}", f.display()))?)
        }
        None => env.token.clone(),
    };
    if token.as_ref().is_some_and(|t| t.trim_ascii().is_empty()) {
        bail!("the token is empty");
    }
    Ok(token)
}

/// A token file a server or `dmover credential verifier` reads, refusing an empty one.
pub fn token_file(f: &Path) -> anyhow::Result<Vec<u8>> {
    let t = std::fs::read(f).with_context(|| format!("reading token file {}", f.display()))?;
    if t.trim_ascii().is_empty() {
        bail!("token file {} is empty", f.display());
    }
    Ok(t)
}

/// A tokio runtime for a client: network work only (disk work has its own threads),
/// a thread per stream up to the cores.
pub fn runtime(streams: u16) -> anyhow::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads((streams as usize).clamp(1, cores))
        .thread_name("dmover-net")
        .enable_all()
        .build()
        .context("starting the network runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_is_the_endpoints_then_the_flags_then_the_environments() {
        let env = Env {
            user: Some("carol".into()),
            ..Env::default()
        };
        let u = |flag: Option<&str>, named: &[&str]| {
            let named: Vec<String> = named.iter().map(|n| n.to_string()).collect();
            user(flag, &named, &env).map_err(|e| e.to_string())
        };
        assert_eq!(u(None, &[]), Ok("carol".into()));
        assert_eq!(u(Some("bob"), &[]), Ok("bob".into()));
        assert_eq!(u(None, &["alice"]), Ok("alice".into()));
        assert_eq!(u(Some("alice"), &["alice", "alice"]), Ok("alice".into()));
        assert!(
            u(Some("bob"), &["alice"])
                .unwrap_err()
                .contains("--user bob and alice@")
        );
        assert!(
            u(None, &["alice", "bob"])
                .unwrap_err()
                .contains("two users")
        );
        assert_eq!(user(None, &[], &Env::default()).unwrap(), "");
    }
}
