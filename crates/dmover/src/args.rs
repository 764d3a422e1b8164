//! The low arguments: what clap parses for the commands of [`crate::cli`] (the flag
//! groups they share — transfer, reliability, filters — and the arguments of cp/sync,
//! serve, mount, demo, credential, completions and man), the value parsers, and
//! [`UsageError`]. Parsed and validated without touching the machine; reading files and
//! the environment is [`crate::resolve`]'s.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use dmover_proto::units::{parse_duration, parse_size};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write dmover.1 and a page per subcommand (dmover-cp.1, ...) into this directory
    /// (which must exist) instead of printing dmover.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Options shared by everything that moves data.
#[derive(Debug, Clone, Args)]
pub struct TransferArgs {
    /// Parallel TCP data streams, pinned [default: the client config's `streams`, else
    /// tuned while the data flows: starts with 4 of 16 and keeps the count that sends
    /// fastest; docs/tuning.md]. Not
    /// rsync's -P (--partial --progress): the bar shows by default on a terminal, and
    /// --resume goes on from an interrupted copy.
    #[arg(short = 'P', long, value_parser = parse_streams, value_name = "N")]
    pub streams: Option<u16>,
    /// Chunk size: the unit of I/O, sending and checksumming (64K..64M, a multiple of
    /// 4K; binary units: 4M = 4MB = 4 MiB), or auto: 16M when files average 16 MiB or
    /// more, else 4M; files under 1 MiB on average go in 1M chunks on links of 20 ms or
    /// more, and in 64 chunks or more (256K at least) when they total under 64 MiB.
    #[arg(long, default_value = "auto", value_parser = parse_chunk)]
    pub chunk: u32,
    /// Do not compute chunk CRCs or end-to-end file digests.
    #[arg(long)]
    pub no_checksum: bool,
    /// Always use direct I/O (O_DIRECT) for files of 128 KiB and more, on both ends.
    /// [default: writes direct, reads direct unless the data is already cached]
    #[arg(long, conflicts_with = "buffered_io")]
    pub direct_io: bool,
    /// Never use direct I/O: everything through the page cache.
    #[arg(long)]
    pub buffered_io: bool,
    /// fsync each received file before giving it its final name.
    #[arg(long)]
    pub fsync: bool,
    /// Disk I/O threads on this side [default: 8 at the start, and more while the
    /// transfer runs when jobs wait for a thread and more threads move more data, up
    /// to 64; docs/tuning.md]. A number pins it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub io_threads: Option<u16>,
    /// Chunk buffers in the pool [default: streams + io threads + 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=65536))]
    pub buffers: Option<u32>,
    /// Socket send and receive buffer size for data streams, e.g. 64M (disables
    /// autotuning; size it to rate × RTT) [default: kernel autotuning, within the
    /// session's share, raised to it past a lower host limit (docs/tuning.md)].
    #[arg(long, value_parser = parse_size)]
    pub tcp_buffer: Option<u64>,
    /// TCP congestion control for data streams (e.g. bbr, cubic) [default: system's];
    /// a pull asks the server to send with it (a server that lacks it warns).
    #[arg(long)]
    pub congestion: Option<String>,
    /// Bandwidth limit of the transfer, all streams together, paced on this side: a
    /// rate that says bits or bytes (500Mbit, 1gbit, 60MB/s, 100MiB/s; a bare number
    /// is refused). A server's own limit for the user or export holds if lower.
    #[arg(long, value_parser = dmover_core::access::parse_bwlimit, value_name = "RATE")]
    pub bwlimit: Option<u64>,
    /// File holding the token the server requires (or set DMOVER_TOKEN) [default: the
    /// client config's, docs/client.md].
    #[arg(help_heading = "Security", long)]
    pub token_file: Option<PathBuf>,
    /// Ed25519 private key to authenticate with (from `dmover credential key`)
    /// [default: the client config's, docs/client.md].
    #[arg(help_heading = "Security", long, env = "DMOVER_KEY")]
    pub key: Option<PathBuf>,
    /// User name on the server: a dmover user of its configuration, not an account
    /// on its host; `USER@HOST:PATH` names it too [env: DMOVER_USER; default: the
    /// client config's profile of the host, else its `[defaults]`].
    #[arg(help_heading = "Security", long, value_name = "NAME")]
    pub user: Option<String>,
    /// Known-hosts file pinning servers' keys on first use [default: the client
    /// config's `known_hosts`, else ~/.config/dmover/known_hosts].
    #[arg(help_heading = "Security", long, env = "DMOVER_KNOWN_HOSTS")]
    pub known_hosts: Option<PathBuf>,
    /// Trust servers whose certificate a CA in this PEM file signed, instead of pinning
    /// (takes precedence over --known-hosts).
    #[arg(help_heading = "Security", long)]
    pub ca: Option<PathBuf>,
    /// Encrypt the data streams (AES-256-GCM), not just authenticate them.
    #[arg(help_heading = "Security", long)]
    pub encrypt: bool,
    /// Send data unauthenticated (no per-record MAC; the join is still proven).
    /// Only for networks you trust.
    #[arg(help_heading = "Security", long, conflicts_with = "encrypt")]
    pub plain_data: bool,
}

