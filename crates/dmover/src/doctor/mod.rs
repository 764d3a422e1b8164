//! `dmover doctor`: checks this host against ESnet fasterdata's host tuning for Data
//! Transfer Nodes and prints each finding with the exact fix. It reads files under
//! `/proc` and `/sys` (and `/proc/mounts`, `/lib/modules`) and changes nothing.
//!
//! Every check reads below a root (`/` unless the hidden `--sysroot` points elsewhere,
//! which the tests use with fake trees); a file that cannot be read makes its finding
//! `unknown`, never an error. With `HOST`, a few TCP connects to a dmover server measure
//! the round-trip time (used for the buffer checks unless `--rtt` is given) and the
//! route's MTU. docs/doctor.md lists the checks and their sources.

mod checks;
mod probe;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dmover_proto::units::{format_rate, parse_duration, parse_rate};
use serde::Serialize;

use checks::Host;

/// `dmover doctor [HOST[:PORT]]`
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// A dmover server to measure the path to (HOST, HOST:PORT or `[V6]:PORT`; port 7700 by
    /// default): the median TCP connect time becomes the RTT of the buffer checks unless
    /// --rtt is given, and the route's MTU is reported.
    #[arg(value_name = "HOST[:PORT]", value_parser = dmover_core::transfer::with_port)]
    pub host: Option<String>,
    /// Round-trip time to size TCP buffers for (a duration with a unit: 100ms, 1.5s)
    /// [default: measured to HOST, else 100ms].
    #[arg(long, value_parser = parse_duration)]
    pub rtt: Option<Duration>,
    /// Rate to size TCP buffers for (bits: 10gbit, 100gbit; bytes per second: 1.25GB/s).
    #[arg(long, default_value = "10gbit", value_parser = parse_rate)]
    pub rate: u64,
    /// Directory to be served or written (an export): its file system and mount options
    /// are checked.
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// TCP connects to HOST for the RTT median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub connects: u32,
    /// Give up on one connect to HOST after this long (a duration with a unit).
    #[arg(long, default_value = "3s", value_parser = parse_duration, value_name = "D")]
    pub connect_timeout: Duration,
    /// Print one JSON object with every finding on stdout.
    #[arg(long)]
    pub json: bool,
    /// Read /proc, /sys, /lib/modules under this directory instead of / (tests).
    #[arg(long, hide = true, default_value = "/")]
    pub sysroot: PathBuf,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As recommended.
    Ok,
    /// Not as recommended, and it costs throughput: the exit code is 1.
    Warn,
    /// Worth knowing or a softer recommendation; does not change the exit code.
    Info,
    /// What the check needs could not be read (missing file, not Linux, ...).
    Unknown,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Info => "info",
            Status::Unknown => "unknown",
        }
    }
}

/// A line to add to a configuration file so a fix survives a reboot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Persist {
    /// The file (e.g. `/etc/sysctl.d/90-dmover.conf`).
    pub file: String,
    /// The line to put in it.
    pub line: String,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Stable identifier (`rmem_max`, `congestion_control`, ...).
    pub id: &'static str,
    /// The outcome.
    pub status: Status,
    /// What this host has.
    pub seen: String,
    /// What the tuning guides recommend, and why.
    pub recommended: String,
    /// Commands (as root) that apply the recommendation now; empty when there is
    /// nothing to do or nothing exact to say.
    pub fix: Vec<String>,
    /// Lines that keep the fix across reboots.
    pub persist: Vec<Persist>,
    /// Where the recommendation comes from.
    pub source: &'static str,
}

impl Finding {
    fn new(id: &'static str, source: &'static str) -> Finding {
        Finding {
            id,
            status: Status::Unknown,
            seen: String::new(),
            recommended: String::new(),
            fix: Vec::new(),
            persist: Vec::new(),
            source,
        }
    }
}

/// What the buffer checks were sized for.
#[derive(Debug, Clone, Serialize)]
pub struct Sizing {
    /// Round-trip time, in milliseconds.
    pub rtt_ms: f64,
    /// Where the RTT came from: `option` (--rtt), `measured` (to HOST) or `default`.
    pub rtt_from: &'static str,
    /// Rate, in bits per second.
    pub rate_bit_per_s: u64,
    /// Bandwidth-delay product, in bytes.
    pub bdp_bytes: u64,
}

/// The JSON document of `--json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    /// The schema's version ([`crate::output::SCHEMA`]).
    schema: u32,
    /// dmover's version.
    version: &'static str,
    sysroot: String,
    sizing: &'a Sizing,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a probe::Probe>,
    warnings: usize,
    findings: &'a [Finding],
}

/// The RTT assumed without `--rtt` or a measurement.
pub const DEFAULT_RTT: Duration = Duration::from_millis(100);

/// Bandwidth-delay product in bytes of `rtt` at `rate` bits per second.
pub fn bdp(rtt: Duration, rate: u64) -> u64 {
    let bits = u128::from(rate) * rtt.as_nanos() / 1_000_000_000;
    u64::try_from(bits / 8).unwrap_or(u64::MAX)
}

