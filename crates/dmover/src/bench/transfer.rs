//! `dmover bench transfer SRC DST`: an xdd-style sweep of end-to-end file transfer rate
//! over streams × chunk size, push (the server writes) and pull (the server reads), with
//! repeats, cold cache and `sync` counted.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use dmover_bench::plot::{Figure, Lines, Panel, Series, XAxis};
use dmover_bench::report::{Report, size_label};
use serde_json::json;

use super::common::{self, Dataset, OutputArgs, Progress, count_tree, row, text};

/// Arguments of `dmover bench transfer`.
#[derive(Debug, Args)]
pub struct TransferBenchArgs {
    /// The dataset: a directory, or a profile name (tiny, losf, medium, large, mixed,
    /// demo) generated into DST/src.
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
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Content seed of a generated dataset.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Extra options for every `dmover cp` (e.g. "--no-checksum --io-threads 4").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub cp_options: String,
    #[command(flatten)]
    pub output: OutputArgs,
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

fn chunk(s: &str) -> Result<u64, String> {
    let v = common::size_item(s)?;
    let c = u32::try_from(v).map_err(|_| format!("chunk {s} is too large"))?;
    dmover_proto::layout::validate_chunk_size(c).map_err(|e| e.to_string())?;
    Ok(v)
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
    /// Starts `dmover serve --root ROOT --listen IP:0` at `place` and learns its port.
    pub fn start(
        place: &Place,
        ip: &str,
        root: &Path,
        read_only: bool,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the dmover binary")?;
        let mut c = place.command(exe);
        let state = log.with_extension("state");
        c.args(["serve", "--listen", &format!("{ip}:0"), "--root"])
            .arg(root)
            .arg("--state-dir")
            .arg(&state)
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

/// One link setting of the sweep: where the client and servers run.
pub struct Link {
    /// Label for rows (`loopback`, or the emulated RTT).
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

pub fn run(a: TransferBenchArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    dmover_bench::peers::close_inherited_fds();
    std::fs::create_dir_all(&a.dst).with_context(|| format!("creating {}", a.dst.display()))?;
    let dst = std::fs::canonicalize(&a.dst)?;
    let ds = Dataset::resolve(&a.src, &dst.join("src"), a.scale, a.seed)?;
    if ds.files == 0 {
        bail!("{} has no files to transfer", ds.path().display());
    }
    let out_dir = a.output.dir("transfer")?;
    let mut report = Report::new("transfer", &dst);
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
    report.note(
        "each run: page cache dropped, destination empty, wall time of `dmover cp` plus a final sync",
    );
    let links = vec![Link::loopback()];
    sweep(&a, &ds, &dst, &links, &out_dir, &mut report)?;
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
            ("status", "status"),
        ],
    )
}

/// Sweeps the grid over every link; appends a row per (link, direction, streams, chunk).
pub fn sweep(
    a: &TransferBenchArgs,
    ds: &Dataset,
    dst: &Path,
    links: &[Link],
    out_dir: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    let copies = dst.join("copies");
    let pulled = dst.join("pulled");
    let logs = out_dir.join("logs");
    for d in [&copies, &pulled, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let extra: Vec<String> = a.cp_options.split_whitespace().map(String::from).collect();
    let exe = std::env::current_exe().context("locating the dmover binary")?;
    let grid: Vec<(Direction, usize, u64)> = a
        .direction
        .iter()
        .flat_map(|&d| {
            a.streams
                .iter()
                .flat_map(move |&s| a.chunk.iter().map(move |&c| (d, s, c)))
        })
        .collect();
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
    for link in links {
        let push_srv = DmoverServer::start(
            &link.server,
            &link.server_ip,
            &copies,
            false,
            &logs.join("server-push.log"),
        )?;
        let pull_srv = DmoverServer::start(
            &link.server,
            &link.server_ip,
            &ds.parent,
            true,
            &logs.join("server-pull.log"),
        )?;
        let rtt = link
            .rtt_ms
            .map_or_else(|| "loopback".to_string(), |r| format!("{r} ms"));
        let mut secs: Vec<Vec<f64>> = vec![Vec::new(); grid.len()];
        let mut fails: Vec<Option<String>> = vec![None; grid.len()];
        for rep in 0..a.repeats {
            for (i, &(dir, streams, chunk)) in grid.iter().enumerate() {
                let label = format!(
                    "{rtt} {} {streams} stream(s) {} chunks r{}",
                    dir.name(),
                    size_label(chunk),
                    rep + 1
                );
                progress.start(&label);
                let mut c = link.client.command(&exe);
                c.args(["cp", "--quiet", "-P", &streams.to_string()])
                    .args(["--chunk", &chunk.to_string()])
                    .args(&extra)
                    .env_remove("DMOVER_TOKEN")
                    .env("DMOVER_KNOWN_HOSTS", logs.join("known_hosts"))
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
                let log = logs.join(format!(
                    "{}-{}-P{streams}-c{}-r{}.log",
                    rtt.replace(' ', ""),
                    dir.name(),
                    size_label(chunk),
                    rep + 1
                ));
                let timed = common::timed_copy(&mut c, &log, report);
                let checked = timed.result.and_then(|()| match count_tree(&target) {
                    Ok(got) if got == (ds.files, ds.bytes) => Ok(()),
                    Ok((f, b)) => Err(format!(
                        "the copy has {f} files and {b} bytes, the source {} and {}",
                        ds.files, ds.bytes
                    )),
                    Err(e) => Err(format!("{}: {e}", target.display())),
                });
                let _ = std::fs::remove_dir_all(&target);
                match checked {
                    Ok(()) => {
                        progress.done(&format!(
                            "{label}: {:.2} Gbit/s",
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
        for (i, &(dir, streams, chunk)) in grid.iter().enumerate() {
            let mut r = row(&[
                ("rtt_ms", link.rtt_ms.map_or(json!(0), |x| json!(x))),
                ("link", json!(rtt)),
                ("direction", json!(dir.name())),
                ("streams", json!(streams)),
                ("chunk", json!(size_label(chunk))),
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
            report.push(r);
        }
    }
    progress.finish();
    let _ = std::fs::remove_dir_all(&copies);
    let _ = std::fs::remove_dir_all(&pulled);
    Ok(())
}

/// Throughput against streams: a panel per direction, a line per chunk size (and RTT).
fn figure(report: &Report) -> Figure {
    let links: Vec<String> = {
        let mut v: Vec<String> = report.rows.iter().map(|r| text(r, "link")).collect();
        v.dedup();
        v
    };
    let panels = ["push", "pull"]
        .iter()
        .filter(|d| report.rows.iter().any(|r| text(r, "direction") == **d))
        .map(|d| {
            let mut series: Vec<Series> = Vec::new();
            for r in report.rows.iter().filter(|r| text(r, "direction") == *d) {
                let name = if links.len() > 1 {
                    format!("{}, {} chunks", text(r, "link"), text(r, "chunk"))
                } else {
                    format!("{} chunks", text(r, "chunk"))
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
    let ds = report
        .parameters
        .get("dataset")
        .and_then(|v| v.as_str())
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Figure {
        title: format!("dmover bench transfer: {ds}"),
        panels,
    }
}
