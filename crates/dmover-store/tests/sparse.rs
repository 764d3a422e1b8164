//! Sparse files through the file Source and Sink: the walk lists them, the source does
//! not read their holes, the sink told of them leaves their zero blocks unwritten and
//! does not preallocate them; files without holes are unchanged.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use dmover_proto::control::DirectIo;
use dmover_store::paths::{self, Base};
use dmover_store::resume::Held;
use dmover_store::sink::{SinkOptions, prepare_sink};
use dmover_store::source::{FileSource, SourceOptions};
use dmover_store::{Sink, Source, walk};

const CHUNK: u32 = 1 << 20;
const MIB: u64 = 1 << 20;

fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_encoded_bytes()
}

/// 16 MiB with 1 MiB of data at 2 MiB, 1 MiB at 5 MiB + 12 KiB (not chunk-aligned)
/// and a hole at the end.
fn make_sparse(path: &Path) -> u64 {
    let f = fs::File::create_new(path).unwrap();
    f.set_len(16 * MIB).unwrap();
    f.write_all_at(&vec![7u8; MIB as usize], 2 * MIB).unwrap();
    let odd: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    f.write_all_at(&odd, 5 * MIB + 12288).unwrap();
    2 * MIB
}

fn copy(direct: DirectIo, tell_sink: bool) -> (tempfile::TempDir, u64) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let data = make_sparse(&src.join("sparse"));
    let dense: Vec<u8> = (0..3 * MIB + 5).map(|i| (i % 253) as u8).collect();
    fs::write(src.join("dense"), &dense).unwrap();

    let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
    let tree = walk::walk(vec![root]).unwrap().tree;
    let e = tree.entries();
    let sparse: Vec<&[u8]> = tree
        .sparse()
        .iter()
        .map(|&i| e[i as usize].name.as_slice())
        .collect();
    assert_eq!(
        sparse,
        vec![b"sparse".as_slice()],
        "only the file with holes"
    );
    let list = tree.sparse().to_vec();
    let entries = e.to_vec();
    let opts = SourceOptions {
        checksum: true,
        direct_io: direct,
        ..SourceOptions::default()
    };
    let source = FileSource::new(tree, CHUNK, opts).unwrap();

    let dest = t.path().join("dest");
    let sopts = SinkOptions {
        checksum: true,
        direct_io: direct,
        verify: true,
        ..SinkOptions::default()
    };
    let mut sink = prepare_sink(&Base::Local, bytes(&dest), entries.clone(), CHUNK, sopts).unwrap();
    if tell_sink {
        sink.set_sparse(list);
    }
    sink.resume(&Held::none(&entries)).unwrap();
    // Direct I/O wants a 4 KiB-aligned buffer.
    let mut raw = vec![0u8; CHUNK as usize + 4096];
    let off = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[off..off + CHUNK as usize];
    let mut digests = Vec::new();
    let mut zero_chunks = 0;
    for k in source.chunks() {
        let read = source.read_chunk(k, buf, &mut digests).unwrap();
        // A chunk read as zeros lies in holes of a listed file: the sink told of the
        // list takes it as a zeros frame, one not told refuses that.
        if read.zeros {
            zero_chunks += 1;
            assert!(buf.iter().all(|&b| b == 0));
        }
        assert!(
            !read.zeros || sink.sparse_chunk(k) == tell_sink,
            "chunk {k}"
        );
        if !tell_sink {
            assert!(!sink.sparse_chunk(k));
        }
        sink.write_chunk(k, buf, &digests, read.crc).unwrap();
    }
    // 16 chunks of 1 MiB, data in chunks 2, 5 and 6: 13 of holes; the dense file none.
    assert_eq!(zero_chunks, 13);
    let summary = sink.finish().unwrap();
    assert!(summary.verified);
    drop(sink);
    assert_eq!(
        fs::read(src.join("sparse")).unwrap(),
        fs::read(dest.join("sparse")).unwrap()
    );
    assert_eq!(fs::read(dest.join("dense")).unwrap(), dense);
    let dense_blocks = fs::metadata(dest.join("dense")).unwrap().blocks() * 512;
    assert!(
        dense_blocks >= 3 * MIB,
        "a file without holes is whole: {dense_blocks}"
    );
    (t, data)
}

fn allocated(t: &tempfile::TempDir) -> u64 {
    let m = fs::metadata(t.path().join("dest/sparse")).unwrap();
    assert_eq!(m.len(), 16 * MIB);
    m.blocks() * 512
}

#[test]
fn holes_stay_holes_buffered_and_direct() {
    for direct in [DirectIo::Never, DirectIo::Always] {
        let (t, data) = copy(direct, true);
        let used = allocated(&t);
        assert!(
            used <= data + MIB,
            "{direct:?}: {used} bytes allocated for {data} of data"
        );
    }
}

#[test]
fn a_sink_not_told_fills_the_holes() {
    let (t, data) = copy(DirectIo::Never, false);
    let used = allocated(&t);
    assert!(used > data + MIB, "preallocated and written whole: {used}");
}

#[test]
fn journaled_pieces_of_a_sparse_file_stay_valid() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    make_sparse(&src.join("sparse"));
    let walked = || {
        let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
        walk::walk(vec![root]).unwrap().tree
    };
    let opts = SourceOptions {
        checksum: true,
        ..SourceOptions::default()
    };
    let sopts = |resume| SinkOptions {
        checksum: true,
        journal: true,
        resume,
        ..SinkOptions::default()
    };
    let dest = t.path().join("dest");
    let tree = walked();
    let (entries, list) = (tree.entries().to_vec(), tree.sparse().to_vec());
    let source = FileSource::new(tree, CHUNK, opts).unwrap();
    let mut raw = vec![0u8; CHUNK as usize + 4096];
    let off = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[off..off + CHUNK as usize];
    let mut digests = Vec::new();
    {
        // The first attempt writes the first 8 of 16 chunks (holes and data), then fails.
        let mut sink = prepare_sink(
            &Base::Local,
            bytes(&dest),
            entries.clone(),
            CHUNK,
            sopts(false),
        )
        .unwrap();
        sink.set_sparse(list.clone());
        sink.resume(&Held::none(&entries)).unwrap();
        for k in source.chunks().take(8) {
            let read = source.read_chunk(k, buf, &mut digests).unwrap();
            sink.write_chunk(k, buf, &digests, read.crc).unwrap();
        }
        sink.abort();
    }
    let mut sink = prepare_sink(
        &Base::Local,
        bytes(&dest),
        entries.clone(),
        CHUNK,
        sopts(true),
    )
    .unwrap();
    sink.set_sparse(list);
    let held = sink.held();
    let pieces: usize = held.partial.values().map(|v| v.len()).sum();
    assert_eq!(pieces, 8, "the pieces written, holes included, are held");
    // The source checks them against the file: none differs.
    let mut source = FileSource::new(walked(), CHUNK, opts).unwrap();
    assert!(source.check_held(&held).is_empty());
    source.resume(&held).unwrap();
    sink.resume(&held).unwrap();
    let mut sent = 0;
    for k in source.chunks() {
        let read = source.read_chunk(k, buf, &mut digests).unwrap();
        sink.write_chunk(k, buf, &digests, read.crc).unwrap();
        sent += 1;
    }
    assert_eq!(sent, 8);
    sink.finish().unwrap();
    drop(sink);
    assert_eq!(
        fs::read(src.join("sparse")).unwrap(),
        fs::read(dest.join("sparse")).unwrap()
    );
    assert!(fs::metadata(dest.join("sparse")).unwrap().blocks() * 512 <= 3 * MIB);
}
