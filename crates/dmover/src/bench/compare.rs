//! `dmover bench compare DATASET...`: dmover and every peer tool on this machine, same
//! data, cold cache, `sync` counted, copies verified, one table.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use dmover_bench::peers::{Layout, Servers, Tool};
use dmover_bench::plot::{Bar, Bars, Figure, Panel};
use dmover_bench::report::{Report, round_sig};
use dmover_store::verify::{self, Compare, Depth};
use serde_json::{Value, json};

use super::common::{self, Dataset, OutputArgs, Progress, num, row, text};
use crate::env::Env;

/// Arguments of `dmover bench compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Datasets: directories (all in one parent directory) or profile names (tiny, losf,
    /// medium, large, mixed, demo, events) generated under --data.
    #[arg(required = true)]
    pub datasets: Vec<String>,
    /// Scale of generated datasets.
    #[arg(long, default_value_t = 1.0, value_parser = crate::args::parse_scale, allow_negative_numbers = true)]
    pub scale: f64,
    /// Content seed of generated datasets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Working directory: generated datasets (src/, kept for later runs), copies (dst/,
    /// emptied) and server state (state/). Copies go to the same file system.
    #[arg(long, default_value = "/var/tmp/dmover-bench")]
    pub data: PathBuf,
    /// Tools to run [default: dmover-push, dmover-pull, cp, rsync, rsync-ssh, scp,
    /// gridftp, xrdcp; also known: rsync-push (into the daemon), gridftp-default
    /// (globus-url-copy without tuning)]. Missing ones are reported as missing.
    #[arg(long, value_delimiter = ',', value_parser = tool)]
    pub tools: Vec<Tool>,
    /// Times each tool copies each dataset (tools are interleaved within a repeat).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// How copies are checked: sample (names, sizes, content of 16 spread files) or full
    /// (every byte).
    #[arg(long, default_value = "sample", value_parser = depth)]
    pub verify: Depth,
    /// Extra options for the dmover-push and dmover-pull copies (e.g. "-P 8 --chunk 16M").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub dmover_options: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn tool(s: &str) -> Result<Tool, String> {
    Tool::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Tool::ALL.iter().map(|t| t.name()).collect();
        format!("unknown tool {s:?} (known: {})", names.join(", "))
    })
}

fn depth(s: &str) -> Result<Depth, String> {
    match s {
        "sample" => Ok(Depth::Sample),
        "full" => Ok(Depth::Full),
        _ => Err(format!("{s:?}: expected sample or full")),
    }
}

