//! `dmover bench transfer SRC DST`: an xdd-style sweep of end-to-end file transfer rate
//! over streams × chunk size, push (the server writes) and pull (the server reads), with
//! repeats, cold cache and `sync` counted; with `--rtt`, once per emulated round-trip
//! time, over a `dmover netlab` link between two network namespaces.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use dmover_bench::plot::{Figure, Lines, Panel, Series, XAxis};
use dmover_bench::report::{Report, round_sig, size_label};
use dmover_netlab::{Lab, LinkSpec};
use dmover_proto::units::{format_rate, parse_duration};
use serde_json::json;

use super::common::{self, Dataset, OutputArgs, Progress, count_tree, row, text};
use super::{interrupt, trajectory};
use crate::env::Env;
use crate::netlab::{parse_link_rate, parse_loss};

/// Arguments of `dmover bench transfer`.
#[derive(Debug, Args)]
pub struct TransferBenchArgs {
    /// The dataset: a directory, or a profile name (tiny, losf, medium, large, mixed,
    /// demo, events) generated into DST/src.
    pub src: String,
    /// Working directory on the destination file system: a `dmover serve` started here
    /// on loopback writes pushes into DST/copies; pulls land in DST/pulled. Both are
    /// emptied after every run.
    pub dst: PathBuf,
    /// Stream counts.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',', value_parser = common::count_item)]
    pub streams: Vec<usize>,
    /// Chunk sizes (64K..64M, multiples of 4K).
    #[arg(long, default_value = "64K,1M,4M,16M", value_delimiter = ',', value_parser = chunk)]
    pub chunk: Vec<u64>,
    /// Directions: push (server writes), pull (server reads), or both.
    #[arg(long, default_value = "push,pull", value_delimiter = ',', value_parser = direction)]
    pub direction: Vec<Direction>,
    /// Times each point is measured (the grid is swept once per repeat, so drift hits
    /// every point alike); rows give the median and the spread.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Scale of a generated dataset.
    #[arg(long, default_value_t = 1.0, value_parser = crate::args::parse_scale, allow_negative_numbers = true)]
    pub scale: f64,
    /// Content seed of a generated dataset.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Emulated round-trip times (e.g. 0,10,50,100,200; bare numbers are ms here, or
    /// give a unit: 500us, 1.5ms, 0.2s). Each value runs the whole grid over a `dmover netlab` link
    /// (needs root and /dev/net/tun): the servers in one network namespace, the client
    /// in the other, data on this file system. 0 is a lab without delay (same rate,
    /// same forwarder as the others); `loopback` is plain 127.0.0.1 [default: loopback].
    #[arg(long, value_delimiter = ',', value_parser = rtt_item)]
    pub rtt: Vec<Rtt>,
    /// Bottleneck rate of the emulated links, each way (e.g. 1gbit, 500mbit, 125MB/s, or
    /// unlimited: as fast as the forwarder goes, which on 2 cores competes with the
    /// copy for CPU).
    #[arg(long, default_value = "1gbit", value_parser = link_rate)]
    pub rate: LinkRate,
    /// Random loss per segment on the emulated links, each way (0.01% or a fraction).
    #[arg(long, default_value = "0", value_parser = parse_loss)]
    pub loss: f64,
    /// TCP congestion control inside the emulated links' namespaces (e.g. cubic, bbr)
    /// [default: the machine's].
    #[arg(long)]
    pub congestion: Option<String>,
    /// Extra options for every `dmover cp` (e.g. "--no-checksum --io-threads 4").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub cp_options: String,
    /// Also run a self-tuning copy (no -P; with --chunk when it names one size) after
    /// the fixed points of each direction, in every repeat and on every link: a row with
    /// streams "tuned" in results.csv, and its rate and streams over time in
    /// trajectory.csv (and, with --plot, FILE-trajectory.svg|png beside the grid's
    /// rates).
    #[arg(long)]
    pub tune: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One point of the grid: fixed settings, or a self-tuning copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    /// `-P streams --chunk chunk`.
    Fixed {
        /// Data streams.
        streams: usize,
        /// Chunk size in bytes.
        chunk: u64,
    },
    /// No `-P`: the streams tuned while the data flows; `--chunk` when given.
    Tuned {
        /// The chunk size, or cp's choice.
        chunk: Option<u64>,
    },
}