#[derive(Debug, Args)]
#[command(override_usage = "dmover cp [OPTIONS] SRC... DST")]
pub struct CpArgs {
    /// Sources and destination: local paths, `[USER@]HOST:PATH`, or
    /// `dmover://[USER@]HOST[:PORT]/PATH`. Paths on a server are relative to its root;
    /// USER is a dmover user of the server (as --user), not an account on its host; with
    /// no server named, both sides are local. Directories are copied with everything
    /// below them (-r or not). `-` (cp only, one file, no --resume): `cp - DST` reads
    /// stdin to its end (into a temporary file in TMPDIR first) and writes the file DST,
    /// whose directory must exist; `cp HOST:PATH -` writes the file to stdout as it
    /// arrives, each chunk's CRC checked first and the file's digest at the end: a
    /// failed check exits 1 with the bytes already written (discard the output), as
    /// with curl or xrdcp.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<OsString>,
    #[command(flatten, next_help_heading = "Transfer")]
    pub transfer: TransferArgs,
    #[command(flatten, next_help_heading = "Reliability")]
    pub reliability: ReliabilityArgs,
    #[command(flatten, next_help_heading = "Filters")]
    pub filters: FilterArgs,
    /// Print one JSON object with the results on stdout at the end (fields:
    /// docs/json.md).
    #[arg(help_heading = "Output", long)]
    pub json: bool,
    /// How to show progress: `bar` on stderr (a bar on a terminal, else a status line
    /// every --progress-interval), `ndjson` one JSON line on stdout per
    /// --progress-interval and per event (retry, lost stream), the last line being the
    /// --json summary (docs/json.md), or `none`. A bare --progress is `bar` (a path
    /// named bar, ndjson or none after it: write --progress=bar).
    #[arg(help_heading = "Output", 
        long,
        value_enum,
        default_value_t = ProgressMode::Bar,
        value_name = "MODE",
        num_args = 0..=1,
        default_missing_value = "bar"
    )]
    pub progress: ProgressMode,
    /// Time between two `--progress ndjson` lines (default 1s), or between two status
    /// lines of `--progress bar` when stderr is not a terminal (default 10s): a
    /// duration with a unit (500ms, 1s, 1m).
    #[arg(help_heading = "Output", long, value_parser = parse_interval, value_name = "D")]
    pub progress_interval: Option<std::time::Duration>,
    /// No progress bar, no status lines and no summary line (errors are still printed).
    #[arg(help_heading = "Output", short, long)]
    pub quiet: bool,
    /// A copy between two servers: `push` (the source server dials the destination,
    /// the default) or `pull` (the destination dials the source), for sites where only
    /// one side accepts connections (docs/third-party.md).
    #[arg(
        help_heading = "Between servers",
        long,
        value_enum,
        value_name = "MODE"
    )]
    pub tpc: Option<TpcArg>,
    /// A copy between two servers that cannot reach each other: the data goes through
    /// this client (pulled from the source and pushed to the destination at once, in
    /// bounded memory; this client's link carries it twice). docs/third-party.md.
    #[arg(help_heading = "Between servers", long, conflicts_with = "tpc")]
    pub via_client: bool,
    /// `--via-client`: the bytes of chunks the client holds for the destination
    /// (tests; at least two chunks).
    #[arg(long, hide = true, value_name = "BYTES")]
    pub debug_relay_bytes: Option<usize>,
    /// `sync`: after a successful transfer, delete destination entries the source does
    /// not have (never outside DST; entries the filters exclude are kept; nothing is
    /// deleted when the source walk was incomplete). docs/sync.md.
    #[arg(help_heading = "Sync", long)]
    pub delete: bool,
    /// `sync --delete`: delete at most N entries; the rest are reported and the exit
    /// code is 1.
    #[arg(help_heading = "Sync", long, value_name = "N")]
    pub max_delete: Option<u64>,
    /// Show what would be sent (`sync`: also skipped as unchanged, and deleted),
    /// changing nothing on either side. A push's `cp` walks the source here only.
    #[arg(help_heading = "Output", short = 'n', long)]
    pub dry_run: bool,
    /// `sync`: compare files of equal size by content (a digest each side computes)
    /// instead of size and mtime; files with the same content are not sent.
    #[arg(help_heading = "Sync", short = 'c', long)]
    pub checksum: bool,
    /// `sync`: a file whose size the destination's has is not sent, whatever its mtime
    /// (a pull gives the kept file the source's mtime; a push leaves it as it is).
    #[arg(help_heading = "Sync", long, conflicts_with_all = ["checksum", "ignore_existing"])]
    pub size_only: bool,
    /// `sync`: a file the destination has already (a regular file at its path) is not
    /// sent or changed at all, whatever its size, mtime or content.
    #[arg(help_heading = "Sync", long, conflicts_with = "checksum")]
    pub ignore_existing: bool,
    /// `sync` (push): after the sync, keep watching SRC and ship each file once it is
    /// closed after writing and quiet for `--quiet-time`; with `--delete`, deletes and
    /// renames are mirrored too. Runs until SIGINT/SIGTERM. docs/sync.md.
    #[arg(help_heading = "Sync", long)]
    pub watch: bool,
    /// `sync --watch`: how long a closed file must stay untouched before it ships (a
    /// writer that reopens it within that time is waited for). Default 200ms.
    #[arg(help_heading = "Sync", long, value_parser = parse_interval, value_name = "D")]
    pub quiet_time: Option<std::time::Duration>,
    /// Accepted for rsync habits: dmover preserves modes, mtimes, symlinks, xattrs,
    /// ACLs and (as root) owners by default.
    #[arg(help_heading = "Metadata", short = 'a', long)]
    pub archive: bool,
    /// Accepted for rsync and scp habits: dmover always copies a directory with
    /// everything below it.
    #[arg(help_heading = "Metadata", short = 'r', long)]
    pub recursive: bool,
    /// Accepted for rsync habits: `user.*` extended attributes are preserved by
    /// default (see --no-xattrs).
    #[arg(help_heading = "Metadata", short = 'X', long)]
    pub xattrs: bool,
    /// Accepted for rsync habits: POSIX ACLs are preserved by default (see
    /// --no-acls).
    #[arg(help_heading = "Metadata", short = 'A', long)]
    pub acls: bool,
    /// Do not copy `user.*` extended attributes (push: not sent; pull: not set).
    #[arg(help_heading = "Metadata", long, conflicts_with = "xattrs")]
    pub no_xattrs: bool,
    /// Do not copy POSIX ACLs.
    #[arg(help_heading = "Metadata", long, conflicts_with = "acls")]
    pub no_acls: bool,
    /// Also copy every other extended-attribute namespace (`trusted.*`,
    /// `security.*`, ...): a push reads and sends them (a server sets them only into an
    /// export with `xattrs = "all"`), a pull sets what such an export sends (setting
    /// `trusted.*` needs root).
    #[arg(help_heading = "Metadata", long, conflicts_with = "no_xattrs")]
    pub all_xattrs: bool,
    /// Do not copy numeric owners (kept by a destination that runs as root and, on
    /// a server, whose export has `preserve_owner = true`).
    #[arg(help_heading = "Metadata", long)]
    pub no_owner: bool,
}

