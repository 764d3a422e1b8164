//! The Source and Sink traits with both implementations: files to memory and memory to
//! files, chunk by chunk as the engine's disk threads drive them.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use dmover_proto::control::DirectIo;
use dmover_proto::manifest::{Entry, EntryKind, NO_PARENT};
use dmover_store::mem::{MemSink, MemSource};
use dmover_store::paths::{self, Base};
use dmover_store::resume::Held;
use dmover_store::sink::{SinkOptions, prepare_sink};
use dmover_store::source::{FileSource, SourceOptions};
use dmover_store::{Sink, Source, verify, walk};

const CHUNK: u32 = 64 << 10;

fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_encoded_bytes()
}

/// Moves every chunk from `source` to `sink` through one reused buffer.
fn pump(source: &dyn Source, sink: &dyn Sink) -> dmover_store::Result<()> {
    let mut buf = vec![0u8; CHUNK as usize];
    let mut digests = Vec::new();
    for k in source.chunks() {
        let read = source.read_chunk(k, &mut buf, &mut digests)?;
        sink.write_chunk(k, &buf, &digests, read.crc)?;
    }
    Ok(())
}

fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    for (name, size) in [
        ("empty", 0usize),
        ("one", 1),
        ("odd", 4095),
        ("sub/chunk", 65_536),
        ("sub/deeper/big", 3 * 65_536 + 17),
        ("sub/aligned", 256 << 10),
    ] {
        let data: Vec<u8> = (0..size).map(|i| (i * 13 + size) as u8).collect();
        fs::write(root.join(name), data).unwrap();
    }
    symlink("one", root.join("link")).unwrap();
}

fn walked(src: &Path) -> FileSource {
    let root = paths::source_root(&Base::Local, bytes(src), b"").unwrap();
    let tree = walk::walk(vec![root]).unwrap().tree;
    let opts = SourceOptions {
        checksum: true,
        direct_io: DirectIo::Never,
        ..SourceOptions::default()
    };
    FileSource::new(tree, CHUNK, opts).unwrap()
}

fn sink_options() -> SinkOptions {
    SinkOptions {
        checksum: true,
        direct_io: DirectIo::Never,
        ..SinkOptions::default()
    }
}

/// Path of manifest entry `i` below the root, as the walk named them.
fn rel_path(entries: &[Entry], mut i: usize) -> std::path::PathBuf {
    let mut parts = Vec::new();
    while entries[i].parent != NO_PARENT {
        parts.push(String::from_utf8(entries[i].name.clone()).unwrap());
        i = entries[i].parent as usize;
    }
    parts.iter().rev().collect()
}

#[test]
fn files_to_memory_and_memory_to_files() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);

    // Files → memory.
    let source = walked(&src);
    let entries = source.tree().entries().to_vec();
    let mem = MemSink::new(entries.clone(), CHUNK, true).unwrap();
    pump(&source, &mem).unwrap();
    let summary = mem.finish().unwrap();
    assert_eq!((summary.files, summary.dirs, summary.symlinks), (6, 3, 1));
    let mut data = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let got = mem.file(i as u32);
        if matches!(e.kind, EntryKind::File { .. }) {
            let want = fs::read(src.join(rel_path(&entries, i))).unwrap();
            assert_eq!(got.as_ref(), Some(&want), "entry {i}");
        }
        data.push(got.unwrap_or_default());
    }

    // Memory → files: the copy is the source, modes and mtimes included.
    let dest = t.path().join("dest");
    let source = MemSource::new(entries.clone(), data, CHUNK, true).unwrap();
    let mut sink = prepare_sink(
        &Base::Local,
        bytes(&dest),
        entries.clone(),
        CHUNK,
        sink_options(),
    )
    .unwrap();
    sink.resume(&Held::none(&entries)).unwrap();
    pump(&source, &sink).unwrap();
    let summary = sink.finish().unwrap();
    assert_eq!((summary.files, summary.dirs, summary.symlinks), (6, 3, 1));
    assert!(summary.verified);
    drop(sink);
    let c = verify::compare_trees(&src, &dest).unwrap();
    assert_eq!((c.files, c.dirs, c.symlinks), (6, 3, 1));
}

