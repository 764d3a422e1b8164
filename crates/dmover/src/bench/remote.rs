//! `dmover bench remote`: seed 000's workloads A–D (1, 10, 100, 1000 files accessed at
//! once) against a server, through the library API ([`Remote`]) or through a real
//! `dmover mount`, with per-I/O latency percentiles and throughput (docs/remote.md).
//!
//! The command makes its own test files: it writes them into a local temporary
//! directory, pushes that as a new directory `.dmover-bench-PID-NANOS` into the target
//! directory, measures, and removes that directory from the server afterwards (an
//! `Op::Prune` restricted to it, [`Client::remove_in`]), also after an error or
//! Ctrl-C. Reads go to `r/rNNNN`; writes create new files in `w/` (through the API:
//! [`StagedFile`]s, uploaded at close), so reads and writes never share a file.
//!
//! Every I/O is timed from its submission (the call) to its completion (the call's
//! return); `--queue-depth N` keeps N I/Os in flight per file (N tasks or threads),
//! `--clients N` runs N independent sessions (N `Remote`s or N mounts) over the same
//! files.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use dmover_bench::plot::{Bar, Bars, Figure, Panel};
use dmover_bench::report::round_sig;
use dmover_bench::stats::Latency;
use dmover_core::client::Client;
use dmover_core::remote::{Remote, RemoteOptions, StagedFile};
use dmover_core::transfer::Endpoint;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

use super::common::{self, row};
use super::interrupt;
use crate::args::{TransferArgs, usage};
use crate::env::Env;
use crate::resolve::runtime;

/// Seed 000's workloads: how many files are accessed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// 1 file.
    A,
    /// 10 files.
    B,
    /// 100 files.
    C,
    /// 1000 files.
    D,
}

impl Workload {
    fn files(self) -> usize {
        match self {
            Workload::A => 1,
            Workload::B => 10,
            Workload::C => 100,
            Workload::D => 1000,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Workload::A => "A",
            Workload::B => "B",
            Workload::C => "C",
            Workload::D => "D",
        }
    }
}

/// Through what the files are accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// The library API: `dmover_core::remote::Remote::read_at` (one session per
    /// client) for reads, `StagedFile::write_at` and its upload at close for writes.
    Api,
    /// A `dmover mount` per client (this binary), plain file I/O from threads.
    Mount,
    /// Plain file I/O from threads in `--dir`: the target directory reached another
    /// way (sshfs, `rclone mount`, NFS, or the server's own disk), for comparison.
    Dir,
}

/// Reads, writes, or both at once (on separate files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mix {
    /// Reads of existing files.
    Read,
    /// New files written, each in `--block` writes up to `--file-size`, then closed
    /// (the close uploads it, through the API and through a mount).
    Write,
    /// Both at once: the workload's files read and as many new files written.
    #[value(name = "50/50")]
    Half,
}

/// Where reads land in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// Block-aligned offsets drawn uniformly.
    Random,
    /// One block after the other, from the start again at the end.
    Sequential,
}

/// Arguments of `dmover bench remote`.
#[derive(Debug, Args)]
pub struct RemoteBenchArgs {
    /// A writable directory on the server, below its export's root:
    /// `dmover://HOST[:PORT]/PATH`. The test files go into a new directory in it,
    /// removed afterwards.
    /// (Not with `--rtt`, which makes its own server.)
    #[arg(
        value_name = "TARGET",
        required_unless_present = "rtt",
        conflicts_with = "rtt"
    )]
    pub target: Option<OsString>,
    /// Run over an emulated link of this round-trip time instead (bare numbers are ms;
    /// root and /dev/net/tun, as `bench transfer --rtt`): the command starts a `dmover
    /// serve` of a temporary directory in the far namespace of a `dmover netlab` link
    /// and runs itself in the near one against it (its mounts too).
    #[arg(long, value_parser = super::transfer::rtt_item, value_name = "RTT")]
    pub rtt: Option<super::transfer::Rtt>,
    /// Bottleneck rate of the `--rtt` link, each way (1gbit, 500mbit, unlimited)
    /// [default: 1gbit].
    #[arg(long, value_parser = super::transfer::link_rate, value_name = "RATE")]
    pub rate: Option<super::transfer::LinkRate>,
    /// The RTT in ms a row reports (set by `--rtt` for its run in the namespace).
    #[arg(long, hide = true)]
    pub debug_rtt_ms: Option<f64>,
    /// Seed 000's workload: A, B, C, D = 1, 10, 100, 1000 files at once.
    #[arg(long, value_enum, ignore_case = true)]
    pub workload: Workload,
    /// Through the library API or through a `dmover mount` (FUSE).
    #[arg(long, value_enum, default_value_t = Via::Api)]
    pub via: Via,
    /// With `--via dir`: where TARGET's directory is seen here (a mount of it, or the
    /// directory itself on the server's machine).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Reads, writes of new files, or both at once (separate files).
    #[arg(long, value_enum, default_value_t = Mix::Read)]
    pub mix: Mix,
    /// Where reads land: random block-aligned offsets, or sequential.
    #[arg(long, value_enum, default_value_t = Pattern::Random)]
    pub pattern: Pattern,
    /// Size of each test file (read files are made this size; written files grow to
    /// it, then are closed and a new one begins).
    #[arg(long, default_value = "4M", value_parser = common::size_item, value_name = "SIZE")]
    pub file_size: u64,
    /// Bytes per I/O.
    #[arg(long, default_value = "128K", value_parser = common::size_item, value_name = "SIZE")]
    pub block: u64,
    /// I/Os in flight per file (tasks or threads, each waiting for its own).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), value_name = "N")]
    pub queue_depth: u32,
    /// How long I/Os are started (those in flight then are waited for and counted).
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds, value_name = "N")]
    pub seconds: f64,
    /// Stop each file's queue slot after N I/Os (reads or writes) even if time is left:
    /// a run of exactly files x queue depth x clients x N I/Os when it ends in time.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), value_name = "N")]
    pub ops: Option<u64>,
    /// Independent sessions (API) or mounts, each running the whole workload.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64), value_name = "N")]
    pub clients: u32,
    /// Chunk cache per session or mount (least recently used out); reads it answers
    /// cost no round trip.
    #[arg(long, default_value = "256M", value_parser = dmover_proto::units::parse_size, value_name = "SIZE")]
    pub cache: u64,
    /// The longest one I/O waits for the server before it counts as failed: an API
    /// read or upload (a write slot's close); given to the mounts as their `--timeout`
    /// (at least 1s).
    #[arg(long, default_value = "30s", value_parser = crate::args::parse_timeout, value_name = "D")]
    pub timeout: Duration,
    /// Read cold: once the test files are on the server, write back and drop this
    /// machine's page cache (`sync`, then `3` into /proc/sys/vm/drop_caches; root), so
    /// the server reads them from its disk. For a server on this machine (loopback,
    /// `--rtt`); a mount's own cache starts empty anyway.
    #[arg(long)]
    pub cold: bool,
    /// Also write the rows as CSV into this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Print the results as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the results into this file (.svg or .png): MiB/s and the latency
    /// percentiles of each kind of I/O.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 86400"
        )),
    }
}