pub fn run(a: DoctorArgs) -> anyhow::Result<ExitCode> {
    let probe = a
        .host
        .as_deref()
        .map(|h| probe::probe(h, a.connects, a.connect_timeout));
    let (rtt, rtt_from) = match (a.rtt, probe.as_ref().and_then(|p| p.median())) {
        (Some(r), _) => (r, "option"),
        (None, Some(m)) => (m, "measured"),
        (None, None) => (DEFAULT_RTT, "default"),
    };
    let sizing = Sizing {
        rtt_ms: rtt.as_nanos() as f64 / 1e6,
        rtt_from,
        rate_bit_per_s: a.rate,
        bdp_bytes: bdp(rtt, a.rate),
    };
    let host = Host::new(&a.sysroot, &sizing);
    let mut findings = host.check_all(a.path.as_deref());
    if let Some(p) = &probe {
        findings.extend(p.findings());
    }
    let warnings = findings.iter().filter(|f| f.status == Status::Warn).count();
    let mut out = std::io::stdout().lock();
    if a.json {
        let report = Report {
            schema: crate::output::SCHEMA,
            version: crate::output::VERSION,
            sysroot: a.sysroot.display().to_string(),
            sizing: &sizing,
            host: probe.as_ref(),
            warnings,
            findings: &findings,
        };
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        render(&mut out, &sizing, &findings)?;
    }
    out.flush()?;
    Ok(if warnings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Columns of the text report (commands are never wrapped).
const WIDTH: usize = 100;

/// The text report: one block per finding, then the lines to persist, grouped by file.
fn render(out: &mut impl Write, s: &Sizing, findings: &[Finding]) -> std::io::Result<()> {
    writeln!(
        out,
        "dmover doctor: this host against ESnet fasterdata's DTN host tuning (changes nothing)"
    )?;
    let from = match s.rtt_from {
        "measured" => "RTT measured to the server",
        "option" => "RTT from --rtt",
        _ => "default RTT; give --rtt or HOST",
    };
    writeln!(
        out,
        "TCP buffers sized for {} x {} ({from}): bandwidth-delay product {}\n",
        fmt_ms(s.rtt_ms),
        format_rate(s.rate_bit_per_s),
        fmt_bytes(s.bdp_bytes),
    )?;
    for f in findings {
        writeln!(
            out,
            "{:<8}{:<20}{}",
            f.status.label(),
            f.id,
            wrap(&f.seen, 28, WIDTH)
        )?;
        if f.status != Status::Ok && !f.recommended.is_empty() {
            writeln!(out, "{:28}want: {}", "", wrap(&f.recommended, 34, WIDTH))?;
        }
        if matches!(f.status, Status::Warn | Status::Info) {
            for c in &f.fix {
                writeln!(out, "{:28}fix:  {c}", "")?;
            }
        }
    }
    let mut files: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for f in findings.iter().filter(|f| f.status == Status::Warn) {
        for p in &f.persist {
            files.entry(&p.file).or_default().push(&p.line);
        }
    }
    for (file, lines) in &files {
        writeln!(out, "\nTo keep the fixes across reboots, put in {file}:")?;
        for l in lines {
            writeln!(out, "    {l}")?;
        }
        if file.starts_with("/etc/sysctl.d/") {
            writeln!(out, "and load it with: sysctl --system")?;
        }
    }
    let count = |st| findings.iter().filter(|f| f.status == st).count();
    writeln!(
        out,
        "\n{} ok, {} warnings, {} info, {} unknown (details: docs/doctor.md)",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Info),
        count(Status::Unknown)
    )
}

/// `212992 bytes (208 KiB)`: the exact number, and binary units for people.
fn fmt_bytes(b: u64) -> String {
    if b < 1024 {
        format!("{b} bytes")
    } else {
        format!("{b} bytes ({})", human(b))
    }
}

/// `208 KiB`, `238.4 MiB` (binary units, one decimal at most).
fn human(b: u64) -> String {
    let (v, u) = if b >= 1 << 30 {
        (b as f64 / (1u64 << 30) as f64, "GiB")
    } else if b >= 1 << 20 {
        (b as f64 / (1u64 << 20) as f64, "MiB")
    } else if b >= 1 << 10 {
        (b as f64 / 1024.0, "KiB")
    } else {
        return format!("{b} bytes");
    };
    let v = format!("{v:.1}");
    format!("{} {u}", v.trim_end_matches(".0"))
}

/// Words of `text` in lines of at most `width` columns, each after `indent` spaces
/// (the first line's prefix is the caller's).
fn wrap(text: &str, indent: usize, width: usize) -> String {
    let mut out = String::new();
    let mut col = indent;
    for (k, w) in text.split(' ').enumerate() {
        if k > 0 {
            if col + 1 + w.chars().count() > width {
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                col = indent;
            } else {
                out.push(' ');
                col += 1;
            }
        }
        out.push_str(w);
        col += w.chars().count();
    }
    out
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 1.0 {
        let v = format!("{ms:.1}");
        format!("{}ms", v.trim_end_matches(".0"))
    } else {
        format!("{:.0}us", ms * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdp_of_rtt_and_rate() {
        assert_eq!(bdp(Duration::from_millis(100), 10_000_000_000), 125_000_000);
        assert_eq!(bdp(Duration::ZERO, 10_000_000_000), 0);
        assert_eq!(bdp(Duration::from_secs(10), u64::MAX), u64::MAX);
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(212_992), "212992 bytes (208 KiB)");
        assert_eq!(fmt_bytes(268_435_456), "268435456 bytes (256 MiB)");
        assert_eq!(fmt_bytes(100), "100 bytes");
        assert_eq!(human(250_000_000), "238.4 MiB");
        assert_eq!(wrap("aa bb cc", 2, 7), "aa bb\n  cc");
        assert_eq!(fmt_ms(100.0), "100ms");
        assert_eq!(fmt_ms(0.052), "52us");
    }
}
