//! `dmover cp` and `dmover sync` resolved: the endpoints parsed, the flags that go
//! together checked, the options read into a [`TransferSpec`] and checked by the
//! library into a [`Transfer`]; `sync --watch` into a [`WatchJob`].

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dmover_core::transfer::{Between, Endpoint, Kind, PlanError, Transfer, TransferSpec};
use dmover_proto::control::{FilterRule, TpcMode};
use dmover_store::filter::{Action, Filter, Rule};
use dmover_store::prune::QuickCheck;

use super::ClientSetup;
use super::profile::Route;
use crate::args::{CpArgs, FilterArg, FilterArgs, ProgressMode, TpcArg, usage};
use crate::env::Env;

/// `--quiet-time`'s default: short enough for a close-to-remote-rename lag under a
/// second plus the wire time, long enough for a writer's close-and-reopen.
pub const QUIET_TIME: Duration = Duration::from_millis(200);

/// `--retry-wait`'s default.
const RETRY_WAIT: Duration = Duration::from_secs(5);

/// `--busy-wait`'s default.
const BUSY_WAIT: Duration = Duration::from_secs(60);

/// How a copy shows itself: progress while it runs, the summary at the end.
#[derive(Debug, Clone, Copy)]
pub struct Show {
    /// `--json`: one JSON object at the end.
    pub json: bool,
    /// `--quiet`: no bar, no summary line.
    pub quiet: bool,
    /// `--progress`.
    pub progress: ProgressMode,
    /// `--progress-interval`, if given.
    pub interval: Option<Duration>,
}

/// A resolved `dmover cp` or `dmover sync`.
#[derive(Debug)]
pub struct Copy {
    /// The checked transfer, its disk threads started.
    pub transfer: Transfer,
    /// `dmover cp - HOST:PATH`: stdin read into this private directory, removed once
    /// the copy is done.
    pub spool: Option<tempfile::TempDir>,
    /// Its output.
    pub show: Show,
    /// `--dry-run`: tell what would be done instead.
    pub dry_run: bool,
    /// A sync (its summary counts unchanged files).
    pub sync: bool,
    /// The sources and the destination as named.
    pub endpoints: crate::output::Endpoints,
}

/// A resolved `dmover sync`: once, or watching.
#[derive(Debug)]
pub enum Sync {
    /// A sync that runs once.
    Once(Copy),
    /// `--watch`.
    Watch(WatchJob),
}

/// A resolved `dmover sync --watch SRC HOST:DST`.
#[derive(Debug)]
pub struct WatchJob {
    /// The local directory watched.
    pub src: Vec<u8>,
    /// The server (`host:port`).
    pub server: String,
    /// The mirror's path on it.
    pub dest: Vec<u8>,
    /// The client's settings (a sync's: mirror, resume, files being written skipped).
    pub client: ClientSetup,
    /// `--quiet-time`.
    pub quiet_time: Duration,
    /// `--delete`.
    pub delete: bool,
    /// `--json`.
    pub json: bool,
    /// `--quiet`.
    pub quiet: bool,
}

/// `dmover cp`.
pub fn copy(a: &CpArgs, env: &Env) -> anyhow::Result<Copy> {
    copy_as(a, env, Kind::Copy)
}

/// The sources and the destination of `a` as named (lossy UTF-8).
fn named(a: &CpArgs) -> crate::output::Endpoints {
    let named: Vec<String> = a
        .paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let (destination, source) = match named.split_last() {
        Some((d, s)) => (d.clone(), s.to_vec()),
        None => (String::new(), Vec::new()),
    };
    crate::output::Endpoints {
        source,
        destination,
    }
}

/// `dmover sync SRC DST`: DST is the mirror itself (docs/sync.md).
pub fn sync(a: &CpArgs, env: &Env) -> anyhow::Result<Sync> {
    if a.paths.len() != 2 {
        return Err(usage(
            "sync takes one source and the destination: dmover sync SRC DST",
        ));
    }
    if a.watch {
        return watch(a, env).map(Sync::Watch);
    }
    if a.quiet_time.is_some() {
        return Err(usage("--quiet-time applies to sync --watch"));
    }
    copy_as(a, env, Kind::Sync).map(Sync::Once)
}

