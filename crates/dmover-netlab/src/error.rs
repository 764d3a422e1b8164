//! Errors of the netlab.

use std::io;

/// Everything that can go wrong setting up, running or removing a lab.
#[derive(Debug, thiserror::Error)]
pub enum NetlabError {
    /// The machine cannot host a lab (not root, no `/dev/net/tun`, no `ip`).
    #[error("netlab is not available here: {0}")]
    Unavailable(String),
    /// The link description is invalid (negative rate, loss of 100 %, bad name, ...).
    #[error("invalid lab: {0}")]
    Invalid(String),
    /// A lab of this name exists and its owner is alive.
    #[error(
        "lab {name:?} already exists (owned by pid {pid}); remove it with `dmover netlab down --name {name}`"
    )]
    Exists {
        /// The lab's name.
        name: String,
        /// The process that owns it.
        pid: u32,
    },
    /// No lab of this name exists.
    #[error("no lab named {0:?} (see `dmover netlab list`)")]
    NotFound(String),
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the object it concerns.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An external command (`ip ...`) failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The link was set up but does not pass traffic.
    #[error("the emulated link of lab {name:?} does not pass traffic: {detail}")]
    NoTraffic {
        /// The lab's name.
        name: String,
        /// What the probe saw.
        detail: String,
    },
    /// The requested congestion control is not allowed on this machine.
    #[error(
        "congestion control {wanted:?} is not available (available: {available}; allowed in \
         namespaces: {allowed})"
    )]
    Congestion {
        /// What was asked for.
        wanted: String,
        /// `net.ipv4.tcp_available_congestion_control`.
        available: String,
        /// `net.ipv4.tcp_allowed_congestion_control` of the root namespace.
        allowed: String,
    },
    /// Tearing a lab down left something behind.
    #[error("removing lab {name:?} left things behind: {detail}")]
    Teardown {
        /// The lab's name.
        name: String,
        /// What could not be removed.
        detail: String,
    },
}

impl NetlabError {
    /// An [`NetlabError::Io`] with context.
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        NetlabError::Io {
            what: what.into(),
            source,
        }
    }
}