/// Which end reads and which writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client reads its files, the server writes.
    Push,
    /// The server reads, the client writes.
    Pull,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Push => "push",
            Direction::Pull => "pull",
        }
    }
}

/// One `--rtt` value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rtt {
    /// Plain loopback, no lab.
    Loopback,
    /// An emulated link adding this round-trip time.
    Lab(Duration),
}

/// Parses one `--rtt` value of a list: `loopback`, or a duration ([`parse_duration`])
/// where, unlike elsewhere, a bare number is milliseconds (`50` is `50ms`), as the
/// option's help says.
pub(crate) fn rtt_item(s: &str) -> Result<Rtt, String> {
    let t = s.trim();
    if t == "loopback" || t == "lo" {
        return Ok(Rtt::Loopback);
    }
    let bare = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let d = if bare {
        parse_duration(&format!("{t}ms"))
    } else {
        parse_duration(t)
    }
    .map_err(|e| format!("{e}; a bare number here is milliseconds"))?;
    if d > Duration::from_secs(10) {
        return Err(format!("RTT {t} is above 10 s"));
    }
    Ok(Rtt::Lab(d))
}

/// The `--rate` of emulated links: bits per second, or unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkRate(pub Option<u64>);

/// Parses `--rate`: a rate (1gbit, 500mbit) or `unlimited`.
pub(crate) fn link_rate(s: &str) -> Result<LinkRate, String> {
    match s.trim() {
        "unlimited" | "none" => Ok(LinkRate(None)),
        t => parse_link_rate(t).map(|r| LinkRate(Some(r))),
    }
}

fn chunk(s: &str) -> Result<u64, String> {
    crate::args::chunk_size(s).map(u64::from)
}

fn direction(s: &str) -> Result<Direction, String> {
    match s.trim() {
        "push" | "write" => Ok(Direction::Push),
        "pull" | "read" => Ok(Direction::Pull),
        _ => Err(format!("{s:?}: expected push or pull")),
    }
}

/// Where processes run: here, or inside a network namespace.
#[derive(Debug, Clone, Default)]
pub struct Place {
    /// The namespace (`ip netns exec NS …`), if any.
    pub netns: Option<String>,
}

impl Place {
    /// A command running `program` at this place.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.netns {
            None => Command::new(program),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec"]).arg(ns).arg(program);
                c
            }
        }
    }
}

/// A `dmover serve` child; killed when dropped.
pub struct DmoverServer {
    child: Child,
    /// The address it listens on.
    pub addr: String,
}

impl Drop for DmoverServer {
    fn drop(&mut self) {
        dmover_bench::peers::kill_group(&mut self.child);
    }
}

impl DmoverServer {
    /// Starts `dmover serve --root ROOT --listen IP:0 --token-file TOKEN` at `place`
    /// and learns its port.
    pub fn start(
        place: &Place,
        ip: &str,
        root: &Path,
        read_only: bool,
        token: &Path,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the dmover binary")?;
        let mut c = place.command(exe);
        let state = log.with_extension("state");
        c.args(["serve", "--listen", &format!("{ip}:0"), "--root"])
            .arg(root)
            .arg("--state-dir")
            .arg(&state)
            .arg("--token-file")
            .arg(token)
            .env_remove("DMOVER_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::create(log)
                    .with_context(|| format!("creating {}", log.display()))?,
            );
        if read_only {
            c.arg("--read-only");
        }
        let mut child = std::os::unix::process::CommandExt::process_group(&mut c, 0)
            .spawn()
            .context("starting dmover serve")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("reading the server's listen line")?;
        let Some(addr) = line.trim().strip_prefix("dmover: listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "dmover serve did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default().trim()
            );
        };
        Ok(DmoverServer {
            addr: addr.to_string(),
            child,
        })
    }
}

/// Writes a new random token to `path` (mode 0600), replacing any old one.
pub(crate) fn write_token(path: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let raw: [u8; 32] = rand::random();
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| writeln!(f, "{hex}"))
        .with_context(|| format!("writing {}", path.display()))
}