/// What `-` stands for in a copy: one file on stdin or stdout.
#[derive(Debug)]
pub enum Stdio {
    /// No `-`: an ordinary copy.
    None,
    /// `dmover cp - DST`: stdin to the file DST.
    In,
    /// `dmover cp SRC -`: the file SRC to stdout.
    Out,
}

/// Where `-` stands in `a`'s paths, refusing what it cannot mean: `-` with `--resume`,
/// several sources, a sync, or on both sides.
pub fn stdio(a: &CpArgs, sync: bool) -> anyhow::Result<Stdio> {
    let dash = |p: &std::ffi::OsString| p.as_bytes() == b"-";
    let (dst, srcs) = a.paths.split_last().expect("clap requires two paths");
    let (from, to) = (srcs.iter().any(dash), dash(dst));
    if !from && !to {
        return Ok(Stdio::None);
    }
    if a.reliability.resume {
        return Err(usage(
            "--resume does not apply to '-' (stdin or stdout cannot be read or written \
             again from where a run stopped): run the copy again whole",
        ));
    }
    if sync || a.watch {
        return Err(usage(
            "'-' (stdin or stdout) is for dmover cp, not sync: a mirror is a tree",
        ));
    }
    if from && to {
        return Err(usage("'-' on both sides: name a file on one of them"));
    }
    if srcs.len() != 1 {
        return Err(usage(
            "'-' (stdin or stdout) takes one file: one source and the destination",
        ));
    }
    Ok(if from { Stdio::In } else { Stdio::Out })
}

/// The sources and the destination of a copy, the users their `USER@`s name, and
/// the servers the client config's profiles routed.
type Ends = (Vec<Endpoint>, Endpoint, Vec<String>, Vec<Route>);

/// The [`Ends`] of `a`.
fn endpoints(a: &CpArgs, env: &Env) -> anyhow::Result<Ends> {
    let (dst_arg, srcs) = a.paths.split_last().expect("clap requires two paths");
    let mut users = Vec::new();
    let mut routes = Vec::new();
    let (mut dst, user) = Endpoint::parse_with_user(dst_arg.as_bytes())
        .map_err(|e| usage(format!("destination: {e}")))?;
    routes.extend(super::route(
        dst_arg.as_bytes(),
        &mut dst,
        user.as_deref(),
        env,
    )?);
    users.extend(user);
    let mut sources = Vec::new();
    for s in srcs {
        let (mut e, user) = Endpoint::parse_with_user(s.as_bytes())
            .map_err(|e| usage(format!("source {}: {e}", s.to_string_lossy())))?;
        routes.extend(super::route(s.as_bytes(), &mut e, user.as_deref(), env)?);
        sources.push(e);
        users.extend(user);
    }
    Ok((sources, dst, users, routes))
}

