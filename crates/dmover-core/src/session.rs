//! What client and server sessions share: options, manifest exchange over the control
//! channel, and watching the control channel while data flows.

use std::time::Duration;

use dmover_net::control::ControlChannel;
use dmover_net::tcp::SocketOptions;
use dmover_proto::control::{Control, ManifestEnd, ManifestPart};
use dmover_proto::layout::DEFAULT_CHUNK;
use dmover_proto::manifest::{self, Entry, EntryKind, Totals};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::engine::Run;
use crate::error::{Error, Result};

/// How long a peer may take to answer a handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most data streams a session may use.
pub const MAX_STREAMS: u16 = 128;
/// Most manifest entries accepted by default (about 100 bytes of memory each).
pub const MAX_ENTRIES: u64 = 50_000_000;
/// Manifest parts are cut at about this many encoded bytes.
const PART_BYTES: usize = 1 << 20;

/// Options of a transfer, as the user sets them.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Parallel TCP data streams.
    pub streams: u16,
    /// Chunk size in bytes; 0 lets the source side choose ([`auto_chunk`]).
    pub chunk_size: u32,
    /// Per-chunk CRC32C and per-file digests.
    pub checksum: bool,
    /// Direct I/O for large files, on both ends.
    pub direct_io: crate::DirectIo,
    /// `fsync` each file before it gets its final name (destination side).
    pub fsync: bool,
    /// Chunk buffers per session (`None`: sized from streams and disk threads).
    pub buffers: Option<usize>,
    /// Socket settings for the data streams.
    pub socket: SocketOptions,
    /// Shared token, if the server requires one.
    pub token: Option<Vec<u8>>,
    /// Limit for connecting and for each handshake step.
    pub connect_timeout: Duration,
    /// How to trust the server's TLS key (`None`: pin in the default known-hosts file).
    pub trust: Option<dmover_net::tls::Trust>,
    /// User name sent to the server (empty: none).
    pub user: String,
    /// Ed25519 key to authenticate with (preferred over a token when both are set).
    pub key: Option<crate::access::ClientKey>,
    /// How the data streams are protected.
    pub protection: dmover_proto::control::DataProtection,
    /// How long a data stream may wait without progress.
    pub idle_timeout: Duration,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            streams: 4,
            chunk_size: 0,
            checksum: true,
            direct_io: crate::DirectIo::Auto,
            fsync: false,
            buffers: None,
            socket: SocketOptions::default(),
            token: None,
            connect_timeout: Duration::from_secs(15),
            trust: None,
            user: String::new(),
            key: None,
            protection: Default::default(),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// Chunk size for a dataset when the user leaves it to us: 16 MiB when files average
/// 16 MiB or more (fewer, larger disk I/Os; measured ~1.3× faster for 256 MiB files
/// with direct I/O on a virtio disk), otherwise 4 MiB (more chunks to spread over
/// disk threads and streams, which small files need).
pub fn auto_chunk(entries: &[Entry]) -> u32 {
    let (files, bytes) = entries
        .iter()
        .filter(|e| e.file_size() > 0)
        .fold((0u64, 0u64), |(n, b), e| (n + 1, b + e.file_size()));
    if files > 0 && bytes / files >= 16 << 20 {
        16 << 20
    } else {
        DEFAULT_CHUNK
    }
}

/// Buffers a session needs to keep `streams` streams and `io_threads` disk threads busy:
/// one in flight per stream and per disk thread, plus two so a finished stage always
/// finds one free.
pub fn default_buffers(streams: u16, io_threads: usize) -> usize {
    (streams as usize + io_threads + 2).max(4)
}

