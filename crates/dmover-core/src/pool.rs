//! A bounded pool of page-aligned chunk buffers.
//!
//! All buffers of a session are allocated when the session starts and recycled for its
//! whole life: memory stays flat however large the dataset, and a stage that runs ahead
//! waits for a free buffer (back-pressure). Buffers are aligned to 4096 bytes so they can
//! be handed to direct I/O. A [`PoolBuf`] returns itself to its pool when dropped, so an
//! error path cannot leak one.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer (direct I/O's strictest common requirement).
pub const BUF_ALIGN: usize = 4096;

/// A zeroed, page-aligned heap buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Maps `len` zeroed bytes (`len` > 0) of anonymous memory: the kernel supplies
    /// zeroed pages when first touched, so untouched pages cost neither memory nor
    /// time. (`alloc_zeroed` with page alignment writes zeros over the whole buffer:
    /// ~50 ms for a session's 14 × 4 MiB pool, at both ends, before the first chunk.)
    pub fn new(len: usize) -> Self {
        assert!(len > 0, "empty buffer");
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        };
        let ptr = match ptr {
            Ok(p) => NonNull::new(p.cast::<u8>()).expect("mmap returns no null mapping"),
            Err(_) => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len, BUF_ALIGN).expect("buffer layout"),
            ),
        };
        AlignedBuf { ptr, len }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; no reference outlives self.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A set of equal-sized buffers, allocated up front; [`Pool::grow`] adds more (a disk
/// tuner that adds threads adds the buffers they fill).
#[derive(Clone)]
pub struct Pool {
    tx: async_channel::Sender<AlignedBuf>,
    rx: async_channel::Receiver<AlignedBuf>,
    size: usize,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size)
            .field("count", &self.count())
            .field("free", &self.rx.len())
            .finish()
    }
}

impl Pool {
    /// Allocates `count` buffers of `size` bytes each.
    pub fn new(count: usize, size: usize) -> Self {
        // Unbounded: the pool never holds more than the buffers it made.
        let (tx, rx) = async_channel::unbounded();
        let pool = Pool {
            tx,
            rx,
            size,
            count: Default::default(),
        };
        pool.grow(count);
        pool
    }

    /// Adds `more` buffers (to every clone of this pool).
    pub fn grow(&self, more: usize) {
        for _ in 0..more {
            self.tx
                .try_send(AlignedBuf::new(self.size))
                .expect("an unbounded channel the pool holds open");
        }
        self.count
            .fetch_add(more, std::sync::atomic::Ordering::Relaxed);
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.size
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for a free buffer.
    pub async fn get(&self) -> PoolBuf {
        let buf = self
            .rx
            .recv()
            .await
            .expect("the pool holds its own sender, so it never closes");
        PoolBuf {
            buf: Some(buf),
            home: self.tx.clone(),
        }
    }
}

/// A buffer on loan from a [`Pool`]; dropping it gives it back.
pub struct PoolBuf {
    buf: Option<AlignedBuf>,
    home: async_channel::Sender<AlignedBuf>,
}

impl Deref for PoolBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().expect("buffer present until drop")
    }
}

impl DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().expect("buffer present until drop")
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            // The channel is unbounded, so this only fails when the pool itself is
            // gone, and then the buffer is simply freed.
            let _ = self.home.try_send(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_recycled() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = Pool::new(2, 64 * 1024);
            let mut a = pool.get().await;
            let b = pool.get().await;
            assert_eq!(a.as_ptr() as usize % BUF_ALIGN, 0);
            assert_eq!(a.len(), 64 * 1024);
            a[0] = 7;
            let pa = a.as_ptr();
            drop(a);
            // A third get would wait; after a drop it succeeds with the same memory.
            let c = tokio::time::timeout(std::time::Duration::from_secs(1), pool.get())
                .await
                .expect("a dropped buffer returns to the pool");
            assert_eq!(c.as_ptr(), pa);
            assert!(
                tokio::time::timeout(std::time::Duration::from_millis(20), pool.get())
                    .await
                    .is_err(),
                "pool is bounded"
            );
            // Grown, it has one more, for every clone.
            pool.clone().grow(1);
            assert_eq!(pool.count(), 3);
            let d = tokio::time::timeout(std::time::Duration::from_secs(1), pool.get())
                .await
                .expect("a grown pool has a buffer more");
            drop((b, c, d));
        });
    }
}
