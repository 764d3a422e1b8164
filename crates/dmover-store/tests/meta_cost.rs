//! What reading owners and xattrs costs next to the walk (docs/sync.md, "Preserved
//! metadata"): `DMOVER_META_COST_DIR=TREE cargo test -p dmover-store --test meta_cost
//! -- --ignored --nocapture` walks TREE three times and reads its metadata three
//! times, printing the times. Ignored by default: it measures, it asserts little.

use std::time::Instant;

use dmover_proto::manifest::XattrScope;
use dmover_store::paths::{Base, source_root};

#[test]
#[ignore]
fn walk_and_metadata_times() {
    let Some(dir) = std::env::var_os("DMOVER_META_COST_DIR") else {
        eprintln!("set DMOVER_META_COST_DIR");
        return;
    };
    let path = std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()).to_vec();
    for _ in 0..3 {
        let t = Instant::now();
        let root = source_root(&Base::Local, &path, b"").unwrap();
        let walked = dmover_store::walk::walk(vec![root]).unwrap();
        let walk = t.elapsed();
        let t = Instant::now();
        let meta = dmover_store::meta::read_tree(&walked.tree, XattrScope::DEFAULT);
        let read = t.elapsed();
        let n: usize = meta.iter().map(|m| m.xattrs.len()).sum();
        assert_eq!(meta.len(), walked.tree.entries().len());
        println!(
            "{} entries: walk {walk:?}, metadata {read:?} ({n} xattrs)",
            meta.len()
        );
    }
}
