//! What a transfer would do, told without doing it ([`super::Transfer::dry_run`]): the
//! files it would send, and for a sync those it would leave (unchanged) and with
//! `delete` what it would delete.

use dmover_proto::manifest::EntryKind;

use crate::client::DryRun;

/// What a transfer would send (a sync: also leave and delete); nothing was changed on
/// either side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRunPlan {
    /// The files it would send, in manifest order: a sync's as paths below the mirror,
    /// a copy's as paths starting with their source's name (where they land in the
    /// destination directory).
    pub send: Vec<String>,
    /// Regular files it would send.
    pub files_to_send: u64,
    /// Their bytes.
    pub bytes_to_send: u64,
    /// Regular files the destination holds unchanged (not sent).
    pub files_unchanged: u64,
    /// Their bytes.
    pub bytes_unchanged: u64,
    /// With `delete`: what it would delete.
    pub delete: Option<Deletions>,
    /// Entries the source walk skipped (special files, files that vanished): with
    /// `delete`, a real run would delete nothing.
    pub skipped: u64,
}

/// What a sync with `delete` would delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deletions {
    /// The paths, relative to the mirror (directories end with `/`; at most the first
    /// 10 000).
    pub paths: Vec<String>,
    /// Entries it would delete (each file, symlink and directory counts one).
    pub entries: u64,
    /// Bytes of the regular files among them.
    pub bytes: u64,
    /// Entries `max_delete` would leave.
    pub over_limit: u64,
}

impl DryRunPlan {
    /// The plan of `found` (the source's manifest and the destination's answer);
    /// `delete`: the sync deletes; `mirror`: a sync (paths below the mirror), else a
    /// copy (paths with their root's name).
    pub(super) fn of(found: &DryRun, delete: bool, mirror: bool) -> Self {
        let r = &found.report;
        let mut unchanged = vec![false; found.entries.len()];
        for range in &r.unchanged {
            for i in range.first..range.first.saturating_add(range.count) {
                if let Some(u) = unchanged.get_mut(i as usize) {
                    *u = true;
                }
            }
        }
        let mut plan = DryRunPlan {
            skipped: found.skipped,
            ..DryRunPlan::default()
        };
        for (i, e) in found.entries.iter().enumerate() {
            let EntryKind::File { size } = e.kind else {
                continue;
            };
            if unchanged[i] {
                plan.files_unchanged += 1;
                plan.bytes_unchanged += size;
            } else {
                plan.files_to_send += 1;
                plan.bytes_to_send += size;
                let path = crate::session::entry_path(&found.entries, i as u32);
                // A sync's: the path below the mirror (the root's name is the mirror's).
                plan.send.push(match mirror {
                    true => path.split_once('/').map_or("", |(_, r)| r).to_string(),
                    false => path,
                });
            }
        }
        plan.delete = delete.then(|| Deletions {
            paths: r
                .paths
                .iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect(),
            entries: r.deleted,
            bytes: r.deleted_bytes,
            over_limit: r.over_limit,
        });
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_proto::control::{EntryRange, PruneReport};
    use dmover_proto::manifest::{Entry, NO_PARENT};

    fn entry(name: &str, parent: u32, kind: EntryKind) -> Entry {
        Entry {
            parent,
            name: name.as_bytes().to_vec(),
            kind,
            mode: 0o644,
            mtime: Default::default(),
        }
    }

    #[test]
    fn counts_what_would_be_sent_left_and_deleted() {
        let found = DryRun {
            entries: vec![
                entry("m", NO_PARENT, EntryKind::Dir),
                entry("a", 0, EntryKind::File { size: 10 }),
                entry("b", 0, EntryKind::File { size: 20 }),
                entry("c", 0, EntryKind::File { size: 30 }),
            ],
            report: PruneReport {
                deleted: 2,
                deleted_bytes: 7,
                paths: vec![b"old".to_vec(), b"gone/".to_vec()],
                unchanged: vec![EntryRange { first: 2, count: 1 }],
                ..PruneReport::default()
            },
            skipped: 1,
        };
        let p = DryRunPlan::of(&found, true, true);
        assert_eq!(p.send, ["a", "c"]);
        assert_eq!((p.files_to_send, p.bytes_to_send), (2, 40));
        assert_eq!((p.files_unchanged, p.bytes_unchanged), (1, 20));
        let d = p.delete.unwrap();
        assert_eq!((d.entries, d.bytes, d.paths.len()), (2, 7, 2));
        assert_eq!(p.skipped, 1);
        assert_eq!(DryRunPlan::of(&found, false, true).delete, None);
        // A copy's paths keep their root's name.
        assert_eq!(DryRunPlan::of(&found, false, false).send, ["m/a", "m/c"]);
    }
}
