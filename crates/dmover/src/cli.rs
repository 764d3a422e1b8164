//! The command tree clap parses: the root of the low arguments (`dmover` and its
//! subcommands). The flag groups they share are in [`crate::args`]; a command whose
//! flags only it uses keeps them beside its code (bench, tune, doctor, netlab).

use clap::{Parser, Subcommand};

use crate::args::{
    CompletionsArgs, CpArgs, CredentialArgs, DemoArgs, LogFormat, ManArgs, MountArgs, ServeArgs,
};
#[cfg(feature = "lab")]
use crate::bench::BenchArgs;

/// Move files and trees between Data Transfer Nodes at line rate.
#[derive(Debug, Parser)]
#[command(
    name = "dmover",
    version = version(),
    about,
    long_about = None,
    propagate_version = true,
    after_long_help = AFTER_LONG_HELP
)]
pub struct Cli {
    /// More output: -v logs at info, -vv at debug, -vvv everything. cp and sync, as
    /// rsync: -v also lists each file sent (stdout; stderr with --json or --progress
    /// ndjson), -vv also the files left as they were (`PATH is uptodate`), and log
    /// debug needs -vvv. DMOVER_LOG overrides the logs' level (e.g. DMOVER_LOG=debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log lines on stderr as `text`, or as `json`: one JSON object per line
    /// (docs/json.md).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Whether the command asked for quiet output.
    pub fn quiet_logs(&self) -> bool {
        matches!(&self.command, Command::Cp(a) | Command::Sync(a) if a.quiet)
    }

    /// The logs' verbosity `-v` asks for (1 info, 2 debug, 3 and more trace): cp's and
    /// sync's `-vv` lists more files, not more logs (rsync's), so their levels come
    /// one `v` later from the second on.
    pub fn log_verbosity(&self) -> u8 {
        match &self.command {
            Command::Cp(_) | Command::Sync(_) if self.verbose >= 2 => self.verbose - 1,
            _ => self.verbose,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Copy files and trees to or from a dmover server, or between local paths.
    // `sync`'s own options, which cp refuses, stay out of cp's help.
    #[command(
        mut_arg("delete", |a| a.hide(true)),
        mut_arg("max_delete", |a| a.hide(true)),
        mut_arg("checksum", |a| a.hide(true)),
        mut_arg("size_only", |a| a.hide(true)),
        mut_arg("ignore_existing", |a| a.hide(true)),
        mut_arg("watch", |a| a.hide(true)),
        mut_arg("quiet_time", |a| a.hide(true))
    )]
    Cp(CpArgs),
    /// Make DST a mirror of SRC: DST is the copy itself (never its parent), so a re-run
    /// converges on one tree and sends only files whose size or mtime changed
    /// (docs/sync.md). Takes cp's options.
    #[command(override_usage = "dmover sync [OPTIONS] SRC DST")]
    Sync(CpArgs),
    /// Serve a directory to dmover clients.
    Serve(ServeArgs),
    /// Hand a copy between servers to a job service (docs/jobs.md) and print its id at
    /// once; the service runs it with no client connected, retrying and resuming.
    #[command(override_usage = "dmover submit [OPTIONS] --service URL SRC... DST")]
    Submit(crate::jobs::SubmitArgs),
    /// List your jobs on a job service (an admin's: everyone's), newest first.
    Jobs(crate::jobs::JobsArgs),
    /// Show a job: state, files done/failed/total, bytes, rate, attempts, errors by
    /// file, times; with --follow, follow it to its end.
    Job(crate::jobs::ShowArgs),
    /// Cancel a job (a running one stops; files it completed stay).
    Cancel(crate::jobs::JobArgs),
    /// Queue a failed or cancelled job again (it resumes: what arrived is not sent
    /// again).
    Retry(crate::jobs::JobArgs),
    /// Mount a server's directory here (FUSE; read-only unless --rw): its files are read
    /// in place, chunk by chunk (docs/remote.md). Runs in the foreground until unmounted
    /// (`umount DIR`, Ctrl-C or SIGTERM).
    #[command(override_usage = "dmover mount [OPTIONS] dmover://HOST[:PORT]/PATH DIR")]
    Mount(MountArgs),
    /// Start a server on loopback, push a generated dataset to it, verify, clean up.
    Demo(DemoArgs),
    /// Measurement tools.
    #[cfg(feature = "lab")]
    Bench(BenchArgs),
    /// Print the checksums file catalogs use (adler32, md5, crc32c) of files, from
    /// each file's cache (a reserved extended attribute) while it is valid, else read
    /// and cached (docs/checksums.md).
    Sum(crate::sum::SumArgs),
    /// Make credentials: a token or a key pair, and the line for the server's config.
    Credential(CredentialArgs),
    /// The client's configuration file (~/.config/dmover/config.toml: host profiles,
    /// defaults, the job service; docs/client.md): `dmover config check`.
    Config(crate::config::ConfigArgs),
    /// Emulated long-haul links (RTT, rate, loss) between two network namespaces.
    #[cfg(feature = "lab")]
    Netlab(crate::netlab::NetlabArgs),
    /// Probe a link (and a storage path) within a time and size cap, clean up, and
    /// print the settings it would use and what limits a transfer: disk read, disk
    /// write, network or CPU (docs/tuning.md).
    #[command(override_usage = "dmover tune [OPTIONS] HOST[:PORT] [PATH]")]
    Tune(crate::tune::TuneArgs),
    /// Check this host's tuning for a DTN and print the fixes (changes nothing).
    ///
    /// Checks against ESnet fasterdata's host tuning: TCP buffer limits for --rtt x
    /// --rate, congestion control, qdisc, CPU governor, NIC IRQs, MTU, THP, the mount of
    /// --path and open-file limits; each finding comes with the exact fix. Exit code 1
    /// when a check warns. Details: docs/doctor.md.
    Doctor(crate::doctor::DoctorArgs),
    /// Print the shell completion script for SHELL on stdout.
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout, or write a page per command into --dir.
    Man(ManArgs),
}