#[test]
fn a_corrupted_chunk_is_refused_and_an_aborted_sink_keeps_only_complete_files() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);
    let source = walked(&src);
    let entries = source.tree().entries().to_vec();
    let dest = t.path().join("dest");
    let mut sink = prepare_sink(
        &Base::Local,
        bytes(&dest),
        entries.clone(),
        CHUNK,
        sink_options(),
    )
    .unwrap();
    sink.resume(&Held::none(&entries)).unwrap();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut digests = Vec::new();
    let read = source.read_chunk(0, &mut buf, &mut digests).unwrap();
    buf[0] ^= 0x40;
    let e = sink.write_chunk(0, &buf, &digests, read.crc).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("checksum mismatch: chunk 0 arrived corrupted (CRC32C "),
        "{e}"
    );
    assert_eq!(e.code(), dmover_proto::control::ErrorCode::Checksum);
    // A chunk without its CRC breaks the protocol.
    let e = sink.write_chunk(0, &buf, &digests, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "protocol error from the source: protocol violation: chunk 0 carries no CRC"
    );
    // One good chunk, then the transfer is given up: the files it completed are
    // final and whole, nothing else is left (no staging file).
    buf[0] ^= 0x40;
    sink.write_chunk(0, &buf, &digests, read.crc).unwrap();
    sink.abort();
    drop(sink);
    let mut left = Vec::new();
    for e in fs::read_dir(&dest)
        .unwrap()
        .chain(fs::read_dir(dest.join("sub")).unwrap())
    {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            let rel = e.path().strip_prefix(&dest).unwrap().to_owned();
            assert_eq!(
                fs::read(e.path()).unwrap(),
                fs::read(src.join(&rel)).unwrap()
            );
            left.push(rel.display().to_string());
        }
    }
    left.sort();
    assert_eq!(left, ["odd", "one"]);
}

/// A later part of a growing manifest in chunks of its own size (feature
/// PART_CHUNKS): both ends lay it out alike and the data arrive whole; the resume
/// journal keeps pieces of files cut in the session's chunks only (its pieces are
/// counted in those), so an aborted sink leaves a piece record for the first part's
/// large file and none for the later part's.
#[test]
fn a_later_part_in_chunks_of_its_own_size() {
    const SESSION: u32 = 256 << 10;
    const PART: u32 = 64 << 10;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let data =
        |n: usize, salt: usize| -> Vec<u8> { (0..n).map(|i| (i * 7 + salt) as u8).collect() };
    fs::write(src.join("a"), data(2 * SESSION as usize, 1)).unwrap();
    let walk_src = || {
        let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
        walk::walk(vec![root]).unwrap().tree
    };
    let tree = walk_src();
    let first = tree.entries().to_vec();
    // The later part: a file of 300 000 bytes, walked after the first part went.
    fs::write(src.join("b"), data(300_000, 2)).unwrap();
    let later: Vec<Entry> = walk_src()
        .entries()
        .iter()
        .filter(|e| e.name == b"b")
        .cloned()
        .collect();
    assert_eq!(later.len(), 1);
    let opts = SourceOptions {
        checksum: true,
        direct_io: DirectIo::Never,
        ..SourceOptions::default()
    };
    let source = FileSource::new(tree, SESSION, opts).unwrap();
    assert_eq!(source.grow(later.clone(), &[], PART).unwrap(), 2 + 5);
    let layout = source.layout();
    assert_eq!(
        layout.chunk_sizes(),
        vec![(u64::from(SESSION), 2), (u64::from(PART), 5)]
    );

    let sink_for = |dest: &Path| {
        let mut sink = prepare_sink(
            &Base::Local,
            bytes(dest),
            first.clone(),
            SESSION,
            SinkOptions {
                journal: true,
                ..sink_options()
            },
        )
        .unwrap();
        sink.resume(&Held::none(&first)).unwrap();
        sink.grow(later.clone(), 2..7, Vec::new(), Vec::new(), PART)
            .unwrap();
        assert_eq!(*sink.layout(), *layout, "both ends lay the part out alike");
        sink
    };
    let mut buf = vec![0u8; SESSION as usize];
    let mut digests = Vec::new();
    let send = |sink: &dyn Sink,
                k: u64,
                buf: &mut Vec<u8>,
                digests: &mut Vec<dmover_proto::data::DigestEntry>| {
        let read = source.read_chunk(k, buf, digests).unwrap();
        sink.write_chunk(k, buf, digests, read.crc).unwrap();
    };

    // Whole: the tree arrives.
    let dest = t.path().join("whole");
    let sink = sink_for(&dest);
    for k in 0..7 {
        send(&sink, k, &mut buf, &mut digests);
    }
    let summary = sink.finish().unwrap();
    drop(sink);
    assert_eq!((summary.files, summary.chunks), (2, 7));
    for f in ["a", "b"] {
        assert_eq!(
            fs::read(dest.join(f)).unwrap(),
            fs::read(src.join(f)).unwrap(),
            "{f}"
        );
    }

    // Aborted after a piece of each file: one piece record, the first part's.
    let dest = t.path().join("aborted");
    let sink = sink_for(&dest);
    for k in [0, 2, 3] {
        send(&sink, k, &mut buf, &mut digests);
    }
    drop(sink);
    // The journal is where the copy's root is made (`dest` is the root itself).
    let journals: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".dmv.journal.")
        })
        .collect();
    assert_eq!(journals.len(), 1, "{journals:?}");
    let j = fs::read(&journals[0]).unwrap();
    let n = dmover_store::journal::RECORD_LEN;
    let pieces = j[n..].chunks(n).filter(|r| r[0] == 2).count();
    let files_done = j[n..].chunks(n).filter(|r| r[0] == 1).count();
    assert_eq!((pieces, files_done), (1, 0), "{} records", j.len() / n - 1);
}