/// Buffers for the source side of a session. When most of the data is in files large
/// enough for direct I/O, the disk rather than the CPU sets the pace, and a deeper pool
/// between reads and the network rides out the device's stalls: at least 160 MiB and 8
/// more than [`default_buffers`]. Measured on loopback with a shared virtio disk (A/B,
/// medians of 8 and 6 runs): 1 GiB of 1 MiB files 1.70 → 1.49 s with 40 × 4 MiB;
/// 16 × 256 MiB 6.05 → 5.46 s with 22 × 16 MiB. Many small files go the other way
/// (20 000 × 8 KiB: 1.06 → 1.31 s with 40 buffers), so they keep the default.
pub fn source_buffers(entries: &[Entry], chunk: u32, streams: u16, io_threads: usize) -> usize {
    let base = default_buffers(streams, io_threads);
    let (mut total, mut aligned) = (0u64, 0u64);
    for e in entries {
        let size = e.file_size();
        total += size;
        if size >= dmover_proto::layout::ALIGN_MIN_SIZE {
            aligned += size;
        }
    }
    if total == 0 || aligned * 2 < total {
        return base;
    }
    let for_bytes = (160usize << 20).div_ceil(chunk as usize);
    base.max(for_bytes).max(base + 8)
}

/// Sends a manifest in parts of about a megabyte, then its totals.
pub async fn send_manifest<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut ControlChannel<S>,
    entries: &[Entry],
) -> Result<()> {
    let mut start = 0;
    let mut bytes = 0;
    for (i, e) in entries.iter().enumerate() {
        let target = match &e.kind {
            EntryKind::Symlink { target } => target.len(),
            _ => 0,
        };
        bytes += e.name.len() + target + 32;
        if bytes >= PART_BYTES {
            ch.send(&Control::Manifest(ManifestPart {
                entries: entries[start..=i].to_vec(),
            }))
            .await?;
            start = i + 1;
            bytes = 0;
        }
    }
    if start < entries.len() {
        ch.send(&Control::Manifest(ManifestPart {
            entries: entries[start..].to_vec(),
        }))
        .await?;
    }
    ch.send(&Control::ManifestEnd(ManifestEnd {
        totals: Totals::of(entries),
    }))
    .await?;
    Ok(())
}

/// Turns a message that should not have arrived into an error (a peer's `Error` into
/// [`Error::Remote`]).
pub fn unexpected(peer: &str, msg: Control, wanted: &str) -> Error {
    match msg {
        Control::Error(e) => Error::Remote {
            peer: peer.to_string(),
            code: e.code,
            message: e.message,
        },
        other => Error::protocol(peer, format!("expected {wanted}, got {}", other.name())),
    }
}

/// Memory a manifest may take by default (entries, names and link targets), all
/// sessions' limits apart: 8 GiB, about 50 million entries with 100-byte names.
pub const MAX_MANIFEST_BYTES: u64 = 8 << 30;

/// Memory an entry takes once received: its fixed part plus its name and link target.
pub fn entry_bytes(e: &Entry) -> u64 {
    let target = match &e.kind {
        EntryKind::Symlink { target } => target.len(),
        _ => 0,
    };
    (std::mem::size_of::<Entry>() + e.name.len() + target) as u64
}

/// Receives a manifest, checking it as it grows and as a whole.
pub async fn recv_manifest<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut ControlChannel<S>,
    max_entries: u64,
) -> Result<Vec<Entry>> {
    recv_manifest_limited(ch, max_entries, MAX_MANIFEST_BYTES).await
}

/// [`recv_manifest`] with a limit on the memory the entries take ([`entry_bytes`]), so a
/// peer cannot exhaust memory with long names and link targets.
pub async fn recv_manifest_limited<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut ControlChannel<S>,
    max_entries: u64,
    max_bytes: u64,
) -> Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut bytes = 0u64;
    loop {
        match ch.recv_timeout(HANDSHAKE_TIMEOUT, "manifest").await? {
            Control::Manifest(part) => {
                if (entries.len() + part.entries.len()) as u64 > max_entries {
                    return Err(Error::refused(
                        dmover_proto::control::ErrorCode::Busy,
                        format!("manifest exceeds {max_entries} entries"),
                    ));
                }
                bytes += part.entries.iter().map(entry_bytes).sum::<u64>();
                if bytes > max_bytes {
                    return Err(Error::refused(
                        dmover_proto::control::ErrorCode::Busy,
                        format!("manifest exceeds {max_bytes} bytes of memory"),
                    ));
                }
                entries.extend(part.entries);
            }
            Control::ManifestEnd(end) => {
                let totals = manifest::validate(&entries, max_entries)
                    .map_err(|e| Error::Net(dmover_net::NetError::proto(ch.peer(), e)))?;
                if totals != end.totals {
                    return Err(Error::protocol(
                        ch.peer(),
                        format!(
                            "manifest totals {:?} do not match its entries {totals:?}",
                            end.totals
                        ),
                    ));
                }
                return Ok(entries);
            }
            other => return Err(unexpected(ch.peer(), other, "manifest")),
        }
    }
}