fn copy_as(a: &CpArgs, env: &Env, kind: Kind) -> anyhow::Result<Copy> {
    let spool = match stdio(a, kind == Kind::Sync)? {
        Stdio::In => Some(spool_stdin(a, env)?),
        Stdio::None => None,
        Stdio::Out => {
            return Err(usage(
                "cp SRC -: the file goes to stdout (resolve::copy_out), not through a transfer",
            ));
        }
    };
    let (srcs, dst, users, routes) = endpoints(a, env)?;
    let (srcs, dst) = match &spool {
        Some((_, file, dest)) => (vec![Endpoint::Local(file.clone())], dest.clone()),
        None => (srcs, dst),
    };
    let sync = kind == Kind::Sync;
    if !sync
        && (a.delete
            || a.max_delete.is_some()
            || a.checksum
            || a.size_only
            || a.ignore_existing
            || a.watch
            || a.quiet_time.is_some())
    {
        return Err(usage(
            "--delete, --max-delete, --checksum, --size-only, --ignore-existing, --watch and \
             --quiet-time are options of dmover sync (cp sends every file; sync compares \
             with the destination)",
        ));
    }
    if !sync && a.dry_run && a.reliability.resume {
        return Err(usage(
            "cp --dry-run lists every file a copy sends; with --resume it cannot tell what \
             the destination's journal keeps: drop one (a sync's --dry-run compares)",
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
    let mut client = copy_options(a, env, &users, &routes)?;
    let opts = &mut client.options;
    opts.resume = a.reliability.resume;
    opts.continue_on_error = a.reliability.continue_on_error;
    opts.compare_content = a.checksum;
    let spec = TransferSpec {
        sources: srcs,
        dest: dst,
        kind,
        between_servers: between(a),
        disk_threads: client.disk_threads(),
        options: client.options,
    };
    let transfer = Transfer::new(spec).map_err(plan_usage)?;
    Ok(Copy {
        transfer,
        spool: spool.map(|(dir, _, _)| dir),
        show: Show {
            json: a.json,
            quiet: a.quiet,
            progress: a.progress,
            interval: a.progress_interval,
        },
        dry_run: a.dry_run,
        sync,
        endpoints: named(a),
    })
}

/// A resolved `dmover cp HOST:PATH -`: one file of a server to stdout.
#[derive(Debug)]
pub struct CopyOut {
    /// The client's settings.
    pub client: ClientSetup,
    /// The server (`host:port`).
    pub server: String,
    /// The file's path on it.
    pub source: Vec<u8>,
    /// `--quiet`: no summary line.
    pub quiet: bool,
}

/// `dmover cp HOST:PATH -` ([`stdio`] said `-` is the destination).
pub fn copy_out(a: &CpArgs, env: &Env) -> anyhow::Result<CopyOut> {
    let src = &a.paths[0];
    let (mut parsed, user) = Endpoint::parse_with_user(src.as_bytes())
        .map_err(|e| usage(format!("source {}: {e}", src.to_string_lossy())))?;
    let routes: Vec<Route> = super::route(src.as_bytes(), &mut parsed, user.as_deref(), env)?
        .into_iter()
        .collect();
    let users: Vec<String> = user.into_iter().collect();
    let Endpoint::Remote { server, path } = parsed else {
        return Err(usage(
            "cp SRC -: SRC must be a file on a server (HOST:PATH); a local file is read \
             with cat",
        ));
    };
    if a.json || a.progress == ProgressMode::Ndjson {
        return Err(usage(
            "--json and --progress ndjson write to stdout, which '-' takes for the data",
        ));
    }
    if between(a).is_some() {
        return Err(usage(
            "--tpc and --via-client are for copies between two servers",
        ));
    }
    let client = copy_options(a, env, &users, &routes)?;
    Ok(CopyOut {
        client,
        server,
        source: path,
        quiet: a.quiet,
    })
}

/// `dmover cp - DST`: stdin read to its end into a file of a private temporary
/// directory, named as DST's last component, and the destination that puts it at DST
/// (DST's directory, which must exist). Its size must be known before its manifest goes:
/// the protocol has no file that grows while it is sent. Returns the directory (removed
/// when dropped), the file and the destination.
fn spool_stdin(a: &CpArgs, env: &Env) -> anyhow::Result<(tempfile::TempDir, Vec<u8>, Endpoint)> {
    let dst = a.paths.last().expect("clap requires two paths");
    let (mut parsed, user) = Endpoint::parse_with_user(dst.as_bytes())
        .map_err(|e| usage(format!("destination: {e}")))?;
    super::route(dst.as_bytes(), &mut parsed, user.as_deref(), env)?;
    let path = parsed.path().to_vec();
    let name = path
        .split(|&b| b == b'/')
        .next_back()
        .unwrap_or_default()
        .to_vec();
    if name.is_empty() || name == b"." || name == b".." {
        return Err(usage(format!(
            "cp - DST: DST must name the file to write (not a directory): {}",
            dst.to_string_lossy()
        )));
    }
    let parent = &path[..path.len() - name.len()];
    // A trailing `/`: the directory must exist (the file is never renamed after it).
    let dest = match parsed {
        Endpoint::Local(_) if parent.is_empty() => Endpoint::Local(b"./".to_vec()),
        Endpoint::Local(_) => Endpoint::Local(parent.to_vec()),
        Endpoint::Remote { server, .. } => Endpoint::Remote {
            server,
            path: parent.to_vec(),
        },
    };
    let dir = tempfile::Builder::new()
        .prefix("dmover-stdin-")
        .tempdir()
        .context("making a directory for stdin")?;
    let file = dir.path().join(std::ffi::OsStr::from_bytes(&name));
    let mut out =
        std::fs::File::create(&file).with_context(|| format!("creating {}", file.display()))?;
    std::io::copy(&mut std::io::stdin().lock(), &mut out)
        .with_context(|| format!("reading stdin into {}", file.display()))?;
    out.sync_all().ok();
    Ok((dir, file.as_os_str().as_bytes().to_vec(), dest))
}

/// `--tpc` and `--via-client`.
fn between(a: &CpArgs) -> Option<Between> {
    match (a.via_client, a.tpc) {
        (true, _) => Some(Between::ViaClient {
            ring_bytes: a
                .debug_relay_bytes
                .unwrap_or(dmover_core::relay::RELAY_BYTES),
        }),
        (false, Some(TpcArg::Push)) => Some(Between::Direct(TpcMode::Push)),
        (false, Some(TpcArg::Pull)) => Some(Direct(TpcMode::Pull)),
        (false, None) => None,
    }
}

use Between::Direct;

/// A refused [`TransferSpec`] as the usage error naming the flags.
fn plan_usage(e: PlanError) -> anyhow::Error {
    usage(match e {
        PlanError::SyncViaClient => "sync between two servers with --via-client is not \
                                     supported yet (without it, the data go from one server \
                                     to the other directly)"
            .to_string(),
        PlanError::BwlimitBetweenServers => "--bwlimit does not apply to a copy between two \
                                             servers (the data does not pass through this \
                                             client; the servers' own limits apply)"
            .to_string(),
        PlanError::NotBetweenServers => "--tpc and --via-client are for copies between two \
                                         servers (dmover://A/PATH dmover://B/PATH)"
            .to_string(),
        other => other.to_string(),
    })
}

/// The options `cp` and `sync` (a one-off run and each batch of `--watch`) take from
/// their arguments alike: transfer, reliability, filters, `--delete`, metadata.
fn copy_options(
    a: &CpArgs,
    env: &Env,
    users: &[String],
    routes: &[Route],
) -> anyhow::Result<ClientSetup> {
    let mut client = super::client(&a.transfer, env)?;
    client.users(&a.transfer, users, routes, env)?;
    let d = &client.defaults;
    let r = &a.reliability;
    let opts = &mut client.options;
    // The flag, else the servers' profiles, else [defaults], else the built-in.
    use super::profile::host_option as host;
    opts.retries = (r.retries.or_else(|| host(routes, |h| h.retries)))
        .or(d.retries)
        .unwrap_or(0);
    opts.retry_wait = (r.retry_wait.or_else(|| host(routes, |h| h.retry_wait)))
        .or(d.retry_wait)
        .unwrap_or(RETRY_WAIT);
    opts.busy_wait = (r.busy_wait.or_else(|| host(routes, |h| h.busy_wait)))
        .or(d.busy_wait)
        .unwrap_or(BUSY_WAIT);
    opts.verify = r.verify;
    opts.journal = !r.no_journal;
    opts.idle_timeout = r.stream_timeout.max(Duration::from_secs(1));
    if let Some(ms) = r.debug_heartbeat_ms {
        opts.heartbeat = Duration::from_millis(ms.max(50));
    }
    let rules = filter_rules(&a.filters)?;
    (opts.filter, opts.files_from) = filters(&rules, a.filters.files_from.as_deref())?;
    opts.rules = rules
        .into_iter()
        .map(|(include, pattern)| FilterRule { include, pattern })
        .collect();
    opts.delete = a.delete;
    opts.max_delete = a.max_delete;
    opts.quick_check = match (a.size_only, a.ignore_existing) {
        (true, _) => QuickCheck::Size,
        (_, true) => QuickCheck::Exists,
        _ => QuickCheck::SizeAndMtime,
    };
    // -a, -r, -X, -A ask for what is done by default.
    let _ = (a.archive, a.recursive, a.xattrs, a.acls);
    opts.meta.xattrs.user = !a.no_xattrs;
    opts.meta.xattrs.acls = !a.no_acls;
    opts.meta.xattrs.all = a.all_xattrs;
    opts.meta.owner = !a.no_owner;
    Ok(client)
}

/// The walk's filters, and the `--files-from` file's contents as read (for a pull's
/// server, which parses them again).
type Filters = (Option<Arc<Filter>>, Option<Vec<u8>>);

/// The `--include`/`--exclude` rules in command-line order, `(include, pattern)`,
/// with the patterns of `--exclude-from`/`--include-from` files read in their place
/// (rsync's reading: one per line, a `\r` before the newline dropped, blank lines and
/// lines starting with `#` or `;` skipped, `+ PATTERN` an include and `- PATTERN` an
/// exclude whichever option read it; `-` is stdin, once).
pub fn filter_rules(f: &FilterArgs) -> anyhow::Result<Vec<(bool, Vec<u8>)>> {
    let stdin_users = f
        .rules
        .iter()
        .filter(|r| matches!(r, FilterArg::From(_, p) if p.as_os_str() == "-"))
        .count()
        + usize::from(
            f.files_from
                .as_deref()
                .is_some_and(|p| p.as_os_str() == "-"),
        );
    if stdin_users > 1 {
        return Err(usage(
            "stdin (-) can be read once: by one of --exclude-from, --include-from and \
             --files-from",
        ));
    }
    let mut rules = Vec::new();
    for r in &f.rules {
        match r {
            FilterArg::Rule(include, p) => rules.push((*include, p.as_bytes().to_vec())),
            FilterArg::From(include, file) => {
                let option = if *include {
                    "--include-from"
                } else {
                    "--exclude-from"
                };
                let text = read_list(file, option)?;
                rules.extend(rules_of_file(&text, *include).map_err(|line| {
                    usage(format!(
                        "{option} {}: line {line}: `!` (clear the rules) is not supported",
                        file.display()
                    ))
                })?);
            }
        }
    }
    Ok(rules)
}

/// A list file's bytes (`-`: stdin).
fn read_list(file: &std::path::Path, option: &str) -> anyhow::Result<Vec<u8>> {
    if file.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
            .with_context(|| format!("reading {option} from stdin"))?;
        Ok(v)
    } else {
        std::fs::read(file).with_context(|| format!("reading {option} {}", file.display()))
    }
}

/// The rules of an `--exclude-from` (`include` false) or `--include-from` file's
/// bytes, as rsync reads them; `Err(line)`: the line (from 1) of a `!`.
fn rules_of_file(text: &[u8], include: bool) -> Result<Vec<(bool, Vec<u8>)>, usize> {
    let mut out = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line.starts_with(b"#") || line.starts_with(b";") {
            continue;
        }
        if line == b"!" {
            return Err(n + 1);
        }
        out.push(match line {
            [b'+', b' ', rest @ ..] => (true, rest.to_vec()),
            [b'-', b' ', rest @ ..] => (false, rest.to_vec()),
            _ => (include, line.to_vec()),
        });
    }
    Ok(out)
}

/// The walk's filters from the rules ([`filter_rules`]) and `--files-from` (`-`:
/// stdin).
fn filters(
    rules: &[(bool, Vec<u8>)],
    files_from: Option<&std::path::Path>,
) -> anyhow::Result<Filters> {
    if rules.is_empty() && files_from.is_none() {
        return Ok((None, None));
    }
    let mut filter = Filter::none();
    for (include, pattern) in rules {
        let action = if *include {
            Action::Include
        } else {
            Action::Exclude
        };
        let rule = Rule::new(action, pattern).map_err(|e| {
            usage(format!(
                "--{} {}: {e}",
                if *include { "include" } else { "exclude" },
                String::from_utf8_lossy(pattern)
            ))
        })?;
        filter.push(rule);
    }
    let mut list = None;
    if let Some(file) = files_from {
        let bytes = read_list(file, "--files-from")?;
        filter.set_files_from(&bytes).map_err(usage)?;
        list = Some(bytes);
    }
    Ok((Some(Arc::new(filter)), list))
}

/// `dmover sync --watch` (`dmover sync` with `--watch`).
fn watch(a: &CpArgs, env: &Env) -> anyhow::Result<WatchJob> {
    let (src, server, dest, users, routes) = watch_endpoints(a, env)?;
    if a.dry_run || a.checksum || a.size_only || a.ignore_existing || a.filters.files_from.is_some()
    {
        return Err(usage(
            "--watch does not take --dry-run, --checksum, --size-only, --ignore-existing or \
             --files-from",
        ));
    }
    if a.max_delete.is_some() && !a.delete {
        return Err(usage("--max-delete limits --delete: add --delete"));
    }
    let root = PathBuf::from(std::ffi::OsStr::from_bytes(&src));
    if !std::fs::metadata(&root)
        .with_context(|| format!("watching {}", root.display()))?
        .is_dir()
    {
        return Err(usage(format!(
            "--watch: {} is not a directory",
            root.display()
        )));
    }
    let quiet_time = a.quiet_time.unwrap_or(QUIET_TIME);
    let mut client = copy_options(a, env, &users, &routes)?;
    // A file being written when read is left for its next close, not a failure.
    client.options.continue_on_error = true;
    client.options.mirror = true;
    client.options.resume = true;
    Ok(WatchJob {
        src,
        server,
        dest,
        client,
        quiet_time,
        delete: a.delete,
        json: a.json,
        quiet: a.quiet,
    })
}

/// A watch's local source, the server, the mirror's path on it, and the users the
/// endpoints name.
type WatchEnds = (Vec<u8>, String, Vec<u8>, Vec<String>, Vec<Route>);

/// The [`WatchEnds`] of `a`.
fn watch_endpoints(a: &CpArgs, env: &Env) -> anyhow::Result<WatchEnds> {
    let (mut srcs, dst, users, routes) = endpoints(a, env)?;
    let src = srcs.remove(0);
    let Endpoint::Local(src) = src else {
        return Err(usage("watch needs a local source"));
    };
    let Endpoint::Remote { server, path } = dst else {
        return Err(usage(
            "watch needs a server as destination (HOST:PATH) for now",
        ));
    };
    let name = path
        .split(|&b| b == b'/')
        .rfind(|c| !c.is_empty())
        .unwrap_or_default();
    if name.is_empty() || name == b"." || name == b".." {
        return Err(usage(
            "sync: DST must name the mirror directory itself (not '.', '..' or a server's root)",
        ));
    }
    Ok((src, server, path, users, routes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_files_are_read_as_rsync_reads_them() {
        let text = b"# comment\n; comment\n\n*.log\r\n+ keep.log\n- tmp/\n  spaced \n#x\n";
        let r = |include| rules_of_file(text, include).unwrap();
        let b = |s: &str| s.as_bytes().to_vec();
        assert_eq!(
            r(false),
            vec![
                (false, b("*.log")),
                (true, b("keep.log")),
                (false, b("tmp/")),
                (false, b("  spaced ")),
            ]
        );
        assert_eq!(r(true)[0], (true, b("*.log")));
        assert_eq!(r(true)[2], (false, b("tmp/")));
        assert_eq!(rules_of_file(b"a\n!\n", false), Err(2));
        assert_eq!(rules_of_file(b"", true), Ok(Vec::new()));
    }

    #[test]
    fn rule_files_keep_their_place_among_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ex");
        std::fs::write(&file, "*.o\n+ a.o\n").unwrap();
        let f = FilterArgs {
            rules: vec![
                FilterArg::Rule(true, "x.o".into()),
                FilterArg::From(false, file.clone()),
                FilterArg::Rule(false, "y".into()),
            ],
            files_from: None,
        };
        let got = filter_rules(&f).unwrap();
        let want: Vec<(bool, Vec<u8>)> =
            [(true, "x.o"), (false, "*.o"), (true, "a.o"), (false, "y")]
                .iter()
                .map(|(i, p)| (*i, p.as_bytes().to_vec()))
                .collect();
        assert_eq!(got, want);
        let missing = FilterArgs {
            rules: vec![FilterArg::From(true, dir.path().join("nope"))],
            files_from: None,
        };
        let e = format!("{:#}", filter_rules(&missing).unwrap_err());
        assert!(e.contains("--include-from"), "{e}");
    }
}