/// dmover's own files (`.dmv.*`) anywhere below `dir`.
fn own_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with(".dmv.") {
                out.push(name);
            }
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The staging files an aborted transfer keeps are those its journal describes (for a
/// resume); the next attempt of the same transfer removes them as it completes, also
/// without `--resume`: none is left unaccounted for.
#[test]
fn an_aborted_transfers_staging_files_go_with_its_next_attempt() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("big"), vec![7u8; 4 * CHUNK as usize]).unwrap();
    fs::write(src.join("sub/big2"), vec![9u8; 3 * CHUNK as usize]).unwrap();
    fs::write(src.join("small"), b"small").unwrap();
    let new_source = || {
        let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
        let tree = walk::walk(vec![root]).unwrap().tree;
        let opts = SourceOptions {
            checksum: true,
            direct_io: DirectIo::Never,
            ..SourceOptions::default()
        };
        FileSource::new(tree, CHUNK, opts).unwrap()
    };
    let entries = new_source().tree().entries().to_vec();
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    let sink_for = |resume: bool| {
        let opts = SinkOptions {
            journal: true,
            resume,
            ..sink_options()
        };
        let mut sink =
            prepare_sink(&Base::Local, bytes(&out), entries.clone(), CHUNK, opts).unwrap();
        sink.resume(&Held::none(&entries)).unwrap();
        sink
    };
    let mut buf = vec![0u8; CHUNK as usize];
    let mut digests = Vec::new();
    let sink = sink_for(false);
    // The first chunk of each large file, then an abort.
    let source = new_source();
    let starts: Vec<u64> = source
        .layout()
        .files()
        .iter()
        .filter(|f| f.size > u64::from(CHUNK))
        .map(|f| f.start / u64::from(CHUNK))
        .collect();
    assert_eq!(starts.len(), 2);
    for &k in &starts {
        let read = source.read_chunk(k, &mut buf, &mut digests).unwrap();
        sink.write_chunk(k, &buf, &digests, read.crc).unwrap();
    }
    drop(sink);
    let kept = own_files(&out);
    assert!(
        kept.iter().any(|n| n.starts_with(".dmv.journal."))
            && kept.iter().filter(|n| n.contains(".big")).count() == 2,
        "the journal and the large files' staging files are kept: {kept:?}"
    );
    // The next attempt, not resumed, completes and takes them away.
    let sink = sink_for(false);
    pump(&new_source(), &sink).unwrap();
    sink.finish().unwrap();
    drop(sink);
    assert_eq!(own_files(&out), Vec::<String>::new());
    assert_eq!(
        fs::read(out.join("src/big")).unwrap(),
        vec![7u8; 4 * CHUNK as usize]
    );
}