/// What one kind of I/O measured.
#[derive(Debug, Default)]
struct Tally {
    lat_ns: Vec<u64>,
    bytes: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.lat_ns.extend(o.lat_ns);
        self.bytes += o.bytes;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn fail(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
}

/// The measurements of a run: reads, writes, closes (uploads), and the time they took.
#[derive(Debug, Default)]
struct Measured {
    read: Tally,
    write: Tally,
    close: Tally,
    seconds: f64,
    /// API only: (chunks received, chunks found in the cache).
    chunks: Option<(u64, u64, u64)>,
}

/// Columns of the CSV and the JSON rows, in order.
const COLUMNS: [&str; 25] = [
    "rtt_ms",
    "workload",
    "via",
    "op",
    "pattern",
    "files",
    "clients",
    "queue_depth",
    "block",
    "file_size",
    "seconds",
    "ops",
    "bytes",
    "mib_per_s",
    "iops",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "errors",
    "chunks_received",
    "parts_received",
    "cache_hits",
    "chunk_size",
];

/// `dmover bench remote`.
pub fn run(a: RemoteBenchArgs, env: &Env) -> anyhow::Result<()> {
    if a.rate.is_some() && a.rtt.is_none() {
        return Err(usage("--rate goes with --rtt"));
    }
    if let Some(rtt) = a.rtt {
        return over_link(a, rtt);
    }
    let target = a.target.clone().expect("clap: TARGET or --rtt");
    let (server, path) = match Endpoint::parse(target.as_bytes())
        .map_err(|e| usage(format!("{}: {e}", target.to_string_lossy())))?
    {
        Endpoint::Remote { server, path } => (server, path),
        Endpoint::Local(_) => {
            return Err(usage(format!(
                "{}: the target must be a directory on a server: dmover://HOST[:PORT]/PATH",
                target.to_string_lossy()
            )));
        }
    };
    if path.iter().all(|&b| b == b'/') {
        return Err(usage(format!(
            "{}: name a directory below the export's root (the test directory is removed \
             with a prune of it, which the root does not allow)",
            target.to_string_lossy()
        )));
    }
    if (a.via == Via::Dir) != a.dir.is_some() {
        return Err(usage(
            "--dir DIR goes with --via dir (and --via dir needs --dir)",
        ));
    }
    if let Some(d) = &a.dir {
        if !d.is_dir() {
            return Err(usage(format!("--dir {}: not a directory", d.display())));
        }
    }
    if a.block > a.file_size {
        return Err(usage(format!(
            "--block {} is larger than --file-size {}",
            a.block, a.file_size
        )));
    }
    let reads = a.mix != Mix::Write;
    let writes = a.mix != Mix::Read;
    let mut setup = crate::resolve::client(&a.transfer, env)?;
    let opts = &mut setup.options;
    if opts.chunk_size == 0 {
        opts.chunk_size = crate::resolve::MOUNT_CHUNK;
    }
    let chunk_size = opts.chunk_size;
    interrupt::install().context("watching for Ctrl-C")?;
    let rt = runtime(opts.streams.max(4))?;
    let client = Arc::new(setup.client());
    let n = a.workload.files();

    // The target must be a directory whose entries the server lets this user delete
    // (a prune there, which an export's root does not allow): checked before anything
    // is made. Its mtime is given back after the cleanup.
    let shown = String::from_utf8_lossy(&path).into_owned();
    let mtime = rt
        .block_on(async {
            let m = client.dir_mtime(&server, &path).await?;
            client
                .remove_in(&server, &path, b".dmover-bench-check", m)
                .await?;
            Ok::<_, dmover_core::Error>(m)
        })
        .with_context(|| {
            format!(
                "{shown} on {server}: the target must be a writable directory below the \
                 export's root"
            )
        })?;

    // The test files, locally first.
    let local = tempfile::Builder::new()
        .prefix("dmover-bench-remote-")
        .tempdir()
        .context("a local temporary directory")?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!(".dmover-bench-{}-{nanos}", std::process::id());
    let tree = local.path().join(&name);
    make_files(&tree, if reads { n } else { 0 }, a.file_size)?;
    std::fs::create_dir_all(tree.join("w"))?;
    eprintln!(
        "creating {} test file{} of {} bytes in {}/{name} on {server}",
        if reads { n } else { 0 },
        if reads && n == 1 { "" } else { "s" },
        a.file_size,
        shown.trim_end_matches('/')
    );

    let measured = (|| -> anyhow::Result<Measured> {
        let run = dmover_core::engine::Run::new();
        let src = [tree.as_os_str().as_bytes().to_vec()];
        rt.block_on(client.push(&src, &server, &path, run))
            .context("pushing the test files to the server")?;
        interrupt::check()?;
        if a.cold {
            drop_caches()?;
        }
        let mut remote_dir = path.clone();
        while remote_dir.last() == Some(&b'/') {
            remote_dir.pop();
        }
        if !remote_dir.is_empty() {
            remote_dir.push(b'/');
        }
        remote_dir.extend_from_slice(name.as_bytes());
        match a.via {
            Via::Api => {
                // The write slots' staging files: here, removed with `local` whatever
                // happens (and each as its slot closes or drops it).
                let staging = local.path().join("staging");
                std::fs::create_dir_all(&staging)
                    .with_context(|| format!("creating {}", staging.display()))?;
                let api = Api {
                    rt: &rt,
                    client: &client,
                    server: &server,
                    remote_dir: &remote_dir,
                    name: &name,
                    staging: &staging,
                    chunk_size,
                };
                via_api(&api, &a, n, reads, writes)
            }
            Via::Mount => {
                let url = format!("{}/{name}", target.to_string_lossy().trim_end_matches('/'));
                let mut mounts = Vec::new();
                for c in 0..a.clients {
                    let dir = local.path().join(format!("mnt{c}"));
                    mounts.push(MountGuard::start(&url, &dir, &a, writes)?);
                }
                let dirs = mounts.iter().map(|m| m.dir.clone()).collect();
                let m = via_files(dirs, &a, n, reads, writes);
                if writes {
                    // A close returns after the upload (flush); the release that
                    // follows reaches the mount a moment later: let it, so the
                    // unmount finds no file open.
                    std::thread::sleep(Duration::from_millis(300));
                }
                drop(mounts);
                m
            }
            Via::Dir => {
                let d = a.dir.as_ref().expect("checked").join(&name);
                if !d.join("w").is_dir() {
                    bail!(
                        "{} is not there: --dir must show the target directory {shown}",
                        d.display()
                    );
                }
                let dirs = (0..a.clients).map(|_| d.clone()).collect();
                via_files(dirs, &a, n, reads, writes)
            }
        }
    })();
    // Always remove what was pushed (a push that failed half-way may have left some).
    match rt.block_on(client.remove_in(&server, &path, name.as_bytes(), mtime)) {
        Ok(k) => eprintln!("removed the test directory from the server ({k} entries)"),
        Err(e) => eprintln!(
            "dmover: warning: the test files were not removed from the server ({e}): \
             remove {}/{name} there",
            shown.trim_end_matches('/')
        ),
    }
    drop(rt);
    let m = measured?;
    interrupt::check()?;

    let mut rows = Vec::new();
    for (op, t) in [("read", &m.read), ("write", &m.write), ("close", &m.close)] {
        if (op == "read" && !reads) || (op != "read" && !writes) {
            continue;
        }
        rows.push(make_row(&a, op, t, m.seconds, n, chunk_size, m.chunks));
    }
    if let Some(p) = &a.csv {
        write_csv(p, &rows).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        match figure(&a, n, &rows).save(p) {
            Ok(()) => eprintln!("plot: {}", p.display()),
            Err(e) => eprintln!("dmover: warning: no plot: {e}"),
        }
    }
    if a.json {
        let out = json!({
            "command": "bench remote",
            "target": target.to_string_lossy(),
            "workload": a.workload.name(),
            "via": format!("{:?}", a.via).to_lowercase(),
            "mix": mix_name(a.mix),
            "rows": rows,
        });
        println!("{out}");
    } else {
        println!(
            "workload {} ({n} file{}), via {}, {}, {} clients, queue depth {}, {:.1} s",
            a.workload.name(),
            if n == 1 { "" } else { "s" },
            format!("{:?}", a.via).to_lowercase(),
            mix_name(a.mix),
            a.clients,
            a.queue_depth,
            m.seconds
        );
        common::print_rows(
            &rows,
            &[
                ("op", "op"),
                ("block", "block"),
                ("ops", "ops"),
                ("mib_per_s", "MiB/s"),
                ("iops", "IOPS"),
                ("p50_us", "p50 µs"),
                ("p90_us", "p90 µs"),
                ("p99_us", "p99 µs"),
                ("p999_us", "p99.9 µs"),
                ("max_us", "max µs"),
                ("errors", "errors"),
            ],
        );
    }
    let errors: u64 = [&m.read, &m.write, &m.close].iter().map(|t| t.errors).sum();
    if errors > 0 {
        let first = [&m.read, &m.write, &m.close]
            .iter()
            .find_map(|t| t.first_error.clone())
            .unwrap_or_default();
        bail!("{errors} I/Os failed; the first: {first}");
    }
    Ok(())
}

/// The `--plot` of a run's rows: MiB/s per kind of I/O, and its latency percentiles
/// (one group of bars per kind).
fn figure(a: &RemoteBenchArgs, n: usize, rows: &[Map<String, Value>]) -> Figure {
    let num = |r: &Map<String, Value>, k: &str| r.get(k).and_then(Value::as_f64);
    let ops: Vec<String> = rows
        .iter()
        .map(|r| {
            r.get("op")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    let bar = |v: Option<f64>| {
        v.map(|value| Bar {
            value,
            lo: None,
            hi: None,
        })
    };
    let rate = Bars {
        title: "throughput".into(),
        y_label: "MiB/s".into(),
        categories: ops.clone(),
        series: vec![(
            "MiB/s".into(),
            rows.iter().map(|r| bar(num(r, "mib_per_s"))).collect(),
        )],
    };
    let latency = Bars {
        title: "latency per I/O".into(),
        y_label: "ms".into(),
        categories: ops,
        series: [
            ("p50", "p50_us"),
            ("p90", "p90_us"),
            ("p99", "p99_us"),
            ("p99.9", "p999_us"),
        ]
        .iter()
        .map(|(name, k)| {
            (
                name.to_string(),
                rows.iter()
                    .map(|r| bar(num(r, k).map(|us| us / 1000.0)))
                    .collect(),
            )
        })
        .collect(),
    };
    let link = a
        .debug_rtt_ms
        .map_or(String::new(), |ms| format!(", RTT {ms} ms"));
    Figure {
        title: format!(
            "dmover bench remote: workload {} ({n} file{}), via {}, {}, block {}{link}",
            a.workload.name(),
            if n == 1 { "" } else { "s" },
            format!("{:?}", a.via).to_lowercase(),
            mix_name(a.mix),
            dmover_bench::report::size_label(a.block),
        ),
        panels: vec![Panel::Bars(rate), Panel::Bars(latency)],
    }
}

/// `--cold`: every dirty page written back, then the page cache dropped.
fn drop_caches() -> anyhow::Result<()> {
    let st = Command::new("sync")
        .status()
        .context("running sync for --cold")?;
    if !st.success() {
        bail!("--cold: sync failed ({st})");
    }
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
        .context("--cold: writing /proc/sys/vm/drop_caches (root only)")?;
    Ok(())
}

fn mix_name(m: Mix) -> &'static str {
    match m {
        Mix::Read => "read",
        Mix::Write => "write",
        Mix::Half => "50/50",
    }
}

fn make_row(
    a: &RemoteBenchArgs,
    op: &str,
    t: &Tally,
    seconds: f64,
    n: usize,
    chunk_size: u32,
    chunks: Option<(u64, u64, u64)>,
) -> Map<String, Value> {
    let mut lat = t.lat_ns.clone();
    let l = Latency::of_nanos(&mut lat);
    let secs = seconds.max(1e-9);
    let r = |x: f64| round_sig(x, 4);
    let mut m = row(&[
        ("workload", json!(a.workload.name())),
        ("via", json!(format!("{:?}", a.via).to_lowercase())),
        ("op", json!(op)),
        (
            "pattern",
            json!(match (op, a.pattern) {
                ("read", Pattern::Random) => "random",
                ("read", Pattern::Sequential) => "sequential",
                _ => "sequential",
            }),
        ),
        ("files", json!(n)),
        ("clients", json!(a.clients)),
        ("queue_depth", json!(a.queue_depth)),
        ("block", json!(if op == "close" { 0 } else { a.block })),
        ("file_size", json!(a.file_size)),
        ("seconds", json!(r(seconds))),
        ("ops", json!(l.ops)),
        ("bytes", json!(t.bytes)),
        (
            "mib_per_s",
            json!(r(t.bytes as f64 / (1u64 << 20) as f64 / secs)),
        ),
        ("iops", json!(r(l.ops as f64 / secs))),
        ("p50_us", json!(r(l.p50_us))),
        ("p90_us", json!(r(l.p90_us))),
        ("p99_us", json!(r(l.p99_us))),
        ("p999_us", json!(r(l.p999_us))),
        ("max_us", json!(r(l.max_us))),
        ("errors", json!(t.errors)),
        ("chunk_size", json!(chunk_size)),
    ]);
    if let Some(ms) = a.debug_rtt_ms {
        m.insert("rtt_ms".into(), json!(ms));
    }
    if let (Some((recv, parts, hits)), "read") = (chunks, op) {
        m.insert("chunks_received".into(), json!(recv));
        m.insert("parts_received".into(), json!(parts));
        m.insert("cache_hits".into(), json!(hits));
    }
    m
}

fn write_csv(p: &Path, rows: &[Map<String, Value>]) -> std::io::Result<()> {
    let mut out = String::new();
    out.push_str(&COLUMNS.join(","));
    out.push('\n');
    for r in rows {
        let cells: Vec<String> = COLUMNS.iter().map(|c| common::text(r, c)).collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    std::fs::write(p, out)
}

/// `dir/r/r0000 …` (`n` files of `size` pseudo-random bytes).
fn make_files(dir: &Path, n: usize, size: u64) -> anyhow::Result<()> {
    let r = dir.join("r");
    std::fs::create_dir_all(&r).with_context(|| format!("creating {}", r.display()))?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x0005_eed0);
    let mut buf = vec![0u8; (1 << 20).min(size as usize)];
    for i in 0..n {
        let p = r.join(format!("r{i:04}"));
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?,
        );
        let mut left = size;
        while left > 0 {
            rng.fill(&mut buf[..]);
            let k = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..k])
                .with_context(|| format!("writing {}", p.display()))?;
            left -= k as u64;
        }
        f.flush()
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The offset of the `k`-th I/O of a file (sequential) or a random one.
fn offset(pattern: Pattern, slots: u64, block: u64, k: u64, rng: &mut impl Rng) -> u64 {
    match pattern {
        Pattern::Sequential => (k % slots) * block,
        Pattern::Random => rng.random_range(0..slots) * block,
    }
}

/// What the API runs against: the runtime, the client, the server, the test
/// directory there (`remote_dir`, whose last component is `name`), and the local
/// directory the write slots stage their files in.
struct Api<'a> {
    rt: &'a tokio::runtime::Runtime,
    client: &'a Arc<Client>,
    server: &'a str,
    remote_dir: &'a [u8],
    name: &'a str,
    staging: &'a Path,
    chunk_size: u32,
}

