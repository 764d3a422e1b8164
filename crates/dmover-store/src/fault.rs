//! Faults injected at the storage seam, for tests: [`Slow`] makes any [`Source`] or
//! [`Sink`] take a while over every chunk, as a slow or busy disk would (on the disk
//! thread that runs it, so the transfer's pipelining is what it is with a real slow
//! disk); [`Failing`] fails reading or writing one chunk, as a bad sector or a full
//! disk would. The application sets it up (`dmover serve`'s hidden `--debug-chunk-delay-ms`);
//! no option struct carries it.

use std::sync::Arc;
use std::time::Duration;

use dmover_proto::control::Summary;
use dmover_proto::data::DigestEntry;
use dmover_proto::layout::Layout;

use crate::Result;
use crate::chunk::{ChunkRead, Sink, Source};

/// A source or sink that sleeps `delay` before each chunk it reads or writes.
pub struct Slow<T: ?Sized> {
    inner: Arc<T>,
    delay: Duration,
}

impl<T: ?Sized> Slow<T> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<T>, delay: Duration) -> Self {
        Slow { inner, delay }
    }
}

impl<T: Source + ?Sized> Source for Slow<T> {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.inner.layout()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        self.inner.chunks()
    }

    fn read_chunk(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> Result<ChunkRead> {
        std::thread::sleep(self.delay);
        self.inner.read_chunk(k, buf, digests)
    }

    fn reread_chunk(&self, k: u64, buf: &mut [u8], crc: Option<u32>) -> Result<()> {
        std::thread::sleep(self.delay);
        self.inner.reread_chunk(k, buf, crc)
    }
}

impl<T: Sink + ?Sized> Sink for Slow<T> {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.inner.layout()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        self.inner.chunks()
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        std::thread::sleep(self.delay);
        self.inner.write_chunk(k, buf, digests, crc)
    }

    fn write_part(
        &self,
        k: u64,
        offset: u32,
        data: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        std::thread::sleep(self.delay);
        self.inner.write_part(k, offset, data, digests, crc)
    }

    fn sparse_chunk(&self, k: u64) -> bool {
        self.inner.sparse_chunk(k)
    }

    fn finish(&self) -> Result<Summary> {
        self.inner.finish()
    }

    fn abort(&self) {
        self.inner.abort()
    }
}

/// A source or sink that fails reading or writing one chunk (each time it is asked
/// to), with an I/O error naming it; every other chunk is its inner storage's.
pub struct Failing<T: ?Sized> {
    inner: Arc<T>,
    chunk: Option<u64>,
}

impl<T: ?Sized> Failing<T> {
    /// Wraps `inner`, failing chunk `chunk` (none: no fault).
    pub fn new(inner: Arc<T>, chunk: Option<u64>) -> Self {
        Failing { inner, chunk }
    }

    /// The storage it wraps.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The storage it wraps, to change (`None` while it is shared).
    pub fn get_mut(&mut self) -> Option<&mut T> {
        Arc::get_mut(&mut self.inner)
    }

    /// The storage it wraps, shared.
    pub fn shared(&self) -> Arc<T> {
        self.inner.clone()
    }

    fn check(&self, k: u64, op: &'static str) -> Result<()> {
        if self.chunk == Some(k) {
            return Err(crate::Error::io(
                op,
                format!("chunk {k}"),
                std::io::Error::other("injected storage fault"),
            ));
        }
        Ok(())
    }
}

impl<T: Source + ?Sized> Source for Failing<T> {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.inner.layout()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        self.inner.chunks()
    }

    fn read_chunk(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> Result<ChunkRead> {
        self.check(k, "read")?;
        self.inner.read_chunk(k, buf, digests)
    }

    fn reread_chunk(&self, k: u64, buf: &mut [u8], crc: Option<u32>) -> Result<()> {
        self.check(k, "read")?;
        self.inner.reread_chunk(k, buf, crc)
    }
}

