//! What the user sees: a progress bar while data moves, then one summary line or one
//! JSON object.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dmover_core::Error;
use dmover_core::client::Report;
use dmover_core::engine::Run;
use dmover_net::NetError;
use dmover_proto::control::ErrorCode;
use serde::Serialize;

/// Which way data went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Local to server.
    Push,
    /// Server to local.
    Pull,
}

/// A progress bar on stderr fed from a run's counters.
pub struct ProgressBar {
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl ProgressBar {
    /// Starts updating a bar five times a second.
    pub fn start(rt: &tokio::runtime::Runtime, run: Arc<Run>) -> Self {
        // Hidden until the walk or the manifest tells how much there is to move.
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::hidden(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {bytes:>10}/{total_bytes:<10} [{wide_bar}] {binary_bytes_per_sec:>12} ETA {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let b = bar.clone();
        let task = rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let p = &run.progress;
                let total = p.total.load(Ordering::Relaxed);
                if total > 0 && b.is_hidden() {
                    b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                }
                b.set_length(total);
                b.set_position(p.bytes.load(Ordering::Relaxed));
            }
        });
        ProgressBar { bar, task }
    }

    /// Removes the bar.
    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

#[derive(Serialize)]
struct JsonReport {
    ok: bool,
    direction: Direction,
    bytes: u64,
    files: u64,
    dirs: u64,
    symlinks: u64,
    seconds: f64,
    gbit_per_s: f64,
    files_per_s: f64,
    streams: u16,
    chunk: u32,
    verified: bool,
    skipped: u64,
    errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The process exit code for an error.
pub fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Refused {
            code: ErrorCode::Auth,
            ..
        }
        | Error::Remote {
            code: ErrorCode::Auth,
            ..
        } => 3,
        // The server is not the one pinned: its identity failed, like a credential.
        Error::Net(NetError::HostKeyChanged { .. }) => 3,
        Error::Net(NetError::Proto { .. }) => 1,
        Error::Net(_) => 4,
        _ => 1,
    }
}

fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", units[u])
    }
}

/// Prints the outcome and returns the exit code.
pub fn report(
    result: Result<Report, Error>,
    direction: Direction,
    secs: f64,
    json: bool,
    quiet: bool,
) -> ExitCode {
    match result {
        Ok(r) => {
            let s = r.summary;
            let gbps = s.bytes as f64 * 8.0 / secs.max(1e-9) / 1e9;
            let fps = s.files as f64 / secs.max(1e-9);
            if json {
                let j = JsonReport {
                    ok: true,
                    direction,
                    bytes: s.bytes,
                    files: s.files,
                    dirs: s.dirs,
                    symlinks: s.symlinks,
                    seconds: secs,
                    gbit_per_s: gbps,
                    files_per_s: fps,
                    streams: r.streams,
                    chunk: r.chunk_size,
                    verified: s.verified,
                    skipped: r.skipped,
                    errors: 0,
                    error: None,
                };
                println!("{}", serde_json::to_string(&j).expect("serialisable"));
            } else if !quiet {
                let verb = match direction {
                    Direction::Push => "pushed",
                    Direction::Pull => "pulled",
                };
                eprintln!(
                    "{verb} {} in {} files, {} dirs, {} symlinks in {secs:.2} s: {gbps:.2} Gbit/s, {fps:.0} files/s ({} streams, {} chunks{}){}",
                    human_bytes(s.bytes),
                    s.files,
                    s.dirs,
                    s.symlinks,
                    r.streams,
                    human_bytes(r.chunk_size.into()),
                    if s.verified {
                        ", checksums verified"
                    } else {
                        ", not checksummed"
                    },
                    if r.skipped > 0 {
                        format!("; skipped {} special files", r.skipped)
                    } else {
                        String::new()
                    },
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            if json {
                let j = JsonReport {
                    ok: false,
                    direction,
                    bytes: 0,
                    files: 0,
                    dirs: 0,
                    symlinks: 0,
                    seconds: secs,
                    gbit_per_s: 0.0,
                    files_per_s: 0.0,
                    streams: 0,
                    chunk: 0,
                    verified: false,
                    skipped: 0,
                    errors: 1,
                    error: Some(e.to_string()),
                };
                println!("{}", serde_json::to_string(&j).expect("serialisable"));
            }
            eprintln!("dmover: error: {e}");
            ExitCode::from(exit_code(&e))
        }
    }
}
