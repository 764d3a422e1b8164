//! What every `dmover bench` subcommand shares: output options, progress, result rows
//! with repeats/medians/spread, the closing table, and list parsing.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use dmover_bench::plot::{Figure, Point as PlotPoint, Series};
use dmover_bench::report::{Report, round_sig};
use dmover_bench::stats::Summary;
use serde_json::{Map, Value, json};

/// Where results go.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Directory for results.csv and results.json [default: a new
    /// bench-out/COMMAND-YYYYmmdd-HHMMSS].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also draw the results into this file (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

impl OutputArgs {
    /// The output directory, created.
    pub fn dir(&self, cmd: &str) -> anyhow::Result<PathBuf> {
        let dir = self
            .out
            .clone()
            .unwrap_or_else(|| dmover_bench::report::default_out_dir(cmd));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the output directory {}", dir.display()))?;
        Ok(dir)
    }
}

/// Progress of a sweep on stderr: a bar on a terminal, one line per finished point
/// otherwise (so logs of long runs show where they are).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
    started: Instant,
}

impl Progress {
    /// A sweep of `total` steps.
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{bar:30}] {pos}/{len} {elapsed_precise} ETA {eta} {wide_msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        });
        Progress {
            bar,
            total,
            done: 0,
            started: Instant::now(),
        }
    }

    /// Says what runs now.
    pub fn start(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
        }
    }

    /// One step finished with result line `line`.
    pub fn done(&mut self, line: &str) {
        self.done += 1;
        match &self.bar {
            Some(b) => {
                b.println(format!("  {line}"));
                b.inc(1);
            }
            None => eprintln!(
                "[{}/{} {:>5.0}s] {line}",
                self.done,
                self.total,
                self.started.elapsed().as_secs_f64()
            ),
        }
    }

    /// Removes the bar.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// Builds a row from `(column, value)` pairs.
