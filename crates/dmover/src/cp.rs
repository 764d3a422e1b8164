//! `dmover cp`: push local sources to a server or pull a server's sources here;
//! `dmover sync`: the same with the destination as the mirror itself.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use dmover_core::DirectIo;
use dmover_core::access::ClientKey;
use dmover_core::client::Client;
use dmover_core::engine::Run;
use dmover_core::session::TransferOptions;
use dmover_net::tcp::SocketOptions;
use dmover_net::tls::Trust;
use dmover_proto::control::DataProtection;

use dmover_store::filter::{Action, Filter, Rule};

use crate::args::{CpArgs, FilterArgs, ProgressMode, TpcArg, TransferArgs, usage};
use crate::endpoint::{self, Endpoint};
use crate::env::Env;
use crate::output::{self, Direction, ProgressBar};

/// Builds transfer options from the command line and environment.
pub fn transfer_options(a: &TransferArgs, env: &Env) -> anyhow::Result<TransferOptions> {
    let token = read_token(a.token_file.as_deref(), env)?;
    let key = a.key.as_deref().map(ClientKey::load).transpose()?;
    let trust = match (&a.ca, &a.known_hosts) {
        (Some(ca), _) => Some(Trust::Ca(ca.clone())),
        (None, Some(kh)) => Some(Trust::KnownHosts(kh.clone())),
        (None, None) => env.known_hosts().map(Trust::KnownHosts),
    };
    Ok(TransferOptions {
        streams: a.streams.unwrap_or(dmover_core::session::TUNED_MAX),
        tune: a.streams.is_none(),
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
        user: a.user.clone(),
        trust,
        protection: if a.encrypt {
            DataProtection::Encrypted
        } else if a.plain_data {
            DataProtection::Plain
        } else {
            DataProtection::Authenticated
        },
        ..TransferOptions::default()
    })
}

/// The token for a server: from `file`, else `DMOVER_TOKEN`, else none.
/// A client with the disk threads `--io-threads` asks for: pinned, or elastic
/// (docs/tuning.md, "Disk threads").
pub fn client_for(opts: TransferOptions, io_threads: Option<u16>) -> Client {
    let (start, max) = dmover_core::diskpool::threads_from(io_threads.map(usize::from));
    Client::elastic(opts, start, max)
}

pub fn read_token(file: Option<&Path>, env: &Env) -> anyhow::Result<Option<Vec<u8>>> {
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

/// A tokio runtime for a client: network work only (disk work has its own threads).
pub fn runtime(streams: u16) -> anyhow::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads((streams as usize).clamp(1, cores))
        .thread_name("dmover-net")
        .enable_all()
        .build()
        .context("starting the network runtime")
}

/// Cancels `run` on Ctrl-C, so the transfer stops cleanly (staging files removed).
pub fn cancel_on_interrupt(rt: &tokio::runtime::Runtime, run: &Arc<Run>) {
    let run = run.clone();
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            run.fail(dmover_core::Error::refused(
                dmover_proto::control::ErrorCode::Aborted,
                "interrupted",
            ));
        }
    });
}

/// The options `cp` and `sync` (a one-off run and each batch of `--watch`) take from
/// their arguments alike: transfer, reliability, filters, `--delete`, metadata.
pub(crate) fn copy_options(a: &CpArgs, env: &Env) -> anyhow::Result<TransferOptions> {
    use std::os::unix::ffi::OsStrExt;
    let mut opts = transfer_options(&a.transfer, env)?;
    let r = &a.reliability;
    opts.retries = r.retries;
    opts.retry_wait = r.retry_wait;
    opts.busy_wait = r.busy_wait;
    opts.verify = r.verify;
    opts.journal = !r.no_journal;
    opts.idle_timeout = r.stream_timeout.max(std::time::Duration::from_secs(1));
    if let Some(ms) = r.debug_heartbeat_ms {
        opts.heartbeat = std::time::Duration::from_millis(ms.max(50));
    }
    (opts.filter, opts.files_from) = filter_of(&a.filters)?;
    opts.rules = a
        .filters
        .rules
        .iter()
        .map(|(include, p)| dmover_proto::control::FilterRule {
            include: *include,
            pattern: p.as_bytes().to_vec(),
        })
        .collect();
    opts.delete = a.delete;
    opts.max_delete = a.max_delete;
    // -a, -X, -A ask for what is done by default.
    let _ = (a.archive, a.xattrs, a.acls);
    opts.meta.xattrs.user = !a.no_xattrs;
    opts.meta.xattrs.acls = !a.no_acls;
    opts.meta.xattrs.all = a.all_xattrs;
    opts.meta.owner = !a.no_owner;
    Ok(opts)
}

/// The walk's filters, and the `--files-from` file's contents as read (for a pull's
/// server, which parses them again).
pub(crate) type Filters = (Option<Arc<Filter>>, Option<Vec<u8>>);