/// Which source entries travel, with rsync's pattern rules (docs/sync.md): the first
/// matching `--include`/`--exclude` wins, in the order given on the command line,
/// `--exclude-from`/`--include-from` files' patterns at the file's place (which clap's
/// derive loses, hence the hand-written parts below). Sources of a push.
#[derive(Debug, Clone, Default)]
pub struct FilterArgs {
    /// The rules and rule files in command-line order.
    pub rules: Vec<FilterArg>,
    /// `--files-from FILE`.
    pub files_from: Option<PathBuf>,
}

/// One `--include`/`--exclude` argument, or a file of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterArg {
    /// `--include PATTERN` (`true`) or `--exclude PATTERN`.
    Rule(bool, OsString),
    /// `--include-from FILE` (`true`) or `--exclude-from FILE` (`-`: stdin): patterns
    /// one per line, read by [`crate::resolve`].
    From(bool, PathBuf),
}

impl clap::FromArgMatches for FilterArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut rules: Vec<(usize, FilterArg)> = Vec::new();
        for (id, include) in [("exclude", false), ("include", true)] {
            if let (Some(vals), Some(idx)) = (m.get_many::<OsString>(id), m.indices_of(id)) {
                rules.extend(
                    idx.zip(vals)
                        .map(|(i, v)| (i, FilterArg::Rule(include, v.clone()))),
                );
            }
        }
        for (id, include) in [("exclude_from", false), ("include_from", true)] {
            if let (Some(vals), Some(idx)) = (m.get_many::<PathBuf>(id), m.indices_of(id)) {
                rules.extend(
                    idx.zip(vals)
                        .map(|(i, v)| (i, FilterArg::From(include, v.clone()))),
                );
            }
        }
        rules.sort_by_key(|r| r.0);
        Ok(FilterArgs {
            rules: rules.into_iter().map(|(_, r)| r).collect(),
            files_from: m.get_one::<PathBuf>("files_from").cloned(),
        })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for FilterArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction, value_parser};
        cmd.arg(
            Arg::new("exclude")
                .long("exclude")
                .value_name("PATTERN")
                .action(ArgAction::Append)
                .value_parser(value_parser!(OsString))
                .help(
                    "Leave out entries matching PATTERN (rsync rules: a leading `/` anchors \
                     to the source root, `*` and `?` stay within a name, `**` crosses `/`, \
                     a trailing `/` matches directories only; an excluded directory is not \
                     descended into)",
                ),
        )
        .arg(
            Arg::new("include")
                .long("include")
                .value_name("PATTERN")
                .action(ArgAction::Append)
                .value_parser(value_parser!(OsString))
                .help("Send entries matching PATTERN (the first matching rule wins)"),
        )
        .arg(
            Arg::new("exclude_from")
                .long("exclude-from")
                .value_name("FILE")
                .action(ArgAction::Append)
                .value_parser(value_parser!(PathBuf))
                .help(
                    "--exclude each pattern of FILE, one per line, where the option stands \
                     among the others (rsync's: blank lines and lines starting with `#` or \
                     `;` skipped, a line starting with `+ ` is an --include, `- ` an \
                     --exclude; `-` reads stdin)",
                ),
        )
        .arg(
            Arg::new("include_from")
                .long("include-from")
                .value_name("FILE")
                .action(ArgAction::Append)
                .value_parser(value_parser!(PathBuf))
                .help("--include each pattern of FILE, as --exclude-from reads it"),
        )
        .arg(
            Arg::new("files_from")
                .long("files-from")
                .value_name("FILE")
                .value_parser(value_parser!(PathBuf))
                .help(
                    "Send only the paths listed in FILE (relative to the source, one per \
                     line), the directories leading to them and what is below listed \
                     directories",
                ),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `dmover cp --tpc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TpcArg {
    /// The source server dials the destination.
    Push,
    /// The destination server dials the source.
    Pull,
}

/// `dmover cp --progress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// A progress bar on stderr when it is a terminal.
    Bar,
    /// JSON lines on stdout.
    Ndjson,
    /// Nothing.
    None,
}

