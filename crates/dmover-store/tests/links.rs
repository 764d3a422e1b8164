//! Hard links in the walk: a later path of an inode with several links becomes a
//! `HardLink` to its first path, and `Tree::without` (`sync --checksum`) keeps every
//! link pointing at an entry that is still there.

use std::collections::HashSet;
use std::fs;
use std::os::unix::ffi::OsStrExt;

use dmover_proto::manifest::{self, EntryKind};
use dmover_store::paths::{self, Base};
use dmover_store::walk;

#[test]
fn later_paths_of_an_inode_are_links_to_the_first() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("f"), b"hello").unwrap();
    fs::hard_link(src.join("f"), src.join("d/g")).unwrap();
    fs::hard_link(src.join("f"), src.join("d/h")).unwrap();
    fs::write(src.join("plain"), b"other").unwrap();
    let root = paths::source_root(&Base::Local, src.as_os_str().as_bytes(), b"").unwrap();
    let tree = walk::walk(vec![root]).unwrap().tree;
    let e = tree.entries();
    manifest::validate(e, 100).unwrap();
    let files: Vec<usize> = (0..e.len())
        .filter(|&i| e[i].kind == EntryKind::File { size: 5 })
        .collect();
    assert_eq!(files.len(), 2, "one path of the inode and plain: {e:?}");
    let links: Vec<u32> = e
        .iter()
        .filter_map(|x| match x.kind {
            EntryKind::HardLink { first } => Some(first),
            _ => None,
        })
        .collect();
    assert_eq!(links.len(), 2, "{e:?}");
    assert!(
        links
            .iter()
            .all(|&f| links[0] == f && files.contains(&(f as usize)))
    );
    assert_eq!(manifest::Totals::of(e).bytes, 10);

    // The first path left out: the first link takes its place, the other follows it.
    let first = links[0];
    let tree = tree.without(&HashSet::from([first]));
    let e = tree.entries();
    manifest::validate(e, 100).unwrap();
    let kinds: Vec<&EntryKind> = e
        .iter()
        .filter(|x| x.name == b"g" || x.name == b"h")
        .map(|x| &x.kind)
        .collect();
    assert_eq!(kinds.len(), 2);
    assert_eq!(*kinds[0], EntryKind::File { size: 5 });
    assert!(
        matches!(kinds[1], EntryKind::HardLink { first } if e[*first as usize].name == b"g" || e[*first as usize].name == b"h")
    );

    // A session without the feature: every path a file.
    let mut tree = tree;
    tree.links_as_files();
    assert!(!manifest::has_links(tree.entries()));
}
