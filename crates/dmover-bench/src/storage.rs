//! The storage sweep: an elbencho-style write-then-read of a dataset of equal-size files,
//! one measurement point at a time.
//!
//! A point is (file size, file count, threads, block size, buffered or direct I/O). Its
//! write phase creates the files in a fresh directory, `threads` threads taking files (or,
//! when there are fewer files than threads, equal block-aligned ranges of them) from a
//! shared queue and writing each with `pwrite` calls of `block` bytes; buffered writes end
//! with a `syncfs` that is counted in the phase's time, so the data is on disk when the
//! clock stops. The read phase reads everything back the same way, after the page cache
//! has been dropped when that is permitted ([`drop_caches`]). Every individual `pwrite`
//! and `pread` is timed from submission to completion; the phase reports its throughput,
//! files/s, IOPS and the latency distribution of those calls. The files are deleted
//! afterwards (deletion is not timed).

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rustix::fs::{Mode, OFlags};
use serde::Serialize;

use crate::stats::Latency;

/// Direct-I/O alignment this module uses for buffers, offsets and lengths.
pub const ALIGN: u64 = 4096;
/// Files per subdirectory of a point's dataset.
const FILES_PER_DIR: u64 = 1000;

/// Why a storage measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file operation failed.
    #[error("cannot {op} {}", .path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The parameters cannot be measured as asked.
    #[error("{0}")]
    Invalid(String),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StorageError + 'a {
    move |source| StorageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Whether I/O goes through the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// Through the page cache.
    Buffered,
    /// `O_DIRECT`: straight between the device and an aligned buffer.
    Direct,
}

impl IoMode {
    /// `buffered` or `direct`.
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Buffered => "buffered",
            IoMode::Direct => "direct",
        }
    }
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "buffered" | "buf" => Ok(IoMode::Buffered),
            "direct" | "dio" => Ok(IoMode::Direct),
            _ => Err(format!("unknown I/O mode {s:?} (buffered or direct)")),
        }
    }
}

/// One measurement point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Point {
    /// Size of every file in bytes.
    pub file_size: u64,
    /// Number of files.
    pub files: u64,
    /// Worker threads.
    pub threads: usize,
    /// Bytes per `pwrite`/`pread` call (the last call of a file may be shorter).
    pub block: u64,
    /// Buffered or direct.
    pub mode: IoMode,
}

impl Point {
    /// Files for a file size under a byte budget: `budget / size`, at least 1, at most
    /// `max_files`.
    pub fn files_for(file_size: u64, budget: u64, max_files: u64) -> u64 {
        (budget / file_size.max(1)).clamp(1, max_files.max(1))
    }

    /// Bytes the point writes.
    pub fn bytes(&self) -> u64 {
        self.file_size * self.files
    }

    /// Checks what direct I/O needs: sizes and blocks multiples of [`ALIGN`].
    pub fn validate(&self) -> Result<(), StorageError> {
        if self.file_size == 0 || self.files == 0 || self.threads == 0 || self.block == 0 {
            return Err(StorageError::Invalid(
                "file size, file count, threads and block size must be positive".into(),
            ));
        }
        if self.mode == IoMode::Direct && (self.file_size % ALIGN != 0 || self.block % ALIGN != 0) {
            return Err(StorageError::Invalid(format!(
                "direct I/O needs file and block sizes that are multiples of {ALIGN} \
                 (file size {}, block {})",
                self.file_size, self.block
            )));
        }
        Ok(())
    }
}

/// Which phase of a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Creating and writing the files.
    Write,
    /// Reading them back.
    Read,
}

/// What one phase measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseResult {
    /// Write or read.
    pub phase: Phase,
    /// Wall-clock seconds of the phase (for buffered writes including the final
    /// `syncfs`).
    pub seconds: f64,
    /// Of which the final `syncfs` (buffered writes only).
    pub sync_seconds: f64,
    /// Bytes moved.
    pub bytes: u64,
    /// Files handled.
    pub files: u64,
    /// Latency of the individual `pwrite`/`pread` calls.
    pub latency: Latency,
}

impl PhaseResult {
    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }

    /// Files per second.
    pub fn files_per_s(&self) -> f64 {
        self.files as f64 / self.seconds.max(1e-9)
    }

    /// I/O calls per second.
    pub fn iops(&self) -> f64 {
        self.latency.ops as f64 / self.seconds.max(1e-9)
    }
}

/// Drops the page cache (`sync; echo 3 > /proc/sys/vm/drop_caches`). Fails without the
/// permission (root, outside a restricted container).
pub fn drop_caches() -> io::Result<()> {
    rustix::fs::sync();
    fs::write("/proc/sys/vm/drop_caches", b"3\n")
}

