//! `dmover bench transfer --tune`: the trajectory of a self-tuning transfer (its rate and
//! the streams it sends on, over time), read from the `--progress ndjson` lines of the
//! `dmover cp` it ran (docs/json.md), written as `trajectory.csv` and drawn next to the
//! fixed grid's rates.

use dmover_bench::plot::{Figure, Panel, Point, Series, Trajectory};
use dmover_bench::report::{round_sig, size_label};
use serde_json::{Map, Value, json};

use super::common::{num, text};

/// Time between two progress samples of a tuned run (`--progress-interval`).
pub const INTERVAL: &str = "500ms";

/// Seconds of the trailing window of `gbit_per_s_2s`, the rate drawn: `bytes_sent`
/// grows by whole chunks (16 MiB is 0.27 Gbit/s over 0.5 s), so the rate over one
/// interval jumps between multiples of a chunk; over 2 s the step is a quarter of that.
pub const WINDOW: f64 = 2.0;

/// The columns of `trajectory.csv`, in order (docs/benchmarks.md).
pub const COLUMNS: [&str; 18] = [
    "run",
    "rtt_ms",
    "link",
    "link_rate",
    "direction",
    "repeat",
    "chunk",
    "chunk_bytes",
    "seconds",
    "event",
    "bytes",
    "interval_seconds",
    "gbit_per_s",
    "gbit_per_s_2s",
    "streams",
    "streams_of",
    "tuner_gbit_per_s",
    "reason",
];

/// What a sample records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A `progress` line: bytes so far and the rate since the previous one.
    Progress,
    /// A `tuning` line: the tuner's decision.
    Tuning,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Progress => "progress",
            Event::Tuning => "tuning",
        }
    }
}

/// One point of a trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Seconds since the copy started (its own clock).
    pub seconds: f64,
    /// What the line was.
    pub event: Event,
    /// Progress: payload bytes across the data streams so far.
    pub bytes: Option<u64>,
    /// Progress: seconds since the previous progress line.
    pub interval_seconds: Option<f64>,
    /// Progress: Gbit/s since the previous progress line.
    pub gbit_per_s: Option<f64>,
    /// Progress: Gbit/s since the latest progress line at least [`WINDOW`] earlier
    /// (since the start, before there is one).
    pub window_gbit_per_s: Option<f64>,
    /// Streams the source sends on at this time (the last decision's); `None` before
    /// the first decision (set-up) and without tuning.
    pub streams: Option<u16>,
    /// Tuning: the rate the tuner measured before deciding.
    pub tuner_gbit_per_s: Option<f64>,
    /// Tuning: why.
    pub reason: Option<String>,
}

/// A tuned run's trajectory and where it ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// The samples in the order printed.
    pub samples: Vec<Sample>,
    /// The summary's chunk size.
    pub chunk: Option<u64>,
    /// The summary's `tuning.streams`: the streams it ended with.
    pub streams_end: Option<u16>,
    /// The summary's `tuning.of`: the session's streams, the most it could use.
    pub streams_of: Option<u16>,
    /// The summary's `tuning.changes`.
    pub changes: Option<u32>,
    /// The summary's `tuning.settled_seconds`.
    pub settled_seconds: Option<f64>,
}

