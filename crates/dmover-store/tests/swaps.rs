//! A tree changed under a sink while a push is open: a directory swapped for a symlink
//! before the sink sets directory modes (a peer's `Op::Rename` from a second session,
//! or a local user who can write in the export) leaves the symlink's target alone, and
//! a directory's setuid/setgid bits pass the filter a file's do.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use dmover_store::paths::{self, Base};
use dmover_store::resume::Held;
use dmover_store::sink::{SinkOptions, prepare_sink};
use dmover_store::source::{FileSource, SourceOptions};
use dmover_store::{Sink, Source, walk};

const CHUNK: u32 = 1 << 20;

fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_encoded_bytes()
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Pushes `src` to `dest` through a file Source and Sink, calling `meanwhile` after the
/// last chunk is written and before the sink finishes.
fn push(src: &Path, dest: &Path, meanwhile: impl FnOnce()) -> dmover_store::Result<()> {
    let root = paths::source_root(&Base::Local, bytes(src), b"").unwrap();
    let tree = walk::walk(vec![root]).unwrap().tree;
    let entries = tree.entries().to_vec();
    let opts = SourceOptions {
        checksum: true,
        ..SourceOptions::default()
    };
    let source = FileSource::new(tree, CHUNK, opts).unwrap();
    let sopts = SinkOptions {
        checksum: true,
        ..SinkOptions::default()
    };
    let mut sink = prepare_sink(&Base::Local, bytes(dest), entries.clone(), CHUNK, sopts)?;
    sink.resume(&Held::none(&entries))?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut digests = Vec::new();
    for k in source.chunks() {
        let read = source.read_chunk(k, &mut buf, &mut digests).unwrap();
        sink.write_chunk(k, &buf, &digests, read.crc)?;
    }
    meanwhile();
    sink.finish().map(|_| ())
}

#[test]
fn a_directory_swapped_for_a_symlink_does_not_chmod_its_target() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"data").unwrap();
    fs::set_permissions(src.join("d"), fs::Permissions::from_mode(0o4777)).unwrap();
    let outside = t.path().join("outside");
    fs::write(&outside, b"not the export's").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o600)).unwrap();
    let dest = t.path().join("dest");
    let moved = t.path().join("moved");
    let r = push(&src, &dest, || {
        fs::rename(dest.join("d"), &moved).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("d")).unwrap();
    });
    let e = r.expect_err("the swapped directory's mode cannot be set");
    assert!(e.to_string().contains("mode"), "{e}");
    assert_eq!(mode(&outside), 0o600, "the symlink's target was changed");
    assert_eq!(fs::read(moved.join("f")).unwrap(), b"data");
}

#[test]
fn a_directory_keeps_setuid_and_setgid_only_with_its_owner() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("shared")).unwrap();
    fs::create_dir_all(src.join("plain")).unwrap();
    fs::write(src.join("shared/f"), b"x").unwrap();
    fs::set_permissions(src.join("shared"), fs::Permissions::from_mode(0o6775)).unwrap();
    fs::set_permissions(src.join("plain"), fs::Permissions::from_mode(0o750)).unwrap();
    let dest = t.path().join("dest");
    push(&src, &dest, || {}).unwrap();
    // No owners applied (the sink's default): neither bit, the other bits as sent.
    assert_eq!(mode(&dest.join("shared")), 0o775);
    assert_eq!(mode(&dest.join("plain")), 0o750);
    assert_eq!(fs::read(dest.join("shared/f")).unwrap(), b"x");
}

/// A chain of directories deeper than the sink's handle cache is made and finished
/// on a thread with a small stack: finding a directory's handle walks up the tree
/// iteratively (it once recursed once per level, and a 50 000-level chain sent by a
/// peer aborted a server).
#[test]
fn a_deep_chain_of_directories_costs_no_stack() {
    use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT};
    const DEPTH: u32 = 4200;
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    let mut entries: Vec<Entry> = (0..DEPTH)
        .map(|i| Entry {
            parent: if i == 0 { NO_PARENT } else { i - 1 },
            name: b"d".to_vec(),
            kind: EntryKind::Dir,
            mode: 0o755,
            mtime: Mtime {
                sec: 1_600_000_000,
                nsec: 0,
            },
        })
        .collect();
    entries.push(Entry {
        parent: DEPTH - 1,
        name: b"f".to_vec(),
        kind: EntryKind::File { size: 0 },
        mode: 0o644,
        mtime: Mtime {
            sec: 1_600_000_000,
            nsec: 0,
        },
    });
    let dest2 = dest.clone();
    std::thread::Builder::new()
        .stack_size(128 << 10)
        .spawn(move || {
            let sopts = SinkOptions {
                checksum: true,
                ..SinkOptions::default()
            };
            let mut sink =
                prepare_sink(&Base::Local, bytes(&dest2), entries.clone(), CHUNK, sopts).unwrap();
            sink.resume(&Held::none(&entries)).unwrap();
            sink.finish().unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
    // Deeper than a path may name: followed one directory at a time.
    let mut dir = std::fs::File::open(&dest).unwrap();
    for _ in 1..DEPTH {
        let fd = rustix::fs::openat(
            &dir,
            "d",
            rustix::fs::OFlags::RDONLY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        dir = std::fs::File::from(fd);
    }
    let st = rustix::fs::statat(&dir, "f", rustix::fs::AtFlags::empty()).unwrap();
    assert_eq!(
        rustix::fs::FileType::from_raw_mode(st.st_mode),
        rustix::fs::FileType::RegularFile
    );
}

/// A source file swapped for a FIFO after the walk (by a local user who can write in
/// the tree) fails that file as changed, at once: opening a FIFO with no writer would
/// block the reading disk thread for good, and reading one would send whatever a
/// writer put there.
#[test]
fn a_file_swapped_for_a_fifo_is_refused_without_blocking() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), vec![7u8; 5000]).unwrap();
    let root = paths::source_root(&Base::Local, bytes(&src), b"").unwrap();
    let tree = walk::walk(vec![root]).unwrap().tree;
    let source = FileSource::new(tree, CHUNK, SourceOptions::default()).unwrap();
    fs::remove_file(src.join("f")).unwrap();
    let fifo = std::ffi::CString::new(bytes(&src.join("f")).to_vec()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK as usize];
        let mut digests = Vec::new();
        let k = source.chunks().next().unwrap();
        let _ = tx.send(source.read_chunk(k, &mut buf, &mut digests).map(|_| ()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading blocked on the FIFO");
    let e = got.expect_err("a FIFO read as the file");
    assert!(e.to_string().contains("no longer a regular file"), "{e}");
    assert!(e.retryable(), "{e}");
}
