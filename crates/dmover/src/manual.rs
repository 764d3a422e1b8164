//! `dmover completions SHELL` and `dmover man`: shell completions and man pages,
//! generated from the command-line definition in `cli.rs`, so they cannot drift from
//! what the binary accepts.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::args::{CompletionsArgs, ManArgs};
use crate::cli::Cli;

pub fn completions(a: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut Cli::command(), "dmover", &mut script);
    print(&script)
}

pub fn man(a: ManArgs) -> anyhow::Result<ExitCode> {
    match a.dir {
        Some(dir) => {
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            print(&page)
        }
    }
}

/// Writes `text` to stdout; a reader that went away (`| head`) is not an error.
fn print(text: &[u8]) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(ExitCode::SUCCESS),
    }
}