impl<T: Sink + ?Sized> Sink for Failing<T> {
    fn layout(&self) -> std::sync::Arc<Layout> {
        self.inner.layout()
    }

    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        self.inner.chunks()
    }

    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        self.check(k, "write")?;
        self.inner.write_chunk(k, buf, digests, crc)
    }

    fn write_part(
        &self,
        k: u64,
        offset: u32,
        data: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        self.check(k, "write")?;
        self.inner.write_part(k, offset, data, digests, crc)
    }

    fn sparse_chunk(&self, k: u64) -> bool {
        self.inner.sparse_chunk(k)
    }

    fn finish(&self) -> Result<Summary> {
        self.inner.finish()
    }

    fn abort(&self) {
        self.inner.abort()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{MemSink, MemSource};
    use dmover_proto::manifest::{Entry, EntryKind, Mtime, NO_PARENT};
    use std::time::Instant;

    #[test]
    fn a_slow_source_and_sink_take_their_time_and_change_nothing() {
        let entries = vec![
            Entry {
                parent: NO_PARENT,
                name: b"d".to_vec(),
                kind: EntryKind::Dir,
                mode: 0o755,
                mtime: Mtime::default(),
            },
            Entry {
                parent: 0,
                name: b"f".to_vec(),
                kind: EntryKind::File { size: 100_000 },
                mode: 0o644,
                mtime: Mtime::default(),
            },
        ];
        let data = vec![Vec::new(), (0..100_000).map(|i| (i % 251) as u8).collect()];
        let chunk = 64 << 10;
        let src = Slow::new(
            Arc::new(MemSource::new(entries.clone(), data.clone(), chunk, true).unwrap()),
            Duration::from_millis(20),
        );
        let mem = Arc::new(MemSink::new(entries, chunk, true).unwrap());
        let sink = Slow::new(mem.clone(), Duration::from_millis(20));
        let started = Instant::now();
        let mut buf = vec![0u8; chunk as usize];
        let mut digests = Vec::new();
        let ks: Vec<u64> = src.chunks().collect();
        for &k in &ks {
            let r = src.read_chunk(k, &mut buf, &mut digests).unwrap();
            sink.write_chunk(k, &buf, &digests, r.crc).unwrap();
        }
        sink.finish().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(40 * ks.len() as u64));
        assert_eq!(mem.file(1).as_deref(), Some(&data[1][..]));
    }

    #[test]
    fn failing_storage_fails_its_chunk_only() {
        let size = 200_000u64;
        let entries = vec![Entry {
            parent: NO_PARENT,
            name: b"f".to_vec(),
            kind: EntryKind::File { size },
            mode: 0o644,
            mtime: Mtime::default(),
        }];
        let data = vec![(0..size).map(|i| (i % 253) as u8).collect::<Vec<u8>>()];
        let chunk = 64 << 10;
        let inner = Arc::new(MemSource::new(entries.clone(), data.clone(), chunk, true).unwrap());
        let src = Failing::new(inner, Some(2));
        let mem = Arc::new(MemSink::new(entries, chunk, true).unwrap());
        let sink = Failing::new(mem.clone(), Some(1));
        let mut buf = vec![0u8; chunk as usize];
        let mut digests = Vec::new();
        let r = src.read_chunk(0, &mut buf, &mut digests).unwrap();
        sink.write_chunk(0, &buf, &digests, r.crc).unwrap();
        let e = src.read_chunk(2, &mut buf, &mut digests).unwrap_err();
        assert!(
            e.to_string().contains("chunk 2: injected storage fault"),
            "{e}"
        );
        assert!(src.reread_chunk(2, &mut buf, None).is_err());
        let r = src.read_chunk(1, &mut buf, &mut digests).unwrap();
        let e = sink.write_chunk(1, &buf, &digests, r.crc).unwrap_err();
        assert!(
            e.to_string().contains("chunk 1: injected storage fault"),
            "{e}"
        );
        assert_eq!(mem.file(0), None, "the file is not complete");
    }
}
