//! The memory all sessions' manifests take together on a server (issue 46, item 6).
//!
//! Each session's manifest is bounded on its own (`max_manifest_bytes` for a push or a
//! prune, `max_manifest_bytes_read` for the ops a read-only user can run: pulls and
//! `sync --checksum`'s digests), and all of them together by the server's
//! [`ManifestBudget`] (`manifest_memory`, by default a quarter of the host's memory, at
//! most 4 GiB). A session holds a [`Charge`] on the budget that grows with its
//! manifest ([`dmover_proto::manifest::entry_bytes`]: entries, names, link targets,
//! metadata and the validator's copy of the names) and is given back when the session
//! ends, whichever way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dmover_proto::control::ErrorCode;

use crate::error::Error;

/// Largest default of [`ManifestBudget`]: 4 GiB.
pub const MAX_DEFAULT_MANIFEST_MEMORY: u64 = 4 << 30;

/// Default per-session limit of the ops other than a push or prune: 256 MiB.
pub const MAX_MANIFEST_BYTES_READ: u64 = 256 << 20;

/// The default server-wide manifest budget: a quarter of `host_memory` (bytes; `None`:
/// unknown, taken as 4 GiB), at most [`MAX_DEFAULT_MANIFEST_MEMORY`].
pub fn default_budget(host_memory: Option<u64>) -> u64 {
    (host_memory.unwrap_or(4 << 30) / 4).min(MAX_DEFAULT_MANIFEST_MEMORY)
}

/// This host's memory (`MemTotal` in `/proc/meminfo`), if it can be read.
pub fn host_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Bytes all sessions' manifests may take together.
#[derive(Debug)]
pub struct ManifestBudget {
    max: u64,
    used: AtomicU64,
}

impl ManifestBudget {
    /// A budget of `max` bytes.
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(ManifestBudget {
            max,
            used: AtomicU64::new(0),
        })
    }

    /// Its size.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Bytes the sessions hold now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok()
    }
}

/// What one session's manifest holds of a [`ManifestBudget`], given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<ManifestBudget>,
    held: u64,
}

impl Charge {
    /// Nothing held yet.
    pub fn new(budget: Arc<ManifestBudget>) -> Self {
        Charge { budget, held: 0 }
    }

    /// Grows what the session holds to `total` bytes (a manifest only grows). A
    /// manifest larger than the whole budget is refused for good (`Unsupported`: no
    /// retry can help); one that
    /// does not fit beside the other sessions' is refused as busy, the client coming
    /// back within its `--busy-wait`.
    pub fn grow_to(&mut self, total: u64) -> Result<(), Error> {
        if total <= self.held {
            return Ok(());
        }
        if self.budget.take(total - self.held) {
            self.held = total;
            return Ok(());
        }
        let max = self.budget.max;
        Err(if total > max {
            Error::refused(
                ErrorCode::Unsupported,
                format!(
                    "the manifest takes more than this server's manifest memory \
                     ({}, manifest_memory in its config)",
                    size(max)
                ),
            )
        } else {
            Error::refused(
                ErrorCode::Busy,
                format!(
                    "this server's manifest memory is in use by other sessions ({} of {}, \
                     manifest_memory in its config); this manifest needs {}",
                    size(self.budget.used()),
                    size(max),
                    size(total)
                ),
            )
        })
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

/// `bytes` in KiB, MiB or GiB, for messages.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b => format!("{} KiB", b.div_ceil(1 << 10)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_share_the_budget_and_give_it_back() {
        let b = ManifestBudget::new(1000);
        let mut one = Charge::new(b.clone());
        one.grow_to(600).unwrap();
        one.grow_to(500).unwrap();
        assert_eq!((one.held(), b.used()), (600, 600));
        let mut two = Charge::new(b.clone());
        let e = two.grow_to(500).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Refused {
                    code: ErrorCode::Busy,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("in use by other sessions"), "{e}");
        let e = two.grow_to(1001).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Refused {
                    code: ErrorCode::Unsupported,
                    ..
                }
            ),
            "{e}"
        );
        two.grow_to(400).unwrap();
        assert_eq!(b.used(), 1000);
        drop(one);
        assert_eq!(b.used(), 400);
        drop(two);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(256 << 10), "256 KiB");
        assert_eq!(size(3 << 19), "1.5 MiB");
        assert_eq!(size(4 << 30), "4.0 GiB");
    }

    #[test]
    fn the_default_is_a_quarter_of_memory_at_most_4_gib() {
        assert_eq!(default_budget(Some(8 << 30)), 2 << 30);
        assert_eq!(default_budget(Some(64 << 30)), 4 << 30);
        assert_eq!(default_budget(None), 1 << 30);
    }
}
