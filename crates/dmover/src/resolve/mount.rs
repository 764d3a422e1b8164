//! `dmover mount` resolved: the server's directory, the mount point checked, the
//! client's options for request-driven sessions.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use dmover_core::transfer::Endpoint;

use super::ClientSetup;
use crate::args::{MountArgs, usage};
use crate::env::Env;

/// The chunk size of a mount when `--chunk` says auto: small enough that a random
/// read of a few KiB costs little more than a round trip (64 KiB: 0.5 ms at 1 Gbit/s;
/// 1 MiB cost 8.4 ms more over a 50 ms link), with sequential reads kept streaming by
/// reading ahead 8 MiB of them (docs/remote.md, "Random reads over long links").
pub const MOUNT_CHUNK: u32 = 64 << 10;

/// A resolved `dmover mount`.
#[derive(Debug)]
pub struct MountJob {
    /// The server (`host:port`).
    pub server: String,
    /// The directory on it.
    pub path: Vec<u8>,
    /// The mount point (an existing directory).
    pub dir: PathBuf,
    /// The client: no tuning, [`MOUNT_CHUNK`] chunks unless `--chunk` says.
    pub client: ClientSetup,
    /// `--cache`: bytes of file data kept per session.
    pub cache: u64,
    /// Chunks read ahead of a sequential read.
    pub read_ahead: u64,
    /// `--attr-timeout`.
    pub attr_timeout: Duration,
    /// `--timeout`.
    pub timeout: Duration,
    /// `--rw`.
    pub rw: bool,
}

/// `dmover mount SOURCE DIR`.
pub fn mount(a: &MountArgs, env: &Env) -> anyhow::Result<MountJob> {
    let source = a.source.to_string_lossy();
    let (mut endpoint, user) = Endpoint::parse_with_user(a.source.as_bytes())
        .map_err(|e| usage(format!("{source}: {e}")))?;
    let routes: Vec<super::profile::Route> =
        super::route(a.source.as_bytes(), &mut endpoint, user.as_deref(), env)?
            .into_iter()
            .collect();
    let (server, path) = match endpoint {
        Endpoint::Remote { server, path } => (server, path),
        Endpoint::Local(_) => {
            return Err(usage(format!(
                "{source}: the source must be on a server: dmover://HOST[:PORT]/PATH or HOST:PATH",
            )));
        }
    };
    match std::fs::metadata(&a.dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(usage(format!("{} is not a directory", a.dir.display()))),
        Err(e) => return Err(usage(format!("mount point {}: {e}", a.dir.display()))),
    }
    let mut client = super::client(&a.transfer, env)?;
    client.users(&a.transfer, &Vec::from_iter(user), &routes, env)?;
    let opts = &mut client.options;
    if opts.chunk_size == 0 {
        opts.chunk_size = MOUNT_CHUNK;
    }
    // A request-driven session sends only the chunks asked for: nothing to tune, and
    // no need for more than the untuned default of streams.
    if opts.tune {
        opts.tune = false;
        opts.streams = dmover_core::session::TUNED_START;
    }
    if let Some(ms) = a.debug_heartbeat_ms {
        opts.heartbeat = Duration::from_millis(ms.max(50));
    }
    let read_ahead = a
        .read_ahead
        .unwrap_or_else(|| dmover_core::remote::read_ahead_chunks(opts.chunk_size));
    Ok(MountJob {
        server,
        path,
        dir: a.dir.clone(),
        client,
        cache: a.cache,
        read_ahead,
        attr_timeout: a.attr_timeout,
        timeout: a.timeout,
        rw: a.rw,
    })
}
