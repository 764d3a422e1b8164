//! The client: connects to a server, authenticates, and pushes or pulls a dataset.
//!
//! A [`Client`] is a [`Dialer`] (the dialing side of sessions, shared with a server
//! that dials another for a third-party copy) with the client's own jobs: transfers
//! (push, pull, a growing push, `sync --dry-run`, the memory test: `transfers.rs`),
//! copies between two servers, steered or relayed (`third_party.rs`), and operations
//! on a server's files (remove, rename, a directory's mtime: `files.rs`).

use std::sync::Arc;

use crate::dialer::Dialer;
use crate::diskpool::DiskPool;
use crate::session::TransferOptions;

mod files;
mod stdout;
mod third_party;
mod transfers;

pub use crate::dialer::{MAX_BUSY_BACKOFF, Relayed, Report};
pub use crate::session::SOFTWARE;
pub use stdout::WriterSink;
pub use third_party::ThirdPartyCopy;
pub use transfers::{DryRun, Growing, Part};

/// A client with its own disk threads.
#[derive(Debug)]
pub struct Client {
    dialer: Dialer,
}

impl std::ops::Deref for Client {
    type Target = Dialer;

    fn deref(&self) -> &Dialer {
        &self.dialer
    }
}

impl Client {
    /// A client with `io_threads` disk threads.
    pub fn new(opts: TransferOptions, io_threads: usize) -> Self {
        Self::elastic(opts, io_threads, io_threads)
    }

    /// A client with `io_threads` disk threads at the start, which its sessions' disk
    /// tuners may grow to `max` ([`crate::disktune`]).
    pub fn elastic(opts: TransferOptions, io_threads: usize, max: usize) -> Self {
        let disk = Arc::new(DiskPool::elastic(io_threads, max, "dmover-disk"));
        Client {
            dialer: Dialer::new(opts, disk),
        }
    }

    /// A client with other options on this one's disk threads (`sync --watch` runs
    /// each batch with the batch's file list as its filter).
    pub fn with_options(&self, opts: TransferOptions) -> Self {
        Client {
            dialer: self.dialer.with_options(opts),
        }
    }
}
