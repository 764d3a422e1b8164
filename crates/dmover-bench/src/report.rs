//! Results of a benchmark run: what was measured, on what machine, with which tools and
//! parameters, written as `results.csv` (one row per measurement point) and
//! `results.json` (the same rows plus the context) into an output directory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value};

/// Why results could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be created or written.
    #[error("cannot write {}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// The machine a benchmark ran on.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Machine {
    /// Host name.
    pub hostname: String,
    /// CPU model name (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Logical CPUs available to this process.
    pub cores: usize,
    /// Total memory in bytes (`/proc/meminfo`).
    pub memory_bytes: u64,
    /// Kernel release and version (`uname -r -v`).
    pub kernel: String,
    /// Directory whose file system is described below.
    pub data_dir: String,
    /// File-system type of `data_dir` (e.g. `ext4`, `xfs`, `tmpfs`).
    pub data_fs: String,
    /// Device or source of that file system.
    pub data_device: String,
    /// Mount options of that file system.
    pub data_mount_options: String,
}

impl Machine {
    /// Describes this machine, with `data_dir`'s file system.
    pub fn probe(data_dir: &Path) -> Machine {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024);
        let uname = rustix::system::uname();
        let kernel = format!(
            "{} {} {}",
            uname.sysname().to_string_lossy(),
            uname.release().to_string_lossy(),
            uname.version().to_string_lossy()
        );
        let abs = fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        let mount = mount_of(&abs).unwrap_or_default();
        Machine {
            hostname: uname.nodename().to_string_lossy().into_owned(),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes,
            kernel,
            data_dir: abs.display().to_string(),
            data_fs: mount.fstype,
            data_device: mount.source,
            data_mount_options: mount.options,
        }
    }

    /// One line for terminals and docs.
    pub fn summary(&self) -> String {
        format!(
            "{} x {}, {:.0} GiB RAM, {}, data on {} ({})",
            self.cores,
            self.cpu_model,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.kernel.split(' ').take(2).collect::<Vec<_>>().join(" "),
            self.data_fs,
            self.data_dir
        )
    }
}

#[derive(Debug, Default, PartialEq)]
struct Mount {
    fstype: String,
    source: String,
    options: String,
}

/// The mount holding `path` (longest mount point that is a prefix), from
/// `/proc/self/mountinfo`.
fn mount_of(path: &Path) -> Option<Mount> {
    parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").ok()?, path)
}

fn parse_mountinfo(text: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<(usize, Mount)> = None;
    for line in text.lines() {
        // id parent major:minor root mountpoint options [optional...] - fstype source superopts
        let (left, right) = line.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if f.len() < 6 || r.len() < 2 {
            continue;
        }
        let mp = unescape_mount(f[4]);
        if !path.starts_with(&mp) {
            continue;
        }
        let len = mp.as_os_str().len();
        // Later lines over-mount earlier ones at the same point.
        if best.as_ref().is_none_or(|(l, _)| len >= *l) {
            best = Some((
                len,
                Mount {
                    fstype: r[0].to_string(),
                    source: r[1].to_string(),
                    options: f[5].to_string(),
                },
            ));
        }
    }
    best.map(|(_, m)| m)
}

/// Mount points escape space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// The first non-empty line a program prints for `args` (e.g. `--version`), on stdout or
/// stderr; `None` if it cannot be run.
pub fn tool_version(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = [out.stdout, out.stderr].concat();
    String::from_utf8_lossy(&text)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// Whether `program` is an executable in one of the directories `path` (the caller's
/// `PATH`), `/usr/sbin` or `/sbin` (or a path to one).
pub fn find_program(program: &str, path: &[PathBuf]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_exec(&p).then_some(p);
    }
    path.iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/usr/sbin"), Path::new("/sbin")])
        .map(|d| d.join(program))
        .find(|p| is_exec(p))
}