/// Whether `dir`'s file system accepts `O_DIRECT` (probed by opening a scratch file).
pub fn direct_io_supported(dir: &Path) -> bool {
    let probe = dir.join(format!(".dmover-dio-probe-{}", std::process::id()));
    let ok = rustix::fs::open(
        &probe,
        OFlags::CREATE | OFlags::WRONLY | OFlags::DIRECT | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .is_ok();
    let _ = fs::remove_file(&probe);
    ok
}

/// A page-aligned heap buffer for direct I/O.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain owned memory; it is only ever used by one thread at a time.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn new(len: usize, seed: u64) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), ALIGN as usize)
            .expect("block size fits a layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let mut b = AlignedBuf { ptr, len, layout };
        // Incompressible content (xorshift64*), so no layer can cheat by compressing.
        let mut x = seed | 1;
        for w in b.as_mut().chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            w.copy_from_slice(&v[..w.len()]);
        }
        b
    }

    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A byte range of one file: the unit a thread takes from the queue.
#[derive(Debug, Clone, Copy)]
struct Job {
    file: u64,
    offset: u64,
    len: u64,
}

fn jobs(p: &Point) -> Vec<Job> {
    let per_file = if p.files >= p.threads as u64 {
        1
    } else {
        // Fewer files than threads: cut each file into block-aligned ranges.
        (p.threads as u64).div_ceil(p.files)
    };
    let mut out = Vec::new();
    for f in 0..p.files {
        let blocks = p.file_size.div_ceil(p.block);
        let parts = per_file.min(blocks).max(1);
        let mut offset = 0;
        for k in 0..parts {
            let end = if k + 1 == parts {
                p.file_size
            } else {
                ((k + 1) * blocks / parts * p.block).min(p.file_size)
            };
            if end > offset {
                out.push(Job {
                    file: f,
                    offset,
                    len: end - offset,
                });
            }
            offset = end;
        }
    }
    out
}

fn file_path(root: &Path, file: u64) -> PathBuf {
    root.join(format!("d{:03}", file / FILES_PER_DIR))
        .join(format!("f{file:07}"))
}

/// A dataset directory for one point; removed when dropped.
pub struct Dataset {
    root: PathBuf,
    point: Point,
}

impl Dataset {
    /// The directory holding the files.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Dataset {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn open(path: &Path, write: bool, mode: IoMode) -> io::Result<OwnedFd> {
    let mut flags = OFlags::CLOEXEC;
    if write {
        flags |= OFlags::WRONLY | OFlags::CREATE;
    } else {
        flags |= OFlags::RDONLY;
    }
    if mode == IoMode::Direct {
        flags |= OFlags::DIRECT;
    }
    Ok(rustix::fs::open(path, flags, Mode::from_raw_mode(0o644))?)
}

/// Runs `jobs` on `threads` threads; each calls `io(fd, buf, offset)` per block and
/// records its time. Returns the per-call times in nanoseconds.
fn run_jobs(root: &Path, p: &Point, jobs: &[Job], write: bool) -> Result<Vec<u64>, StorageError> {
    let next = AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.threads)
            .map(|t| {
                let (next, stop) = (&next, &stop);
                s.spawn(move || -> Result<Vec<u64>, StorageError> {
                    let mut buf = AlignedBuf::new(p.block as usize, 0x5eed + t as u64);
                    let mut times = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        let path = file_path(root, job.file);
                        let r = do_job(&path, job, p, write, &mut buf, &mut times);
                        if r.is_err() {
                            stop.store(true, Ordering::Relaxed);
                            return r.map(|_| times);
                        }
                    }
                    Ok(times)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(t)) => all.extend(t),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        first_err.map_or(Ok(all), Err)
    })
}

fn do_job(
    path: &Path,
    job: &Job,
    p: &Point,
    write: bool,
    buf: &mut AlignedBuf,
    times: &mut Vec<u64>,
) -> Result<(), StorageError> {
    let fd =
        open(path, write, p.mode).map_err(io_err(if write { "create" } else { "open" }, path))?;
    let end = job.offset + job.len;
    let mut off = job.offset;
    while off < end {
        let n = p.block.min(end - off) as usize;
        let t0 = Instant::now();
        let done = if write {
            rustix::io::pwrite(fd.as_fd(), &buf.as_ref()[..n], off)
        } else {
            rustix::io::pread(fd.as_fd(), &mut buf.as_mut()[..n], off)
        };
        times.push(t0.elapsed().as_nanos() as u64);
        let done = done
            .map_err(io::Error::from)
            .map_err(io_err(if write { "write" } else { "read" }, path))?;
        if done == 0 {
            return Err(StorageError::Io {
                op: if write { "write" } else { "read" },
                path: path.to_path_buf(),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("no progress at offset {off}"),
                ),
            });
        }
        off += done as u64;
    }
    Ok(())
}

