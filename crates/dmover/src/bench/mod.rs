//! `dmover bench`: measurement tools. Every measuring subcommand writes `results.csv` and
//! `results.json` into its output directory and can draw a plot (see [`common`]).

mod common;
pub mod compare;
pub mod cpu;
pub mod net;
pub mod remote;
pub mod storage;
pub mod trajectory;
pub mod transfer;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use dmover_bench::mkdata::{self, Spec};

use clap::{Args, Subcommand};

use crate::args::parse_scale;
use crate::env::Env;
use crate::interrupt::sweep as interrupt;

/// `dmover bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Generate a benchmark dataset.
    Mkdata(MkdataArgs),
    /// Storage sweep: write then read files of each size (buffered and direct I/O,
    /// 1..N threads, block sizes); throughput, files/s and per-I/O latency.
    Storage(crate::bench::storage::StorageArgs),
    /// Memory-to-memory throughput through dmover's transport against `dmover serve`
    /// (1..N streams, zero-copy on/off, congestion control), beside iperf3.
    Net(crate::bench::net::NetArgs),
    /// dmover push/pull and every peer tool found here (cp, rsync daemon, rsync over ssh,
    /// scp, GridFTP, XRootD) on the same data: cold cache, sync counted, verified.
    Compare(crate::bench::compare::CompareArgs),
    /// xdd-style sweep of end-to-end transfer rate over streams x chunk size, push and
    /// pull, against a `dmover serve` this command starts.
    Transfer(crate::bench::transfer::TransferBenchArgs),
    /// Seed 000's workloads A-D (1, 10, 100, 1000 files at once) read or written on a
    /// server through the library API or a `dmover mount`: per-I/O latency percentiles
    /// and throughput (docs/remote.md).
    Remote(crate::bench::remote::RemoteBenchArgs),
    /// Single-core GB/s of every primitive dmover runs over every byte (AES-256-GCM seal
    /// and open, encrypted and authenticated; CRC32C; xxh3; the per-file digest; memcpy),
    /// beside `openssl speed -evp aes-256-gcm`.
    Cpu(crate::bench::cpu::CpuArgs),
}

#[derive(Debug, Args)]
pub struct MkdataArgs {
    /// Directory to create (must not exist or be empty).
    pub dir: PathBuf,
    /// Dataset shape.
    #[arg(long)]
    pub profile: dmover_bench::mkdata::Profile,
    /// Size multiplier (file counts for small-file profiles, sizes for big-file ones).
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale, allow_negative_numbers = true)]
    pub scale: f64,
    /// Seed of the pseudo-random content (same seed, same bytes).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchArgs, env: &Env) -> anyhow::Result<ExitCode> {
    match a.command {
        BenchCommand::Mkdata(m) => mkdata_cmd(m),
        BenchCommand::Storage(s) => storage::run(s, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Net(n) => net::run(n, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Compare(c) => compare::run(c, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Transfer(t) => transfer::run(t, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Remote(r) => remote::run(r, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Cpu(c) => cpu::run(c, env).map(|()| ExitCode::SUCCESS),
    }
}

fn mkdata_cmd(a: MkdataArgs) -> anyhow::Result<ExitCode> {
    let spec = Spec::new(a.profile).scale(a.scale).seed(a.seed);
    let stats = mkdata::generate(&a.dir, &spec, None)
        .with_context(|| format!("generating {} in {}", a.profile, a.dir.display()))?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "dir": a.dir,
                "profile": a.profile.to_string(),
                "scale": a.scale,
                "seed": a.seed,
                "files": stats.files,
                "dirs": stats.dirs,
                "symlinks": stats.symlinks,
                "bytes": stats.bytes,
                "seconds": stats.seconds,
            })
        );
    } else {
        eprintln!("{}: {stats}", a.dir.display());
    }
    Ok(ExitCode::SUCCESS)
}
