//! The catalog checksums against the tools catalogs trust: Debian's `md5sum` and
//! zlib's adler32 (python3's `zlib.adler32`), on an empty file, one byte, a
//! multi-chunk file of odd size and a sparse one; adler32 and crc32c also from pieces
//! combined in a shuffled order; and the cache in its xattr.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use dmover_store::catalog::{
    CacheUse, Checksum, ChecksumType, PieceSums, Pieces, SUM_XATTR, checksum, read_cache, sum_file,
};

fn md5sum(p: &Path) -> String {
    let o = Command::new("md5sum").arg(p).output().expect("md5sum");
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()[..32].to_string()
}

/// zlib's adler32 of the file, as 8 hex digits.
fn zlib_adler32(p: &Path) -> String {
    let o = Command::new("python3")
        .args([
            "-c",
            "import sys, zlib\nprint('%08x' % zlib.adler32(open(sys.argv[1], 'rb').read()))",
        ])
        .arg(p)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// The files: name → how it is made.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut mk = |name: &str, f: &dyn Fn(&File)| {
        let p = dir.join(name);
        f(&File::create(&p).unwrap());
        out.push(p);
    };
    mk("empty", &|_| {});
    mk("one", &|f| f.write_all_at(b"x", 0).unwrap());
    mk("multi", &|f| {
        // 5 MiB and 3 bytes of a pattern with no period a chunk divides.
        let data: Vec<u8> = (0..(5u32 << 20) + 3)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        f.write_all_at(&data, 0).unwrap();
    });
    mk("sparse", &|f| {
        // Data, a hole of 3 MiB, data, and a hole to the end.
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", (3 << 20) + 4).unwrap();
        f.set_len((7 << 20) + 1).unwrap();
    });
    out
}

#[test]
fn the_sums_match_md5sum_and_zlib() {
    let t = tempfile::tempdir().unwrap();
    for p in files(t.path()) {
        let f = File::open(&p).unwrap();
        let r = sum_file(&f, &ChecksumType::ALL, CacheUse::OFF).unwrap();
        assert!(!r.cached && !r.stored);
        let [a, m, c] = r.sums[..] else {
            panic!("{r:?}")
        };
        assert_eq!(a.to_string(), zlib_adler32(&p), "{}", p.display());
        assert_eq!(m.to_string(), md5sum(&p), "{}", p.display());
        let data = std::fs::read(&p).unwrap();
        assert_eq!(c, Checksum::Crc32c(crc32c::crc32c(&data)));

        // Pieces of a chunk-like size, and a short last one, in a shuffled order.
        for kind in [ChecksumType::Adler32, ChecksumType::Crc32c] {
            let mut pieces: Vec<(u64, &[u8])> = data
                .chunks(1 << 20)
                .enumerate()
                .map(|(i, d)| ((i as u64) << 20, d))
                .collect();
            let n = pieces.len();
            for i in 0..n {
                pieces.swap(i, (i * 5 + 3) % n);
            }
            let mut all = Pieces::new(kind).unwrap();
            for (o, d) in pieces {
                all.add(o, d.len() as u64, checksum(kind, d));
            }
            let whole = all.whole(data.len() as u64).unwrap();
            assert_eq!(whole, if kind == ChecksumType::Adler32 { a } else { c });
        }
    }
}

fn has_cache(p: &Path) -> bool {
    read_cache(&File::open(p).unwrap()).is_some()
}