/// A row with `rtt_ms`, `link` and `link_rate` first, then `row`'s columns.
pub(crate) fn with_link_columns(
    setting: Option<&LinkSpec>,
    row: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let (rtt_ms, link, rate) = match setting {
        None => (json!(0), "loopback".to_string(), "loopback".to_string()),
        Some(s) => {
            let ms = round_sig(s.rtt.as_secs_f64() * 1000.0, 6);
            (
                if ms.fract() == 0.0 {
                    json!(ms as u64)
                } else {
                    json!(ms)
                },
                rtt_label(s.rtt),
                s.rate_bps.map_or("unlimited".into(), format_rate),
            )
        }
    };
    let mut out = serde_json::Map::new();
    out.insert("rtt_ms".into(), rtt_ms);
    out.insert("link".into(), json!(link));
    out.insert("link_rate".into(), json!(rate));
    out.extend(row);
    out
}

/// One link setting of the sweep: where the client and servers run.
pub struct Link {
    /// The emulated RTT in ms (`None`: loopback).
    pub rtt_ms: Option<f64>,
    /// Where `dmover cp` runs.
    pub client: Place,
    /// Where the servers run, and the address they listen on.
    pub server: Place,
    /// The servers' address.
    pub server_ip: String,
}

impl Link {
    /// Client and servers here, on 127.0.0.1.
    pub fn loopback() -> Link {
        Link {
            rtt_ms: None,
            client: Place::default(),
            server: Place::default(),
            server_ip: "127.0.0.1".into(),
        }
    }
}

/// The link settings of a run: `--rtt` values, or loopback alone.
fn settings(a: &TransferBenchArgs) -> anyhow::Result<Vec<Option<LinkSpec>>> {
    if a.rtt.is_empty() {
        return Ok(vec![None]);
    }
    link_settings(&a.rtt, a.rate, a.loss, a.congestion.as_deref())
}

/// One link setting per `--rtt` value (`None`: loopback); checks up front that emulated
/// links can be made here.
pub(crate) fn link_settings(
    rtts: &[Rtt],
    rate: LinkRate,
    loss: f64,
    congestion: Option<&str>,
) -> anyhow::Result<Vec<Option<LinkSpec>>> {
    let mut out = Vec::new();
    for r in rtts {
        out.push(match *r {
            Rtt::Loopback => None,
            Rtt::Lab(rtt) => {
                let spec = LinkSpec {
                    rtt,
                    rate_bps: rate.0,
                    loss,
                    congestion: congestion.map(str::to_string),
                    ..LinkSpec::default()
                };
                spec.validate()?;
                Some(spec)
            }
        });
    }
    if out.iter().any(Option::is_some) {
        dmover_netlab::available().map_err(|why| {
            anyhow::anyhow!(
                "--rtt needs emulated links (dmover netlab) and this machine cannot make them: \
                 {why}; without --rtt (or with --rtt loopback) the sweep runs over plain loopback"
            )
        })?;
    }
    Ok(out)
}

/// A row label for an emulated RTT.
pub(crate) fn rtt_label(rtt: Duration) -> String {
    format!("{} ms", round_sig(rtt.as_secs_f64() * 1000.0, 6))
}