/// The end of `dmover --help`: a summary of the man page's EXIT STATUS and ENVIRONMENT
/// ([`crate::manual`], whose tests hold the two together).
pub(crate) const AFTER_LONG_HELP: &str = "\
Exit status: 0 success; 1 the transfer failed (I/O, checksum, refused path, ...); 2 usage \
error; 3 authentication refused, or the server's key is not the pinned one; 4 network \
failure (unreachable server, dropped connection, a server still busy after --busy-wait); \
23 a partial copy (cp or sync copied all but some files: --continue-on-error); 130, 143 \
cp or sync stopped cleanly by SIGINT or SIGTERM (rerun with --resume to go on).

Environment: DMOVER_TOKEN (the token when no --token-file is given), DMOVER_USER \
(--user), DMOVER_KEY (--key), DMOVER_KNOWN_HOSTS (--known-hosts), DMOVER_SERVICE (the \
job service's URL), DMOVER_CONFIG (the client's configuration file), DMOVER_LOG (log \
filter, overrides -v for the logs), XDG_CONFIG_HOME and HOME (the client's configuration \
file, dmover/config.toml, and the known-hosts file), XDG_STATE_HOME (the server's key when not root), NOTIFY_SOCKET \
(systemd readiness for dmover serve). More in the man page (dmover man).

Client configuration (host profiles, defaults, the job service): \
~/.config/dmover/config.toml, checked by dmover config check; docs/client.md in the \
source. Precedence: a flag, then the environment, then the host's profile, then \
[defaults].

Server configuration: docs/config.md in the source, or /etc/dmover/server.toml as \
packaged.";

/// What `--version` prints after the name: the release, the git commit it was built
/// from (`unknown` when built without git) and the protocol versions it speaks.
pub fn version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        version_text(
            env!("CARGO_PKG_VERSION"),
            env!("DMOVER_GIT_COMMIT"),
            dmover_proto::MIN_PROTOCOL_VERSION,
            dmover_proto::PROTOCOL_VERSION,
        )
    })
}