pub fn row(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// Adds the throughput columns of a point measured `seconds.len()` times, moving `bytes`
/// and `files` each time: `repeats`, `seconds` (median), `seconds_min`, `seconds_max`,
/// `spread` ((max − min) / median of the seconds), `gbit_per_s` (at the median time),
/// `gbit_per_s_min`, `gbit_per_s_max`, `files_per_s`, `mib_per_s`, and the raw
/// `seconds_samples`.
pub fn add_throughput(row: &mut Map<String, Value>, bytes: u64, files: u64, seconds: &[f64]) {
    let Some(s) = Summary::of(seconds) else {
        row.insert("repeats".into(), json!(0));
        return;
    };
    let gbit = |secs: f64| round_sig(bytes as f64 * 8.0 / secs.max(1e-9) / 1e9, 4);
    row.insert("repeats".into(), json!(s.n));
    row.insert("seconds".into(), json!(round_sig(s.median, 4)));
    row.insert("seconds_min".into(), json!(round_sig(s.min, 4)));
    row.insert("seconds_max".into(), json!(round_sig(s.max, 4)));
    row.insert("spread".into(), json!(round_sig(s.spread, 3)));
    row.insert("gbit_per_s".into(), json!(gbit(s.median)));
    row.insert("gbit_per_s_min".into(), json!(gbit(s.max)));
    row.insert("gbit_per_s_max".into(), json!(gbit(s.min)));
    row.insert(
        "mib_per_s".into(),
        json!(round_sig(
            bytes as f64 / (1 << 20) as f64 / s.median.max(1e-9),
            4
        )),
    );
    row.insert(
        "files_per_s".into(),
        json!(round_sig(files as f64 / s.median.max(1e-9), 4)),
    );
    let samples: Vec<f64> = seconds.iter().map(|&x| round_sig(x, 4)).collect();
    row.insert("seconds_samples".into(), json!(samples));
}

/// A number from a row.
pub fn num(row: &Map<String, Value>, key: &str) -> Option<f64> {
    row.get(key).and_then(Value::as_f64)
}

/// A string from a row.
pub fn text(row: &Map<String, Value>, key: &str) -> String {
    match row.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

/// Appends `pt` to the plot series called `name`, starting the series if it is new.
pub fn add_point(series: &mut Vec<Series>, name: String, pt: PlotPoint) {
    match series.iter_mut().find(|s| s.name == name) {
        Some(s) => s.points.push(pt),
        None => series.push(Series {
            name,
            points: vec![pt],
        }),
    }
}

/// A row's median Gbit/s over its stream count, with min–max whiskers.
pub fn streams_point(r: &Map<String, Value>) -> Option<PlotPoint> {
    Some(PlotPoint {
        x: num(r, "streams")?,
        y: num(r, "gbit_per_s")?,
        lo: num(r, "gbit_per_s_min"),
        hi: num(r, "gbit_per_s_max"),
    })
}

/// Writes results (and the plot), prints the table and where everything went.
pub fn finish(
    mut report: Report,
    started: Instant,
    dir: &Path,
    out: &OutputArgs,
    figure: Option<Figure>,
    table_cols: &[(&str, &str)],
) -> anyhow::Result<()> {
    report.seconds = round_sig(started.elapsed().as_secs_f64(), 4);
    report
        .write(dir)
        .with_context(|| format!("writing results into {}", dir.display()))?;
    print_table(&report, table_cols);
    for n in &report.notes {
        println!("note: {n}");
    }
    eprintln!(
        "results: {} and results.json",
        dir.join("results.csv").display()
    );
    if let (Some(path), Some(fig)) = (&out.plot, figure) {
        match fig.save(path) {
            Ok(()) => eprintln!("plot: {}", path.display()),
            Err(e) => eprintln!("dmover: warning: no plot: {e}"),
        }
    }
    Ok(())
}

/// Prints `(column, header)` of every row as an aligned text table on stdout.
pub fn print_table(report: &Report, cols: &[(&str, &str)]) {
    print_rows(&report.rows, cols)
}

/// Prints `(column, header)` of `rows` as an aligned text table on stdout.
pub fn print_rows(rows: &[Map<String, Value>], cols: &[(&str, &str)]) {
    let mut cells: Vec<Vec<String>> = vec![cols.iter().map(|(_, h)| h.to_string()).collect()];
    for r in rows {
        cells.push(
            cols.iter()
                .map(|(k, _)| match r.get(*k) {
                    Some(Value::Number(n)) => {
                        let x = n.as_f64().unwrap_or(0.0);
                        if n.is_f64() {
                            dmover_bench::plot::format_value(x)
                        } else {
                            n.to_string()
                        }
                    }
                    Some(Value::Bool(b)) => if *b { "yes" } else { "no" }.into(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|v| match v {
                            Value::Null => "-".to_string(),
                            Value::String(s) => s.clone(),
                            v => v.to_string(),
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                    _ => {
                        let t = text(r, k);
                        if t.chars().count() > 60 {
                            t.chars().take(59).chain(['…']).collect()
                        } else {
                            t
                        }
                    }
                })
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..cols.len())
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (n, r) in cells.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
        if n == 0 {
            println!(
                "{}",
                widths
                    .iter()
                    .map(|w| "-".repeat(*w))
                    .collect::<Vec<_>>()
                    .join("  ")
            );
        }
    }
}

/// A positive byte size, an item of a list like `4K,1M,1G`.
pub fn size_item(x: &str) -> Result<u64, String> {
    let v = dmover_proto::units::parse_size(x)?;
    if v == 0 {
        return Err(format!("size {x:?} must be positive"));
    }
    Ok(v)
}

/// A count between 1 and 4096, an item of a list like `1,2,4,8`.
pub fn count_item(x: &str) -> Result<usize, String> {
    match x.trim().parse::<usize>() {
        Ok(v) if (1..=4096).contains(&v) => Ok(v),
        _ => Err(format!("{x:?} is not a count between 1 and 4096")),
    }
}

/// Drops the page cache if permitted; notes once in `report` when it is not.
pub fn drop_caches(report: &mut Report) -> bool {
    match dmover_bench::storage::drop_caches() {
        Ok(()) => true,
        Err(e) => {
            report.note(format!(
                "page cache not dropped ({e}; needs root): reads may come from memory, \
                 runs are not cold"
            ));
            false
        }
    }
}

/// A dataset to copy: an existing directory, or a profile name generated (once, and
/// kept) below `gen_root`.
pub struct Dataset {
    /// Directory holding the dataset (it is one entry in it).
    pub parent: PathBuf,
    /// The dataset's directory name.
    pub name: String,
    /// Regular files in it.
    pub files: u64,
    /// Bytes of regular files.
    pub bytes: u64,
}

impl Dataset {
    /// Resolves `spec`: a directory, or `tiny|losf|medium|large|mixed|demo|events` made with
    /// `scale` and `seed` in `gen_root/<profile>-x<scale>-s<seed>`.
    pub fn resolve(spec: &str, gen_root: &Path, scale: f64, seed: u64) -> anyhow::Result<Dataset> {
        let p = Path::new(spec);
        let dir = if p.is_dir() {
            std::fs::canonicalize(p).with_context(|| format!("resolving {spec}"))?
        } else if let Ok(profile) = spec.parse::<dmover_bench::mkdata::Profile>() {
            let dir = gen_root.join(format!("{profile}-x{scale}-s{seed}"));
            let done = gen_root.join(format!(".{profile}-x{scale}-s{seed}.ok"));
            if !(dir.is_dir() && done.exists()) {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(gen_root)
                    .with_context(|| format!("creating {}", gen_root.display()))?;
                eprintln!(
                    "generating {profile} (scale {scale}, seed {seed}) in {}",
                    dir.display()
                );
                let spec = dmover_bench::mkdata::Spec::new(profile)
                    .scale(scale)
                    .seed(seed);
                let st = dmover_bench::mkdata::generate(&dir, &spec, None)
                    .with_context(|| format!("generating {profile} in {}", dir.display()))?;
                eprintln!("  {st}");
                rustix::fs::sync();
                std::fs::write(&done, st.to_string())
                    .with_context(|| format!("writing {}", done.display()))?;
            }
            std::fs::canonicalize(&dir)?
        } else {
            anyhow::bail!(
                "{spec} is neither a directory nor a dataset profile (tiny, losf, medium, large, mixed, demo, events)"
            );
        };
        let (files, bytes) =
            count_tree(&dir).with_context(|| format!("walking {}", dir.display()))?;
        Ok(Dataset {
            parent: dir
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| "/".into()),
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .context("a dataset cannot be /")?,
            files,
            bytes,
        })
    }

    /// The dataset's directory.
    pub fn path(&self) -> PathBuf {
        self.parent.join(&self.name)
    }
}

/// Regular files and their bytes below `dir` (symlinks not followed).
pub fn count_tree(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                files += 1;
                bytes += e.metadata()?.len();
            }
        }
    }
    Ok((files, bytes))
}

