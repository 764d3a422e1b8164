//! `--files-from` takes memory linear in the list: a list of deep paths (a line of N
//! components once stored N prefixes, N²/2 bytes, which let one ~120 KB line take a
//! server to 7 GB). Measured by counting this test binary's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dmover_store::filter::{Filter, MAX_LIST_LINE};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_list_of_deep_paths_takes_memory_linear_in_its_size() {
    // 4 MiB (a whole `Open`) of lines of ~2000 components each, all different.
    let mut list = Vec::new();
    let mut n = 0u32;
    while list.len() < 4 << 20 {
        let line = format!("{n:x}/{}", "a/".repeat(MAX_LIST_LINE / 2 - 8));
        list.extend_from_slice(&line.as_bytes()[..MAX_LIST_LINE.min(line.len())]);
        list.push(b'\n');
        n += 1;
    }
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut f = Filter::none();
    f.set_files_from(&list).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        peak < 4 * list.len(),
        "{peak} bytes at the peak for a list of {} bytes",
        list.len()
    );
    assert!(f.admits(b"0/a/a", true));
    assert!(!f.admits(b"zz", false));
}