/// Runs `transfer` while listening on the control channel. A peer's `Error`, or the
/// control connection dropping, cancels the run. Any other message (such as the
/// peer's `Done`, which can race the end of our own sending) is handed back.
pub async fn watch_control<S, F, T>(
    ch: &mut ControlChannel<S>,
    run: &Run,
    transfer: F,
) -> Result<(T, Option<Control>)>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: std::future::Future<Output = Result<T>>,
{
    tokio::pin!(transfer);
    let mut early = None;
    let mut listening = true;
    loop {
        tokio::select! {
            biased;
            r = &mut transfer => return r.map(|t| (t, early)),
            m = ch.recv(), if listening => {
                listening = false;
                match m {
                    Ok(Control::Error(e)) => run.fail(Error::Remote {
                        peer: ch.peer().to_string(),
                        code: e.code,
                        message: e.message,
                    }),
                    Ok(msg) => early = Some(msg),
                    Err(e) => run.fail(Error::Net(e)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_proto::manifest::{Mtime, NO_PARENT};

    fn files(sizes: &[u64]) -> Vec<Entry> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| Entry {
                parent: NO_PARENT,
                name: format!("f{i}").into_bytes(),
                kind: EntryKind::File { size },
                mode: 0o644,
                mtime: Mtime::default(),
            })
            .collect()
    }

    #[tokio::test]
    async fn manifests_are_limited_in_entries_and_memory() {
        let mut names = files(&[1; 10]);
        for (i, e) in names.iter_mut().enumerate() {
            e.name = vec![b'a' + i as u8; 200];
        }
        for (max_entries, max_bytes, ok) in
            [(10, 1 << 20, true), (9, 1 << 20, false), (10, 1000, false)]
        {
            let (a, b) = tokio::io::duplex(1 << 20);
            let mut tx = ControlChannel::new(a, "tx", dmover_proto::control::MAX_FRAME);
            let mut rx = ControlChannel::new(b, "rx", dmover_proto::control::MAX_FRAME);
            send_manifest(&mut tx, &names).await.unwrap();
            let r = recv_manifest_limited(&mut rx, max_entries, max_bytes).await;
            assert_eq!(
                r.is_ok(),
                ok,
                "{max_entries} entries, {max_bytes} bytes: {r:?}"
            );
        }
    }

    #[test]
    fn chunk_size_follows_the_mean_file_size() {
        assert_eq!(auto_chunk(&files(&[256 << 20; 4])), 16 << 20);
        assert_eq!(auto_chunk(&files(&[1 << 20; 100])), DEFAULT_CHUNK);
        assert_eq!(auto_chunk(&files(&[8192; 100])), DEFAULT_CHUNK);
        assert_eq!(auto_chunk(&[]), DEFAULT_CHUNK);
        // Empty files do not drag the mean down.
        assert_eq!(auto_chunk(&files(&[0, 0, 0, 64 << 20])), 16 << 20);
    }

    #[test]
    fn deep_pools_only_for_large_file_data() {
        assert_eq!(default_buffers(4, 8), 14);
        assert_eq!(source_buffers(&files(&[8192; 1000]), 4 << 20, 4, 8), 14);
        assert_eq!(source_buffers(&files(&[1 << 20; 1000]), 4 << 20, 4, 8), 40);
        assert_eq!(source_buffers(&files(&[256 << 20; 16]), 16 << 20, 4, 8), 22);
        assert_eq!(source_buffers(&[], 4 << 20, 4, 8), 14);
    }
}