/// Reads and writes through the library API, at once: `clients` [`Remote`] sessions,
/// each with `queue_depth` tasks per file calling `read_at`; and per client, file and
/// queue slot a writer thread writing new files through [`StagedFile`]s (`write_at`
/// in blocks, then the upload), until the time or `--ops` is up.
fn via_api(
    api: &Api<'_>,
    a: &RemoteBenchArgs,
    n: usize,
    reads: bool,
    writes: bool,
) -> anyhow::Result<Measured> {
    let ropts = RemoteOptions {
        cache_bytes: a.cache,
        read_ahead: dmover_core::remote::read_ahead_chunks(api.chunk_size),
    };
    let (sessions, files) = if reads {
        api.rt.block_on(async {
            let mut sessions = Vec::new();
            for _ in 0..a.clients {
                let r = Remote::open_with(api.client, api.server, api.remote_dir, ropts)
                    .await
                    .context("opening a remote session")?;
                sessions.push(Arc::new(r));
            }
            let mut files = Vec::new();
            for i in 0..n {
                let p = format!("{}/r/r{i:04}", api.name);
                let e = sessions[0]
                    .lookup(&p)
                    .with_context(|| format!("{p} is not on the server after the push"))?;
                files.push(e);
            }
            anyhow::Ok((sessions, files))
        })?
    } else {
        (Vec::new(), Vec::new())
    };
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(a.seconds);
    let mut m = Measured::default();
    let mut writers = Vec::new();
    if writes {
        let mut dir = api.remote_dir.to_vec();
        dir.extend_from_slice(b"/w/");
        'spawn: for c in 0..a.clients {
            for i in 0..n {
                for q in 0..a.queue_depth {
                    let slot = WriteSlot {
                        rt: api.rt.handle().clone(),
                        client: api.client.clone(),
                        server: api.server.to_string(),
                        dir: dir.clone(),
                        staging: api.staging.to_path_buf(),
                        prefix: format!("c{c}-f{i:04}-q{q}"),
                        block: a.block,
                        size: a.file_size,
                        cap: a.ops.unwrap_or(u64::MAX),
                        end,
                        timeout: a.timeout,
                    };
                    let b = std::thread::Builder::new().stack_size(256 << 10);
                    match b.spawn(move || slot.run()) {
                        Ok(h) => writers.push(h),
                        Err(e) => {
                            // The run fails; the slots started run on and are counted.
                            m.write.fail(format!("starting a writer thread: {e}"));
                            break 'spawn;
                        }
                    }
                }
            }
        }
    }
    let mut tasks = Vec::new();
    if reads {
        let _guard = api.rt.enter();
        let slots = (a.file_size / a.block).max(1);
        for (c, s) in sessions.iter().enumerate() {
            for (i, &e) in files.iter().enumerate() {
                let cursor = Arc::new(AtomicU64::new(0));
                for q in 0..a.queue_depth {
                    let (s, cursor) = (s.clone(), cursor.clone());
                    let (pattern, block, cap) = (a.pattern, a.block, a.ops.unwrap_or(u64::MAX));
                    let limit = a.timeout;
                    let seed = ((c as u64) << 40) ^ ((i as u64) << 8) ^ q as u64;
                    tasks.push(tokio::spawn(async move {
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
                        let mut t = Tally::default();
                        while (t.lat_ns.len() as u64) < cap
                            && Instant::now() < end
                            && !interrupt::requested()
                        {
                            // A read the cache answers does not wait: spend the
                            // task's budget, so it yields now and then to the other
                            // tasks (reads, uploads) instead of holding one of the
                            // runtime's threads until the deadline.
                            tokio::task::consume_budget().await;
                            let k = cursor.fetch_add(1, Relaxed);
                            let off = offset(pattern, slots, block, k, &mut rng);
                            let t0 = Instant::now();
                            let r = tokio::time::timeout(limit, s.read_at(e, off, block)).await;
                            let dt = t0.elapsed().as_nanos() as u64;
                            match r {
                                Ok(Ok(d)) if d.len() as u64 == block => {
                                    t.lat_ns.push(dt);
                                    t.bytes += block;
                                }
                                Ok(Ok(d)) => {
                                    t.fail(format!(
                                        "read of {block} bytes at {off} gave {}",
                                        d.len()
                                    ));
                                    break;
                                }
                                Ok(Err(e)) => {
                                    t.fail(e.to_string());
                                    break;
                                }
                                Err(_) => {
                                    t.fail(format!("read at {off}: no answer within {limit:?}"));
                                    break;
                                }
                            }
                        }
                        t
                    }));
                }
            }
        }
    }
    finish(m, tasks, writers, sessions, started, api.rt)
}

