//! Unit tests of the drivers' pure helpers; whole sessions on both drivers are in
//! [`crate::harness`].

use super::*;
use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT};

#[test]
fn streamed_parts_cut_the_manifest_with_running_totals_and_their_metadata() {
    use dmover_proto::manifest::EntryMeta;
    let mtime = Mtime { sec: 1, nsec: 2 };
    let mut entries = vec![Entry {
        parent: NO_PARENT,
        name: b"d".to_vec(),
        kind: EntryKind::Dir,
        mode: 0o755,
        mtime,
    }];
    for i in 0..9u64 {
        entries.push(Entry {
            parent: 0,
            name: format!("f{i}").into_bytes(),
            kind: EntryKind::File { size: i },
            mode: 0o644,
            mtime,
        });
    }
    let meta = |entry: u32| EntryMeta {
        entry,
        uid: entry,
        gid: 0,
        xattrs: Vec::new(),
    };
    let rest = entries.split_off(3);
    let first = entries.clone();
    // Metadata out of order, one entry past the manifest (dropped).
    let all_meta = vec![meta(9), meta(0), meta(4), meta(12), meta(2), meta(7)];
    let parts = streamed_parts(first.clone(), 1, rest, &[3, 5, 8, 10], all_meta);
    let shape: Vec<(usize, u64, u64, bool, Vec<u32>)> = parts
        .iter()
        .map(|p| {
            (
                p.entries.len(),
                p.totals.entries,
                p.totals.bytes,
                p.last,
                p.meta.iter().map(|m| m.entry).collect(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (3, 3, 1, false, vec![0, 2]),
            (2, 5, 1 + 2 + 3, false, vec![4]),
            (3, 8, 6 + 4 + 5 + 6, false, vec![7]),
            (2, 10, 21 + 7 + 8, true, vec![9]),
        ]
    );
    assert_eq!(parts[0].entries, first);
    assert_eq!(parts[0].chunks, 1);
    assert_eq!(parts[3].entries[1].name, b"f8");
    // Ends short of the manifest: the rest is a last part of its own.
    let rest: Vec<Entry> = parts
        .iter()
        .skip(1)
        .flat_map(|p| p.entries.clone())
        .collect();
    let short = streamed_parts(first.clone(), 1, rest, &[3, 5], Vec::new());
    let lens: Vec<(usize, bool)> = short.iter().map(|p| (p.entries.len(), p.last)).collect();
    assert_eq!(lens, vec![(3, false), (2, false), (5, true)]);
    assert_eq!(short[2].totals.entries, 10);
    // A manifest that fits its first part: one part, the last.
    let parts = streamed_parts(first, 1, vec![], &[3], Vec::new());
    assert_eq!(parts.len(), 1);
    assert!(parts[0].last);
}
