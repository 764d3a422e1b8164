//! `dmover bench cpu`: the single-core rate of every primitive dmover runs over every
//! byte it moves, through the same functions the transfers call, beside
//! `openssl speed -evp aes-256-gcm` on one thread.
//!
//! The primitives: the data records' AES-256-GCM (sealed and opened, encrypted with
//! `--encrypt`, authenticated only by default: a GMAC over the plaintext) through
//! [`dmover_net::stream::RecordCipher`], the chunk CRC32C
//! ([`dmover_proto::digest::crc32c_append`]), the xxh3-64 piece hash
//! ([`dmover_proto::digest::piece_hash`]), the per-file digest built from it
//! ([`dmover_proto::digest::FileDigest`]), and a memcpy. Each runs alone on one thread
//! over the same buffer (cache-resident, as `openssl speed`'s is) for `--seconds`, in
//! `--repeats` interleaved rounds; rows give the median rate and the min–max.

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use dmover_bench::plot::{Bar, Bars, Figure, Panel};
use dmover_bench::report::{
    Report, find_program, round_sig, size_label, thread_cpu_time, tool_version,
};
use dmover_bench::stats::Summary;
use dmover_net::stream::RecordCipher;
use dmover_proto::digest::{FileDigest, crc32c_append, piece_hash};
use dmover_proto::record::{self, HEADER_LEN, MAX_RECORD, TAG_LEN};
use serde_json::{Map, Value, json};

use super::common::{self, OutputArgs, Progress, num, row, text};
use crate::env::Env;

/// Goal of issue 44: dmover's AES-256-GCM per core against `openssl speed`'s.
const AES_GOAL: f64 = 0.8;

/// Arguments of `dmover bench cpu`.
#[derive(Debug, Args)]
pub struct CpuArgs {
    /// Bytes per call: the buffer each primitive runs over (AES-256-GCM seals it as
    /// records of at most 256 KiB, as a data stream does), and `openssl speed -bytes`.
    #[arg(long, default_value = "256K", value_parser = common::size_item)]
    pub buffer: u64,
    /// Seconds each primitive runs in each round.
    #[arg(long, default_value_t = 0.2, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Rounds over all primitives (interleaved, so a noisy neighbour hits them alike);
    /// rows give the median rate and the min–max.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// The `openssl` to compare AES-256-GCM with: `auto` (from PATH), `none`, or a path.
    /// It runs `openssl speed -evp aes-256-gcm -bytes BUFFER -seconds N` once per round
    /// (N: --seconds rounded up to whole seconds).
    #[arg(long, default_value = "auto", value_name = "PATH")]
    pub openssl: String,
    /// Print results.json on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the rows as CSV into this file (as results.csv).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_seconds(x: &str) -> Result<f64, String> {
    match x.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("{x:?} is not a number of seconds in (0, 3600]")),
    }
}

/// A primitive: its row name, the code it runs, what dmover uses it for.
struct Primitive {
    name: &'static str,
    library: &'static str,
    used_for: &'static str,
    /// Compared with `openssl speed`'s AES-256-GCM.
    aes: bool,
    work: Box<dyn Work>,
}

/// A point in time on both clocks: this thread's CPU time and the wall clock.
#[derive(Clone, Copy)]
struct Stamp {
    cpu: Duration,
    wall: Instant,
}

impl Stamp {
    fn now() -> Stamp {
        Stamp {
            cpu: thread_cpu_time(),
            wall: Instant::now(),
        }
    }

    /// Time spent since `self`.
    fn spent(self) -> Spent {
        let now = Stamp::now();
        Spent {
            cpu: now.cpu.saturating_sub(self.cpu),
            wall: now.wall - self.wall,
        }
    }
}

/// CPU and wall-clock time counted.
#[derive(Clone, Copy, Default)]
struct Spent {
    cpu: Duration,
    wall: Duration,
}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, o: Spent) {
        self.cpu += o.cpu;
        self.wall += o.wall;
    }
}

/// One primitive's state: runs `calls` calls over the buffer, returning the time to
/// count (the calls themselves, without any untimed preparation they need).
trait Work {
    fn run(&mut self, calls: u64) -> Spent;
}