/// CPU seconds (user + system) this process has used so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`, in
/// nanoseconds): what a measurement of one thread's work counts when other processes
/// share the cores (as `openssl speed` counts user CPU time unless `-elapsed`).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Seconds since the epoch as `(YYYYmmdd-HHMMSS, RFC 3339)` in UTC.
pub fn timestamps(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (
        format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}"),
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z"),
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The default output directory of a subcommand: `bench-out/<cmd>-<YYYYmmdd-HHMMSS>`,
/// with a numeric suffix if that exists already.
pub fn default_out_dir(cmd: &str) -> PathBuf {
    let (stamp, _) = timestamps(SystemTime::now());
    let base = PathBuf::from("bench-out").join(format!("{cmd}-{stamp}"));
    let mut dir = base.clone();
    let mut k = 2;
    while dir.exists() {
        dir = PathBuf::from(format!("{}-{k}", base.display()));
        k += 1;
    }
    dir
}

/// Everything a run produced: context and one row per measurement point.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The version of this document's shape (docs/json.md): raised when a field
    /// changes meaning or goes away.
    pub schema: u32,
    /// The subcommand (`storage`, `net`, `transfer`, `compare`).
    pub command: String,
    /// The full command line.
    pub argv: Vec<String>,
    /// When the run started (UTC, RFC 3339).
    pub started: String,
    /// Wall-clock seconds the whole run took.
    pub seconds: f64,
    /// The dmover version that measured.
    pub dmover_version: String,
    /// The machine.
    pub machine: Machine,
    /// Versions of the tools involved (peer tools; "missing" when not installed).
    pub tools: BTreeMap<String, String>,
    /// The run's parameters.
    pub parameters: Map<String, Value>,
    /// Things a reader must know (page cache not dropped, fallbacks, failures, ...).
    pub notes: Vec<String>,
    /// Column names, in order: the CSV header.
    pub columns: Vec<String>,
    /// One object per measurement point, with (at least) the columns.
    pub rows: Vec<Map<String, Value>>,
}