/// Waits for the read tasks and the writer threads, takes the time, closes the
/// sessions (adding up their chunk counts, when there are any).
fn finish(
    mut m: Measured,
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
    writers: Vec<std::thread::JoinHandle<(Tally, Tally)>>,
    sessions: Vec<Arc<Remote>>,
    started: Instant,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Measured> {
    rt.block_on(async {
        for t in tasks {
            match t.await {
                Ok(t) => m.read.merge(t),
                Err(e) => m.read.fail(format!("a read task: {e}")),
            }
        }
    });
    for h in writers {
        match h.join() {
            Ok((w, c)) => {
                m.write.merge(w);
                m.close.merge(c);
            }
            Err(_) => m.write.fail("a writer thread panicked".into()),
        }
    }
    m.seconds = started.elapsed().as_secs_f64();
    let (mut recv, mut parts, mut hits) = (0, 0, 0);
    let read = !sessions.is_empty();
    rt.block_on(async {
        for s in sessions {
            let st = s.stats();
            recv += st.chunks_received;
            parts += st.parts_received;
            hits += st.cache_hits;
            if let Ok(s) = Arc::try_unwrap(s) {
                if let Err(e) = s.close().await {
                    tracing::warn!("closing a remote session: {e}");
                }
            }
        }
    });
    if read {
        m.chunks = Some((recv, parts, hits));
    }
    Ok(m)
}

/// One write slot of the API: new files `dir/PREFIX-SEQ` on the server, each staged
/// locally in `staging`, written in `block`s with [`StagedFile::write_at`] up to `size`
/// bytes and uploaded (the `close` row), until `end`, `cap` writes or an interrupt.
struct WriteSlot {
    rt: tokio::runtime::Handle,
    client: Arc<Client>,
    server: String,
    dir: Vec<u8>,
    staging: PathBuf,
    prefix: String,
    block: u64,
    size: u64,
    cap: u64,
    end: Instant,
    timeout: Duration,
}

impl WriteSlot {
    /// (the writes, the closes).
    fn run(self) -> (Tally, Tally) {
        let (mut w, mut cl) = (Tally::default(), Tally::default());
        let buf = vec![0x5au8; self.block as usize];
        let more = |w: &Tally| {
            (w.lat_ns.len() as u64) < self.cap
                && Instant::now() < self.end
                && !interrupt::requested()
        };
        let mut seq = 0u64;
        'files: while more(&w) {
            let leaf = format!("{}-{seq}", self.prefix);
            seq += 1;
            let mut dest = self.dir.clone();
            dest.extend_from_slice(leaf.as_bytes());
            let f = match StagedFile::create(&self.staging, &self.server, &dest, 0o644) {
                Ok(f) => f,
                Err(e) => {
                    w.fail(format!("creating {leaf}: {e}"));
                    break;
                }
            };
            let mut done = 0;
            while done < self.size && more(&w) {
                let k = self.block.min(self.size - done) as usize;
                let t0 = Instant::now();
                let r = f.write_at(&buf[..k], done);
                let dt = t0.elapsed().as_nanos() as u64;
                if let Err(e) = r {
                    w.fail(format!("writing {leaf}: {e}"));
                    break 'files;
                }
                w.lat_ns.push(dt);
                w.bytes += k as u64;
                done += k as u64;
            }
            if interrupt::requested() {
                // Not uploaded: the staging file goes with `f`.
                break;
            }
            let t0 = Instant::now();
            let r = self.upload(f);
            let dt = t0.elapsed().as_nanos() as u64;
            match r {
                Ok(()) => {
                    cl.lat_ns.push(dt);
                    cl.bytes += done;
                }
                Err(e) => {
                    cl.fail(format!("uploading {leaf}: {e}"));
                    break;
                }
            }
        }
        (w, cl)
    }

    /// Uploads `f` as its close does, on the runtime, within the timeout (then the
    /// push is cancelled, as the mount's close does) or until an interrupt; the
    /// staging file goes either way.
    fn upload(&self, f: StagedFile) -> Result<(), String> {
        let (client, limit) = (self.client.clone(), self.timeout);
        let task = self.rt.spawn(async move {
            let run = dmover_core::engine::Run::new();
            let stop = async {
                while !interrupt::requested() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            // The client's upload slots: the wait for one is not timed, the upload is.
            let r = tokio::select! {
                r = f.upload_within(&client, run.clone(), limit) => r.map_err(|e| e.to_string()),
                () = stop => {
                    run.fail(dmover_core::Error::Aborted);
                    Err("interrupted".to_string())
                }
            };
            drop(f);
            r
        });
        self.rt
            .block_on(task)
            .unwrap_or_else(|e| Err(format!("the upload task: {e}")))
    }
}

/// The `major:minor` of the mount on `dir`, if one is there (from mountinfo: a stat
/// of `dir` could hang on a stuck mount).
fn mounted(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dir = dir.to_str()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&dir)).then(|| f.get(2).map(|s| s.to_string()))?
    })
}