/// Rate measured over whole calls: `f` runs over the buffer.
struct Timed<F>(F);

impl<F: FnMut()> Work for Timed<F> {
    fn run(&mut self, calls: u64) -> Spent {
        let t = Stamp::now();
        for _ in 0..calls {
            (self.0)();
        }
        t.spent()
    }
}

/// The record boundaries of a buffer of `len` bytes: `(start, end)` of each body, after
/// `HEADER_LEN` bytes of room (so an authenticated record's header can precede its body,
/// as in a data stream's chunk buffer).
fn records(len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut a = HEADER_LEN;
    while a < HEADER_LEN + len {
        let b = (a + MAX_RECORD).min(HEADER_LEN + len);
        out.push((a, b));
        a = b;
    }
    out
}

/// Seals every record of `buf` with sequence numbers from `seq`, as a data stream's
/// `seal_chunk` does (an authenticated record's header borrows the bytes before its
/// body and gives them back); returns the tags.
fn seal_all(
    c: &RecordCipher,
    encrypt: bool,
    seq: u64,
    buf: &mut [u8],
    recs: &[(usize, usize)],
) -> Vec<[u8; TAG_LEN]> {
    recs.iter()
        .enumerate()
        .map(|(i, &(a, b))| {
            let header = record::encode_header(b - a);
            if encrypt {
                c.seal(seq + i as u64, header, &mut buf[a..b], 0)
            } else {
                let run = &mut buf[a - HEADER_LEN..b];
                let saved: [u8; HEADER_LEN] = run[..HEADER_LEN].try_into().unwrap();
                run[..HEADER_LEN].copy_from_slice(&header);
                let tag = c.seal(seq + i as u64, header, run, HEADER_LEN);
                run[..HEADER_LEN].copy_from_slice(&saved);
                tag
            }
        })
        .collect()
}

/// Opens every record of `buf` (sequence numbers from 0), as a data stream's reads do;
/// `false` if one fails.
fn open_all(
    c: &RecordCipher,
    encrypt: bool,
    buf: &mut [u8],
    recs: &[(usize, usize)],
    tags: &[[u8; TAG_LEN]],
) -> bool {
    recs.iter()
        .zip(tags)
        .enumerate()
        .all(|(i, (&(a, b), tag))| {
            let header = record::encode_header(b - a);
            if encrypt {
                c.open(i as u64, header, &mut buf[a..b], 0, tag)
            } else {
                let run = &mut buf[a - HEADER_LEN..b];
                let saved: [u8; HEADER_LEN] = run[..HEADER_LEN].try_into().unwrap();
                run[..HEADER_LEN].copy_from_slice(&header);
                let ok = c.open(i as u64, header, run, HEADER_LEN, tag);
                run[..HEADER_LEN].copy_from_slice(&saved);
                ok
            }
        })
}

/// Sealing records, sequence numbers counting up as on a stream.
struct Seal {
    c: RecordCipher,
    encrypt: bool,
    seq: u64,
    buf: Vec<u8>,
    recs: Vec<(usize, usize)>,
}

impl Work for Seal {
    fn run(&mut self, calls: u64) -> Spent {
        let t = Stamp::now();
        for _ in 0..calls {
            let tags = seal_all(&self.c, self.encrypt, self.seq, &mut self.buf, &self.recs);
            black_box(tags);
            self.seq += self.recs.len() as u64;
        }
        t.spent()
    }
}

/// Opening the same sealed records again and again. Encrypted records are decrypted in
/// place, so they are sealed again (untimed: the same key, nonces and plaintext give
/// the same ciphertext) before each timed open.
struct Open {
    c: RecordCipher,
    encrypt: bool,
    buf: Vec<u8>,
    recs: Vec<(usize, usize)>,
    tags: Vec<[u8; TAG_LEN]>,
}