fn version_text(release: &str, commit: &str, min: u16, max: u16) -> String {
    let protocol = if min == max {
        format!("protocol version {max}")
    } else {
        format!("protocol versions {min} to {max}")
    };
    format!("{release} (commit {commit}, {protocol})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        use std::time::Duration;
        let cli = |a: &[&str]| {
            let args = ["dmover", "cp"].into_iter().chain(a.iter().copied());
            Cli::try_parse_from(args.chain(["a", "b:"]))
        };
        let Command::Cp(c) = cli(&["--retry-wait", "100ms", "--stream-timeout", "2m"])
            .unwrap()
            .command
        else {
            panic!("not cp");
        };
        assert_eq!(c.reliability.retry_wait, Some(Duration::from_millis(100)));
        assert_eq!(c.reliability.stream_timeout, Duration::from_secs(120));
        let e = cli(&["--retry-wait", "5"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("needs a unit"), "{e}");
    }

    #[test]
    fn filter_files_keep_their_place_and_habits_parse() {
        use crate::args::FilterArg;
        let args = [
            "dmover",
            "cp",
            "-rn",
            "--exclude",
            "a",
            "--include-from",
            "f1",
            "--include",
            "b",
            "--exclude-from",
            "f2",
            "--size-only",
            "x",
            "h:",
        ];
        let Command::Cp(c) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not cp");
        };
        assert_eq!(
            c.filters.rules,
            vec![
                FilterArg::Rule(false, "a".into()),
                FilterArg::From(true, "f1".into()),
                FilterArg::Rule(true, "b".into()),
                FilterArg::From(false, "f2".into()),
            ]
        );
        assert!(c.recursive && c.dry_run && c.size_only);
        // A bare --progress before an option is the bar.
        let Command::Sync(c) =
            Cli::try_parse_from(["dmover", "sync", "--progress", "-q", "x", "h:m"])
                .unwrap()
                .command
        else {
            panic!("not sync");
        };
        assert_eq!(c.progress, crate::args::ProgressMode::Bar);
        // cp's and sync's -vv lists files; their logs need one more v.
        let v = |a: &[&str]| Cli::try_parse_from(a).unwrap().log_verbosity();
        assert_eq!(v(&["dmover", "-v", "cp", "x", "h:"]), 1);
        assert_eq!(v(&["dmover", "cp", "-vv", "x", "h:"]), 1);
        assert_eq!(v(&["dmover", "sync", "-vvv", "x", "h:m"]), 2);
        assert_eq!(v(&["dmover", "serve", "-vv", "--root", "."]), 2);
    }

    #[test]
    fn version_names_release_commit_and_protocols() {
        assert_eq!(
            version_text("1.2.3", "abc1234", 4, 4),
            "1.2.3 (commit abc1234, protocol version 4)"
        );
        assert_eq!(
            version_text("1.2.3", "unknown", 3, 4),
            "1.2.3 (commit unknown, protocol versions 3 to 4)"
        );
        assert!(version().starts_with(env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
    /// `dmover SUB --help` as printed.
    fn help(sub: &str) -> String {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        let c = cmd.find_subcommand_mut(sub).expect("subcommand");
        c.render_long_help().to_string()
    }

    #[test]
    fn cp_help_leaves_out_sync_options_and_groups_the_rest() {
        let sync_only = [
            "--delete",
            "--max-delete",
            "--checksum",
            "--size-only",
            "--ignore-existing",
            "--watch",
            "--quiet-time",
        ];
        let (cp, sync) = (help("cp"), help("sync"));
        for o in sync_only {
            assert!(
                !cp.contains(&format!("{o}\n")) && !cp.contains(&format!("{o} ")),
                "cp shows {o}:\n{cp}"
            );
            assert!(sync.contains(o), "sync lacks {o}:\n{sync}");
        }
        assert!(!cp.contains("\nSync:\n"), "{cp}");
        assert!(sync.contains("\nSync:\n"), "{sync}");
        for h in [
            "Transfer",
            "Security",
            "Reliability",
            "Filters",
            "Output",
            "Between servers",
            "Metadata",
        ] {
            assert!(cp.contains(&format!("\n{h}:\n")), "cp lacks {h}:\n{cp}");
            assert!(
                sync.contains(&format!("\n{h}:\n")),
                "sync lacks {h}:\n{sync}"
            );
        }
        // cp still takes them, to refuse them with a message naming sync.
        assert!(Cli::try_parse_from(["dmover", "cp", "--delete", "a", "h:b"]).is_ok());
    }
}