/// What `-P` is in dmover, for those who type rsync's `-P` (`--partial --progress`).
pub const STREAMS_NOT_PARTIAL: &str = "-P is the number of parallel data streams in dmover \
     (-P 8), not rsync's --partial --progress: the progress bar shows by default on a \
     terminal (--progress), and an interrupted copy goes on with --resume (a sync goes on \
     by itself)";

/// Parses `-P`/`--streams`: 1 to 128; a word says what `-P` is in dmover.
fn parse_streams(s: &str) -> Result<u16, String> {
    match s.parse::<u64>() {
        Ok(n) if (1..=128).contains(&n) => Ok(n as u16),
        Ok(n) => Err(format!("{n} is not in 1..=128")),
        Err(_) => Err(STREAMS_NOT_PARTIAL.to_string()),
    }
}

/// The rsync habits that clap cannot take as they are, made into what it takes, for
/// `cp` and `sync` (`argv` with the program's name first; nothing after `--`):
/// - a bare `--progress` (followed by nothing, an option or a path, not by `bar`,
///   `ndjson` or `none`) is `--progress=bar`, so it does not take the path as its
///   value;
/// - `-P` with no count after it (`-avP SRC DST` as the last option, or before
///   another option) is refused saying what `-P` is ([`STREAMS_NOT_PARTIAL`]); a word
///   after it is refused by its value parser with the same words.
pub fn habits(mut argv: Vec<OsString>) -> Result<Vec<OsString>, (&'static str, String)> {
    // The subcommand: the first word that is not an option (`--log-format`, before
    // it, takes a value).
    let mut i = 1;
    while let Some(a) = argv.get(i) {
        match a.to_str() {
            Some("--log-format") => i += 2,
            Some(o) if o.starts_with('-') => i += 1,
            _ => break,
        }
    }
    let sub = match argv.get(i).and_then(|a| a.to_str()) {
        Some("cp") => "cp",
        Some("sync") => "sync",
        _ => return Ok(argv),
    };
    let end = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    let modes = ["bar", "ndjson", "none"];
    for j in i + 1..end {
        let Some(a) = argv[j].to_str().map(str::to_string) else {
            continue;
        };
        let next = argv[..end].get(j + 1).and_then(|n| n.to_str());
        let bare = a == "--progress" && !next.is_some_and(|n| modes.contains(&n));
        let cluster = a.len() >= 2
            && a.starts_with('-')
            && !a.starts_with("--")
            && a[1..].bytes().all(|b| b.is_ascii_alphabetic());
        if cluster && a.ends_with('P') && next.is_none_or(|n| n.starts_with('-')) {
            return Err((sub, STREAMS_NOT_PARTIAL.to_string()));
        }
        if bare {
            argv[j] = OsString::from("--progress=bar");
        }
    }
    Ok(argv)
}