/// A second request is answered from the cache; a write (even of the same size) or a
/// replacement invalidates it; a type not cached is
/// computed and joins the others.
#[test]
fn the_cache_answers_until_the_file_changes() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("f");
    std::fs::write(&p, b"hello").unwrap();
    if rustix::fs::setxattr(&p, "user.probe", b"1", rustix::fs::XattrFlags::empty()).is_err() {
        eprintln!("no user xattrs here: skipped");
        return;
    }
    let sum = |kinds: &[ChecksumType]| sum_file(&File::open(&p).unwrap(), kinds, CacheUse::ON);
    let adler = [ChecksumType::Adler32];
    let r = sum(&adler).unwrap();
    assert!(!r.cached && r.stored, "{r:?}");
    assert_eq!(r.sums[0].to_string(), "062c0215");
    let r = sum(&adler).unwrap();
    assert!(r.cached && !r.stored, "{r:?}");

    // Another type: computed, and the cache then holds both.
    let both = [ChecksumType::Md5, ChecksumType::Adler32];
    let r = sum(&both).unwrap();
    assert!(!r.cached && r.stored);
    assert_eq!(r.sums[0].to_string(), "5d41402abc4b2a76b9719d911017c592");
    let r = sum(&both).unwrap();
    assert!(r.cached);
    assert_eq!(read_cache(&File::open(&p).unwrap()).unwrap().sums.len(), 2);

    // A forged value under the current key is believed: the cache trusts whoever
    // may write the file's xattrs (docs/checksums.md); the same bytes under a stale
    // key are not.
    let mut c = read_cache(&File::open(&p).unwrap()).unwrap();
    c.sums = vec![Checksum::Adler32(7)];
    let f = File::open(&p).unwrap();
    assert!(dmover_store::catalog::write_cache(&f, &c).unwrap());
    assert_eq!(sum(&adler).unwrap().sums[0], Checksum::Adler32(7));

    // Same size, other bytes: the write moves the mtime (nanoseconds).
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .write_all(b"HELLO")
        .unwrap();
    let r = sum(&adler).unwrap();
    assert!(!r.cached, "{r:?}");
    assert_eq!(r.sums[0], checksum(ChecksumType::Adler32, b"HELLO"));

    // Replaced by a rename: another inode.
    let q = t.path().join("g");
    std::fs::write(&q, b"HELLO").unwrap();
    std::fs::rename(&q, &p).unwrap();
    assert!(!has_cache(&p));
    let r = sum(&adler).unwrap();
    assert!(!r.cached && r.stored);

    // Without reading the cache, the file is read; without storing, nothing is set.
    let r = sum_file(&File::open(&p).unwrap(), &adler, CacheUse::OFF).unwrap();
    assert!(!r.cached && !r.stored);
    let e = t.path().join("e");
    std::fs::write(&e, b"").unwrap();
    let r = sum_file(
        &File::open(&e).unwrap(),
        &adler,
        CacheUse {
            read: true,
            store: false,
        },
    )
    .unwrap();
    assert_eq!(r.sums[0].to_string(), "00000001");
    assert!(!r.stored && !has_cache(&e));
    assert_eq!(SUM_XATTR, b"user.dmover.sum");
}

/// The values of pieces as a destination writes them, out of order: all three from the
/// pieces alone while md5's window holds what arrives early; past the window (or for a
/// hole never written) md5 comes from one re-read, reported, and still matches.
#[test]
fn pieces_written_out_of_order() {
    let t = tempfile::tempdir().unwrap();
    for p in files(t.path()) {
        let data = std::fs::read(&p).unwrap();
        let f = File::open(&p).unwrap();
        let want = sum_file(&f, &ChecksumType::ALL, CacheUse::OFF)
            .unwrap()
            .sums;
        let mut pieces: Vec<(u64, &[u8])> = data
            .chunks(256 << 10)
            .enumerate()
            .map(|(i, d)| ((i as u64) * (256 << 10), d))
            .collect();
        // Each pair swapped: one piece ahead at a time.
        for pair in pieces.chunks_mut(2) {
            pair.reverse();
        }
        for (window, rereads) in [(1 << 20, false), (1000, pieces.len() > 1)] {
            let mut s = PieceSums::new(data.len() as u64, &ChecksumType::ALL, window);
            for &(o, d) in &pieces {
                s.add(o, d);
            }
            let r = s.finish(&f).unwrap();
            assert_eq!(r.sums, want, "{} {window}", p.display());
            assert_eq!(r.reread, rereads, "{} {window}", p.display());
        }
        // Only adler32 and crc32c: never a re-read, whatever the order.
        let mut s = PieceSums::new(
            data.len() as u64,
            &[ChecksumType::Crc32c, ChecksumType::Adler32],
            0,
        );
        for &(o, d) in pieces.iter().rev() {
            s.add(o, d);
        }
        let r = s.finish(&f).unwrap();
        assert!(!r.reread);
        assert_eq!(r.sums, vec![want[2], want[0]]);
    }
    // A hole never written: re-read.
    let p = t.path().join("holes");
    let f = File::create(&p).unwrap();
    f.write_all_at(b"ab", 10).unwrap();
    let f = File::open(&p).unwrap();
    let mut s = PieceSums::new(12, &[ChecksumType::Adler32], 1 << 20);
    s.add(10, b"ab");
    let r = s.finish(&f).unwrap();
    assert!(r.reread);
    assert_eq!(
        r.sums[0],
        checksum(ChecksumType::Adler32, b"\0\0\0\0\0\0\0\0\0\0ab")
    );
}
