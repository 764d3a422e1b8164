//! Structured: a manifest of files whose sizes cluster where the layout has edges
//! (empty, the alignment threshold, chunk boundaries, huge), mixed with directories
//! and symlinks, and a chunk size from the input; validated, laid out and walked.
#![no_main]

use dmover_fuzz::check_layout;
use dmover_proto::layout::{self, ALIGN, ALIGN_MIN_SIZE, Layout, MAX_CHUNK, MIN_CHUNK};
use dmover_proto::manifest::{self, Entry, EntryKind, Mtime, NO_PARENT};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn size(u: &mut Unstructured<'_>, chunk: u64) -> Result<u64> {
    let near = |u: &mut Unstructured<'_>, x: u64| -> Result<u64> {
        Ok((x + u.int_in_range(0..=2 * ALIGN)?).saturating_sub(ALIGN))
    };
    Ok(match u.int_in_range(0..=5u8)? {
        0 => 0,
        1 => u.int_in_range(1..=2 * ALIGN)?,
        2 => near(u, ALIGN_MIN_SIZE)?,
        3 => {
            let k = u.int_in_range(1..=4)?;
            near(u, k * chunk)?
        }
        4 => u.int_in_range(1..=8 * chunk)?,
        _ => u.arbitrary::<u64>()? >> u.int_in_range(2..=63)?,
    })
}

fn build(u: &mut Unstructured<'_>) -> Result<(Vec<Entry>, u32)> {
    let chunk = if u.ratio(1, 16)? {
        u.arbitrary()? // mostly invalid
    } else {
        MIN_CHUNK + u.int_in_range(0..=(MAX_CHUNK - MIN_CHUNK) / ALIGN as u32)? * ALIGN as u32
    };
    let mut entries = Vec::new();
    while !u.is_empty() && entries.len() < 512 {
        let kind = match u.int_in_range(0..=7u8)? {
            0 => EntryKind::Dir,
            1 => EntryKind::Symlink {
                target: b"t".to_vec(),
            },
            _ => EntryKind::File {
                // An invalid chunk size (even 0) still needs sensible file sizes.
                size: size(u, chunk.clamp(MIN_CHUNK, MAX_CHUNK).into())?,
            },
        };
        entries.push(Entry {
            parent: NO_PARENT,
            name: format!("e{}", entries.len()).into_bytes(),
            kind,
            mode: 0o644,
            mtime: Mtime::default(),
        });
    }
    Ok((entries, chunk))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok((entries, chunk)) = build(&mut u) else {
        return;
    };
    let l = Layout::new(&entries, chunk);
    if layout::validate_chunk_size(chunk).is_err() {
        assert!(l.is_err(), "bad chunk size {chunk} accepted");
        return;
    }
    match (manifest::validate(&entries, u64::MAX), l) {
        (Ok(_), Err(e)) => panic!("a validated manifest does not lay out: {e}"),
        // Unvalidated (over 2^62 bytes) but laid out: it must still be consistent.
        (_, Ok(l)) => check_layout(&l),
        (Err(_), Err(_)) => {}
    }
});