/// Reads the `--progress ndjson` output of one `dmover cp`: `progress` and `tuning`
/// lines become samples, the `summary` gives where the tuner ended. Lines that are not
/// JSON objects, and types it does not know, are skipped.
pub fn parse(ndjson: &str) -> Trace {
    let mut t = Trace::default();
    let mut streams: Option<u16> = None;
    let mut last_progress: Option<f64> = None;
    // (seconds, bytes) of the progress lines so far, from the start.
    let mut marks: Vec<(f64, u64)> = vec![(0.0, 0)];
    let u16_of = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    for line in ndjson.lines() {
        let Ok(Value::Object(v)) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let seconds = v.get("seconds").and_then(Value::as_f64);
        match v.get("type").and_then(Value::as_str) {
            Some("progress") => {
                let Some(seconds) = seconds else { continue };
                let bytes = v.get("bytes_sent").and_then(Value::as_u64);
                let window_gbit_per_s = bytes.map(|b| {
                    let &(t0, b0) = marks
                        .iter()
                        .rev()
                        .find(|m| seconds - m.0 >= WINDOW)
                        .unwrap_or(&marks[0]);
                    let span = seconds - t0;
                    if span > 0.0 {
                        b.saturating_sub(b0) as f64 * 8.0 / span / 1e9
                    } else {
                        0.0
                    }
                });
                if let Some(b) = bytes {
                    marks.push((seconds, b));
                }
                t.samples.push(Sample {
                    seconds,
                    event: Event::Progress,
                    bytes,
                    window_gbit_per_s,
                    interval_seconds: Some(seconds - last_progress.unwrap_or(0.0)),
                    gbit_per_s: v.get("bit_per_s").and_then(Value::as_f64).map(|b| b / 1e9),
                    streams,
                    tuner_gbit_per_s: None,
                    reason: None,
                });
                last_progress = Some(seconds);
            }
            Some("tuning") => {
                let Some(seconds) = seconds else { continue };
                streams = v.get("streams").and_then(u16_of).or(streams);
                t.samples.push(Sample {
                    seconds,
                    event: Event::Tuning,
                    bytes: None,
                    interval_seconds: None,
                    gbit_per_s: None,
                    window_gbit_per_s: None,
                    streams,
                    tuner_gbit_per_s: v.get("gbit_per_s").and_then(Value::as_f64),
                    reason: v.get("reason").and_then(Value::as_str).map(String::from),
                });
            }
            Some("summary") => {
                t.chunk = v.get("chunk").and_then(Value::as_u64).filter(|&c| c > 0);
                if let Some(Value::Object(tu)) = v.get("tuning") {
                    t.streams_end = tu.get("streams").and_then(u16_of);
                    t.streams_of = tu.get("of").and_then(u16_of);
                    t.changes = tu
                        .get("changes")
                        .and_then(Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok());
                    t.settled_seconds = tu.get("settled_seconds").and_then(Value::as_f64);
                }
            }
            _ => {}
        }
    }
    t
}

/// The `trajectory.csv` rows of run number `run`: `context` (its `rtt_ms`, `link`,
/// `link_rate`, `direction`, `repeat`) and the trace's chunk size in every row, one
/// row per sample.
pub fn rows(run: u32, context: &Map<String, Value>, trace: &Trace) -> Vec<Map<String, Value>> {
    let opt = |x: Option<f64>, digits| x.map_or(Value::Null, |x| json!(round_sig(x, digits)));
    trace
        .samples
        .iter()
        .map(|s| {
            let mut r = Map::new();
            r.insert("run".into(), json!(run));
            r.extend(context.clone());
            r.insert(
                "chunk".into(),
                trace.chunk.map_or(Value::Null, |c| json!(size_label(c))),
            );
            r.insert("chunk_bytes".into(), json!(trace.chunk));
            r.insert("seconds".into(), json!(round_sig(s.seconds, 5)));
            r.insert("event".into(), json!(s.event.name()));
            r.insert("bytes".into(), json!(s.bytes));
            r.insert("interval_seconds".into(), opt(s.interval_seconds, 4));
            r.insert("gbit_per_s".into(), opt(s.gbit_per_s, 4));
            r.insert("gbit_per_s_2s".into(), opt(s.window_gbit_per_s, 4));
            r.insert("streams".into(), json!(s.streams));
            r.insert("streams_of".into(), json!(trace.streams_of));
            r.insert("tuner_gbit_per_s".into(), opt(s.tuner_gbit_per_s, 4));
            r.insert("reason".into(), json!(s.reason));
            r
        })
        .collect()
}

/// `rows` as `trajectory.csv`: the header is [`COLUMNS`], whatever the rows hold.
pub fn to_csv(rows: &[Map<String, Value>]) -> String {
    let columns: Vec<String> = COLUMNS.iter().map(|c| c.to_string()).collect();
    dmover_bench::report::to_csv(&columns, rows)
}

