//! What `sync --watch` ships and deletes, and when: sans-IO (changes in, batches out,
//! the clock passed in), so the rules below are tested without a file system or a
//! network.
//!
//! - A file is *ready* once it was closed after writing (or moved into the tree, or
//!   found in a new directory) and nothing touched it for the quiet time since. A write
//!   after the close makes it busy again until its next close: a writer that reopens
//!   within the quiet time is waited for, never shipped mid-way.
//! - A name that leaves the tree (deleted, renamed away) before it ships is forgotten:
//!   a temporary file renamed to its final name ships once, under the final name.
//!   With `--delete` it is deleted remotely, unless it was created while watched and
//!   never shipped (then the destination cannot hold it: a temporary name costs no
//!   round trip).
//! - [`Batcher::take`] hands out everything ready at once, so many small files share
//!   one session (and its chunks); deletions go first (a directory replaced by a new
//!   one is deleted before the new one ships).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// A path relative to the source root, components joined by `/` (the root is empty).
pub type Rel = Vec<u8>;

/// A change seen in the source tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new name (`IN_CREATE` of a file): nothing remote can hold it yet.
    Created(Rel),
    /// Data written (`IN_MODIFY`): busy until the next close.
    Modified(Rel),
    /// Closed after writing (`IN_CLOSE_WRITE`), or its metadata changed (`IN_ATTRIB`).
    Closed(Rel),
    /// Present and complete: moved in (`IN_MOVED_TO`), a symlink made, or found when a
    /// new directory was scanned. `dir`: an (empty) directory, shipped on its own
    /// only while nothing below it is.
    Appeared { rel: Rel, dir: bool },
    /// Deleted or moved away; `dir`: it was a directory (with what was below).
    Gone { rel: Rel, dir: bool },
}

/// What one tick ships and deletes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Names to delete remotely (with `--delete`), outermost only, sorted.
    pub delete: Vec<Rel>,
    /// Paths to ship, sorted, each with the time it became ready to wait for (its last
    /// close): the lag is measured from it.
    pub ship: Vec<(Rel, Instant)>,
}

impl Batch {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.ship.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    /// The last change.
    last: Instant,
    /// Written since its last close.
    writing: bool,
    /// A directory shipped for its own sake (it was empty when seen).
    dir: bool,
}

/// The queue of a watch (see the module docs).
#[derive(Debug)]
pub struct Batcher {
    quiet: Duration,
    delete: bool,
    pending: HashMap<Rel, Pending>,
    /// Names created while watched and not shipped since.
    unshipped: HashSet<Rel>,
    /// Names to delete remotely → whether they were directories.
    deletes: BTreeMap<Rel, bool>,
}

/// Whether `path` is `dir` or below it.
fn within(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || (path.starts_with(dir) && matches!(path.get(dir.len()), None | Some(b'/')))
}

impl Batcher {
    /// A queue with this quiet time; `delete`: deletions are mirrored.
    pub fn new(quiet: Duration, delete: bool) -> Self {
        Batcher {
            quiet,
            delete,
            pending: HashMap::new(),
            unshipped: HashSet::new(),
            deletes: BTreeMap::new(),
        }
    }

    /// Takes a change seen at `now`.
    pub fn note(&mut self, change: Change, now: Instant) {
        match change {
            Change::Created(rel) => {
                self.drop_dir_ancestors(&rel);
                // A name whose deletion is queued may still be there.
                if !self.deletes.contains_key(&rel) {
                    self.unshipped.insert(rel);
                }
            }
            Change::Modified(rel) => {
                self.drop_dir_ancestors(&rel);
                self.pending.insert(
                    rel,
                    Pending {
                        last: now,
                        writing: true,
                        dir: false,
                    },
                );
            }
            Change::Closed(rel) => self.ready(rel, false, now),
            Change::Appeared { rel, dir } => self.ready(rel, dir, now),
            Change::Gone { rel, dir } => {
                self.pending.retain(|p, _| !within(p, &rel));
                let fresh = self.unshipped.remove(&rel);
                self.unshipped.retain(|p| !within(p, &rel));
                // A file made while watched and never shipped cannot be there.
                if self.delete && (dir || !fresh) {
                    self.deletes.insert(rel, dir);
                }
            }
        }
    }

    fn ready(&mut self, rel: Rel, dir: bool, now: Instant) {
        self.drop_dir_ancestors(&rel);
        // A file back under a name whose deletion is queued replaces it when shipped;
        // a directory's deletion stays (it may hold entries the new one lacks).
        if self.deletes.get(&rel) == Some(&false) {
            self.deletes.remove(&rel);
            // The old file is still there until this one replaces it.
            self.unshipped.remove(&rel);
        }
        self.pending.insert(
            rel,
            Pending {
                last: now,
                writing: false,
                dir,
            },
        );
    }