impl Work for Open {
    fn run(&mut self, calls: u64) -> Spent {
        let mut spent = Spent::default();
        let mut t = Stamp::now();
        for _ in 0..calls {
            if self.encrypt {
                self.tags = seal_all(&self.c, true, 0, &mut self.buf, &self.recs);
                t = Stamp::now();
            }
            let ok = open_all(&self.c, self.encrypt, &mut self.buf, &self.recs, &self.tags);
            assert!(ok, "a record sealed here failed to open");
            if self.encrypt {
                spent += t.spent();
            }
        }
        if !self.encrypt {
            spent = t.spent();
        }
        spent
    }
}

/// The primitives, in report order, over buffers of `len` bytes.
fn primitives(len: usize) -> Vec<Primitive> {
    let data: Vec<u8> = (0..HEADER_LEN + len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let key = [7u8; 32];
    let recs = records(len);
    let aead = |name, used_for, encrypt, open: bool| {
        let c = RecordCipher::new(&key, encrypt);
        let mut buf = data.clone();
        let work: Box<dyn Work> = if open {
            let tags = seal_all(&c, encrypt, 0, &mut buf, &recs);
            Box::new(Open {
                c,
                encrypt,
                buf,
                recs: recs.clone(),
                tags,
            })
        } else {
            Box::new(Seal {
                c,
                encrypt,
                seq: 0,
                buf,
                recs: recs.clone(),
            })
        };
        Primitive {
            name,
            library: "aws-lc-rs",
            used_for,
            aes: encrypt,
            work,
        }
    };
    let src = data[HEADER_LEN..].to_vec();
    let crc_src = src.clone();
    let xxh_src = src.clone();
    let digest_src = src.clone();
    let mut dst = vec![0u8; len];
    let mut digest = FileDigest::default();
    let mut piece = 0u64;
    vec![
        aead(
            "aes256gcm_seal",
            "--encrypt: each record encrypted and tagged (sender)",
            true,
            false,
        ),
        aead(
            "aes256gcm_open",
            "--encrypt: each record checked and decrypted (receiver)",
            true,
            true,
        ),
        aead(
            "gmac_seal",
            "default (authenticated): AES-256-GCM tag over each record (sender)",
            false,
            false,
        ),
        aead(
            "gmac_open",
            "default (authenticated): each record's tag checked (receiver)",
            false,
            true,
        ),
        Primitive {
            name: "crc32c",
            library: "crc-fast",
            used_for: "chunk checksum, both ends",
            aes: false,
            work: Box::new(Timed(move || {
                black_box(crc32c_append(0, black_box(&crc_src)));
            })),
        },
        Primitive {
            name: "xxh3",
            library: "twox-hash",
            used_for: "piece hash (xxh3-64 of a file's part of a chunk), both ends",
            aes: false,
            work: Box::new(Timed(move || {
                black_box(piece_hash(black_box(&xxh_src)));
            })),
        },
        Primitive {
            name: "file_digest",
            library: "twox-hash",
            used_for: "per-file digest: piece hashes folded in order (a piece per buffer)",
            aes: false,
            work: Box::new(Timed(move || {
                digest.add(piece, piece_hash(black_box(&digest_src)));
                piece += 1;
                black_box(digest.contiguous());
            })),
        },
        Primitive {
            name: "memcpy",
            library: "std",
            used_for: "a buffer copied (records of small pieces, non-zero-copy paths)",
            aes: false,
            work: Box::new(Timed(move || {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            })),
        },
    ]
}

/// One measurement: bytes per second of this thread's CPU time, and of wall-clock time.
#[derive(Clone, Copy)]
struct Rate {
    cpu: f64,
    wall: f64,
}

/// Runs `w` for `seconds` of counted CPU time, in batches of about 10 ms (the clocks
/// are read per batch, not per call).
fn measure(w: &mut dyn Work, bytes: usize, seconds: f64) -> Rate {
    let one = w.run(1).wall.as_secs_f64().max(1e-7);
    let batch = ((0.01 / one) as u64).clamp(1, 1 << 20);
    let (mut spent, mut calls) = (Spent::default(), 0u64);
    let limit = Duration::from_secs_f64(seconds);
    // The wall-clock bound only matters if the thread's CPU clock does not advance.
    while (spent.cpu < limit && spent.wall < limit * 20) || calls == 0 {
        spent += w.run(batch);
        calls += batch;
    }
    let total = (calls * bytes as u64) as f64;
    Rate {
        cpu: total / spent.cpu.as_secs_f64().max(1e-9),
        wall: total / spent.wall.as_secs_f64().max(1e-9),
    }
}

/// The bytes per second of the last row of `openssl speed`'s table
/// (`AES-256-GCM  4543739.25k`, in 1000s of bytes per second).
pub fn parse_openssl_speed(out: &str) -> Option<f64> {
    let last = out.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    let v = last.split_whitespace().last()?;
    let k: f64 = v.strip_suffix('k')?.parse().ok()?;
    (k > 0.0 && k.is_finite()).then_some(k * 1000.0)
}

/// One `openssl speed` run: bytes per second, or why there is none.
fn openssl_speed(openssl: &std::path::Path, bytes: u64, seconds: u64) -> Result<f64, String> {
    let out = Command::new(openssl)
        .args(["speed", "-evp", "aes-256-gcm", "-bytes"])
        .arg(bytes.to_string())
        .arg("-seconds")
        .arg(seconds.to_string())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", openssl.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match parse_openssl_speed(&text) {
        Some(r) if out.status.success() => Ok(r),
        _ => Err(format!(
            "openssl speed gave no rate ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("(no output)")
        )),
    }
}