/// A panel per link and direction that has tuned runs (in the order of `grid`, the
/// sweep's rows): each run's rate over time (`gbit_per_s_2s`) with the streams it sent
/// on as a step line on the right axis, the tuner's own measurement at each decision
/// (the streams' TCP-acknowledged bytes, not whole chunks), and a dashed line at each
/// grid row's median rate in that cell (the fixed settings, and the tuned runs' own
/// whole-run rate: wall time with set-up and the final sync, as every grid row).
pub fn figure(title: String, grid: &[Map<String, Value>], traj: &[Map<String, Value>]) -> Figure {
    let cell = |r: &Map<String, Value>| (text(r, "link"), text(r, "direction"));
    let mut cells: Vec<(String, String)> = Vec::new();
    for r in traj {
        if !cells.contains(&cell(r)) {
            cells.push(cell(r));
        }
    }
    let order = |c: &(String, String)| grid.iter().position(|r| cell(r) == *c);
    cells.sort_by_key(|c| order(c).unwrap_or(usize::MAX));
    let panels = cells
        .iter()
        .map(|c| {
            let mut rates: Vec<Series> = Vec::new();
            let mut steps: Vec<Series> = Vec::new();
            let mut marks: Vec<Series> = Vec::new();
            let mut runs: Vec<String> = Vec::new();
            let mut first_decision: Vec<bool> = Vec::new();
            for r in traj.iter().filter(|r| cell(r) == *c) {
                let run = text(r, "run");
                if !runs.contains(&run) {
                    runs.push(run.clone());
                    let rep = text(r, "repeat");
                    // One legend entry for all steps and one for all marks: the
                    // colour says the repeat.
                    let first = runs.len() == 1;
                    let once = |name: &str| {
                        if first {
                            name.to_string()
                        } else {
                            String::new()
                        }
                    };
                    rates.push(Series {
                        name: format!("tuned r{rep}"),
                        points: Vec::new(),
                    });
                    steps.push(Series {
                        name: once("streams sending (steps, right axis)"),
                        points: Vec::new(),
                    });
                    marks.push(Series {
                        name: once("tuner's measurement (TCP acked)"),
                        points: Vec::new(),
                    });
                    first_decision.push(true);
                }
                let i = runs.iter().position(|x| *x == run).unwrap_or(0);
                let Some(x) = num(r, "seconds") else { continue };
                let pt = |y| Point {
                    x,
                    y,
                    lo: None,
                    hi: None,
                };
                if let Some(s) = num(r, "streams") {
                    steps[i].points.push(pt(s));
                }
                if text(r, "event") == "progress" {
                    if let Some(g) = num(r, "gbit_per_s_2s") {
                        rates[i].points.push(pt(g));
                    }
                }
                // A decision's rate is the tuner's measurement of the period it ends,
                // but for the first (where it starts: no measurement).
                if text(r, "event") == "tuning" && !std::mem::replace(&mut first_decision[i], false)
                {
                    if let Some(g) = num(r, "tuner_gbit_per_s") {
                        marks[i].points.push(pt(g));
                    }
                }
            }
            let references = grid
                .iter()
                .filter(|r| cell(r) == *c && text(r, "status") == "ok")
                .filter_map(|r| {
                    let g = num(r, "gbit_per_s")?;
                    let name = match text(r, "streams").as_str() {
                        "tuned" => format!("tuned, whole run: {}", round_sig(g, 3)),
                        s => format!("-P {s}, {}: {}", text(r, "chunk"), round_sig(g, 3)),
                    };
                    Some((name, g))
                })
                .collect();
            let link = match c.0.as_str() {
                "loopback" => "loopback".to_string(),
                l => format!("RTT {l}"),
            };
            Panel::Trajectory(Trajectory {
                title: format!("{link}, {}", c.1),
                x_label: "seconds since the copy started".into(),
                y_label: "Gbit/s (lines: over 2 s; dashed: whole runs)".into(),
                y2_label: "streams sending".into(),
                rates,
                steps,
                marks,
                references,
            })
        })
        .collect();
    Figure { title, panels }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `dmover cp --progress ndjson` printed for a short tuned push (shortened).
    const NDJSON: &str = r#"{"schema":1,"type":"progress","seconds":0.5,"bytes_sent":0,"bytes_total":0,"bytes_resumed":0,"chunks":0,"files":0,"files_total":0,"bit_per_s":0.0,"avg_bit_per_s":0.0,"streams_lost":0,"attempt":1}
{"schema":1,"type":"tuning","attempt":1,"streams":4,"gbit_per_s":0.0,"reason":"starting with 4 of 16 streams","seconds":0.61}
{"schema":1,"type":"progress","seconds":1.0,"bytes_sent":50000000,"bit_per_s":800000000.0,"attempt":1}
{"schema":1,"type":"files_done","attempt":1,"seconds":1.4,"count":1,"files":["d/f0"]}
dmover: a stray line that is not JSON
{"schema":1,"type":"tuning","attempt":1,"streams":8,"gbit_per_s":0.41,"reason":"4 streams at 0.41 Gbit/s: trying 8","seconds":1.42}
{"schema":1,"type":"progress","seconds":1.5,"bytes_sent":100000000,"bit_per_s":800000000.0,"attempt":1}
{"schema":1,"type":"something_new","seconds":1.6}
{"schema":1,"type":"progress","seconds":1.51,"bytes_sent":100100000,"bit_per_s":80000000.0,"attempt":1}
{"schema":1,"type":"summary","ok":true,"chunk":16777216,"streams":16,"tuning":{"streams":8,"of":16,"changes":1,"settled_seconds":null}}
"#;

    #[test]
    fn progress_and_tuning_lines_become_samples_with_the_streams_in_use() {
        let t = parse(NDJSON);
        let kinds: Vec<Event> = t.samples.iter().map(|s| s.event).collect();
        use Event::{Progress as P, Tuning as T};
        assert_eq!(kinds, [P, T, P, T, P, P]);
        let streams: Vec<Option<u16>> = t.samples.iter().map(|s| s.streams).collect();
        assert_eq!(
            streams,
            [None, Some(4), Some(4), Some(8), Some(8), Some(8)],
            "each sample carries the last decision's streams"
        );
        assert_eq!(t.samples[2].gbit_per_s, Some(0.8));
        assert_eq!(t.samples[2].bytes, Some(50_000_000));
        assert_eq!(t.samples[2].interval_seconds, Some(0.5));
        assert_eq!(t.samples[2].window_gbit_per_s, Some(0.4));
        assert_eq!(t.samples[3].tuner_gbit_per_s, Some(0.41));
        assert_eq!(
            t.samples[3].reason.as_deref(),
            Some("4 streams at 0.41 Gbit/s: trying 8")
        );
        assert_eq!(t.chunk, Some(16 << 20));
        assert_eq!(t.streams_end, Some(8));
        assert_eq!(t.streams_of, Some(16));
        assert_eq!(t.changes, Some(1));
        assert_eq!(t.settled_seconds, None);
        // The drawn rate: over the latest line at least 2 s back.
        let line = |t: u32, b: u64| {
            format!(r#"{{"type":"progress","seconds":{t}.0,"bytes_sent":{b},"bit_per_s":1.0}}"#)
        };
        let text: Vec<String> = [(1, 100), (2, 200), (3, 300), (4, 500)]
            .iter()
            .map(|&(t, mb)| line(t, mb * 1_000_000))
            .collect();
        let w: Vec<Option<f64>> = parse(&text.join("\n"))
            .samples
            .iter()
            .map(|s| s.window_gbit_per_s)
            .collect();
        assert_eq!(w, [Some(0.8), Some(0.8), Some(0.8), Some(1.2)]);
        // Nothing parseable: an empty trace, no panic.
        assert_eq!(
            parse("garbage\n{\"type\":\"progress\"}\n[1,2]"),
            Trace::default()
        );
    }

    #[test]
    fn rows_have_the_documented_columns_and_one_line_per_sample() {
        let t = parse(NDJSON);
        let ctx: Map<String, Value> = [
            ("rtt_ms", json!(50)),
            ("link", json!("50 ms")),
            ("link_rate", json!("1gbit")),
            ("direction", json!("push")),
            ("repeat", json!(1)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let rows = rows(3, &ctx, &t);
        assert_eq!(rows.len(), 6);
        for r in &rows {
            let mut keys: Vec<&str> = r.keys().map(String::as_str).collect();
            let mut want = COLUMNS.to_vec();
            keys.sort_unstable();
            want.sort_unstable();
            assert_eq!(keys, want, "a row has exactly the documented columns");
        }
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 7);
        assert_eq!(lines[0], COLUMNS.join(","));
        assert!(lines.iter().all(|l| l.split(',').count() >= COLUMNS.len()));
        assert_eq!(
            lines[4],
            "3,50,50 ms,1gbit,push,1,16M,16777216,1.42,tuning,,,,,8,16,0.41,\
             4 streams at 0.41 Gbit/s: trying 8"
        );
        assert!(lines[3].starts_with(
            "3,50,50 ms,1gbit,push,1,16M,16777216,1.0,progress,50000000,0.5,0.8,0.4,4,16,,"
        ));
        // No rows: the header alone.
        assert_eq!(to_csv(&[]), format!("{}\n", COLUMNS.join(",")));
    }

    #[test]
    fn the_figure_has_a_panel_per_cell_with_the_grid_as_references() {
        let t = parse(NDJSON);
        let ctx = |dir: &str| -> Map<String, Value> {
            [
                ("link", json!("50 ms")),
                ("direction", json!(dir)),
                ("repeat", json!(1)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        };
        let mut traj = rows(1, &ctx("push"), &t);
        traj.extend(rows(2, &ctx("pull"), &t));
        let grid_row = |dir: &str, streams: Value, g: f64, status: &str| -> Map<String, Value> {
            [
                ("link", json!("50 ms")),
                ("direction", json!(dir)),
                ("streams", streams),
                ("chunk", json!("16M")),
                ("gbit_per_s", json!(g)),
                ("status", json!(status)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        };
        let grid = vec![
            grid_row("pull", json!(4), 0.7, "ok"),
            grid_row("pull", json!(16), 0.9, "failed: x"),
            grid_row("pull", json!("tuned"), 0.8, "ok"),
            grid_row("push", json!(4), 0.6, "ok"),
        ];
        let fig = figure("t".into(), &grid, &traj);
        assert_eq!(fig.panels.len(), 2);
        let Panel::Trajectory(pull) = &fig.panels[0] else {
            panic!("a trajectory panel")
        };
        assert_eq!(pull.title, "RTT 50 ms, pull", "the grid's order");
        assert_eq!(
            pull.references,
            vec![
                ("-P 4, 16M: 0.7".to_string(), 0.7),
                ("tuned, whole run: 0.8".to_string(), 0.8)
            ],
            "failed points are no reference"
        );
        // The rate over the trailing 2 s (from the start, for these first seconds).
        let pts: Vec<(f64, f64)> = pull.rates[0].points.iter().map(|p| (p.x, p.y)).collect();
        assert_eq!(pts, [(0.5, 0.0), (1.0, 0.4), (1.5, 0.5333), (1.51, 0.5303)]);
        let marks: Vec<(f64, f64)> = pull.marks[0].points.iter().map(|p| (p.x, p.y)).collect();
        assert_eq!(marks, [(1.42, 0.41)], "the start is no measurement");
        let steps: Vec<(f64, f64)> = pull.steps[0].points.iter().map(|p| (p.x, p.y)).collect();
        assert_eq!(
            steps,
            [
                (0.61, 4.0),
                (1.0, 4.0),
                (1.42, 8.0),
                (1.5, 8.0),
                (1.51, 8.0)
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("t.png");
        fig.save_in_columns(&png, 2).unwrap();
        assert!(std::fs::metadata(&png).unwrap().len() > 5000);
    }
}
