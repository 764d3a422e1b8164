//! Generates a benchmark dataset without the dmover CLI, and prints what it made and how fast.
//! Takes the same arguments as `dmover bench mkdata`, so scripts can use either:
//!
//! `cargo run --release -p dmover-bench --example mkdata -- DIR --profile P [--scale F]
//! [--seed S] [--threads N]`

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use dmover_bench::mkdata::{self, Profile, Spec};

const USAGE: &str = "usage: mkdata DIR --profile P [--scale F] [--seed S] [--threads N]";

fn parse(args: &[String]) -> Result<(PathBuf, Spec, usize), String> {
    let mut dir = None;
    let mut profile = None;
    let (mut scale, mut seed, mut threads) = (1.0, Spec::DEFAULT_SEED, mkdata::default_threads());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--profile" => profile = Some(value(a)?.parse::<Profile>().map_err(|e| e.to_string())?),
            "--scale" => scale = value(a)?.parse().map_err(|e| format!("bad --scale: {e}"))?,
            "--seed" => seed = value(a)?.parse().map_err(|e| format!("bad --seed: {e}"))?,
            "--threads" => {
                threads = value(a)?
                    .parse()
                    .map_err(|e| format!("bad --threads: {e}"))?
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s if dir.is_none() => dir = Some(PathBuf::from(s)),
            s => return Err(format!("unexpected argument {s}")),
        }
    }
    let dir = dir.ok_or("missing DIR")?;
    let profile = profile.ok_or("missing --profile")?;
    Ok((
        dir,
        Spec {
            profile,
            scale,
            seed,
        },
        threads,
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, spec, threads) = match parse(&args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mkdata: {e}\n{USAGE}\nprofiles:");
            for p in Profile::ALL {
                eprintln!("  {:<7} {}", p.name(), p.description());
            }
            return ExitCode::from(2);
        }
    };
    let progress = |bytes: u64| {
        eprint!("\r{:.1} MiB", bytes as f64 / (1u64 << 20) as f64);
        let _ = std::io::stderr().flush();
    };
    match mkdata::generate_with_threads(&dir, &spec, threads, Some(&progress)) {
        Ok(stats) => {
            eprintln!();
            println!(
                "{} x{}: {stats} [{threads} threads]",
                spec.profile, spec.scale
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!();
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("mkdata: {msg}");
            ExitCode::FAILURE
        }
    }
}