/// Parses `--progress-interval`: a duration of at least 10 ms.
fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < std::time::Duration::from_millis(10) {
        return Err(format!("{s:?} is too short: at least 10ms"));
    }
    Ok(d)
}

/// Resume, retries and error handling of `dmover cp`.
#[derive(Debug, Clone, Args)]
pub struct ReliabilityArgs {
    /// Resume an interrupted copy: send only what the destination's journal says is
    /// missing (files changed since are sent again whole).
    #[arg(long)]
    pub resume: bool,
    /// Start again, resuming, up to N times after a failure that may pass (network,
    /// busy server, a file changed while read) [default: 0, or the client config's
    /// `retries`].
    #[arg(long, value_name = "N")]
    pub retries: Option<u32>,
    /// Pause before each retry: a duration with a unit (500ms, 5s, 1m; units ns, us,
    /// ms, s, m, h) [default: 5s, or the client config's `retry_wait`].
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    pub retry_wait: Option<std::time::Duration>,
    /// How long to keep connecting again to a server that answers busy (too many
    /// connections in set-up or sessions) or refuses the session for now (your user's
    /// session limit, its memory budget), whatever --retries says: after the wait it
    /// asks for (1s for a refusal), doubled each time (at most 8s), jittered; 0 fails
    /// at once (exit 4) [default: 60s, or the client config's `busy_wait`].
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    pub busy_wait: Option<std::time::Duration>,
    /// Skip source files that cannot be read (vanished, unreadable, changed while
    /// read), copy the rest, list the skipped ones and exit with 23 (as rsync).
    #[arg(long)]
    pub continue_on_error: bool,
    /// Re-read every file at the destination after fsync and compare its digest
    /// with the source's before giving it its final name.
    #[arg(long, conflicts_with = "no_checksum")]
    pub verify: bool,
    /// Keep no resume journal at the destination (a failed copy cannot resume).
    #[arg(long, conflicts_with = "resume")]
    pub no_journal: bool,
    /// A data stream that makes no progress for this long (nothing received, nothing
    /// sent, or no acknowledgement of the chunks in flight on it) is declared broken and
    /// its chunks are sent on the other streams: a duration with a unit (30s, 2m).
    #[arg(long, default_value = "120s", value_parser = parse_duration, value_name = "D")]
    pub stream_timeout: std::time::Duration,
    /// Heartbeat interval on the control channel, in milliseconds (tests).
    #[arg(long, hide = true)]
    pub debug_heartbeat_ms: Option<u64>,
}

/// `dmover mount`.
#[derive(Debug, Clone, Args)]
pub struct MountArgs {
    /// The server's directory: `dmover://[USER@]HOST[:PORT]/PATH` or
    /// `[USER@]HOST:PATH` (relative to its root; USER as --user).
    #[arg(value_name = "SOURCE")]
    pub source: OsString,
    /// The mount point: an existing directory.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// How long names, attributes and listings are trusted: after it, the next lookup
    /// sees the server's changes (a duration with a unit: 500ms, 1s, 1m).
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "D")]
    pub attr_timeout: std::time::Duration,
    /// The longest any file system call waits for the server before it fails with EIO.
    #[arg(long, default_value = "30s", value_parser = parse_timeout, value_name = "D")]
    pub timeout: std::time::Duration,
    /// Most bytes of file data kept in memory per session (least recently used out).
    #[arg(long, default_value = "256M", value_parser = parse_size, value_name = "SIZE")]
    pub cache: u64,
    /// Chunks asked for ahead of a sequential read [default: 8 MiB of chunks, 128 of
    /// the default 64 KiB].
    #[arg(long, value_name = "N")]
    pub read_ahead: Option<u64>,
    /// Read-write, whole files: files created or rewritten are written locally and
    /// uploaded complete at close (staging and rename on the server, as copies do;
    /// close reports a failed upload; an existing file opened without O_TRUNC is
    /// fetched first, up to 256 MiB); mkdir, unlink, rmdir, rename and truncate work on
    /// the server (errno table: docs/remote.md).
    #[arg(long)]
    pub rw: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
    /// Heartbeat interval on the control channel, in milliseconds (tests).
    #[arg(long, hide = true)]
    pub debug_heartbeat_ms: Option<u64>,
}