/// One timed copy: page cache dropped first (when permitted), then the command, then a
/// `sync` inside the timed span (a copy is done when its data is on disk).
pub struct Timed {
    /// Wall-clock seconds including the final sync.
    pub seconds: f64,
    /// `Err` with the first line of the tool's output when it failed.
    pub result: Result<(), String>,
    /// What the command printed on stdout (empty when it could not run).
    pub stdout: String,
}

/// Runs `cmd` as one timed copy; `log` receives its output.
pub fn timed_copy(cmd: &mut std::process::Command, log: &Path, report: &mut Report) -> Timed {
    use std::process::Stdio;
    drop_caches(report);
    let t0 = Instant::now();
    // As `cmd.output()`, with the child's pid known to the interrupt handler.
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|child| {
            super::interrupt::set_child(Some(child.id()));
            let out = child.wait_with_output();
            super::interrupt::set_child(None);
            out
        });
    rustix::fs::sync();
    let seconds = t0.elapsed().as_secs_f64();
    let stdout = out
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let result = match out {
        Err(e) => Err(format!("cannot run {:?}: {e}", cmd.get_program())),
        Ok(o) => {
            let _ = std::fs::write(
                log,
                [
                    format!("{cmd:?}\n").into_bytes(),
                    o.stdout.clone(),
                    o.stderr.clone(),
                ]
                .concat(),
            );
            if o.status.success() {
                Ok(())
            } else {
                let text = String::from_utf8_lossy(&o.stderr);
                let first = text
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .unwrap_or("(no output)");
                let first: String = first.chars().take(200).collect();
                Err(format!("{}: {first}", o.status))
            }
        }
    };
    Timed {
        seconds,
        result,
        stdout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_reject() {
        assert_eq!(size_item("1M"), Ok(1 << 20));
        assert!(size_item("").is_err());
        assert!(size_item("0").is_err());
        assert_eq!(count_item(" 8"), Ok(8));
        assert!(count_item("0").is_err());
        assert!(count_item("x").is_err());
    }

    #[test]
    fn throughput_columns_use_the_median_time() {
        let mut r = Map::new();
        add_throughput(&mut r, 1_000_000_000, 10, &[2.0, 1.0, 4.0]);
        assert_eq!(num(&r, "seconds"), Some(2.0));
        assert_eq!(num(&r, "gbit_per_s"), Some(4.0));
        assert_eq!(num(&r, "gbit_per_s_min"), Some(2.0));
        assert_eq!(num(&r, "gbit_per_s_max"), Some(8.0));
        assert_eq!(num(&r, "spread"), Some(1.5));
        assert_eq!(num(&r, "files_per_s"), Some(5.0));
        assert_eq!(r["seconds_samples"], json!([2.0, 1.0, 4.0]));
    }
}
