//! What the machines' own tests need besides the machines (`tests/pair.rs`, the
//! `session_machines` fuzz target): an error type a driver would report, a manifest,
//! and the limits a dialer and an acceptor tell each other.
//!
//! There is no driver here. Whole sessions run on the production drivers, over an
//! in-memory transport on tokio's paused clock: `dmover-core`'s `harness` (its pair
//! schedules, its driver tests, and the `drive_pair` fuzz target).

use std::fmt;

use super::Cause;
use crate::control::ErrorCode;
use crate::manifest::{Entry, EntryKind, Mtime, NO_PARENT, Totals};

/// An error as a driver would report it to a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestError {
    /// Its class.
    pub code: ErrorCode,
    /// Its rank ([`Cause::rank`]).
    pub rank: u8,
    /// Whether a stream failing with it ends the session.
    pub ends: bool,
    /// Its text.
    pub text: String,
}

impl fmt::Display for TestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Cause for TestError {
    fn code(&self) -> ErrorCode {
        self.code
    }
    fn rank(&self) -> u8 {
        self.rank
    }
    fn ends_session(&self) -> bool {
        self.ends
    }
}

/// The limits a dialer sends in tests (feature `LIMITS`).
pub fn dialer_limits() -> crate::control::SessionLimits {
    crate::control::SessionLimits {
        bwlimit: 1_000_000,
        congestion: "reno".into(),
        refused: String::new(),
    }
}

/// An acceptor's answer, in tests, to the dialer's limits `l`.
pub fn acceptor_limits(l: &crate::control::SessionLimits) -> crate::control::SessionLimits {
    crate::control::SessionLimits {
        bwlimit: 500_000,
        congestion: l.congestion.clone(),
        refused: String::new(),
    }
}

/// A manifest of one directory holding `files` files.
pub fn manifest(files: u32) -> Vec<Entry> {
    let mut v = vec![Entry {
        parent: NO_PARENT,
        name: b"s".to_vec(),
        kind: EntryKind::Dir,
        mode: 0o755,
        mtime: Mtime::default(),
    }];
    for i in 0..files {
        v.push(Entry {
            parent: 0,
            name: format!("f{i}").into_bytes(),
            kind: EntryKind::File { size: 1 << 20 },
            mode: 0o644,
            mtime: Mtime::default(),
        });
    }
    v
}

/// The totals of a manifest (it must be valid).
pub fn totals(entries: &[Entry]) -> Totals {
    crate::manifest::validate(entries, u64::MAX).expect("valid manifest")
}