/// Parses `--timeout`: at least 1s.
pub(crate) fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("{s:?} is too short: at least 1s"));
    }
    Ok(d)
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Directory to serve; clients' paths are relative to it and cannot leave it.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    pub root: Option<PathBuf>,
    /// Configuration file (TOML): exports, users with tokens or keys and rights, limits.
    /// SIGHUP reads its users and exports again (the token of --token-file too): the
    /// sessions of a user removed, or whose credential or rights changed, end with
    /// "credential revoked"; the others go on. A file that does not parse keeps the
    /// users and exports in force.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory of the server's TLS key, created on first start
    /// [default: /var/lib/dmover for root, else ~/.local/state/dmover].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Present this certificate chain (PEM) instead of a self-signed one (with --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Check the configuration file (and these flags) as a start would, without
    /// listening or writing anything (not even a first key), and exit: 0 with one line
    /// saying what it would serve, or 2 naming the key (and its line) at fault.
    #[arg(long)]
    pub check: bool,
    /// Address to listen on [default: [::]:7700 (IPv6 and IPv4 on one socket; IPv4
    /// alone where IPv6 is off) with credentials, 127.0.0.1:7700 without; config
    /// listen].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Refuse pushes [config: read_only].
    #[arg(long)]
    pub read_only: bool,
    /// Allow third-party copies (`dmover cp dmover://A/.. dmover://B/..`) to read from
    /// and write to every export; with --config, per export `third_party = true`.
    #[arg(long)]
    pub third_party: bool,
    /// Pushed files keep their numeric owner (when the server runs as root) on every
    /// export; with --config, per export `preserve_owner = true`. Off by default.
    #[arg(long)]
    pub preserve_owner: bool,
    /// Every extended-attribute namespace travels on every export (`trusted.*`,
    /// `security.*`, ... besides `user.*` and ACLs: pushed files get what the client
    /// sent, pulls send them); with --config, per export `xattrs = "all"`.
    #[arg(long)]
    pub all_xattrs: bool,
    /// The address other servers dial for third-party copies (e.g. an address on a
    /// data network), the only one the capabilities this server issues name; without
    /// it, the address the steering client reached this server at; config
    /// `tpc_address`.
    #[arg(long, value_name = "HOST:PORT")]
    pub tpc_address: Option<String>,
    /// A server this one may dial for third-party copies, by key fingerprint
    /// (`sha256:...`, as `dmover doctor` or a client's known-hosts file shows it);
    /// repeatable. Without any, it dials any server the steering client pinned, at the
    /// address that server named for itself; config `tpc_peers`.
    #[arg(long = "tpc-peer", value_name = "FINGERPRINT")]
    pub tpc_peers: Vec<String>,
    /// File holding the shared token clients must prove. Without one (or --config) the
    /// server only listens on loopback.
    #[arg(long, conflicts_with = "config")]
    pub token_file: Option<PathBuf>,
    /// Disk I/O threads shared by all sessions [default: 8 at the start, and more
    /// while sessions run when jobs wait for a thread and more threads move more data,
    /// up to 64; docs/tuning.md]. A number pins it [config: io_threads].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub io_threads: Option<u16>,
    /// Network threads shared by all sessions [default: number of cores; config:
    /// net_threads].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub net_threads: Option<u16>,
    /// Sessions at once; more are answered busy (clients come back, see `cp
    /// --busy-wait`) [default: 64, or the config's].
    #[arg(long, value_parser = parse_at_least_one)]
    pub max_sessions: Option<usize>,
    /// Connections in set-up (before TLS and authentication are done, or a data
    /// stream joined) at once. Beyond it a client's control connection is answered
    /// "busy, retry after N s" before TLS (clients wait and connect again by
    /// themselves, see `cp --busy-wait`); beyond 4 times it connections are answered
    /// busy and closed [default: 256, or the config's].
    #[arg(long, value_parser = parse_at_least_one, value_name = "N")]
    pub max_handshakes: Option<usize>,
    /// Connections one source address may have before they authenticate or join (0:
    /// no limit); more are answered busy. Raise it for clients behind one NAT address
    /// [default: 64, or the config's max_unauthenticated_per_address].
    #[arg(long, value_name = "N")]
    pub max_unauthenticated_per_address: Option<usize>,
    /// Memory all sessions' manifests may take together (e.g. 1G; binary units); a
    /// manifest that does not fit beside the others' is refused as busy [default: a
    /// quarter of the host's memory, at most 4G, or the config's manifest_memory].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub manifest_memory: Option<u64>,
    /// Most memory the manifest of a pull or of `sync --checksum`'s digests (the ops a
    /// read-only user can run) may take, per session [default: 256M, or the config's
    /// max_manifest_bytes_read].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_manifest_bytes_read: Option<u64>,
    /// Memory for chunk buffers shared by all sessions (e.g. 512M, 2G; binary units;
    /// at least 2M). A session needs two buffers of its chunk size, and is refused if
    /// they do not fit [default: 2G, or the config's memory].
    #[arg(long, value_parser = parse_memory, value_name = "SIZE")]
    pub memory: Option<u64>,
    /// Socket buffer size for accepted connections, e.g. 64M [default: kernel
    /// autotuning, within each session's share, raised to it past a lower host limit
    /// (docs/tuning.md, "Socket buffers"); config tcp_buffer].
    #[arg(long, value_parser = parse_size)]
    pub tcp_buffer: Option<u64>,
    /// TCP congestion control this server sends data with when the client names none
    /// [default: system's; config congestion] (connections start on cubic;
    /// docs/protocol.md, Limits).
    #[arg(long)]
    pub congestion: Option<String>,
    /// Serve Prometheus metrics (/metrics), a live page of the transfers (/) and its
    /// JSON (/api/transfers) on this address, e.g. 127.0.0.1:9770 [default: the
    /// config's `metrics`, else none]. Loopback only, unless the config names
    /// `metrics_users` (then TLS and bearer tokens; docs/metrics.md).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Run the job service beside the server (docs/jobs.md): a queue of transfers in
    /// a database in the state directory, run by the service, and its REST API
    /// (bearer tokens of the server's users) [default: the config's `[jobs] enabled`].
    #[arg(long)]
    pub jobs: bool,
    /// The job service's REST API address [default: the config's `[jobs] listen`,
    /// else 127.0.0.1:7780]. Not loopback: TLS with the server's key.
    #[arg(long, value_name = "ADDR")]
    pub jobs_listen: Option<SocketAddr>,
    /// The job service's database: a PostgreSQL URL (`postgres://USER@HOST/DB`) that
    /// several services share, one per DTN (docs/cluster.md), or an SQLite file
    /// [default: the config's `[jobs] database`, else `jobs.sqlite` in the state
    /// directory].
    #[arg(long, value_name = "URL|FILE")]
    pub db: Option<String>,
    /// This service's name among those sharing a PostgreSQL job database (one live
    /// service per name) [default: the config's `[jobs] agent`, else the host's
    /// name].
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Fault injection for tests: sleep this many milliseconds per chunk read or written,
    /// on threads pinned at their start (`--io-threads`, else 8), so that a transfer lasts
    /// as long as the test needs.
    #[arg(long, hide = true, conflicts_with = "debug_io_latency_ms")]
    pub debug_chunk_delay_ms: Option<u64>,
    /// Storage emulation for benchmarks: every chunk read or written waits this many
    /// milliseconds on its disk thread (a parallel file system, where each I/O waits on
    /// a round trip); unlike --debug-chunk-delay-ms the disk threads stay tuned.
    #[arg(long, hide = true)]
    pub debug_io_latency_ms: Option<u64>,
    /// Fault injection for tests: cut the first data stream whose chunk payload passes
    /// BYTES, in the middle of a chunk (once); `BYTES:reset` cuts with a TCP reset.
    #[arg(long, hide = true, value_name = "BYTES[:reset]")]
    pub debug_cut_stream_after: Option<String>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Size multiplier of the generated dataset (1.0 ≈ 300 MiB).
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale, allow_negative_numbers = true)]
    pub scale: f64,
    /// Keep the temporary directory instead of removing it.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

