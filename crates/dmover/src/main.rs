//! `dmover`: move files and trees between Data Transfer Nodes.
//!
//! Exit codes: 0 success; 1 the transfer failed (I/O, checksum, refused path, ...);
//! 2 usage error; 3 authentication refused (or the server's key is not the pinned one); 4 network failure (unreachable server,
//! dropped connection).

mod args;
mod bench;
mod cp;
mod credential;
mod demo;
mod endpoint;
mod netlab;
mod output;
mod serve;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose, cli.quiet_logs());
    dmover_store::sys::raise_fd_limit();
    let result = match cli.command {
        Command::Cp(a) => cp::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Credential(a) => credential::run(a),
        Command::Netlab(a) => netlab::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dmover: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (quiet, verbose) {
        (true, 0) => "error",
        (_, 0) => "warn,dmover_core::server=info",
        (_, 1) => "info",
        (_, 2) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("DMOVER_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