/// A `dmover mount` of this binary on a temporary directory; unmounted when dropped,
/// whatever happened: SIGTERM (the mount unmounts itself), then, if it is still
/// there, the FUSE connection aborted (root), `umount -l` or `fusermount3 -uz`.
struct MountGuard {
    child: Child,
    dir: PathBuf,
}

impl MountGuard {
    fn start(url: &str, dir: &Path, a: &RemoteBenchArgs, rw: bool) -> anyhow::Result<MountGuard> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let exe = std::env::current_exe().context("finding this program")?;
        let mut cmd = Command::new(exe);
        cmd.arg("mount")
            .arg(url)
            .arg(&dir)
            .arg("--cache")
            .arg(a.cache.to_string())
            .arg("--timeout")
            .arg(format!("{}ms", a.timeout.as_millis()));
        if rw {
            cmd.arg("--rw");
        }
        forward_transfer_args(&mut cmd, &a.transfer);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting dmover mount")?;
        let out = child.stdout.take().context("the mount's stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut g = MountGuard { child, dir };
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        if line.starts_with("dmover: mounted ") && mounted(&g.dir).is_some() {
            return Ok(g);
        }
        let status = wait_exit(&mut g.child, Duration::from_secs(5));
        bail!(
            "dmover mount {url} did not mount ({}; its error is above)",
            status.map_or("still running".to_string(), |s| s.to_string())
        )
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        use rustix::process::{Pid, Signal, kill_process};
        let pid = Pid::from_child(&self.child);
        if mounted(&self.dir).is_some() && self.child.try_wait().ok().flatten().is_none() {
            let _ = kill_process(pid, Signal::TERM);
            let _ = wait_exit(&mut self.child, Duration::from_secs(10));
        }
        if let Some(dev) = mounted(&self.dir) {
            // Still there: abort the connection (root), so nothing can hang on it.
            if let Some((_, minor)) = dev.split_once(':') {
                let _ = std::fs::write(
                    Path::new("/sys/fs/fuse/connections")
                        .join(minor)
                        .join("abort"),
                    "1",
                );
            }
        }
        let _ = self.child.kill();
        let _ = wait_exit(&mut self.child, Duration::from_secs(10));
        if mounted(&self.dir).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        if mounted(&self.dir).is_some() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.dir)
                .status();
        }
        if mounted(&self.dir).is_some() {
            eprintln!(
                "dmover: warning: {} is still mounted: `umount -l` it",
                self.dir.display()
            );
        }
    }
}