#[derive(Debug, Args)]
pub struct CredentialArgs {
    #[command(subcommand)]
    pub command: CredentialCommand,
}

#[derive(Debug, Subcommand)]
pub enum CredentialCommand {
    /// Write a new random token to FILE (mode 0600) and print its verifier for the
    /// server's config (`token = "..."`); the server never stores the token itself.
    Token {
        /// Where to write the token (must not exist).
        file: PathBuf,
    },
    /// Print the verifier of an existing token file.
    Verifier {
        /// The token file.
        file: PathBuf,
    },
    /// Write a new Ed25519 key to FILE (mode 0600) and FILE.pub, and print the public
    /// key for the server's config (`keys = ["..."]`).
    Key {
        /// Where to write the private key (must not exist).
        file: PathBuf,
    },
}

/// A command line that makes no sense, found after clap parsed it (options that
/// contradict each other, a malformed `HOST:PATH`): `dmover` exits with 2, as for the
/// errors clap finds.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A [`UsageError`] as an `anyhow::Error`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Parses `--memory`: a size of at least 2 MiB, the two buffers of the smallest chunk
/// a session needs.
fn parse_memory(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < 2 << 20 {
        return Err(format!(
            "{s:?} is too little: sessions need two chunk buffers, at least 2M"
        ));
    }
    Ok(v)
}

