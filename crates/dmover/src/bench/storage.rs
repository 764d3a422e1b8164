//! `dmover bench storage DIR`: the elbencho-style storage sweep.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use dmover_bench::plot::{Figure, Lines, Panel, Point as PlotPoint, Series, XAxis};
use dmover_bench::report::{Report, round_sig, size_label};
use dmover_bench::stats::Summary;
use dmover_bench::storage::{self, IoMode, Phase, PhaseResult, Point};
use serde_json::json;

use super::common::{self, OutputArgs, Progress, num, row, text};
use crate::env::Env;

/// Arguments of `dmover bench storage`.
#[derive(Debug, Args)]
pub struct StorageArgs {
    /// Directory on the file system to measure (a scratch subdirectory is created in it
    /// and removed).
    pub dir: PathBuf,
    /// File sizes, one measurement point each.
    #[arg(long, default_value = "4K,64K,1M,16M,256M", value_delimiter = ',', value_parser = common::size_item)]
    pub sizes: Vec<u64>,
    /// Bytes written per file size: files = budget / size (at least one, at most
    /// --max-files). Larger budgets give steadier numbers.
    #[arg(long, default_value = "128M", value_parser = dmover_proto::units::parse_size)]
    pub budget: u64,
    /// Most files per point (caps the small sizes).
    #[arg(long, default_value_t = 10_000)]
    pub max_files: u64,
    /// Thread counts.
    #[arg(long, default_value = "1,4", value_delimiter = ',', value_parser = common::count_item)]
    pub threads: Vec<usize>,
    /// Block sizes: bytes per write/read call (capped at the file size).
    #[arg(long, default_value = "1M", value_delimiter = ',', value_parser = common::size_item)]
    pub block: Vec<u64>,
    /// I/O modes: buffered, direct, or both.
    #[arg(long = "io", default_value = "buffered,direct", value_delimiter = ',', value_parser = clap::value_parser!(IoModeArg))]
    pub io: Vec<IoModeArg>,
    /// Times each point is measured; rows give the median and the spread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// An I/O mode on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoModeArg {
    /// Through the page cache.
    Buffered,
    /// O_DIRECT.
    Direct,
}

impl From<IoModeArg> for IoMode {
    fn from(m: IoModeArg) -> IoMode {
        match m {
            IoModeArg::Buffered => IoMode::Buffered,
            IoModeArg::Direct => IoMode::Direct,
        }
    }
}

/// The grid, in run order, with blocks capped at the file size and duplicates removed;
/// each point with the block size asked for.
fn grid(a: &StorageArgs) -> Vec<(Point, u64)> {
    let mut out: Vec<(Point, u64)> = Vec::new();
    for &size in &a.sizes {
        let files = Point::files_for(size, a.budget, a.max_files);
        for mode in a.io.iter().map(|&m| IoMode::from(m)) {
            for &threads in &a.threads {
                for &block in &a.block {
                    let p = Point {
                        file_size: size,
                        files,
                        threads,
                        block: block.min(size),
                        mode,
                    };
                    if !out.iter().any(|(q, _)| *q == p) {
                        out.push((p, block));
                    }
                }
            }
        }
    }
    out
}

pub fn run(a: StorageArgs, env: &Env) -> anyhow::Result<()> {
    let started = Instant::now();
    if !a.dir.is_dir() {
        bail!("{} is not a directory", a.dir.display());
    }
    let out_dir = a.output.dir("storage")?;
    let mut report = Report::new("storage", &env.argv, &a.dir);
    report.param("dir", &a.dir);
    report.param("sizes", &a.sizes);
    report.param("budget", a.budget);
    report.param("max_files", a.max_files);
    report.param("threads", &a.threads);
    report.param("block", &a.block);
    let modes: Vec<IoMode> = a.io.iter().map(|&m| m.into()).collect();
    report.param("io", &modes);
    report.param("repeats", a.repeats);
    report.note(
        "buffered write times include a final syncfs (the data is on disk when the clock stops)",
    );

    let direct_ok = storage::direct_io_supported(&a.dir);
    if !direct_ok && modes.contains(&IoMode::Direct) {
        report.note(format!(
            "{} does not support O_DIRECT: direct points skipped",
            a.dir.display()
        ));
    }
    let mut points = grid(&a);
    let skipped: Vec<Point> = points
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| p.validate().is_err() || (p.mode == IoMode::Direct && !direct_ok))
        .collect();
    for p in &skipped {
        if let Err(e) = p.validate() {
            report.note(format!(
                "skipped {} {}: {e}",
                size_label(p.file_size),
                p.mode.name()
            ));
        }
    }
    points.retain(|(p, _)| !skipped.contains(p));
    let need = points.iter().map(|(p, _)| p.bytes()).max().unwrap_or(0);
    let free =
        storage::free_bytes(&a.dir).with_context(|| format!("statvfs {}", a.dir.display()))?;
    if need + (64 << 20) > free {
        bail!(
            "{} has {} free; the largest point needs {} (lower --budget or --sizes)",
            a.dir.display(),
            size_label(free),
            size_label(need)
        );
    }
    eprintln!(
        "storage sweep of {}: {} points x {} repeat(s), write then read; results in {}",
        a.dir.display(),
        points.len(),
        a.repeats,
        out_dir.display()
    );
    let mut progress = Progress::new(points.len() as u64 * u64::from(a.repeats));
    for (p, asked_block) in &points {
        let label = format!(
            "{} x {} {} {}t {}",
            p.files,
            size_label(p.file_size),
            p.mode.name(),
            p.threads,
            size_label(p.block)
        );
        let mut writes: Vec<PhaseResult> = Vec::new();
        let mut reads: Vec<PhaseResult> = Vec::new();
        let mut dropped_all = true;
        for rep in 0..a.repeats {
            progress.start(&format!("{label} (repeat {})", rep + 1));
            let (ds, w) = storage::write_phase(&a.dir, p)
                .with_context(|| format!("write phase of {label} in {}", a.dir.display()))?;
            dropped_all &= common::drop_caches(&mut report);
            let r = storage::read_phase(&ds)
                .with_context(|| format!("read phase of {label} in {}", a.dir.display()))?;
            drop(ds);
            progress.done(&format!(
                "{label}: write {:.0} MiB/s {:.0} files/s, read {:.0} MiB/s {:.0} files/s",
                w.bytes_per_s() / 1048576.0,
                w.files_per_s(),
                r.bytes_per_s() / 1048576.0,
                r.files_per_s()
            ));
            writes.push(w);
            reads.push(r);
        }
        for results in [&writes, &reads] {
            let mut r = phase_row(p, results, dropped_all);
            r.insert("block_asked".into(), json!(size_label(*asked_block)));
            report.push(r);
        }
    }
    progress.finish();
    let figure = a.output.plot.as_ref().map(|_| figure(&report));
    common::finish(
        report,
        started,
        &out_dir,
        &a.output,
        figure,
        &[
            ("phase", "phase"),
            ("size", "size"),
            ("files", "files"),
            ("io", "io"),
            ("threads", "thr"),
            ("block", "block"),
            ("mib_per_s", "MiB/s"),
            ("files_per_s", "files/s"),
            ("iops", "IOPS"),
            ("lat_p50_us", "p50 µs"),
            ("lat_p99_us", "p99 µs"),
            ("lat_p999_us", "p99.9 µs"),
            ("lat_max_us", "max µs"),
        ],
    )
}