pub fn run(a: TransferBenchArgs, env: &Env) -> anyhow::Result<()> {
    let started = Instant::now();
    let settings = settings(&a)?;
    interrupt::install().context("watching for Ctrl-C")?;
    dmover_bench::peers::close_inherited_fds();
    std::fs::create_dir_all(&a.dst).with_context(|| format!("creating {}", a.dst.display()))?;
    let dst = std::fs::canonicalize(&a.dst)?;
    let ds = Dataset::resolve(&a.src, &dst.join("src"), a.scale, a.seed)?;
    if ds.files == 0 {
        bail!("{} has no files to transfer", ds.path().display());
    }
    let out_dir = a.output.dir("transfer")?;
    let mut report = Report::new("transfer", &env.argv, &dst);
    report.param("dataset", ds.path());
    report.param("files", ds.files);
    report.param("bytes", ds.bytes);
    report.param("streams", &a.streams);
    report.param("chunk", &a.chunk);
    report.param(
        "directions",
        a.direction.iter().map(|d| d.name()).collect::<Vec<_>>(),
    );
    report.param("repeats", a.repeats);
    report.param("cp_options", &a.cp_options);
    report.param("tune", a.tune);
    report.param(
        "rtt",
        settings
            .iter()
            .map(|s| s.as_ref().map_or("loopback".into(), |s| rtt_label(s.rtt)))
            .collect::<Vec<_>>(),
    );
    if settings.iter().any(Option::is_some) {
        report.param(
            "link_rate",
            a.rate.0.map_or("unlimited".into(), format_rate),
        );
        report.param("link_loss", a.loss);
        report.param(
            "link_congestion",
            a.congestion.as_deref().unwrap_or("default"),
        );
        report.note(
            "emulated links: `dmover netlab` (userspace forwarder between two network \
             namespaces: half the RTT each way, tail-drop queue of one bandwidth-delay product, \
             tcp_rmem/tcp_wmem maxima 4 x BDP); servers in namespace b, `dmover cp` in a, data \
             on this file system. Forwarder CPU and release lateness are in the fwd_* columns: \
             when they grow, the emulator and not dmover is the limit; fwd_limited marks a link \
             whose busiest forwarder thread used more than 80 % of a core or released packets \
             more than 1 ms late (p99), over the link's whole sweep",
        );
    }
    report.note(
        "each run: page cache dropped, destination empty, wall time of `dmover cp` plus a final sync",
    );
    if a.tune {
        report.note(format!(
            "streams \"tuned\": `dmover cp` without -P (the streams tuned while the data flows, \
             docs/tuning.md){}; tuned_streams is what each repeat ended with, of tuned_of; \
             trajectory.csv has its rate and streams every {} and at each decision, from its \
             --progress ndjson lines",
            if a.chunk.len() == 1 {
                ", with --chunk as the grid's"
            } else {
                ", its chunk size its own choice"
            },
            trajectory::INTERVAL
        ));
    }
    let mut traj = Vec::new();
    let swept = sweep(&a, &ds, &dst, &settings, &out_dir, &mut report, &mut traj);
    if let Err(e) = &swept {
        report.note(format!(
            "incomplete run (rows of finished links only): {e:#}"
        ));
    }
    if a.tune {
        // The grid's results are written whatever happens here.
        if let Err(e) = write_trajectory(&a, &report, &traj, &out_dir) {
            eprintln!("dmover: warning: no trajectory: {e:#}");
            report.note(format!("no trajectory.csv: {e:#}"));
        }
    }
    let figure = a.output.plot.as_ref().map(|_| figure(&report));
    common::finish(
        report,
        started,
        &out_dir,
        &a.output,
        figure,
        &[
            ("rtt_ms", "RTT ms"),
            ("direction", "dir"),
            ("streams", "streams"),
            ("chunk", "chunk"),
            ("gbit_per_s", "Gbit/s"),
            ("gbit_per_s_min", "min"),
            ("gbit_per_s_max", "max"),
            ("files_per_s", "files/s"),
            ("spread", "spread"),
            ("tuned_streams", "kept"),
            ("fwd_cpu_cores", "fwd CPU"),
            ("status", "status"),
        ],
    )?;
    swept
}

/// Writes `trajectory.csv` into `out_dir` and, with `--plot FILE`, draws the
/// trajectories into FILE's name with `-trajectory` before its extension.
fn write_trajectory(
    a: &TransferBenchArgs,
    report: &Report,
    traj: &[serde_json::Map<String, serde_json::Value>],
    out_dir: &Path,
) -> anyhow::Result<()> {
    let csv = out_dir.join("trajectory.csv");
    std::fs::write(&csv, trajectory::to_csv(traj))
        .with_context(|| format!("writing {}", csv.display()))?;
    eprintln!("trajectory: {}", csv.display());
    let Some(plot) = &a.output.plot else {
        return Ok(());
    };
    let path = trajectory_plot_path(plot);
    let fig = trajectory::figure(
        format!("bench transfer --tune: {}", dataset_title(report)),
        &report.rows,
        traj,
    );
    match fig.save_in_columns(&path, a.direction.len()) {
        Ok(()) => eprintln!("trajectory plot: {}", path.display()),
        Err(e) => eprintln!("dmover: warning: no trajectory plot: {e}"),
    }
    Ok(())
}

/// `DIR/NAME-trajectory.EXT` for `--plot DIR/NAME.EXT`.
fn trajectory_plot_path(plot: &Path) -> PathBuf {
    let stem = plot
        .file_stem()
        .map_or_else(|| "plot".into(), |s| s.to_string_lossy().into_owned());
    let name = match plot.extension() {
        Some(ext) => format!("{stem}-trajectory.{}", ext.to_string_lossy()),
        None => format!("{stem}-trajectory"),
    };
    plot.with_file_name(name)
}

/// The dataset's name and the emulated link's rate, for plot titles.
fn dataset_title(report: &Report) -> String {
    let ds = report
        .parameters
        .get("dataset")
        .and_then(|v| v.as_str())
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match report.parameters.get("link_rate").and_then(|v| v.as_str()) {
        Some(rate) => format!("{ds}, emulated link {rate}"),
        None => ds,
    }
}

