//! Command-line arguments, parsed and validated without touching the machine.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Move files and trees between Data Transfer Nodes at line rate.
#[derive(Debug, Parser)]
#[command(name = "dmover", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More log output (-v info, -vv debug); DMOVER_LOG overrides (e.g. DMOVER_LOG=debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Whether the command asked for quiet output.
    pub fn quiet_logs(&self) -> bool {
        matches!(&self.command, Command::Cp(a) if a.quiet)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Copy files and trees to or from a dmover server.
    Cp(CpArgs),
    /// Serve a directory to dmover clients.
    Serve(ServeArgs),
    /// Start a server on loopback, push a generated dataset to it, verify, clean up.
    Demo(DemoArgs),
    /// Measurement tools.
    Bench(BenchArgs),
    /// Emulated long-haul links (RTT, rate, loss) between two network namespaces.
    Netlab(crate::netlab::NetlabArgs),
}

/// Options shared by everything that moves data.
#[derive(Debug, Clone, Args)]
pub struct TransferArgs {
    /// Parallel TCP data streams.
    #[arg(short = 'P', long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=128))]
    pub streams: u16,
    /// Chunk size: the unit of I/O, sending and checksumming (64K..64M, a multiple of
    /// 4K), or auto: 16M when files average 16 MiB or more, else 4M.
    #[arg(long, default_value = "auto", value_parser = parse_chunk)]
    pub chunk: u32,
    /// Do not compute chunk CRCs or end-to-end file digests.
    #[arg(long)]
    pub no_checksum: bool,
    /// Always use direct I/O (O_DIRECT) for files of 128 KiB and more, on both ends.
    /// [default: writes direct, reads direct unless the data is already cached]
    #[arg(long, conflicts_with = "buffered_io")]
    pub direct_io: bool,
    /// Never use direct I/O: everything through the page cache.
    #[arg(long)]
    pub buffered_io: bool,
    /// fsync each received file before giving it its final name.
    #[arg(long)]
    pub fsync: bool,
    /// Disk I/O threads on this side.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub io_threads: u16,
    /// Chunk buffers in the pool [default: streams + io threads + 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=65536))]
    pub buffers: Option<u32>,
    /// Socket send and receive buffer size for data streams (disables autotuning;
    /// size it to rate × RTT) [default: kernel autotuning].
    #[arg(long, value_parser = parse_size)]
    pub tcp_buffer: Option<u64>,
    /// TCP congestion control for data streams (e.g. bbr, cubic) [default: system's].
    #[arg(long)]
    pub congestion: Option<String>,
    /// File holding the shared token the server requires (or set DMOVER_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(override_usage = "dmover cp [OPTIONS] SRC... DST")]
pub struct CpArgs {
    /// Sources and destination: local paths, HOST:PATH, or dmover://HOST[:PORT]/PATH.
    /// Paths on a server are relative to its root.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<OsString>,
    #[command(flatten)]
    pub transfer: TransferArgs,
    /// Print one JSON object with the results on stdout at the end.
    #[arg(long)]
    pub json: bool,
    /// No progress bar and no summary line (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Directory to serve; clients' paths are relative to it and cannot leave it.
    #[arg(long)]
    pub root: PathBuf,
    /// Address to listen on [default: 127.0.0.1:7700 without a token, 0.0.0.0:7700 with one].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Refuse pushes.
    #[arg(long)]
    pub read_only: bool,
    /// File holding the shared token clients must prove. Without one the server only
    /// listens on loopback.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Disk I/O threads shared by all sessions.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub io_threads: u16,
    /// Network threads shared by all sessions [default: number of cores].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub net_threads: Option<u16>,
    /// Sessions at once; more are refused as busy.
    #[arg(long, default_value_t = 64)]
    pub max_sessions: usize,
    /// Memory for chunk buffers shared by all sessions.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub memory: u64,
    /// Socket buffer size for accepted connections [default: kernel autotuning].
    #[arg(long, value_parser = parse_size)]
    pub tcp_buffer: Option<u64>,
    /// TCP congestion control for accepted connections.
    #[arg(long)]
    pub congestion: Option<String>,
    /// Fault injection for tests: sleep this many milliseconds per chunk read or written.
    #[arg(long, hide = true)]
    pub debug_chunk_delay_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Size multiplier of the generated dataset (1.0 ≈ 300 MiB).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Keep the temporary directory instead of removing it.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Generate a benchmark dataset.
    Mkdata(MkdataArgs),
}

#[derive(Debug, Args)]
pub struct MkdataArgs {
    /// Directory to create (must not exist or be empty).
    pub dir: PathBuf,
    /// Dataset shape.
    #[arg(long)]
    pub profile: dmover_bench::mkdata::Profile,
    /// Size multiplier (file counts for small-file profiles, sizes for big-file ones).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Seed of the pseudo-random content (same seed, same bytes).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parses a byte size: a number with an optional binary unit (K, M, G, T; KiB, MiB, ...).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown unit {u:?} in {s:?} (use K, M, G or T)")),
    };
    let v = num * mult as f64;
    if !(0.0..1.8e19).contains(&v) {
        return Err(format!("size {s:?} out of range"));
    }
    Ok(v as u64)
}

/// Parses a chunk size; `auto` is 0.
fn parse_chunk(s: &str) -> Result<u32, String> {
    if s == "auto" {
        return Ok(0);
    }
    let v = parse_size(s)?;
    let v = u32::try_from(v).map_err(|_| format!("chunk size {s} is too large"))?;
    dmover_proto::layout::validate_chunk_size(v).map_err(|e| e.to_string())?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("4X").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_chunk("1M"), Ok(1 << 20));
        assert_eq!(parse_chunk("auto"), Ok(0));
        assert!(parse_chunk("1000").is_err());
        assert!(parse_chunk("128M").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