/// One row per point and phase; latency from the repeat with the median time.
fn phase_row(
    p: &Point,
    results: &[PhaseResult],
    cache_dropped: bool,
) -> serde_json::Map<String, serde_json::Value> {
    let secs: Vec<f64> = results.iter().map(|r| r.seconds).collect();
    let median = Summary::of(&secs).map_or(0.0, |s| s.median);
    let mid = results
        .iter()
        .min_by(|a, b| {
            (a.seconds - median)
                .abs()
                .total_cmp(&(b.seconds - median).abs())
        })
        .copied()
        .expect("at least one repeat");
    let phase = match mid.phase {
        Phase::Write => "write",
        Phase::Read => "read",
    };
    let mut r = row(&[
        ("phase", json!(phase)),
        ("file_size", json!(p.file_size)),
        ("size", json!(size_label(p.file_size))),
        ("files", json!(p.files)),
        ("bytes", json!(p.bytes())),
        ("io", json!(p.mode.name())),
        ("threads", json!(p.threads)),
        ("block", json!(size_label(p.block))),
        ("block_bytes", json!(p.block)),
    ]);
    common::add_throughput(&mut r, p.bytes(), p.files, &secs);
    let l = mid.latency;
    for (k, v) in [
        ("sync_seconds", mid.sync_seconds),
        ("iops", mid.iops()),
        ("lat_p50_us", l.p50_us),
        ("lat_p90_us", l.p90_us),
        ("lat_p99_us", l.p99_us),
        ("lat_p999_us", l.p999_us),
        ("lat_max_us", l.max_us),
    ] {
        r.insert(k.into(), json!(round_sig(v, 4)));
    }
    r.insert("ops".into(), json!(l.ops));
    r.insert(
        "cache_dropped".into(),
        json!(mid.phase == Phase::Write || cache_dropped),
    );
    r
}

/// Throughput against file size: a write and a read panel, a line per setting.
fn figure(report: &Report) -> Figure {
    let mut panels = Vec::new();
    for phase in ["write", "read"] {
        let mut series: Vec<Series> = Vec::new();
        for r in report.rows.iter().filter(|r| text(r, "phase") == phase) {
            let name = format!(
                "{}, {} thread{}, {} blocks",
                text(r, "io"),
                text(r, "threads"),
                if text(r, "threads") == "1" { "" } else { "s" },
                text(r, "block_asked")
            );
            let (Some(x), Some(y)) = (num(r, "file_size"), num(r, "mib_per_s")) else {
                continue;
            };
            let scale = y / num(r, "gbit_per_s").unwrap_or(1.0).max(1e-12);
            let pt = PlotPoint {
                x,
                y,
                lo: num(r, "gbit_per_s_min").map(|g| g * scale),
                hi: num(r, "gbit_per_s_max").map(|g| g * scale),
            };
            common::add_point(&mut series, name, pt);
        }
        panels.push(Panel::Lines(Lines {
            title: if phase == "write" {
                "write (buffered: incl. syncfs)".into()
            } else {
                "read (cold cache)".into()
            },
            x_label: "file size".into(),
            y_label: "MiB/s".into(),
            x_axis: XAxis::Log2Bytes,
            series,
        }));
    }
    Figure {
        title: format!(
            "dmover bench storage: {} ({})",
            report.machine.data_fs, report.machine.data_dir
        ),
        panels,
    }
}