/// The walk's filters from `--exclude`, `--include` and `--files-from`.
pub(crate) fn filter_of(f: &FilterArgs) -> anyhow::Result<Filters> {
    use std::os::unix::ffi::OsStrExt;
    if f.is_empty() {
        return Ok((None, None));
    }
    let mut filter = Filter::none();
    for (include, pattern) in &f.rules {
        let action = if *include {
            Action::Include
        } else {
            Action::Exclude
        };
        let rule = Rule::new(action, pattern.as_bytes()).map_err(|e| {
            usage(format!(
                "--{} {}: {e}",
                if *include { "include" } else { "exclude" },
                pattern.to_string_lossy()
            ))
        })?;
        filter.push(rule);
    }
    let mut files_from = None;
    if let Some(file) = &f.files_from {
        let list = if file.as_os_str() == "-" {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
                .context("reading --files-from from stdin")?;
            v
        } else {
            std::fs::read(file).with_context(|| format!("reading {}", file.display()))?
        };
        filter.set_files_from(&list).map_err(usage)?;
        files_from = Some(list);
    }
    Ok((Some(Arc::new(filter)), files_from))
}

/// `dmover cp`.
pub fn run(a: CpArgs, env: &Env) -> anyhow::Result<ExitCode> {
    run_copy(a, env, false)
}

/// `dmover sync SRC DST`: DST is the mirror itself; unchanged files are not sent
/// (docs/sync.md).
pub fn sync(a: CpArgs, env: &Env) -> anyhow::Result<ExitCode> {
    if a.paths.len() != 2 {
        return Err(usage(
            "sync takes one source and the destination: dmover sync SRC DST",
        ));
    }
    if a.tpc.is_some() || a.via_client {
        return Err(usage("sync between two servers is not supported yet"));
    }
    if a.watch {
        return crate::watch::run(a, env);
    }
    if a.quiet_time.is_some() {
        return Err(usage("--quiet-time applies to sync --watch"));
    }
    run_copy(a, env, true)
}