    /// A directory queued for its own sake stops being so once something below it is
    /// queued: that brings it along, and shipping the directory would ship what is
    /// below it, also files still being written.
    fn drop_dir_ancestors(&mut self, rel: &[u8]) {
        for (i, _) in rel.iter().enumerate().filter(|(_, b)| **b == b'/') {
            if self.pending.get(&rel[..i]).is_some_and(|p| p.dir) {
                self.pending.remove(&rel[..i]);
            }
        }
    }

    /// When the next batch is due: now with deletions queued, else when the first
    /// closed file has been quiet long enough; `None` when nothing waits for the clock.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        if !self.deletes.is_empty() {
            return Some(now);
        }
        self.pending
            .values()
            .filter(|p| !p.writing)
            .map(|p| p.last + self.quiet)
            .min()
    }

    /// Everything due at `now`.
    pub fn take(&mut self, now: Instant) -> Batch {
        let quiet = self.quiet;
        let mut ship: Vec<(Rel, Instant)> = Vec::new();
        self.pending.retain(|rel, p| {
            if !p.writing && p.last + quiet <= now {
                ship.push((rel.clone(), p.last));
                false
            } else {
                true
            }
        });
        ship.sort();
        for (rel, _) in &ship {
            self.unshipped.remove(rel);
        }
        let mut delete: Vec<Rel> = Vec::new();
        for rel in std::mem::take(&mut self.deletes).into_keys() {
            // Sorted: an ancestor comes before what is below it.
            if !delete.last().is_some_and(|d| within(&rel, d)) {
                delete.push(rel);
            }
        }
        Batch { delete, ship }
    }

    /// Puts a batch that failed back: its files ship with the next batch (unless they
    /// changed meanwhile: then the newer state counts), its deletions are tried again.
    pub fn requeue(&mut self, batch: Batch) {
        for (rel, last) in batch.ship {
            self.pending.entry(rel).or_insert(Pending {
                last,
                writing: false,
                dir: false,
            });
        }
        for rel in batch.delete {
            self.deletes.entry(rel).or_insert(true);
        }
    }

    /// The paths waiting to ship (ready or not).
    pub fn queued(&self) -> impl Iterator<Item = &Rel> {
        self.pending.keys()
    }

    /// Files waiting (ready or not) and deletions queued.
    pub fn len(&self) -> usize {
        self.pending.len() + self.deletes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Duration = Duration::from_millis(200);

    fn r(s: &str) -> Rel {
        s.as_bytes().to_vec()
    }

    fn names(b: &Batch) -> Vec<String> {
        b.ship
            .iter()
            .map(|(p, _)| String::from_utf8(p.clone()).unwrap())
            .collect()
    }

    fn ms(t: Instant, n: u64) -> Instant {
        t + Duration::from_millis(n)
    }

    #[test]
    fn a_closed_file_ships_after_the_quiet_time() {
        let t = Instant::now();
        let mut b = Batcher::new(Q, false);
        b.note(Change::Created(r("a")), t);
        b.note(Change::Modified(r("a")), t);
        assert_eq!(
            b.next_due(t),
            None,
            "a file being written waits for its close"
        );
        b.note(Change::Closed(r("a")), ms(t, 10));
        assert_eq!(b.next_due(t), Some(ms(t, 210)));
        assert!(b.take(ms(t, 209)).is_empty());
        let batch = b.take(ms(t, 210));
        assert_eq!(names(&batch), ["a"]);
        assert_eq!(batch.ship[0].1, ms(t, 10), "the lag counts from the close");
        assert!(b.take(ms(t, 1000)).is_empty(), "shipped once");
    }

    #[test]
    fn a_writer_that_reopens_within_the_quiet_time_is_waited_for() {
        let t = Instant::now();
        let mut b = Batcher::new(Q, false);
        b.note(Change::Closed(r("a")), t);
        b.note(Change::Modified(r("a")), ms(t, 150));
        assert!(
            b.take(ms(t, 300)).is_empty(),
            "written again: not shipped mid-way"
        );
        b.note(Change::Closed(r("a")), ms(t, 400));
        assert!(b.take(ms(t, 599)).is_empty());
        assert_eq!(names(&b.take(ms(t, 600))), ["a"]);
    }

    #[test]
    fn temp_then_rename_ships_the_final_name_once() {
        for delete in [false, true] {
            let t = Instant::now();
            let mut b = Batcher::new(Q, delete);
            b.note(Change::Created(r("d/.a.tmp")), t);
            b.note(Change::Modified(r("d/.a.tmp")), t);
            b.note(Change::Closed(r("d/.a.tmp")), ms(t, 5));
            b.note(
                Change::Gone {
                    rel: r("d/.a.tmp"),
                    dir: false,
                },
                ms(t, 6),
            );
            b.note(
                Change::Appeared {
                    rel: r("d/a"),
                    dir: false,
                },
                ms(t, 6),
            );
            let batch = b.take(ms(t, 1000));
            assert_eq!(names(&batch), ["d/a"]);
            assert!(
                batch.delete.is_empty(),
                "a name never shipped is not deleted"
            );
        }
    }

    #[test]
    fn deletes_are_mirrored_outermost_first_and_only_with_delete() {
        let t = Instant::now();
        let mut off = Batcher::new(Q, false);
        let mut on = Batcher::new(Q, true);
        for b in [&mut off, &mut on] {
            for (rel, dir) in [("d/x", false), ("d/e/y", false), ("d/e", true), ("d", true)] {
                b.note(Change::Gone { rel: r(rel), dir }, t);
            }
            b.note(
                Change::Gone {
                    rel: r("f"),
                    dir: false,
                },
                t,
            );
        }
        assert_eq!(off.next_due(t), None);
        assert!(off.take(t).is_empty());
        assert_eq!(on.next_due(t), Some(t), "deletions do not wait");
        assert_eq!(on.take(t).delete, [r("d"), r("f")]);
    }

    #[test]
    fn a_rewritten_file_cancels_its_deletion_a_new_directory_does_not() {
        let t = Instant::now();
        let mut b = Batcher::new(Q, true);
        b.note(
            Change::Gone {
                rel: r("f"),
                dir: false,
            },
            t,
        );
        b.note(Change::Closed(r("f")), t);
        b.note(
            Change::Gone {
                rel: r("d"),
                dir: true,
            },
            t,
        );
        b.note(Change::Closed(r("d/new")), t);
        let batch = b.take(ms(t, 500));
        assert_eq!(batch.delete, [r("d")]);
        assert_eq!(names(&batch), ["d/new", "f"]);
    }

    #[test]
    fn a_name_deleted_recreated_and_deleted_again_is_still_deleted() {
        let t = Instant::now();
        let mut b = Batcher::new(Q, true);
        let gone = || Change::Gone {
            rel: r("f"),
            dir: false,
        };
        b.note(gone(), t);
        b.note(Change::Created(r("f")), t);
        b.note(Change::Closed(r("f")), t);
        b.note(gone(), t);
        let batch = b.take(ms(t, 500));
        assert_eq!(
            batch.delete,
            [r("f")],
            "the old f is still at the destination"
        );
        assert!(batch.ship.is_empty());
    }

    #[test]
    fn an_empty_directory_ships_until_something_below_it_is_queued() {
        let t = Instant::now();
        let mut b = Batcher::new(Q, false);
        b.note(
            Change::Appeared {
                rel: r("e"),
                dir: true,
            },
            t,
        );
        b.note(
            Change::Appeared {
                rel: r("n"),
                dir: true,
            },
            t,
        );
        b.note(Change::Modified(r("n/big")), ms(t, 100));
        let batch = b.take(ms(t, 500));
        assert_eq!(
            names(&batch),
            ["e"],
            "n would ship n/big while it is written"
        );
        b.note(Change::Closed(r("n/big")), ms(t, 600));
        assert_eq!(names(&b.take(ms(t, 800))), ["n/big"]);
    }

    #[test]
    fn ready_files_share_a_batch_and_a_failed_batch_is_requeued() {
        let t = Instant::now();
        let mut b = Batcher::new(Q, true);
        for i in 0..50 {
            b.note(Change::Closed(r(&format!("f{i:02}"))), ms(t, i));
        }
        b.note(Change::Closed(r("late")), ms(t, 300));
        let batch = b.take(ms(t, 260));
        assert_eq!(batch.ship.len(), 50, "all that are ready, at once");
        b.note(Change::Modified(r("f00")), ms(t, 270));
        b.requeue(batch);
        assert_eq!(b.len(), 51);
        let again = b.take(ms(t, 600));
        assert_eq!(again.ship.len(), 50, "f00 is written again and waits");
        assert!(!names(&again).contains(&"f00".to_string()));
        assert!(names(&again).contains(&"late".to_string()));
    }
}