/// Parses a dataset scale: a number above 0, at most 1e6 (what the generator takes).
pub(crate) fn parse_scale(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0 && *v <= 1e6)
        .ok_or_else(|| format!("scale {s:?} must be a number above 0 and at most 1e6"))
}

/// Parses a count of at least 1.
fn parse_at_least_one(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| format!("{s:?} is not a whole number of at least 1"))
}

/// Parses a chunk size; `auto` is 0.
fn parse_chunk(s: &str) -> Result<u32, String> {
    if s == "auto" {
        return Ok(0);
    }
    chunk_size(s)
}

/// Parses a chunk size ([`parse_size`]) and checks it is one the protocol allows.
pub(crate) fn chunk_size(s: &str) -> Result<u32, String> {
    let v = parse_size(s)?;
    u32::try_from(v)
        .ok()
        .filter(|&c| dmover_proto::layout::validate_chunk_size(c).is_ok())
        .ok_or_else(|| format!("chunk size {s:?} must be a multiple of 4K from 64K to 64M"))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks() {
        assert_eq!(parse_chunk("1M"), Ok(1 << 20));
        assert_eq!(parse_chunk("64K"), Ok(64 << 10));
        assert_eq!(parse_chunk("4MB"), Ok(4 << 20));
        assert_eq!(parse_chunk("auto"), Ok(0));
        assert!(parse_chunk("1000").is_err());
        assert!(parse_chunk("128M").is_err());
        assert!(parse_chunk("1gb").is_err());
        assert!(parse_chunk("4X").unwrap_err().contains("K/KiB"));
    }

    #[test]
    fn streams_say_what_p_is() {
        assert_eq!(parse_streams("8"), Ok(8));
        assert_eq!(parse_streams("0"), Err("0 is not in 1..=128".into()));
        assert_eq!(parse_streams("129"), Err("129 is not in 1..=128".into()));
        assert_eq!(parse_streams("src"), Err(STREAMS_NOT_PARTIAL.into()));
    }

    #[test]
    fn rsync_habits_are_made_into_arguments() {
        let h = |a: &[&str]| {
            let argv: Vec<OsString> = a.iter().map(OsString::from).collect();
            habits(argv).map(|v| {
                v.iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        assert_eq!(
            h(&["dmover", "cp", "--progress", "a", "h:"]),
            Ok("dmover cp --progress=bar a h:".into())
        );
        assert_eq!(
            h(&["dmover", "-v", "sync", "a", "h:m", "--progress"]),
            Ok("dmover -v sync a h:m --progress=bar".into())
        );
        assert_eq!(
            h(&["dmover", "cp", "--progress", "-q", "a", "h:"]),
            Ok("dmover cp --progress=bar -q a h:".into())
        );
        for mode in ["bar", "ndjson", "none"] {
            let line = format!("dmover cp --progress {mode} a h:");
            let args: Vec<&str> = line.split(' ').collect();
            assert_eq!(h(&args), Ok(line.clone()));
        }
        // Not after `--`, not for other commands.
        assert_eq!(
            h(&["dmover", "cp", "--", "--progress", "h:"]),
            Ok("dmover cp -- --progress h:".into())
        );
        assert_eq!(
            h(&["dmover", "--log-format", "json", "bench", "--progress", "x"]),
            Ok("dmover --log-format json bench --progress x".into())
        );
        // A -P with no count.
        for bad in [
            &["dmover", "cp", "a", "h:", "-avP"][..],
            &["dmover", "cp", "-P", "--resume", "a", "h:"],
            &["dmover", "sync", "a", "h:m", "-P"],
        ] {
            assert_eq!(h(bad), Err((bad[1], STREAMS_NOT_PARTIAL.into())), "{bad:?}");
        }
        // A count, or a word its value parser refuses with the same words.
        assert_eq!(
            h(&["dmover", "cp", "-avP", "8", "a", "h:"]),
            Ok("dmover cp -avP 8 a h:".into())
        );
        assert_eq!(
            h(&["dmover", "cp", "-avP", "a", "h:"]),
            Ok("dmover cp -avP a h:".into())
        );
    }

    #[test]
    fn counts_scales_and_memory_are_checked() {
        assert_eq!(parse_scale("0.5"), Ok(0.5));
        for bad in ["0", "-1", "nan", "inf", "2e6", "x"] {
            assert!(parse_scale(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_at_least_one("3"), Ok(3));
        assert!(parse_at_least_one("0").is_err());
        assert_eq!(parse_memory("2M"), Ok(2 << 20));
        assert!(parse_memory("1M").unwrap_err().contains("at least 2M"));
    }
}