/// Write phase: creates `p.files` files of `p.file_size` bytes in a new directory
/// `dmover-storage-<pid>-<k>` below `dir`.
pub fn write_phase(dir: &Path, p: &Point) -> Result<(Dataset, PhaseResult), StorageError> {
    p.validate()?;
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let root = dir.join(format!(
        "dmover-storage-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir(&root).map_err(io_err("create directory", &root))?;
    let ds = Dataset { root, point: *p };
    for d in 0..p.files.div_ceil(FILES_PER_DIR) {
        let sub = ds.root.join(format!("d{d:03}"));
        fs::create_dir(&sub).map_err(io_err("create directory", &sub))?;
    }
    let jobs = jobs(p);
    let t0 = Instant::now();
    let mut times = run_jobs(&ds.root, p, &jobs, true)?;
    let mut sync_seconds = 0.0;
    if p.mode == IoMode::Buffered {
        let t = Instant::now();
        let fd = rustix::fs::open(&ds.root, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(io::Error::from)
            .map_err(io_err("open", &ds.root))?;
        rustix::fs::syncfs(&fd)
            .map_err(io::Error::from)
            .map_err(io_err("sync", &ds.root))?;
        sync_seconds = t.elapsed().as_secs_f64();
    }
    let seconds = t0.elapsed().as_secs_f64();
    let r = PhaseResult {
        phase: Phase::Write,
        seconds,
        sync_seconds,
        bytes: p.bytes(),
        files: p.files,
        latency: Latency::of_nanos(&mut times),
    };
    Ok((ds, r))
}

/// Read phase: reads every file of `ds` back with the point's settings.
pub fn read_phase(ds: &Dataset) -> Result<PhaseResult, StorageError> {
    let p = ds.point;
    let jobs = jobs(&p);
    let t0 = Instant::now();
    let mut times = run_jobs(&ds.root, &p, &jobs, false)?;
    Ok(PhaseResult {
        phase: Phase::Read,
        seconds: t0.elapsed().as_secs_f64(),
        sync_seconds: 0.0,
        bytes: p.bytes(),
        files: p.files,
        latency: Latency::of_nanos(&mut times),
    })
}

/// Free bytes on `dir`'s file system for an unprivileged writer.
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(file_size: u64, files: u64, threads: usize, block: u64) -> Point {
        Point {
            file_size,
            files,
            threads,
            block,
            mode: IoMode::Buffered,
        }
    }

    #[test]
    fn jobs_cover_every_byte_once() {
        for p in [
            point(1 << 20, 3, 8, 64 << 10),
            point(4096, 100, 4, 1 << 20),
            point(10 << 20, 1, 3, 1 << 20),
            point(12288, 1, 8, 4096),
        ] {
            let js = jobs(&p);
            for f in 0..p.files {
                let mut ranges: Vec<(u64, u64)> = js
                    .iter()
                    .filter(|j| j.file == f)
                    .map(|j| (j.offset, j.len))
                    .collect();
                ranges.sort();
                let mut at = 0;
                for (o, l) in ranges {
                    assert_eq!(o, at, "{p:?}");
                    assert!(o % p.block == 0, "{p:?}: unaligned range at {o}");
                    at += l;
                }
                assert_eq!(at, p.file_size, "{p:?}");
            }
            if p.files < p.threads as u64 {
                assert!(js.len() as u64 > p.files, "{p:?}: big files are not split");
            }
        }
    }

    #[test]
    fn files_follow_the_budget() {
        assert_eq!(Point::files_for(4096, 1 << 20, 10_000), 256);
        assert_eq!(Point::files_for(1 << 30, 1 << 20, 10_000), 1);
        assert_eq!(Point::files_for(4096, 1 << 30, 10_000), 10_000);
    }

    #[test]
    fn write_then_read_a_small_point() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [IoMode::Buffered, IoMode::Direct] {
            if mode == IoMode::Direct && !direct_io_supported(dir.path()) {
                continue;
            }
            let p = Point {
                mode,
                ..point(64 << 10, 12, 2, 16 << 10)
            };
            let (ds, w) = write_phase(dir.path(), &p).unwrap();
            assert_eq!((w.files, w.bytes, w.latency.ops), (12, 12 * 65536, 48));
            let on_disk = fs::metadata(file_path(ds.root(), 11)).unwrap().len();
            assert_eq!(on_disk, 64 << 10);
            let r = read_phase(&ds).unwrap();
            assert_eq!((r.bytes, r.latency.ops), (12 * 65536, 48));
            assert!(r.latency.p50_us > 0.0 && r.latency.max_us >= r.latency.p99_us);
            assert!(w.bytes_per_s() > 0.0 && r.files_per_s() > 0.0);
            let root = ds.root().to_path_buf();
            drop(ds);
            assert!(!root.exists());
        }
        let bad = Point {
            mode: IoMode::Direct,
            ..point(1000, 1, 1, 4096)
        };
        assert!(matches!(
            write_phase(dir.path(), &bad),
            Err(StorageError::Invalid(_))
        ));
    }
}
