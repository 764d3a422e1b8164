//! The chunk pipeline's two storage seams.
//!
//! The engine moves chunks of the layout (see [`dmover_proto::layout`]): the source
//! side takes a buffer from its pool, asks a [`Source`] to fill it, and sends it; the
//! destination receives a chunk into a pool buffer and hands it to a [`Sink`]. Both
//! traits work on the caller's buffer in place, so no chunk is copied for their sake,
//! and both are called from any disk thread, in any chunk order.

use dmover_proto::control::Summary;
use dmover_proto::data::DigestEntry;
use dmover_proto::layout::Layout;

use crate::error::{Error, Result};

/// What reading a chunk produced besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRead {
    /// CRC32C of the wire payload (with checksums on).
    pub crc: Option<u32>,
    /// Digest entries (and failure markers) it gave.
    pub n_digests: u32,
    /// Every piece lies in a hole of a sparse file (the buffer holds zeros).
    pub zeros: bool,
}

/// The read side: fills chunk buffers from storage.
pub trait Source: Send + Sync {
    /// The dataset layout (chunk size, files and their pieces; of a growing manifest,
    /// so far).
    fn layout(&self) -> std::sync::Arc<Layout>;

    /// The chunks to send, in order (those the destination does not already hold).
    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_>;

    /// Reads chunk `k` into `buf` (at least the chunk size) at the layout's offsets,
    /// giving in `digests` (cleared first) the digest entries of files it completes
    /// and failure markers of files it could not read, in file order.
    fn read_chunk(
        &self,
        k: u64,
        buf: &mut [u8],
        digests: &mut Vec<DigestEntry>,
    ) -> Result<ChunkRead>;

    /// Reads chunk `k` again to resend it (its first copy went down with a data
    /// stream), checking it against the CRC it was first sent with.
    fn reread_chunk(&self, k: u64, buf: &mut [u8], crc: Option<u32>) -> Result<()>;
}

/// The write side: stores received chunks and completes the files they hold.
pub trait Sink: Send + Sync {
    /// The dataset layout (chunk size, files and their pieces; of a growing manifest,
    /// so far).
    fn layout(&self) -> std::sync::Arc<Layout>;

    /// The chunks the source will send, in order.
    fn chunks(&self) -> Box<dyn Iterator<Item = u64> + Send + '_>;

    /// Writes chunk `k`, whose wire payload has been placed in `buf` at the layout's
    /// offsets, with the `digests` and `crc` its frame carried (decoded by the
    /// transport): checks the CRC, writes each piece at its file offset, and completes
    /// every file whose pieces are all written once its digest matches the source's.
    fn write_chunk(
        &self,
        k: u64,
        buf: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()>;

    /// (feature `PARTS`, request-driven sinks) Takes `data`, bytes `offset..` of chunk
    /// `k` (within one piece) that came as a part frame with the failure markers
    /// `digests` and `crc` of `data`. A sink that never asks for parts refuses them.
    fn write_part(
        &self,
        k: u64,
        offset: u32,
        data: &[u8],
        digests: &[DigestEntry],
        crc: Option<u32>,
    ) -> Result<()> {
        let _ = (offset, data, digests, crc);
        Err(crate::Error::protocol(
            "the source",
            format!("a part of chunk {k}, which this side did not ask for"),
        ))
    }

    /// Whether every piece of chunk `k` belongs to a file the source listed as sparse
    /// (only such a chunk may come as a zeros frame).
    fn sparse_chunk(&self, k: u64) -> bool {
        let _ = k;
        false
    }

    /// Completes the transfer once every chunk is written (entries without data,
    /// metadata, the check that every file arrived) and sums it up.
    fn finish(&self) -> Result<Summary>;

    /// Gives up the transfer: nothing incomplete stays under a final name. Dropping a
    /// sink whose `finish` did not succeed does the same.
    fn abort(&self);
}

/// Checks chunk `k`'s CRC32C (`crc`, as its frame carried it) over its pieces, placed
/// in `buf` at `layout`'s offsets: what every sink does first when checksums are on.
/// `from` names the sender in the error of a chunk that carries none.
pub fn check_crc(layout: &Layout, k: u64, buf: &[u8], crc: Option<u32>, from: &str) -> Result<()> {
    let want = crc.ok_or_else(|| Error::protocol(from, format!("chunk {k} carries no CRC")))?;
    let got = layout.pieces(k).fold(0, |c, p| {
        dmover_proto::digest::crc32c_append(c, &buf[p.buf_offset..p.buf_offset + p.len])
    });
    if got != want {
        return Err(Error::Checksum(format!(
            "chunk {k} arrived corrupted (CRC32C {got:08x}, sent as {want:08x})"
        )));
    }
    Ok(())
}