pub fn run(a: CompareArgs, env: &Env) -> anyhow::Result<()> {
    let started = Instant::now();
    dmover_bench::peers::close_inherited_fds();
    let out_dir = a.output.dir("compare")?;
    let tools: Vec<Tool> = if a.tools.is_empty() {
        Tool::DEFAULT.to_vec()
    } else {
        a.tools.clone()
    };
    let gen_root = a.data.join("src");
    let datasets = a
        .datasets
        .iter()
        .map(|d| Dataset::resolve(d, &gen_root, a.scale, a.seed))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let src_root = datasets[0].parent.clone();
    if let Some(d) = datasets.iter().find(|d| d.parent != src_root) {
        bail!(
            "datasets must share one parent directory: {} is not in {}",
            d.path().display(),
            src_root.display()
        );
    }
    let dst_root = a.data.join("dst");
    let state = a.data.join("state");
    for d in [&dst_root, &state] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let logs = out_dir.join("logs");
    std::fs::create_dir_all(&logs)?;

    let mut report = Report::new("compare", &env.argv, &dst_root);
    report.param("datasets", &a.datasets);
    report.param("scale", a.scale);
    report.param("seed", a.seed);
    report.param("repeats", a.repeats);
    report.param(
        "verify",
        if a.verify == Depth::Full {
            "full"
        } else {
            "sample"
        },
    );
    report.param("data", &a.data);
    report.param("dmover_options", &a.dmover_options);
    let dmover = std::env::current_exe().context("locating the dmover binary")?;
    let mut runnable = Vec::new();
    let mut missing = Vec::new();
    let mut commands = serde_json::Map::new();
    for &t in &tools {
        commands.insert(t.name().into(), json!(Servers::describe(t)));
        match t.available(&env.path) {
            Ok(()) => {
                report.tools.insert(
                    t.name().into(),
                    t.version(&dmover).unwrap_or_else(|| "?".into()),
                );
                runnable.push(t);
            }
            Err(why) => {
                report.tools.insert(t.name().into(), why.clone());
                missing.push((t, why));
            }
        }
    }
    report.param("commands", commands);
    report.note(
        "each copy: page cache dropped, destination empty, wall time includes a final sync; \
         copies are verified (names, kinds, sizes and content)",
    );

    let servers = Servers::start(
        Layout {
            src_root: src_root.clone(),
            dst_root: dst_root.clone(),
            state: state.clone(),
            dmover: dmover.clone(),
            path: env.path.clone(),
        },
        &runnable,
    );
    for &t in &runnable {
        if let Some(e) = servers.failure(t) {
            report.note(format!("{}: server did not start: {e}", t.name()));
        }
    }
    let total = datasets.len() as u64 * u64::from(a.repeats) * runnable.len() as u64;
    eprintln!(
        "comparing {} tool(s) on {} dataset(s), {} repeat(s); missing: {}; results in {}",
        runnable.len(),
        datasets.len(),
        a.repeats,
        if missing.is_empty() {
            "none".to_string()
        } else {
            missing
                .iter()
                .map(|(t, _)| t.name())
                .collect::<Vec<_>>()
                .join(", ")
        },
        out_dir.display()
    );
    let mut progress = Progress::new(total);
    for ds in &datasets {
        // seconds of successful runs, and the last failure, per tool
        let mut secs: Vec<Vec<f64>> = vec![Vec::new(); runnable.len()];
        let mut fails: Vec<Option<String>> = vec![None; runnable.len()];
        for rep in 0..a.repeats {
            for (i, &t) in runnable.iter().enumerate() {
                let label = format!("{} {} r{}", ds.name, t.name(), rep + 1);
                progress.start(&label);
                let parent = dst_root.join(t.name());
                let target = servers.copy_path(t, &ds.name);
                let _ = std::fs::remove_dir_all(&target);
                std::fs::create_dir_all(&parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
                let outcome = match servers.copy_command(t, &ds.name) {
                    Err(e) => Err(e),
                    Ok(mut cmd) => {
                        if matches!(t, Tool::DmoverPush | Tool::DmoverPull) {
                            cmd.args(a.dmover_options.split_whitespace());
                        }
                        let log = logs.join(format!("{}-{}-r{}.log", ds.name, t.name(), rep + 1));
                        let timed = common::timed_copy(&mut cmd, &log, &mut report);
                        timed
                            .result
                            .and_then(|()| {
                                verify::compare(&ds.path(), &target, Compare::content(a.verify))
                                    .map_err(|e| format!("verify: {e}"))
                            })
                            .map(|_| timed.seconds)
                    }
                };
                let _ = std::fs::remove_dir_all(&target);
                match outcome {
                    Ok(s) => {
                        progress.done(&format!(
                            "{label}: {s:.2} s, {:.2} Gbit/s, {:.0} files/s",
                            ds.bytes as f64 * 8.0 / s / 1e9,
                            ds.files as f64 / s
                        ));
                        secs[i].push(s);
                    }
                    Err(e) => {
                        progress.done(&format!("{label}: FAILED: {e}"));
                        fails[i] = Some(e);
                    }
                }
            }
        }
        for (i, &t) in runnable.iter().enumerate() {
            let status = match (&fails[i], secs[i].len()) {
                (None, _) => "ok".to_string(),
                (Some(e), 0) => format!("failed: {e}"),
                (Some(e), n) => format!("ok {n}/{}; failed: {e}", a.repeats),
            };
            let mut r = row(&[
                ("dataset", json!(ds.name)),
                ("tool", json!(t.name())),
                ("status", json!(status)),
                ("files", json!(ds.files)),
                ("bytes", json!(ds.bytes)),
            ]);
            common::add_throughput(&mut r, ds.bytes, ds.files, &secs[i]);
            report.push(r);
        }
        for (t, why) in &missing {
            report.push(row(&[
                ("dataset", json!(ds.name)),
                ("tool", json!(t.name())),
                ("status", json!(why)),
                ("files", json!(ds.files)),
                ("bytes", json!(ds.bytes)),
                ("repeats", json!(0)),
            ]));
        }
    }
    progress.finish();
    drop(servers);
    let _ = std::fs::remove_dir_all(&dst_root);
    add_ratios(&mut report);
    let figure = a.output.plot.as_ref().map(|_| figure(&report));
    common::finish(
        report,
        started,
        &out_dir,
        &a.output,
        figure,
        &[
            ("dataset", "dataset"),
            ("tool", "tool"),
            ("gbit_per_s", "Gbit/s"),
            ("gbit_per_s_min", "min"),
            ("gbit_per_s_max", "max"),
            ("files_per_s", "files/s"),
            ("seconds", "median s"),
            ("vs_best_peer", "vs best peer"),
            ("status", "status"),
        ],
    )
}

/// dmover rows get `vs_best_peer`: the fastest peer's median time over dmover's.
fn add_ratios(report: &mut Report) {
    let best: Vec<(String, f64)> = {
        let mut v: Vec<(String, f64)> = Vec::new();
        for r in &report.rows {
            if text(r, "tool").starts_with("dmover") {
                continue;
            }
            if let Some(s) = num(r, "seconds") {
                let d = text(r, "dataset");
                match v.iter_mut().find(|(x, _)| *x == d) {
                    Some((_, b)) => *b = b.min(s),
                    None => v.push((d, s)),
                }
            }
        }
        v
    };
    for r in &mut report.rows {
        if !text(r, "tool").starts_with("dmover") {
            continue;
        }
        let d = text(r, "dataset");
        let ratio = best
            .iter()
            .find(|(x, _)| *x == d)
            .and_then(|(_, b)| Some(b / num(r, "seconds")?));
        r.insert(
            "vs_best_peer".into(),
            ratio.map_or(Value::Null, |x| json!(round_sig(x, 3))),
        );
    }
    if !report.columns.iter().any(|c| c == "vs_best_peer") {
        report.columns.push("vs_best_peer".into());
    }
}

/// A panel per dataset, a bar per tool (median Gbit/s, min–max whiskers).
fn figure(report: &Report) -> Figure {
    let mut names: Vec<String> = Vec::new();
    for r in &report.rows {
        let d = text(r, "dataset");
        if !names.contains(&d) {
            names.push(d);
        }
    }
    let panels = names
        .iter()
        .map(|d| {
            let rows: Vec<_> = report
                .rows
                .iter()
                .filter(|r| text(r, "dataset") == *d && num(r, "gbit_per_s").is_some())
                .collect();
            Panel::Bars(Bars {
                title: format!(
                    "{d} ({} files, {})",
                    rows.first().map_or(String::new(), |r| text(r, "files")),
                    dmover_bench::report::size_label(
                        rows.first().and_then(|r| num(r, "bytes")).unwrap_or(0.0) as u64
                    )
                ),
                y_label: "Gbit/s (cold cache, sync counted)".into(),
                categories: rows.iter().map(|r| text(r, "tool")).collect(),
                series: vec![(
                    "median".into(),
                    rows.iter()
                        .map(|r| {
                            Some(Bar {
                                value: num(r, "gbit_per_s")?,
                                lo: num(r, "gbit_per_s_min"),
                                hi: num(r, "gbit_per_s_max"),
                            })
                        })
                        .collect(),
                )],
            })
        })
        .collect();
    Figure {
        title: "dmover bench compare: copies on loopback".into(),
        panels,
    }
}