/// Passes the credential, trust and transfer options given to the bench on to `dmover
/// mount` (the environment, e.g. DMOVER_TOKEN, is inherited).
fn forward_transfer_args(cmd: &mut Command, t: &TransferArgs) {
    if let Some(p) = t.streams {
        cmd.arg("-P").arg(p.to_string());
    }
    if t.chunk != 0 {
        cmd.arg("--chunk").arg(t.chunk.to_string());
    }
    if t.no_checksum {
        cmd.arg("--no-checksum");
    }
    for (flag, v) in [
        ("--token-file", &t.token_file),
        ("--key", &t.key),
        ("--known-hosts", &t.known_hosts),
        ("--ca", &t.ca),
    ] {
        if let Some(v) = v {
            cmd.arg(flag).arg(v);
        }
    }
    if let Some(user) = &t.user {
        cmd.arg("--user").arg(user);
    }
    if t.encrypt {
        cmd.arg("--encrypt");
    }
    if t.plain_data {
        cmd.arg("--plain-data");
    }
    if let Some(c) = &t.congestion {
        cmd.arg("--congestion").arg(c);
    }
    if let Some(b) = t.tcp_buffer {
        cmd.arg("--tcp-buffer").arg(b.to_string());
    }
}

/// Closes `f`, returning the error of close(2) (where a mount reports a failed upload),
/// which dropping a `File` would ignore.
fn close_file(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken out of the `File`, which no longer owns it.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads and writes in `dirs` (one per client: each a view of the test directory):
/// `queue_depth` threads per file and kind, plain `pread`/`write`/`close`.
fn via_files(
    dirs: Vec<PathBuf>,
    a: &RemoteBenchArgs,
    n: usize,
    reads: bool,
    writes: bool,
) -> anyhow::Result<Measured> {
    let slots = (a.file_size / a.block).max(1);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(a.seconds);
    let (pattern, block, size) = (a.pattern, a.block, a.file_size);
    let cap = a.ops.unwrap_or(u64::MAX);
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for (c, dir) in dirs.iter().enumerate() {
        for i in 0..n {
            let cursor = Arc::new(AtomicU64::new(0));
            for q in 0..a.queue_depth {
                let seed = ((c as u64) << 40) ^ ((i as u64) << 8) ^ q as u64;
                let b = std::thread::Builder::new().stack_size(256 << 10);
                if reads {
                    let p = dir.join(format!("r/r{i:04}"));
                    let cursor = cursor.clone();
                    readers.push(b.spawn(move || {
                        let mut t = Tally::default();
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
                        let f = match std::fs::File::open(&p) {
                            Ok(f) => f,
                            Err(e) => {
                                t.fail(format!("opening {}: {e}", p.display()));
                                return t;
                            }
                        };
                        let mut buf = vec![0u8; block as usize];
                        while (t.lat_ns.len() as u64) < cap
                            && Instant::now() < end
                            && !interrupt::requested()
                        {
                            let k = cursor.fetch_add(1, Relaxed);
                            let off = offset(pattern, slots, block, k, &mut rng);
                            let t0 = Instant::now();
                            let r = f.read_exact_at(&mut buf, off);
                            let dt = t0.elapsed().as_nanos() as u64;
                            if let Err(e) = r {
                                t.fail(format!("reading {} at {off}: {e}", p.display()));
                                break;
                            }
                            t.lat_ns.push(dt);
                            t.bytes += block;
                        }
                        t
                    })?);
                }
                if writes {
                    let dir = dir.join("w");
                    let b = std::thread::Builder::new().stack_size(256 << 10);
                    writers.push(b.spawn(move || {
                        let (mut w, mut cl) = (Tally::default(), Tally::default());
                        let buf = vec![0x5au8; block as usize];
                        let mut seq = 0u64;
                        let more = |w: &Tally| {
                            (w.lat_ns.len() as u64) < cap
                                && Instant::now() < end
                                && !interrupt::requested()
                        };
                        'files: while more(&w) {
                            let p = dir.join(format!("c{c}-f{i:04}-q{q}-{seq}"));
                            seq += 1;
                            let mut f = match std::fs::File::create(&p) {
                                Ok(f) => f,
                                Err(e) => {
                                    w.fail(format!("creating {}: {e}", p.display()));
                                    break;
                                }
                            };
                            let mut done = 0;
                            while done < size && more(&w) {
                                let k = block.min(size - done) as usize;
                                let t0 = Instant::now();
                                let r = f.write_all(&buf[..k]);
                                let dt = t0.elapsed().as_nanos() as u64;
                                if let Err(e) = r {
                                    w.fail(format!("writing {}: {e}", p.display()));
                                    break 'files;
                                }
                                w.lat_ns.push(dt);
                                w.bytes += k as u64;
                                done += k as u64;
                            }
                            let t0 = Instant::now();
                            let r = close_file(f);
                            let dt = t0.elapsed().as_nanos() as u64;
                            match r {
                                Ok(()) => {
                                    cl.lat_ns.push(dt);
                                    cl.bytes += done;
                                }
                                Err(e) => {
                                    cl.fail(format!("closing {}: {e}", p.display()));
                                    break;
                                }
                            }
                        }
                        (w, cl)
                    })?);
                }
            }
        }
    }
    let mut m = Measured::default();
    for h in readers {
        match h.join() {
            Ok(t) => m.read.merge(t),
            Err(_) => m.read.fail("a reader thread panicked".into()),
        }
    }
    for h in writers {
        match h.join() {
            Ok((w, c)) => {
                m.write.merge(w);
                m.close.merge(c);
            }
            Err(_) => m.write.fail("a writer thread panicked".into()),
        }
    }
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// `--rtt`: a `dmover netlab` link; `dmover serve` of a temporary directory (with
/// `data/` in it, a token required) in its far namespace; this command again, without
/// `--rtt`, in the near one against `dmover://FAR/data`. Its output is this command's;
/// the lab and the server are torn down whatever happens.
fn over_link(a: RemoteBenchArgs, rtt: super::transfer::Rtt) -> anyhow::Result<()> {
    use super::transfer::{DmoverServer, Place, Rtt, link_settings, write_token};
    if a.via == Via::Dir {
        return Err(usage(
            "--via dir does not go with --rtt (the far side is a namespace)",
        ));
    }
    let Rtt::Lab(d) = rtt else {
        return Err(usage(
            "--rtt loopback: give no --rtt, and a TARGET, instead",
        ));
    };
    let rate = match a.rate {
        Some(r) => r,
        None => super::transfer::link_rate("1gbit").map_err(anyhow::Error::msg)?,
    };
    let spec = link_settings(&[rtt], rate, 0.0, a.transfer.congestion.as_deref())?
        .pop()
        .flatten()
        .context("a link")?;
    interrupt::install().context("watching for Ctrl-C")?;
    let t = tempfile::Builder::new()
        .prefix("dmover-bench-remote-lab-")
        .tempdir()
        .context("a temporary directory")?;
    std::fs::create_dir_all(t.path().join("root/data"))?;
    let token = t.path().join("token");
    write_token(&token)?;
    let lab_name = format!("brem{}", std::process::id());
    // Declared before the server, so it is torn down after it.
    let lab = dmover_netlab::Lab::up(&lab_name, &spec)
        .with_context(|| format!("bringing up an emulated link (RTT {d:?})"))?;
    let far = Place {
        netns: Some(lab.b().netns.clone()),
    };
    let near = Place {
        netns: Some(lab.a().netns.clone()),
    };
    let srv = DmoverServer::start(
        &far,
        &lab.b().addr.to_string(),
        &t.path().join("root"),
        false,
        &token,
        &t.path().join("server.log"),
    )?;
    interrupt::check()?;
    let exe = std::env::current_exe().context("locating the dmover binary")?;
    let mut c = near.command(exe);
    c.args(["bench", "remote"])
        .arg(format!("dmover://{}/data", srv.addr))
        .args(["--workload", a.workload.name()])
        .args(["--via", if a.via == Via::Api { "api" } else { "mount" }])
        .args(["--mix", mix_name(a.mix)])
        .args([
            "--pattern",
            if a.pattern == Pattern::Random {
                "random"
            } else {
                "sequential"
            },
        ])
        .args(["--file-size", &a.file_size.to_string()])
        .args(["--block", &a.block.to_string()])
        .args(["--queue-depth", &a.queue_depth.to_string()])
        .args(["--seconds", &a.seconds.to_string()])
        .args(["--clients", &a.clients.to_string()])
        .args(["--cache", &a.cache.to_string()])
        .args(["--timeout", &format!("{}ms", a.timeout.as_millis())])
        .args(["--debug-rtt-ms", &(d.as_secs_f64() * 1000.0).to_string()]);
    if let Some(n) = a.ops {
        c.args(["--ops", &n.to_string()]);
    }
    if let Some(p) = &a.csv {
        c.arg("--csv").arg(std::path::absolute(p)?);
    }
    if a.json {
        c.arg("--json");
    }
    if let Some(p) = &a.plot {
        c.arg("--plot").arg(std::path::absolute(p)?);
    }
    if a.cold {
        c.arg("--cold");
    }
    let mut t2 = a.transfer.clone();
    t2.token_file = Some(token.clone());
    t2.known_hosts = Some(t.path().join("known_hosts"));
    t2.key = None;
    t2.ca = None;
    forward_transfer_args(&mut c, &t2);
    c.env_remove("DMOVER_TOKEN").env_remove("DMOVER_KEY");
    let mut child = c
        .spawn()
        .context("running the bench in the near namespace")?;
    super::interrupt::set_child(Some(child.id()));
    let status = child.wait();
    super::interrupt::set_child(None);
    drop(srv);
    drop(lab);
    let status = status.context("waiting for the bench in the near namespace")?;
    interrupt::check()?;
    if !status.success() {
        bail!("the bench over the emulated link failed ({status})");
    }
    Ok(())
}
