//! `dmover bench`: measurement tools. Every measuring subcommand writes `results.csv` and
//! `results.json` into its output directory and can draw a plot (see [`common`]).

mod common;
pub mod compare;
pub(crate) mod interrupt;
pub mod net;
pub mod remote;
pub mod storage;
pub mod trajectory;
pub mod transfer;

use std::process::ExitCode;

use anyhow::Context;
use dmover_bench::mkdata::{self, Spec};

use crate::args::{BenchArgs, BenchCommand, MkdataArgs};
use crate::env::Env;

pub fn run(a: BenchArgs, env: &Env) -> anyhow::Result<ExitCode> {
    match a.command {
        BenchCommand::Mkdata(m) => mkdata_cmd(m),
        BenchCommand::Storage(s) => storage::run(s, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Net(n) => net::run(n, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Compare(c) => compare::run(c, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Transfer(t) => transfer::run(t, env).map(|()| ExitCode::SUCCESS),
        BenchCommand::Remote(r) => remote::run(r, env).map(|()| ExitCode::SUCCESS),
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
