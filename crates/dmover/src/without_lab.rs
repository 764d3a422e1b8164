//! The build without the `lab` feature (`cargo build --no-default-features`): a server
//! and client without `dmover bench` and `dmover netlab`. They are not in its command
//! line, so its help, man pages and completions describe what the binary does; a
//! script or a habit that runs one learns why it fails instead of reading clap's
//! "unrecognized subcommand" as a typo.

/// The commands only the lab build has.
const LAB_COMMANDS: [&str; 2] = ["bench", "netlab"];

/// Exits with a usage error (2) that says why, when clap refused a lab command; returns
/// for any other error.
pub fn explain(e: &clap::Error) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::InvalidSubcommand {
        return;
    }
    if let Some(ContextValue::String(name)) = e.get(ContextKind::InvalidSubcommand) {
        if LAB_COMMANDS.contains(&name.as_str()) {
            eprintln!(
                "dmover: error: this build has no `dmover {name}` (built without the `lab` \
                 feature, as a packaged server is); build with the default features for it"
            );
            std::process::exit(2);
        }
    }
}
