//! `dmover`: move files and trees between Data Transfer Nodes.
//!
//! Exit codes: 0 success; 1 the transfer failed (I/O, checksum, refused path, ...);
//! 2 usage error; 3 authentication refused (or the server's key is not the pinned one); 4 network failure (unreachable server,
//! dropped connection, a server still busy after `--busy-wait`); 23 a `cp` or `sync` that
//! copied all but some files (`--continue-on-error`, rsync's code); 130 and 143 a `cp` or
//! `sync` that SIGINT or SIGTERM stopped (cleanly, see [`interrupt`]). `dmover doctor`
//! exits with 1 when a check warns. The man page's EXIT STATUS ([`manual`]) says the same.

//!
//! The layers, each using only those below it: [`cli`] (the command tree clap parses)
//! → the commands (`cp`, `watch`, `mount`, `serve`, `bench`, `tune`, ...) →
//! [`resolve`] (arguments and environment into the library's option structs) →
//! [`args`] (the flag groups and value parsers) and [`env`] (the environment, read
//! once).

#![deny(clippy::too_many_lines)]

mod args;
// Benchmark drivers are long measurement scripts, kept whole to be read as such.
#[cfg(feature = "lab")]
#[allow(clippy::too_many_lines)]
mod bench;
mod cli;
mod config;
mod cp;
mod credential;
mod demo;
mod doctor;
mod env;
mod interrupt;
mod jobs;
mod manual;
mod metrics;
mod mount;
#[cfg(feature = "lab")]
mod netlab;
mod output;
mod resolve;
mod serve;
mod sum;
mod tune;
mod watch;
#[cfg(not(feature = "lab"))]
mod without_lab;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::env::Env;

fn main() -> ExitCode {
    // rsync's habits that clap cannot parse as they are (a bare `--progress`, `-avP`).
    let argv = args::habits(std::env::args_os().collect()).unwrap_or_else(|(sub, msg)| {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        let sub = cmd
            .find_subcommand_mut(sub)
            .expect("cp and sync are commands");
        sub.error(clap::error::ErrorKind::ValueValidation, msg)
            .exit()
    });
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| {
        #[cfg(not(feature = "lab"))]
        without_lab::explain(&e);
        e.exit()
    });
    // The one read of the environment: everything below takes its values from `env`.
    let env = Env::capture();
    let verbose = cli.verbose;
    init_logging(
        cli.log_verbosity(),
        cli.quiet_logs(),
        env.log.as_deref(),
        cli.log_format,
    );
    // `doctor` reports the open-file limit it was started with.
    if !matches!(cli.command, Command::Doctor(_)) {
        dmover_store::sys::raise_fd_limit();
    }
    let result = match cli.command {
        Command::Cp(a) => match resolve::stdio(&a, false) {
            Ok(resolve::Stdio::Out) => resolve::copy_out(&a, &env).and_then(cp::run_out),
            Ok(_) => resolve::copy(&a, &env).and_then(|c| cp::run(c, verbose)),
            Err(e) => Err(e),
        },
        Command::Sync(a) => resolve::sync(&a, &env).and_then(|s| match s {
            resolve::Sync::Once(c) => cp::run(c, verbose),
            resolve::Sync::Watch(w) => watch::run(w),
        }),
        Command::Serve(a) if a.check => Ok(serve_check(&a, &env)),
        Command::Serve(a) => {
            resolve::serve(&a, &env).and_then(|s| serve::run(s, &env, cli.log_format))
        }
        Command::Submit(a) => jobs::submit(a, &env),
        Command::Jobs(a) => jobs::list(a, &env),
        Command::Job(a) => jobs::show(a, &env),
        Command::Cancel(a) => jobs::act(a, jobs::Act::Cancel, &env),
        Command::Retry(a) => jobs::act(a, jobs::Act::Retry, &env),
        Command::Mount(a) => resolve::mount(&a, &env).and_then(mount::run),
        Command::Demo(a) => resolve::client(&a.transfer, &env).and_then(|c| demo::run(a, c)),
        #[cfg(feature = "lab")]
        Command::Bench(a) => bench::run(a, &env),
        Command::Credential(a) => credential::run(a),
        Command::Sum(a) => sum::run(a, &env),
        Command::Config(a) => Ok(config::run(a, &env)),
        #[cfg(feature = "lab")]
        Command::Netlab(a) => netlab::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Tune(a) => resolve::tune(a, &env).and_then(|(a, c)| tune::run(a, c)),
        Command::Completions(a) => manual::completions(a),
        Command::Man(a) => manual::man(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dmover: error: {}", output::printable(&format!("{e:#}")));
            ExitCode::from(if e.is::<args::UsageError>() { 2 } else { 1 })
        }
    }
}

/// `dmover serve --check`: exit 0 with one line on stdout, or 2 with what is wrong.
fn serve_check(a: &args::ServeArgs, env: &Env) -> ExitCode {
    match resolve::serve_check(a, env) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dmover: error: {}", output::printable(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}

/// Logs to stderr in `format`: `log` (`DMOVER_LOG`'s directives) if set and valid,
/// else the level `verbose` and `quiet` ask for.
fn init_logging(verbose: u8, quiet: bool, log: Option<&str>, format: args::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let default = match (quiet, verbose) {
        (true, 0) => "error",
        // fuser logs every request it has no handler for as a warning.
        (_, 0) => "warn,dmover_core::server=info,dmover::serve=info,fuser=error",
        (_, 1) => "info",
        (_, 2) => "debug",
        _ => "trace",
    };
    let filter = log
        .and_then(|l| EnvFilter::try_new(l).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        args::LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .init(),
        // One object per line: timestamp, level, target, message and the event's
        // fields at the top level (docs/json.md).
        args::LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_ansi(false)
            .init(),
    }
}