/// A later part of a growing manifest may not name dmover's own files, nor add a root.
#[test]
fn a_later_part_may_not_name_dmovers_own_files_nor_add_a_root() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
    let entries = walk::walk(vec![root]).unwrap().tree.entries().to_vec();
    let dest = t.path().join("dest");
    let mut sink = prepare_sink(
        &Base::Local,
        bytes(&dest),
        entries.clone(),
        CHUNK,
        sink_options(),
    )
    .unwrap();
    sink.resume(&Held::none(&entries)).unwrap();
    let file = |parent, name: &str| Entry {
        parent,
        name: name.as_bytes().to_vec(),
        kind: EntryKind::File { size: 0 },
        mode: 0o644,
        mtime: entries[0].mtime,
    };
    let e = sink
        .grow(
            vec![file(0, ".dmv.journal.0000000000000001")],
            0..0,
            Vec::new(),
            Vec::new(),
            CHUNK,
        )
        .unwrap_err();
    assert!(e.to_string().contains("dmover's own"), "{e}");
    let e = sink
        .grow(
            vec![file(NO_PARENT, ".ssh")],
            0..0,
            Vec::new(),
            Vec::new(),
            CHUNK,
        )
        .unwrap_err();
    assert!(e.to_string().contains("later part"), "{e}");
    assert!(!dest.join(".dmv.journal.0000000000000001").exists());
    assert_eq!(own_files(t.path()), Vec::<String>::new());
}

/// Issue 46, item 7: a file declared huge (here 256 MiB) of which one chunk came is
/// preallocated whole at its first write; when the transfer aborts and its journal
/// keeps the staging file for a resume, the space never written is given back (its
/// size and the chunk stay). Before, the reservation stayed with the kept file.
#[test]
fn an_aborted_transfer_keeps_no_more_space_than_it_wrote() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let size = 256u64 << 20;
    // Sparse at the source: reading costs nothing; the sink is not told it is sparse.
    fs::File::create(src.join("huge"))
        .unwrap()
        .set_len(size)
        .unwrap();
    let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
    let tree = walk::walk(vec![root]).unwrap().tree;
    let entries = tree.entries().to_vec();
    let source = FileSource::new(
        tree,
        CHUNK,
        SourceOptions {
            checksum: true,
            direct_io: DirectIo::Never,
            ..SourceOptions::default()
        },
    )
    .unwrap();
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    let opts = SinkOptions {
        journal: true,
        ..sink_options()
    };
    let mut sink = prepare_sink(&Base::Local, bytes(&out), entries.clone(), CHUNK, opts).unwrap();
    sink.resume(&Held::none(&entries)).unwrap();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut digests = Vec::new();
    let read = source.read_chunk(0, &mut buf, &mut digests).unwrap();
    sink.write_chunk(0, &buf, &digests, read.crc).unwrap();
    let staging = |dir: &Path| {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().ends_with(".huge"))
    };
    let dir = out.join("src");
    let kept = staging(&dir).expect("a staging file");
    let reserved = fs::metadata(&kept).unwrap().blocks() * 512;
    if reserved < size {
        eprintln!("skipped: this file system does not preallocate ({reserved} bytes)");
        return;
    }
    drop(sink);
    let kept = staging(&dir).expect("the journal keeps the staging file");
    let m = fs::metadata(&kept).unwrap();
    assert_eq!(m.len(), size);
    assert!(
        m.blocks() * 512 <= 4 * u64::from(CHUNK),
        "the kept staging file holds {} bytes of disk",
        m.blocks() * 512
    );
}