/// The rate columns of a row from per-round bytes-per-second samples.
fn add_rates(r: &mut Map<String, Value>, samples: &[f64]) {
    let Some(s) = Summary::of(samples) else {
        r.insert("repeats".into(), json!(0));
        return;
    };
    let gb = |x: f64| round_sig(x / 1e9, 4);
    r.insert("repeats".into(), json!(s.n));
    r.insert("gbyte_per_s".into(), json!(gb(s.median)));
    r.insert("gbyte_per_s_min".into(), json!(gb(s.min)));
    r.insert("gbyte_per_s_max".into(), json!(gb(s.max)));
    r.insert(
        "gbit_per_s".into(),
        json!(round_sig(s.median * 8.0 / 1e9, 4)),
    );
    r.insert("spread".into(), json!(round_sig(s.spread, 3)));
    let v: Vec<f64> = samples.iter().map(|&x| gb(x)).collect();
    r.insert("gbyte_per_s_samples".into(), json!(v));
}

pub fn run(a: CpuArgs, env: &Env) -> anyhow::Result<()> {
    let started = Instant::now();
    let Ok(len) = usize::try_from(a.buffer) else {
        bail!("--buffer {} is too large", a.buffer)
    };
    // Each primitive keeps its own buffer or two.
    if len > 256 << 20 {
        bail!("--buffer {} is over 256M", size_label(a.buffer));
    }
    let out_dir = a.output.dir("cpu")?;
    let mut report = Report::new("cpu", &env.argv, std::path::Path::new("."));
    report.param("buffer", a.buffer);
    report.param("seconds", a.seconds);
    report.param("repeats", a.repeats);
    report.param("threads", 1);
    report.note(
        "one thread; every primitive runs over the same cache-resident buffer, as \
         `openssl speed` does; rates are per second of the thread's CPU time, as \
         `openssl speed` counts its user CPU time (gbyte_per_s_wall: per second of \
         wall-clock time, lower when other processes take the core); GB = 10^9 bytes",
    );
    let openssl = match a.openssl.as_str() {
        "none" => None,
        "auto" => find_program("openssl", &env.path),
        p => find_program(p, &env.path).or_else(|| {
            report.note(format!("--openssl {p}: no such program"));
            None
        }),
    };
    match &openssl {
        Some(p) => {
            // "OpenSSL 3.0.19 27 Jan 2026 (Library: ...)": name and version.
            let v = tool_version(&p.to_string_lossy(), &["version"])
                .map(|v| v.split_whitespace().take(2).collect::<Vec<_>>().join(" "));
            report.tools.insert(
                "openssl".into(),
                v.unwrap_or_else(|| "unknown version".into()),
            );
        }
        None if a.openssl == "none" => {
            report
                .tools
                .insert("openssl".into(), "not run (--openssl none)".into());
        }
        None => {
            report.tools.insert("openssl".into(), "missing".into());
        }
    }
    let ossl_secs = a.seconds.ceil().max(1.0) as u64;
    let mut prims = primitives(len);
    let mut samples: Vec<Vec<Rate>> = vec![Vec::new(); prims.len()];
    let mut ossl: Vec<f64> = Vec::new();
    let mut ossl_err: Option<String> = None;
    eprintln!(
        "cpu: {} primitives{} x {} round(s) of {}s on {} buffers; results in {}",
        prims.len(),
        if openssl.is_some() { " + openssl" } else { "" },
        a.repeats,
        a.seconds,
        size_label(a.buffer),
        out_dir.display()
    );
    let steps = u64::from(a.repeats) * (prims.len() as u64 + u64::from(openssl.is_some()));
    let mut progress = Progress::new(steps);
    for round in 1..=a.repeats {
        for (p, s) in prims.iter_mut().zip(&mut samples) {
            progress.start(&format!("{} (round {round})", p.name));
            let r = measure(p.work.as_mut(), len, a.seconds);
            s.push(r);
            progress.done(&format!(
                "{}: {:.2} GB/s ({:.2} GB/s of wall-clock time)",
                p.name,
                r.cpu / 1e9,
                r.wall / 1e9
            ));
        }
        if let Some(o) = &openssl
            && ossl_err.is_none()
        {
            progress.start(&format!("openssl speed (round {round})"));
            match openssl_speed(o, a.buffer, ossl_secs) {
                Ok(r) => {
                    ossl.push(r);
                    progress.done(&format!("openssl aes-256-gcm: {:.2} GB/s", r / 1e9));
                }
                Err(e) => {
                    progress.done(&e);
                    ossl_err = Some(e);
                }
            }
        }
    }
    progress.finish();
    let ossl_median = Summary::of(&ossl).map(|s| s.median);
    for (p, s) in prims.iter().zip(&samples) {
        let mut r = row(&[
            ("primitive", json!(p.name)),
            ("library", json!(p.library)),
            ("buffer_bytes", json!(a.buffer)),
        ]);
        let cpu: Vec<f64> = s.iter().map(|r| r.cpu).collect();
        let wall: Vec<f64> = s.iter().map(|r| r.wall).collect();
        add_rates(&mut r, &cpu);
        let median = Summary::of(&cpu).map_or(0.0, |s| s.median);
        r.insert(
            "gbyte_per_s_wall".into(),
            json!(Summary::of(&wall).map_or(0.0, |s| round_sig(s.median / 1e9, 4))),
        );
        r.insert(
            "vs_openssl".into(),
            match (p.aes, ossl_median) {
                (true, Some(o)) => json!(round_sig(median / o, 3)),
                _ => Value::Null,
            },
        );
        r.insert("used_for".into(), json!(p.used_for));
        report.push(r);
    }
    match (&openssl, ossl_median) {
        (Some(_), Some(_)) => {
            let mut r = row(&[
                ("primitive", json!("openssl_aes256gcm")),
                (
                    "library",
                    json!(report.tools.get("openssl").cloned().unwrap_or_default()),
                ),
                ("buffer_bytes", json!(a.buffer)),
            ]);
            add_rates(&mut r, &ossl);
            r.insert("vs_openssl".into(), json!(1.0));
            r.insert(
                "used_for".into(),
                json!(format!(
                    "reference: openssl speed -evp aes-256-gcm -bytes {} -seconds {ossl_secs} \
                     (user CPU time)",
                    a.buffer
                )),
            );
            report.push(r);
            for name in ["aes256gcm_seal", "aes256gcm_open"] {
                if let Some(x) = report
                    .rows
                    .iter()
                    .find(|r| text(r, "primitive") == name)
                    .and_then(|r| num(r, "vs_openssl"))
                {
                    report.note(format!(
                        "goal (issue 44): {name} >= {AES_GOAL} x openssl speed per core: \
                         {x:.2} x, {}",
                        if x >= AES_GOAL { "met" } else { "NOT met" }
                    ));
                }
            }
        }
        (Some(_), None) => report.note(format!(
            "no openssl comparison: {}",
            ossl_err.unwrap_or_else(|| "no rate".into())
        )),
        (None, _) if a.openssl == "none" => report.note("no openssl comparison: --openssl none"),
        (None, _) => report.note("no openssl comparison: openssl is missing"),
    }
    report.param("openssl_seconds", ossl_secs);
    if let Some(p) = &a.csv {
        std::fs::write(p, report.to_csv()).with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        report.seconds = round_sig(started.elapsed().as_secs_f64(), 4);
        report.write(&out_dir)?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        if let Some(path) = &a.output.plot
            && let Err(e) = figure(&report).save(path)
        {
            eprintln!("dmover: warning: no plot: {e}");
        }
        return Ok(());
    }
    let figure = a.output.plot.as_ref().map(|_| figure(&report));
    common::finish(
        report,
        started,
        &out_dir,
        &a.output,
        figure,
        &[
            ("primitive", "primitive"),
            ("library", "library"),
            ("gbyte_per_s", "GB/s"),
            ("gbyte_per_s_min", "min"),
            ("gbyte_per_s_max", "max"),
            ("spread", "spread"),
            ("vs_openssl", "x openssl"),
        ],
    )
}

