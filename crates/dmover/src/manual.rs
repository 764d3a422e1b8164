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
            let written = || -> std::io::Result<()> {
                clap_mangen::generate_to(Cli::command(), &dir)?;
                // dmover.1 again, with its sections.
                std::fs::write(dir.join("dmover.1"), page()?)
            };
            written().with_context(|| format!("writing man pages into {}", dir.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        None => print(&page()?),
    }
}

/// dmover.1: what clap_mangen makes of the command line, with EXIT STATUS,
/// ENVIRONMENT, FILES and EXAMPLES before VERSION (in place of the short summary
/// `dmover --help` ends with).
fn page() -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    let cmd = Cli::command().after_long_help(None::<&str>);
    clap_mangen::Man::new(cmd).render(&mut page)?;
    let text = String::from_utf8(page).expect("roff of UTF-8 text");
    let at = text.find("\n.SH VERSION").map_or(text.len(), |i| i + 1);
    let mut out = text[..at].to_string();
    out.push_str(&sections());
    out.push_str(&text[at..]);
    Ok(out.into_bytes())
}

/// The exit codes of dmover, each with what it means (`dmover --help` ends with a
/// summary of them: [`crate::cli`]).
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success: everything asked for was done."),
    (
        "1",
        "The transfer failed (I/O, checksum, a refused path, ...); a sync whose deletions \
         were refused or stopped by --max-delete; a dmover doctor check warns.",
    ),
    (
        "2",
        "Usage error: an unknown option, options that contradict each other, a malformed \
         HOST:PATH; dmover serve (with or without --check) or dmover config check: the \
         configuration is wrong (the key and its line are named); any command of a client whose \
         configuration file (FILES) does not parse.",
    ),
    (
        "3",
        "Authentication refused, or the server's key is not the one pinned in the \
         known-hosts file.",
    ),
    (
        "4",
        "Network failure: an unreachable server, a dropped connection, a silent peer, a \
         server still busy after --busy-wait.",
    ),
    (
        "23",
        "A partial copy (rsync's code): cp or sync copied all but some files \
         (--continue-on-error); those are named on stderr and in the JSON summary's \
         failed list. Rerun with --resume to retry them.",
    ),
    (
        "130, 143",
        "cp or sync stopped by SIGINT (Ctrl-C: 130) or SIGTERM (143): 128 plus the \
         signal's number, as a shell reports a process the signal killed. The transfer stops \
         cleanly: staging files are removed, nothing incomplete is under a final name, \
         the destination keeps its journal, and a rerun with --resume (a sync: the same \
         command) goes on from there. A second signal exits at once without cleaning up \
         (what is left is what a killed client leaves, which --resume also handles). \
         sync --watch, mount and serve take SIGINT and SIGTERM as their normal end \
         (exit 0).",
    ),
];

/// The environment variables dmover reads ([`crate::env`]; clap reads those of options).
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "DMOVER_TOKEN",
        "The token a client sends when no --token-file is given (cp, sync, bench net, the \
         job commands).",
    ),
    (
        "DMOVER_USER",
        "The user name, as --user (a dmover user of the server); --user and a USER@ of \
         an endpoint go before it.",
    ),
    ("DMOVER_KEY", "The private key file, as --key."),
    (
        "DMOVER_KNOWN_HOSTS",
        "The known-hosts file, as --known-hosts.",
    ),
    (
        "DMOVER_SERVICE",
        "The job service's URL, as --service of submit, jobs, job, cancel and retry.",
    ),
    (
        "DMOVER_CONFIG",
        "The client's configuration file, in place of $XDG_CONFIG_HOME/dmover/config.toml \
         (FILES); it must exist.",
    ),
    (
        "DMOVER_LOG",
        "Log filter (tracing directives, e.g. debug or dmover_core=trace); overrides -v \
         and --quiet for the logs (not the files cp -v and sync -v list).",
    ),
    (
        "XDG_CONFIG_HOME, HOME",
        "Where the client's configuration file and the default known-hosts file are \
         (FILES).",
    ),
    (
        "XDG_STATE_HOME, HOME",
        "The server's default state directory when not run as root (FILES).",
    ),
    (
        "PATH",
        "Where dmover bench looks for peer tools and iperf3.",
    ),
    (
        "TMPDIR",
        "Where dmover cp - DST keeps stdin until it has all of it (removed at the end).",
    ),
    (
        "NOTIFY_SOCKET",
        "Set by systemd for Type=notify services: dmover serve sends READY=1 there once \
         it listens, and STOPPING=1 on SIGTERM.",
    ),
];

/// The files dmover reads and writes.
const FILES: &[(&str, &str)] = &[
    (
        "$XDG_CONFIG_HOME/dmover/config.toml",
        "The client's configuration (else ~/.config/dmover/config.toml; DMOVER_CONFIG \
         names another file): [host.NAME] profiles (the address and port dialed for the \
         host NAME of an endpoint, the dmover user, a token_file or key: each server of \
         a copy between two servers gets its own; streams, retries, retry_wait, \
         busy_wait) and [defaults] (the job service's URL, \
         the user and credential of hosts without a profile, known_hosts, streams, \
         retries, retry_wait, busy_wait). A flag wins over the environment, which wins \
         over the host's profile, which wins over [defaults]. A credential file others \
         can read is warned about. dmover config check checks it. Its keys are \
         described in docs/client.md of the source.",
    ),
    (
        "$XDG_CONFIG_HOME/dmover/known_hosts",
        "Servers' keys, pinned on first use by a client (else ~/.config/dmover/known_hosts; \
         --known-hosts or DMOVER_KNOWN_HOSTS name another file).",
    ),
    (
        "/etc/dmover/server.toml",
        "The server's configuration as packaged (dmover serve --config): exports, users, \
         rights, limits and every setting of dmover serve, sizes and durations with units \
         (\"8G\", \"30s\"). dmover serve --check checks it. Its keys are described in \
         docs/config.md of the source.",
    ),
    (
        "/var/lib/dmover",
        "The server's state directory when run as root (else $XDG_STATE_HOME/dmover, or \
         ~/.local/state/dmover; --state-dir or state_dir in the configuration): its TLS key, \
         made on first start, and the job service's database.",
    ),
    (
        "DEST/.dmv.journal.*, DEST/.dmv.*",
        "In a destination directory: the journal of a transfer in progress or interrupted \
         (what --resume reads) and its staging files. Names starting with .dmv. are \
         reserved; a completed transfer leaves none.",
    ),
];