fn run_copy(a: CpArgs, env: &Env, sync: bool) -> anyhow::Result<ExitCode> {
    let (dst, srcs) = a.paths.split_last().expect("clap requires two paths");
    let dst = endpoint::parse(dst).map_err(|e| usage(format!("destination: {e}")))?;
    let srcs = srcs
        .iter()
        .map(|s| {
            endpoint::parse(s).map_err(|e| usage(format!("source {}: {e}", s.to_string_lossy())))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !sync
        && (a.delete
            || a.max_delete.is_some()
            || a.dry_run
            || a.checksum
            || a.watch
            || a.quiet_time.is_some())
    {
        return Err(usage(
            "--delete, --max-delete, --dry-run, --checksum, --watch and --quiet-time are \
             options of dmover sync",
        ));
    }
    if a.max_delete.is_some() && !a.delete {
        return Err(usage("--max-delete limits --delete: add --delete"));
    }
    if a.delete && a.filters.files_from.is_some() {
        return Err(usage(
            "--delete with --files-from is not supported yet (which destination entries \
             the list protects is not defined)",
        ));
    }
    let mut opts = copy_options(&a, env)?;
    opts.resume = a.reliability.resume;
    opts.continue_on_error = a.reliability.continue_on_error;
    opts.compare_content = a.checksum;
    if sync {
        // The destination's files are looked at (size, mtime) as a resume does.
        opts.mirror = true;
        opts.resume = true;
    }
    let remote_source = srcs.iter().any(|s| matches!(s, Endpoint::Remote { .. }));
    if remote_source
        && (!opts.rules.is_empty() || opts.files_from.is_some())
        && matches!(dst, Endpoint::Remote { .. })
    {
        return Err(usage(
            "--exclude, --include and --files-from do not apply to a copy between two \
             servers yet",
        ));
    }
    if sync {
        match (&dst, srcs.first()) {
            (Endpoint::Remote { .. }, Some(Endpoint::Remote { .. })) => {
                return Err(usage("sync between two servers is not supported yet"));
            }
            (Endpoint::Local(d), _) | (Endpoint::Remote { path: d, .. }, _) => {
                let name = d
                    .split(|&b| b == b'/')
                    .rfind(|c| !c.is_empty())
                    .unwrap_or_default();
                if name.is_empty() || name == b"." || name == b".." {
                    return Err(usage(
                        "sync: DST must name the mirror directory itself (not '.', '..' or a \
                         server's root)",
                    ));
                }
            }
        }
    }
    // Two servers: a third-party copy, the data going from one to the other.
    if let Endpoint::Remote {
        server: dest_server,
        path: dest,
    } = &dst
    {
        if srcs.iter().any(|s| matches!(s, Endpoint::Remote { .. })) {
            if a.transfer.bwlimit.is_some() {
                return Err(usage(
                    "--bwlimit does not apply to a copy between two servers (the data does \
                     not pass through this client; the servers' own limits apply)",
                ));
            }
            return third_party(&a, env, opts, srcs, dest_server.clone(), dest.clone());
        }
    }
    if a.tpc.is_some() || a.via_client {
        return Err(usage(
            "--tpc and --via-client are for copies between two servers \
             (dmover://A/PATH dmover://B/PATH)",
        ));
    }
    let (direction, server, sources, dest) = match dst {
        Endpoint::Remote { server, path } => {
            let mut local = Vec::new();
            for s in srcs {
                match s {
                    Endpoint::Local(p) => local.push(p),
                    Endpoint::Remote { .. } => unreachable!("a third-party copy, above"),
                }
            }
            (Direction::Push, server, local, path)
        }
        Endpoint::Local(dest) => {
            let mut server = None;
            let mut paths = Vec::new();
            for s in srcs {
                match s {
                    Endpoint::Remote { server: h, path } => {
                        if server.as_ref().is_some_and(|s: &String| *s != h) {
                            return Err(usage("all sources must be on the same server"));
                        }
                        server = Some(h);
                        paths.push(path);
                    }
                    Endpoint::Local(p) => {
                        return Err(usage(format!(
                            "{} and the destination are both local: name a server as HOST:PATH on one side",
                            String::from_utf8_lossy(&p)
                        )));
                    }
                }
            }
            (
                Direction::Pull,
                server.expect("at least one source"),
                paths,
                dest,
            )
        }
    };

    if a.dry_run {
        return dry_run(&a, opts, direction, &server, &sources, &dest);
    }
    let rt = runtime(opts.streams)?;
    let client = client_for(opts.clone(), a.transfer.io_threads);
    let run = Run::new();
    cancel_on_interrupt(&rt, &run);
    let ndjson = a.progress == ProgressMode::Ndjson;
    let bar =
        (a.progress == ProgressMode::Bar && !a.quiet && !a.json && std::io::stderr().is_terminal())
            .then(|| ProgressBar::start(&rt, run.clone()));
    let started = Instant::now();
    let sampler = output::Sampler::start(&rt, run.clone());
    let lines =
        ndjson.then(|| output::Ndjson::start(&rt, run.clone(), started, a.progress_interval));
    let result = rt.block_on(async {
        match direction {
            Direction::Push => client.push(&sources, &server, &dest, run.clone()).await,
            Direction::Pull => client.pull(&server, &sources, &dest, run.clone()).await,
            Direction::TpcPush | Direction::TpcPull | Direction::TpcRelay => {
                unreachable!("run by `third_party`")
            }
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let timing = sampler.finish();
    if let Some(bar) = bar {
        bar.finish();
    }
    if let Some(lines) = lines {
        lines.finish(&rt);
    }
    // Join the disk threads: an aborted transfer's staging files are gone after this.
    drop(client);
    drop(rt);
    Ok(output::report_with(
        result,
        direction,
        None,
        secs,
        timing,
        a.json || ndjson,
        a.quiet,
        &run.progress,
        a.transfer.bwlimit,
        sync,
    ))
}

/// `dmover sync --dry-run`: what would be sent, skipped and deleted (docs/sync.md).
fn dry_run(
    a: &CpArgs,
    opts: TransferOptions,
    direction: Direction,
    server: &str,
    sources: &[Vec<u8>],
    dest: &[u8],
) -> anyhow::Result<ExitCode> {
    use dmover_proto::manifest::EntryKind;
    let rt = runtime(opts.streams)?;
    let delete = opts.delete;
    let client = client_for(opts, a.transfer.io_threads);
    let push = direction == Direction::Push;
    let result = rt.block_on(client.sync_dry_run(push, server, &sources[0], dest));
    drop(client);
    drop(rt);
    let plan = match result {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dmover: error: {e}");
            return Ok(ExitCode::from(output::exit_code(&e)));
        }
    };
    let r = &plan.report;
    let mut unchanged = vec![false; plan.entries.len()];
    for range in &r.unchanged {
        for i in range.first..range.first + range.count {
            if let Some(u) = unchanged.get_mut(i as usize) {
                *u = true;
            }
        }
    }
    let (mut send_files, mut send_bytes, mut same_files, mut same_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut lines = Vec::new();
    for (i, e) in plan.entries.iter().enumerate() {
        if let EntryKind::File { size } = e.kind {
            if unchanged[i] {
                same_files += 1;
                same_bytes += size;
            } else {
                send_files += 1;
                send_bytes += size;
                let path = dmover_core::session::entry_path(&plan.entries, i as u32);
                // The path below the mirror (the root's name is the mirror's).
                let rel = path.split_once('/').map_or("", |(_, r)| r).to_string();
                lines.push(format!("send {rel}"));
            }
        }
    }
    let (deleted, deleted_bytes, over) = if delete {
        for p in &r.paths {
            lines.push(format!("delete {}", String::from_utf8_lossy(p)));
        }
        (r.deleted, r.deleted_bytes, r.over_limit)
    } else {
        (0, 0, 0)
    };
    if a.json {
        let j = serde_json::json!({
            "schema": output::SCHEMA,
            "type": "dry_run",
            "ok": over == 0,
            "direction": direction,
            "files_to_send": send_files,
            "bytes_to_send": send_bytes,
            "files_unchanged": same_files,
            "bytes_unchanged": same_bytes,
            "files_deleted": delete.then_some(deleted),
            "bytes_deleted": delete.then_some(deleted_bytes),
            "delete_over_limit": delete.then_some(over),
            "skipped": plan.skipped,
        });
        println!("{j}");
    } else {
        if !a.quiet {
            for l in &lines {
                println!("{l}");
            }
        }
        eprintln!(
            "dry run: would send {send_files} files ({send_bytes} bytes), skip {same_files} \
             unchanged ({same_bytes} bytes){}; nothing was changed",
            if delete {
                format!(", delete {deleted} entries ({deleted_bytes} bytes)")
            } else {
                String::new()
            }
        );
    }
    if delete && plan.skipped > 0 {
        eprintln!(
            "dmover: error: the source walk skipped {} entries: a real run would delete nothing",
            plan.skipped
        );
        return Ok(ExitCode::from(1));
    }
    if over > 0 {
        eprintln!(
            "dmover: error: --max-delete would stop deletions: {over} more entries would not \
             be deleted"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `dmover cp dmover://A/PATH... dmover://B/PATH`: server A to server B, the data going
/// directly (docs/third-party.md).
fn third_party(
    a: &CpArgs,
    _env: &Env,
    opts: dmover_core::session::TransferOptions,
    srcs: Vec<Endpoint>,
    dest_server: String,
    dest: Vec<u8>,
) -> anyhow::Result<ExitCode> {
    use dmover_core::client::ThirdPartyCopy;
    use dmover_proto::control::TpcMode;
    let mut source_server: Option<String> = None;
    let mut sources = Vec::new();
    for s in srcs {
        match s {
            Endpoint::Remote { server, path } => {
                if source_server.as_ref().is_some_and(|h| *h != server) {
                    return Err(usage("all sources must be on the same server"));
                }
                source_server = Some(server);
                sources.push(path);
            }
            Endpoint::Local(p) => {
                return Err(usage(format!(
                    "{}: a copy between two servers takes sources on one server only",
                    String::from_utf8_lossy(&p)
                )));
            }
        }
    }
    let source_server = source_server.expect("a remote source");
    let mode = match a.tpc.unwrap_or(TpcArg::Push) {
        TpcArg::Push => TpcMode::Push,
        TpcArg::Pull => TpcMode::Pull,
    };
    let (direction, dialer) = match mode {
        _ if a.via_client => (Direction::TpcRelay, None),
        TpcMode::Push => (Direction::TpcPush, Some(source_server.clone())),
        TpcMode::Pull => (Direction::TpcPull, Some(dest_server.clone())),
    };
    let copy = ThirdPartyCopy {
        mode,
        source_server,
        sources,
        dest_server,
        dest,
    };
    let rt = runtime(opts.streams)?;
    let client = Client::new(opts, 1);
    let run = Run::new();
    cancel_on_interrupt(&rt, &run);
    let ndjson = a.progress == ProgressMode::Ndjson;
    let bar =
        (a.progress == ProgressMode::Bar && !a.quiet && !a.json && std::io::stderr().is_terminal())
            .then(|| ProgressBar::start(&rt, run.clone()));
    let started = Instant::now();
    let sampler = output::Sampler::start(&rt, run.clone());
    let lines =
        ndjson.then(|| output::Ndjson::start(&rt, run.clone(), started, a.progress_interval));
    let result = if a.via_client {
        let ring = a
            .debug_relay_bytes
            .unwrap_or(dmover_core::relay::RELAY_BYTES);
        rt.block_on(client.relay(&copy, ring, run.clone()))
    } else {
        rt.block_on(client.third_party(&copy, run.clone()))
    };
    let secs = started.elapsed().as_secs_f64();
    let timing = sampler.finish();
    if let Some(bar) = bar {
        bar.finish();
    }
    if let Some(lines) = lines {
        lines.finish(&rt);
    }
    drop(client);
    drop(rt);
    Ok(output::report(
        result,
        direction,
        dialer.as_deref(),
        secs,
        timing,
        a.json || ndjson,
        a.quiet,
        &run.progress,
        a.transfer.bwlimit,
    ))
}