impl Report {
    /// An empty report for `command` run as `argv` (the full command line), started
    /// now.
    pub fn new(command: &str, argv: &[String], data_dir: &Path) -> Report {
        let (_, started) = timestamps(SystemTime::now());
        Report {
            schema: 1,
            command: command.into(),
            argv: argv.to_vec(),
            started,
            seconds: 0.0,
            dmover_version: env!("CARGO_PKG_VERSION").into(),
            machine: Machine::probe(data_dir),
            tools: BTreeMap::new(),
            parameters: Map::new(),
            notes: Vec::new(),
            columns: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Records a parameter.
    pub fn param(&mut self, key: &str, value: impl Serialize) {
        self.parameters.insert(
            key.into(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
    }

    /// Adds a note, once.
    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Appends a row; new keys become new columns (in the order first seen).
    pub fn push(&mut self, row: Map<String, Value>) {
        for k in row.keys() {
            if !self.columns.contains(k) {
                self.columns.push(k.clone());
            }
        }
        self.rows.push(row);
    }

    /// The rows as CSV (RFC 4180): a header of [`Report::columns`], then one line per
    /// row; arrays are joined with `;`, missing values are empty.
    pub fn to_csv(&self) -> String {
        to_csv(&self.columns, &self.rows)
    }

    /// Writes `results.csv` and `results.json` into `dir` (created if needed).
    pub fn write(&self, dir: &Path) -> Result<(), ReportError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReportError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(err(dir))?;
        let csv = dir.join("results.csv");
        fs::write(&csv, self.to_csv()).map_err(err(&csv))?;
        let json = dir.join("results.json");
        let text = serde_json::to_string_pretty(self).map_err(io::Error::other);
        fs::write(&json, text.map_err(err(&json))? + "\n").map_err(err(&json))?;
        Ok(())
    }
}

/// `rows` as CSV (RFC 4180): a header of `columns`, then one line per row with those
/// columns; arrays are joined with `;`, missing values are empty.
pub fn to_csv(columns: &[String], rows: &[Map<String, Value>]) -> String {
    let mut out = String::new();
    let header: Vec<String> = columns.iter().map(|c| csv_field(c)).collect();
    out.push_str(&header.join(","));
    out.push('\n');
    for row in rows {
        let line: Vec<String> = columns
            .iter()
            .map(|c| csv_field(&value_text(row.get(c).unwrap_or(&Value::Null))))
            .collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// A JSON value as CSV text: strings bare, numbers as JSON prints them, arrays joined
/// with `;`.
fn value_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(value_text).collect::<Vec<_>>().join(";"),
        other => other.to_string(),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        let mut q = String::with_capacity(s.len() + 2);
        q.push('"');
        for c in s.chars() {
            if c == '"' {
                q.push('"');
            }
            q.push(c);
        }
        q.push('"');
        q
    } else {
        s.to_string()
    }
}

/// Rounds to `digits` significant digits, so reports do not carry noise digits.
pub fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let mag = x.abs().log10().floor() as i32;
    let f = 10f64.powi(digits - 1 - mag);
    (x * f).round() / f
}

/// A byte count as a short binary size: `4K`, `1M`, `1.5G`, `100`.
pub fn size_label(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (u, m) in UNITS {
        if bytes >= m {
            let v = bytes as f64 / m as f64;
            let mut s = String::new();
            if v.fract() == 0.0 {
                let _ = write!(s, "{v:.0}{u}");
            } else {
                let _ = write!(s, "{v:.1}{u}");
            }
            return s;
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn csv_columns_follow_first_appearance_and_quote() {
        let mut r = Report::new("test", &["dmover".into()], Path::new("/"));
        let row = |v: Value| v.as_object().unwrap().clone();
        r.push(row(json!({"tool": "cp", "gbit_per_s": 1.5})));
        r.push(row(
            json!({"tool": "a,b \"x\"", "seconds": [1.0, 2.5], "gbit_per_s": 2}),
        ));
        assert_eq!(r.columns, ["tool", "gbit_per_s", "seconds"]);
        assert_eq!(
            r.to_csv(),
            "tool,gbit_per_s,seconds\ncp,1.5,\n\"a,b \"\"x\"\"\",2,1.0;2.5\n"
        );
    }

    #[test]
    fn mountinfo_picks_the_longest_prefix() {
        let text = "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n\
                    30 22 0:5 / /tmp rw,nosuid - tmpfs tmpfs rw\n\
                    31 22 0:6 / /data\\040dir rw - xfs /dev/sdb rw\n";
        let m = parse_mountinfo(text, Path::new("/tmp/x")).unwrap();
        assert_eq!((m.fstype.as_str(), m.source.as_str()), ("tmpfs", "tmpfs"));
        let m = parse_mountinfo(text, Path::new("/tmpfoo")).unwrap();
        assert_eq!(m.fstype, "ext4");
        let m = parse_mountinfo(text, Path::new("/data dir/a")).unwrap();
        assert_eq!((m.fstype.as_str(), m.options.as_str()), ("xfs", "rw"));
    }

    #[test]
    fn dates_and_labels() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_764_000_000);
        assert_eq!(
            timestamps(t),
            (
                "20251124-160000".to_string(),
                "2025-11-24T16:00:00Z".to_string()
            )
        );
        assert_eq!(timestamps(UNIX_EPOCH).0, "19700101-000000");
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(3 << 29), "1.5G");
        assert_eq!(size_label(100), "100");
        assert_eq!(round_sig(1234.567, 3), 1230.0);
        assert_eq!(round_sig(0.0012345, 2), 0.0012);
    }

    #[test]
    fn machine_probe_fills_what_linux_has() {
        let m = Machine::probe(Path::new("/"));
        assert!(m.cores >= 1);
        assert!(m.memory_bytes > 0);
        assert!(m.kernel.starts_with("Linux"), "{}", m.kernel);
        assert!(!m.data_fs.is_empty());
    }
}