/// Sweeps the grid over every link setting (`None`: loopback; else an emulated link
/// brought up for the setting and torn down after it, also on errors and interrupts);
/// appends a row per (link, direction, streams, chunk), with `--tune` one per (link,
/// direction) for the tuned copies, and their trajectories' rows to `traj`.
pub fn sweep(
    a: &TransferBenchArgs,
    ds: &Dataset,
    dst: &Path,
    links: &[Option<LinkSpec>],
    out_dir: &Path,
    report: &mut Report,
    traj: &mut Vec<serde_json::Map<String, serde_json::Value>>,
) -> anyhow::Result<()> {
    let result = sweep_links(a, ds, dst, links, out_dir, report, traj);
    let _ = std::fs::remove_dir_all(dst.join("copies"));
    let _ = std::fs::remove_dir_all(dst.join("pulled"));
    result
}

fn sweep_links(
    a: &TransferBenchArgs,
    ds: &Dataset,
    dst: &Path,
    links: &[Option<LinkSpec>],
    out_dir: &Path,
    report: &mut Report,
    traj: &mut Vec<serde_json::Map<String, serde_json::Value>>,
) -> anyhow::Result<()> {
    let copies = dst.join("copies");
    let pulled = dst.join("pulled");
    let logs = out_dir.join("logs");
    for d in [&copies, &pulled, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let extra: Vec<String> = a.cp_options.split_whitespace().map(String::from).collect();
    // Servers on an emulated link listen on a non-loopback address, which needs
    // authentication; every link uses the same token, so all rows pay the same set-up.
    let token = logs.join("token");
    write_token(&token)?;
    let exe = std::env::current_exe().context("locating the dmover binary")?;
    let grid = grid(a);
    let total = (links.len() * grid.len()) as u64 * u64::from(a.repeats);
    eprintln!(
        "transfer sweep of {} ({} files, {}): {} points x {} repeat(s) over {} link(s); results in {}",
        ds.path().display(),
        ds.files,
        size_label(ds.bytes),
        grid.len(),
        a.repeats,
        links.len(),
        out_dir.display()
    );
    let mut progress = Progress::new(total);
    let mut run_no = 0u32;
    let lab_name = format!("bench{}", std::process::id());
    for (link_no, setting) in links.iter().enumerate() {
        // Each link's servers are new (in a new namespace, perhaps on a port an earlier
        // link's other server had), so each link pins their keys in its own file.
        let known_hosts = logs.join(format!("known_hosts-{link_no}"));
        interrupt::check()?;
        // Declared before the servers, so it is dropped (torn down) after them.
        let lab = match setting {
            None => None,
            Some(spec) => {
                progress.start(&format!("bringing up a lab: RTT {:?}", spec.rtt));
                let lab = Lab::up(&lab_name, spec).with_context(|| {
                    format!(
                        "bringing up an emulated link (RTT {:?}, rate {})",
                        spec.rtt,
                        spec.rate_bps.map_or("unlimited".into(), format_rate)
                    )
                })?;
                Some(lab)
            }
        };
        interrupt::check()?;
        let link = match (&lab, setting) {
            (Some(lab), Some(spec)) => Link {
                rtt_ms: Some(spec.rtt.as_secs_f64() * 1000.0),
                client: Place {
                    netns: Some(lab.a().netns.clone()),
                },
                server: Place {
                    netns: Some(lab.b().netns.clone()),
                },
                server_ip: lab.b().addr.to_string(),
            },
            _ => Link::loopback(),
        };
        let push_srv = DmoverServer::start(
            &link.server,
            &link.server_ip,
            &copies,
            false,
            &token,
            &logs.join("server-push.log"),
        )?;
        let pull_srv = DmoverServer::start(
            &link.server,
            &link.server_ip,
            &ds.parent,
            true,
            &token,
            &logs.join("server-pull.log"),
        )?;
        let rtt = setting
            .as_ref()
            .map_or_else(|| "loopback".to_string(), |s| rtt_label(s.rtt));
        let rate = match setting {
            None => "loopback".to_string(),
            Some(s) => s.rate_bps.map_or("unlimited".into(), format_rate),
        };
        let rtt_ms = match link.rtt_ms.map(|x| round_sig(x, 6)) {
            None => json!(0),
            Some(x) if x.fract() == 0.0 => json!(x as u64),
            Some(x) => json!(x),
        };
        let mut secs: Vec<Vec<f64>> = vec![Vec::new(); grid.len()];
        let mut fails: Vec<Option<String>> = vec![None; grid.len()];
        let mut traces: Vec<Vec<trajectory::Trace>> = vec![Vec::new(); grid.len()];
        for rep in 0..a.repeats {
            for (i, &(dir, point)) in grid.iter().enumerate() {
                interrupt::check()?;
                let (label, log) = point_label(&rtt, dir, point, rep);
                progress.start(&label);
                let mut c = link.client.command(&exe);
                c.args(["cp", "--quiet"]);
                match point {
                    Setting::Fixed { streams, chunk } => {
                        c.args(["-P", &streams.to_string()])
                            .args(["--chunk", &chunk.to_string()]);
                    }
                    Setting::Tuned { chunk } => {
                        c.args(["--progress", "ndjson"])
                            .args(["--progress-interval", trajectory::INTERVAL]);
                        if let Some(chunk) = chunk {
                            c.args(["--chunk", &chunk.to_string()]);
                        }
                    }
                }
                c.args(&extra)
                    .arg("--token-file")
                    .arg(&token)
                    .env_remove("DMOVER_TOKEN")
                    .env("DMOVER_KNOWN_HOSTS", &known_hosts)
                    .stdin(Stdio::null());
                let target = match dir {
                    Direction::Push => {
                        c.arg(ds.path())
                            .arg(format!("dmover://{}/run", push_srv.addr));
                        copies.join("run")
                    }
                    Direction::Pull => {
                        let t = pulled.join(&ds.name);
                        c.arg(format!("dmover://{}/{}", pull_srv.addr, ds.name))
                            .arg(&t);
                        t
                    }
                };
                let _ = std::fs::remove_dir_all(&target);
                let log = logs.join(log);
                let timed = common::timed_copy(&mut c, &log, report);
                let mut ended = String::new();
                if let Setting::Tuned { .. } = point {
                    run_no += 1;
                    let trace = trajectory::parse(&timed.stdout);
                    let context = row(&[
                        ("rtt_ms", rtt_ms.clone()),
                        ("link", json!(rtt)),
                        ("link_rate", json!(rate)),
                        ("direction", json!(dir.name())),
                        ("repeat", json!(rep + 1)),
                    ]);
                    traj.extend(trajectory::rows(run_no, &context, &trace));
                    if let (Some(n), Some(of)) = (trace.streams_end, trace.streams_of) {
                        ended = format!(", ended on {n} of {of} streams");
                    }
                    traces[i].push(trace);
                }
                let checked = timed.result.and_then(|()| match count_tree(&target) {
                    Ok(got) if got == (ds.files, ds.bytes) => Ok(()),
                    Ok((f, b)) => Err(format!(
                        "the copy has {f} files and {b} bytes, the source {} and {}",
                        ds.files, ds.bytes
                    )),
                    Err(e) => Err(format!("{}: {e}", target.display())),
                });
                let _ = std::fs::remove_dir_all(&target);
                interrupt::check()?;
                match checked {
                    Ok(()) => {
                        progress.done(&format!(
                            "{label}: {:.2} Gbit/s{ended}",
                            ds.bytes as f64 * 8.0 / timed.seconds / 1e9
                        ));
                        secs[i].push(timed.seconds);
                    }
                    Err(e) => {
                        progress.done(&format!("{label}: FAILED: {e}"));
                        fails[i] = Some(e);
                    }
                }
            }
        }
        let fwd = lab.as_ref().map(Lab::stats);
        if let Some(f) = &fwd {
            if f.a_to_b.failed || f.b_to_a.failed {
                report.note(format!(
                    "the emulated link's forwarder failed during the {rtt} points; they are not valid"
                ));
            }
        }
        for (i, &(dir, point)) in grid.iter().enumerate() {
            let (streams, chunk) = match point {
                Setting::Fixed { streams, chunk } => (json!(streams), Some(chunk)),
                Setting::Tuned { chunk } => (
                    json!("tuned"),
                    chunk.or_else(|| traces[i].iter().find_map(|t| t.chunk)),
                ),
            };
            let mut r = row(&[
                ("rtt_ms", rtt_ms.clone()),
                ("link", json!(rtt)),
                ("link_rate", json!(rate)),
                ("loss", json!(setting.as_ref().map_or(0.0, |s| s.loss))),
                ("direction", json!(dir.name())),
                ("streams", streams),
                ("chunk", chunk.map_or(json!(null), |c| json!(size_label(c)))),
                ("chunk_bytes", json!(chunk)),
                ("files", json!(ds.files)),
                ("bytes", json!(ds.bytes)),
                (
                    "status",
                    json!(
                        fails[i]
                            .clone()
                            .map_or("ok".into(), |e| format!("failed: {e}"))
                    ),
                ),
            ]);
            common::add_throughput(&mut r, ds.bytes, ds.files, &secs[i]);
            if a.tune {
                add_tuned_columns(&mut r, &traces[i]);
            }
            add_forwarder_columns(&mut r, fwd.as_ref());
            report.push(r);
        }
        drop(push_srv);
        drop(pull_srv);
        if let Some(lab) = lab {
            lab.down().context("removing the emulated link")?;
        }
    }
    progress.finish();
    Ok(())
}

/// A point's label in the progress lines and its log file's name.
fn point_label(rtt: &str, dir: Direction, point: Setting, rep: u32) -> (String, String) {
    let file_rtt = rtt.replace(' ', "");
    match point {
        Setting::Fixed { streams, chunk } => (
            format!(
                "{rtt} {} {streams} stream(s) {} chunks r{}",
                dir.name(),
                size_label(chunk),
                rep + 1
            ),
            format!(
                "{file_rtt}-{}-P{streams}-c{}-r{}.log",
                dir.name(),
                size_label(chunk),
                rep + 1
            ),
        ),
        Setting::Tuned { .. } => (
            format!("{rtt} {} tuned r{}", dir.name(), rep + 1),
            format!("{file_rtt}-{}-tuned-r{}.log", dir.name(), rep + 1),
        ),
    }
}

/// The emulated link's forwarder over a link's whole sweep (both directions), in a
/// row's columns (null on a link without one).
fn add_forwarder_columns(
    r: &mut serde_json::Map<String, serde_json::Value>,
    fwd: Option<&dmover_netlab::ForwarderStats>,
) {
    let null = json!(null);
    let cols: [(&str, serde_json::Value); 10] = match fwd {
        None => [
            ("fwd_cpu_cores", null.clone()),
            ("fwd_cpu_busiest", null.clone()),
            ("fwd_late_p50_us", null.clone()),
            ("fwd_late_p99_us", null.clone()),
            ("fwd_late_max_us", null.clone()),
            ("fwd_queue_drops", null.clone()),
            ("fwd_loss_drops", null.clone()),
            ("fwd_uso", null.clone()),
            ("fwd_limited", null.clone()),
            ("fwd_limited_why", null),
        ],
        Some(f) => {
            let limited = f.limited();
            [
                ("fwd_cpu_cores", json!(round_sig(f.cpu_cores(), 3))),
                (
                    "fwd_cpu_busiest",
                    json!(round_sig(f.busiest_thread_cpu(), 3)),
                ),
                (
                    "fwd_late_p50_us",
                    json!(f.a_to_b.late_p50_us.max(f.b_to_a.late_p50_us)),
                ),
                (
                    "fwd_late_p99_us",
                    json!(f.a_to_b.late_p99_us.max(f.b_to_a.late_p99_us)),
                ),
                (
                    "fwd_late_max_us",
                    json!(round_sig(f.a_to_b.late_max_us.max(f.b_to_a.late_max_us), 3)),
                ),
                (
                    "fwd_queue_drops",
                    json!(f.a_to_b.queue_drops + f.b_to_a.queue_drops),
                ),
                (
                    "fwd_loss_drops",
                    json!(f.a_to_b.loss_drops + f.b_to_a.loss_drops),
                ),
                ("fwd_uso", json!(f.uso)),
                ("fwd_limited", json!(limited.is_some())),
                ("fwd_limited_why", json!(limited)),
            ]
        }
    };
    for (k, v) in cols {
        r.insert(k.into(), v);
    }
}

/// The grid's points in the order they run: per direction, the fixed points (streams ×
/// chunk), then with `--tune` the tuned copy.
fn grid(a: &TransferBenchArgs) -> Vec<(Direction, Setting)> {
    let mut out = Vec::new();
    for &d in &a.direction {
        for &streams in &a.streams {
            for &chunk in &a.chunk {
                out.push((d, Setting::Fixed { streams, chunk }));
            }
        }
        if a.tune {
            let chunk = (a.chunk.len() == 1).then(|| a.chunk[0]);
            out.push((d, Setting::Tuned { chunk }));
        }
    }
    out
}

/// The tuned copies' columns of a grid row (null for fixed points): `tuned_streams`
/// the streams each repeat ended with, `tuned_of` the most it could use,
/// `tuned_changes` each repeat's changes, `tuned_settled_seconds` when each first
/// settled (null: it had not).
fn add_tuned_columns(
    r: &mut serde_json::Map<String, serde_json::Value>,
    traces: &[trajectory::Trace],
) {
    let tuned = !traces.is_empty();
    let list = |f: &dyn Fn(&trajectory::Trace) -> serde_json::Value| {
        if tuned {
            json!(traces.iter().map(f).collect::<Vec<_>>())
        } else {
            json!(null)
        }
    };
    r.insert("tuned_streams".into(), list(&|t| json!(t.streams_end)));
    r.insert(
        "tuned_of".into(),
        json!(traces.iter().filter_map(|t| t.streams_of).max()),
    );
    r.insert("tuned_changes".into(), list(&|t| json!(t.changes)));
    r.insert(
        "tuned_settled_seconds".into(),
        list(&|t| json!(t.settled_seconds.map(|s| round_sig(s, 3)))),
    );
}

/// Throughput against streams: a panel per direction, a line per RTT (and chunk size).
fn figure(report: &Report) -> Figure {
    let distinct = |key: &str| {
        let mut v: Vec<String> = report.rows.iter().map(|r| text(r, key)).collect();
        v.dedup();
        v.sort();
        v.dedup();
        v.len()
    };
    let (links, chunks) = (distinct("link"), distinct("chunk"));
    let panels = ["push", "pull"]
        .iter()
        .filter(|d| report.rows.iter().any(|r| text(r, "direction") == **d))
        .map(|d| {
            let mut series: Vec<Series> = Vec::new();
            for r in report.rows.iter().filter(|r| text(r, "direction") == *d) {
                let name = match (links > 1, chunks > 1) {
                    (true, true) => format!("RTT {}, {} chunks", text(r, "link"), text(r, "chunk")),
                    (true, false) if text(r, "link") == "loopback" => "loopback".into(),
                    (true, false) => format!("RTT {}", text(r, "link")),
                    _ => format!("{} chunks", text(r, "chunk")),
                };
                if let Some(pt) = common::streams_point(r) {
                    common::add_point(&mut series, name, pt);
                }
            }
            Panel::Lines(Lines {
                title: format!(
                    "{d} ({})",
                    if *d == "push" {
                        "server writes"
                    } else {
                        "server reads"
                    }
                ),
                x_label: "TCP streams".into(),
                y_label: "Gbit/s (cold cache, sync counted)".into(),
                x_axis: XAxis::Log2Count,
                series,
            })
        })
        .collect();
    Figure {
        title: format!("dmover bench transfer: {}", dataset_title(report)),
        panels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_lists_read_bare_numbers_as_ms() {
        let lab = |ms: u64| Ok(Rtt::Lab(Duration::from_millis(ms)));
        assert_eq!(rtt_item("50"), lab(50));
        assert_eq!(rtt_item("0"), lab(0));
        assert_eq!(rtt_item(" 2.5"), Ok(Rtt::Lab(Duration::from_micros(2500))));
        assert_eq!(rtt_item("50ms"), lab(50));
        assert_eq!(rtt_item("0.2s"), lab(200));
        assert_eq!(rtt_item("500us"), Ok(Rtt::Lab(Duration::from_micros(500))));
        assert_eq!(rtt_item("loopback"), Ok(Rtt::Loopback));
        assert!(rtt_item("fast").unwrap_err().contains("milliseconds"));
        assert!(rtt_item("-5").unwrap_err().contains("negative"));
        assert!(rtt_item("").is_err());
        assert!(rtt_item("10001").unwrap_err().contains("above 10 s"));
        assert_eq!(link_rate("unlimited"), Ok(LinkRate(None)));
        assert_eq!(link_rate("1gbit"), Ok(LinkRate(Some(1_000_000_000))));
        assert!(link_rate("1gb").unwrap_err().contains("1GB/s"));
        assert!(link_rate("500").unwrap_err().contains("needs a unit"));
    }
}