/// One bar per primitive: median GB/s with min–max whiskers.
fn figure(report: &Report) -> Figure {
    Figure {
        title: format!(
            "dmover bench cpu: one core of {} ({} buffers)",
            report.machine.cpu_model,
            size_label(
                report
                    .parameters
                    .get("buffer")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            )
        ),
        panels: vec![Panel::Bars(Bars {
            title: "single-thread rate".into(),
            y_label: "GB/s".into(),
            categories: report.rows.iter().map(|r| text(r, "primitive")).collect(),
            series: vec![(
                "median".into(),
                report
                    .rows
                    .iter()
                    .map(|r| {
                        Some(Bar {
                            value: num(r, "gbyte_per_s")?,
                            lo: num(r, "gbyte_per_s_min"),
                            hi: num(r, "gbyte_per_s_max"),
                        })
                    })
                    .collect(),
            )],
        })],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openssl_speed_tables() {
        let out = "version: 3.0.19\n\
                   The 'numbers' are in 1000s of bytes per second processed.\n\
                   type         262144 bytes\n\
                   AES-256-GCM    4543739.25k\n\n";
        assert_eq!(parse_openssl_speed(out), Some(4_543_739_250.0));
        assert_eq!(parse_openssl_speed(""), None);
        assert_eq!(parse_openssl_speed("AES-256-GCM 0.00k"), None);
        assert_eq!(parse_openssl_speed("Error: unknown cipher"), None);
    }

    #[test]
    fn records_cover_the_buffer_and_open_after_sealing() {
        for len in [1, 4096, MAX_RECORD, MAX_RECORD + 1, 3 * MAX_RECORD] {
            let recs = records(len);
            assert_eq!(recs.first().unwrap().0, HEADER_LEN);
            assert_eq!(recs.last().unwrap().1, HEADER_LEN + len);
            assert!(recs.windows(2).all(|w| w[0].1 == w[1].0));
            assert!(recs.iter().all(|&(a, b)| b > a && b - a <= MAX_RECORD));
        }
        for encrypt in [false, true] {
            let c = RecordCipher::new(&[1; 32], encrypt);
            let plain: Vec<u8> = (0..HEADER_LEN + 600_000).map(|i| i as u8).collect();
            let mut buf = plain.clone();
            let recs = records(600_000);
            let tags = seal_all(&c, encrypt, 0, &mut buf, &recs);
            assert_eq!(buf != plain, encrypt);
            assert!(open_all(&c, encrypt, &mut buf, &recs, &tags));
            assert_eq!(buf, plain);
            buf[HEADER_LEN + 5] ^= 1;
            assert!(!open_all(&c, encrypt, &mut buf, &recs, &tags));
        }
    }
}