/// Commands with what they do.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "Serve what the configuration file exports (a first start makes the server's TLS \
         key):",
        "dmover serve --config /etc/dmover/server.toml",
    ),
    (
        "Check a changed configuration before restarting the server (exit 0, or 2 naming \
         the key and its line):",
        "dmover serve --check --config /etc/dmover/server.toml",
    ),
    (
        "Push a tree into a directory of server dtn1, then pull it back:",
        "dmover cp run1 dtn1:incoming/\ndmover cp dtn1:incoming/run1 back/",
    ),
    (
        "rsync's habits: see what a copy would send, then copy as user alice of dtn1 \
         listing each file sent (-r and -a change nothing: trees and metadata go by \
         default; -P is the number of streams):",
        "dmover cp -n run1 dtn1:incoming/\ndmover cp -av run1 alice@dtn1:incoming/",
    ),
    (
        "A mirror that leaves alone every file already there, with rsync's exclude file:",
        "dmover sync --ignore-existing --exclude-from excludes.txt run1 dtn1:mirror/run1",
    ),
    (
        "Go on with a copy that was interrupted (a signal, a network failure):",
        "dmover cp --resume run1 dtn1:incoming/",
    ),
    (
        "Keep a mirror (a re-run sends only what changed and deletes what the source no \
         longer has):",
        "dmover sync --delete run1 dtn1:mirror/run1",
    ),
    (
        "A script that tells a partial copy from a failure:",
        "dmover cp --continue-on-error --json run1 dtn1:in/ > summary.json\n\
         case $? in\n\
         0) echo complete ;;\n\
         23) echo \"some files failed: rerun with --resume\" ;;\n\
         130|143) echo \"stopped: rerun with --resume\" ;;\n\
         *) echo failed ;;\n\
         esac",
    ),
    (
        "Copy between two local paths, through the same checks and atomic renames (no \
         server):",
        "dmover sync --delete /scratch/run1 /project/run1",
    ),
    (
        "A producer's output to a file on a server, and a file on a server to a consumer \
         (a failed check exits 1 after the bytes went out: discard them):",
        "tar cf - run1 | dmover cp - dtn1:in/run1.tar\n\
         dmover cp dtn1:in/run1.tar - | tar xf -",
    ),
    (
        "Copy between two servers, the data going from one to the other directly:",
        "dmover cp dmover://dtn1/run1 dmover://dtn2/in/",
    ),
    (
        "Check the client's configuration file and see each host profile as it resolves:",
        "dmover config check",
    ),
];

/// The EXIT STATUS, ENVIRONMENT, FILES and EXAMPLES sections, in roff.
fn sections() -> String {
    let mut out = String::new();
    let list = |out: &mut String, title: &str, items: &[(&str, &str)]| {
        match title.contains(' ') {
            true => out.push_str(&format!(".SH \"{title}\"\n")),
            false => out.push_str(&format!(".SH {title}\n")),
        }
        for (term, text) in items {
            out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(term), roff(text)));
        }
    };
    list(&mut out, "EXIT STATUS", EXIT_STATUS);
    list(&mut out, "ENVIRONMENT", ENVIRONMENT);
    list(&mut out, "FILES", FILES);
    out.push_str(".SH EXAMPLES\n");
    for (what, commands) in EXAMPLES {
        out.push_str(&format!(".PP\n{}\n.PP\n.nf\n.RS 4\n", roff(what)));
        for line in commands.lines() {
            out.push_str(&roff(line));
            out.push('\n');
        }
        out.push_str(".RE\n.fi\n");
    }
    out
}

/// `text` as roff: backslashes and hyphens escaped, no line starting with a control
/// character.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    match escaped.starts_with(['.', '\'']) {
        true => format!("\\&{escaped}"),
        false => escaped,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_summary_names_every_exit_code_and_variable_of_the_page() {
        let help = crate::cli::AFTER_LONG_HELP;
        for (codes, _) in EXIT_STATUS {
            for code in codes.split(", ") {
                let named = [" ", ","].map(|after| format!(" {code}{after}"));
                assert!(
                    named.iter().any(|n| help.contains(n.as_str())),
                    "--help lacks exit code {code}"
                );
            }
        }
        for (names, _) in ENVIRONMENT {
            for name in names.split(", ").filter(|n| n.starts_with("DMOVER_")) {
                assert!(help.contains(name), "--help lacks {name}");
            }
        }
    }

    #[test]
    fn roff_escapes_hyphens_backslashes_and_leading_dots() {
        assert_eq!(roff("--resume a\\b"), "\\-\\-resume a\\eb");
        assert_eq!(roff(".dmv.*"), "\\&.dmv.*");
    }
}
