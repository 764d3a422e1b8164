//! Sparse files, end to end: the real binary against a real server on loopback. A file
//! with holes arrives with its holes (the copy allocates about its data, not its size),
//! pushed and pulled, direct and buffered, and its chunks that lie wholly in holes
//! cross as zeros frames without payload; a file without holes is written whole.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::*;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `tree/sparse`: 64 MiB with three 1 MiB data extents (at 0, at 20 MiB + 12 KiB, not
/// chunk-aligned, and at 40 MiB) and a hole at the end; `tree/dense`: 3 MiB of data.
/// Returns the data bytes of the sparse file.
fn make_tree(root: &Path) -> u64 {
    std::fs::create_dir_all(root).unwrap();
    let f = std::fs::File::create_new(root.join("sparse")).unwrap();
    f.set_len(SIZE).unwrap();
    for (i, at) in [0, 20 * MIB + 12288, 40 * MIB].into_iter().enumerate() {
        let data: Vec<u8> = (0..MIB).map(|j| (j % 249) as u8 + i as u8 + 1).collect();
        f.write_all_at(&data, at).unwrap();
    }
    f.set_modified(
        std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
    )
    .unwrap();
    write_file(&root.join("dense"), 5, 3 << 20, 0o644, 1_700_000_001);
    3 * MIB
}

/// The copy is the source, its sparse file allocates at most its data and 1 MiB, and
/// its dense file is allocated whole.
fn assert_sparse(src: &Path, copy: &Path, data: u64) {
    same(src, copy);
    let m = std::fs::metadata(copy.join("sparse")).unwrap();
    assert_eq!(m.len(), SIZE);
    let used = m.blocks() * 512;
    assert!(
        used <= data + MIB,
        "{}: {used} bytes allocated for {data} bytes of data",
        copy.display()
    );
    let d = std::fs::metadata(copy.join("dense")).unwrap();
    assert!(d.blocks() * 512 >= d.len(), "the dense file is whole");
}

#[test]
fn holes_survive_push_and_pull() {
    let t = tempfile::Builder::new()
        .prefix("dmover-sparse-")
        .tempdir()
        .unwrap();
    let src = t.path().join("tree");
    let data = make_tree(&src);
    let src_used = std::fs::metadata(src.join("sparse")).unwrap().blocks() * 512;
    assert!(src_used <= data + MIB, "the test's file system keeps holes");
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);

    // Pushed (direct writes at the server, the default for large files).
    let o = cp(&["--json", "--chunk", "4M", s(&src), &srv.url("pushed")]);
    ok(&o);
    assert_sparse(&src, &root.join("pushed"), data);
    let j = json(&o);
    assert_eq!(j["bytes"], SIZE + (3 << 20), "{j}");
    // Chunks wholly in holes go as zeros frames without payload: only the file's
    // 4 MiB chunks holding data (three) and the dense file carry bytes.
    let sent = j["bytes_sent"].as_u64().unwrap();
    assert!(sent <= 5 * 4 * MIB + (3 << 20), "{j}");

    // Pushed with buffered writes, in 1 MiB chunks.
    let o = cp(&[
        "--buffered-io",
        "--chunk",
        "1M",
        s(&src),
        &srv.url("buffered"),
    ]);
    ok(&o);
    assert_sparse(&src, &root.join("buffered"), data);

    // Pulled back.
    let pulled = t.path().join("pulled");
    let o = cp(&["--json", "--chunk", "4M", &srv.url("pushed"), s(&pulled)]);
    ok(&o);
    assert_sparse(&src, &pulled, data);
    let j = json(&o);
    let sent = j["bytes_sent"].as_u64().unwrap();
    assert!(sent <= 5 * 4 * MIB + (3 << 20), "{j}");
    assert!(staging_files(&pulled).is_empty());
}
