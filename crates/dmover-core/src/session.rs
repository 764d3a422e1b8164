//! What client and server sessions share: options, manifest exchange over the control
//! channel, the resume negotiation, and watching the control channel while data flows.

use std::time::Duration;

use dmover_net::control::ControlChannel;
use dmover_net::link::SocketOptions;
use dmover_proto::control::{Control, SessionOptions};
use dmover_proto::layout::DEFAULT_CHUNK;
use dmover_proto::manifest::{self, Entry};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::Error;

/// The software name sent in greetings.
pub const SOFTWARE: &str = concat!("dmover ", env!("CARGO_PKG_VERSION"));

/// How long a peer may take to answer a handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client keeps connecting again to a busy server by default.
pub const DEFAULT_BUSY_WAIT: Duration = Duration::from_secs(60);
/// Most data streams a session may use.
pub const MAX_STREAMS: u16 = 128;
/// Streams a self-tuning transfer (no `-P`) asks for: the most its tuner may use.
pub const TUNED_MAX: u16 = 16;
/// Streams a self-tuning transfer starts with (the untuned default).
pub const TUNED_START: u16 = 4;
/// Streams a self-tuning transfer starts with on a link of [`WIDE_START_RTT`] or more
/// when its files average under 16 MiB. There the whole copy of small files is mostly
/// slow start, and eight streams open with twice the window of four. Pushes at 1 Gbit/s,
/// 3 interleaved runs (docs/benchmarks.md, "Starting with 8 streams on long links"):
/// 200 ms: 2000 × 8 KiB 2.60 → 2.45 s, 512 × 1 MiB 6.90 → 6.71 s, but 2 × 512 MiB
/// 11.43 → 11.68 s; 100 and 50 ms: within ±2 %, either way.
pub const TUNED_START_WIDE: u16 = 8;
/// See [`TUNED_START_WIDE`]: the round trip (of the control connection) from which a
/// tuned transfer of small files starts wider.
pub const WIDE_START_RTT: std::time::Duration = std::time::Duration::from_millis(150);

/// The streams a self-tuning transfer of `entries` starts with on a link of round trip
/// `rtt` (`None`: not known): [`TUNED_START_WIDE`] or [`TUNED_START`].
pub fn tuned_start(entries: &[Entry], rtt: Option<std::time::Duration>) -> u16 {
    let small = mean_file_size(entries).is_some_and(|m| m < LARGE_FILES);
    if small && rtt.is_some_and(|r| r >= WIDE_START_RTT) {
        TUNED_START_WIDE
    } else {
        TUNED_START
    }
}

/// A self-tuning session's buffers are sized for at most this many streams: a chunk
/// holds its buffer only while it is written into the socket, so more streams do not
/// need more buffers (the data in flight waits in the sockets' buffers).
pub const TUNED_BUFFER_STREAMS: u16 = 8;

/// The streams to size a session's buffers for (see [`TUNED_BUFFER_STREAMS`]).
pub fn buffer_streams(streams: u16, tuned: bool) -> u16 {
    if tuned {
        streams.min(TUNED_BUFFER_STREAMS)
    } else {
        streams
    }
}
pub use dmover_proto::manifest::{MAX_ENTRIES, MAX_MANIFEST_BYTES, entry_bytes};
/// Default interval between heartbeats on the control channel.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// A peer silent for this many heartbeat intervals is declared gone.
pub const SILENT_INTERVALS: u32 = 4;

/// Options of a transfer, as the user sets them.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Parallel TCP data streams (with `tune`: the most the tuner may use).
    pub streams: u16,
    /// The source tunes how many of the streams it sends on, while it sends (feature
    /// `TUNING`; offered to the server only then).
    pub tune: bool,
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
    /// How to trust the server's TLS key. `None` (no known-hosts file could be
    /// named: the caller found no home directory) refuses to connect.
    pub trust: Option<dmover_net::tls::Trust>,
    /// User name sent to the server (empty: none).
    pub user: String,
    /// Ed25519 key to authenticate with (preferred over a token when both are set).
    pub key: Option<crate::access::ClientKey>,
    /// The user and credential for particular servers (`host:port` as dialed), in
    /// place of `user`, `token` and `key`: a client's profiles give each server of a
    /// copy between two servers its own. Empty: every server gets the options' own.
    pub per_server: std::collections::HashMap<String, ServerCredential>,
    /// How the data streams are protected.
    pub protection: dmover_proto::control::DataProtection,
    /// How long a data stream may wait without progress.
    pub idle_timeout: Duration,
    /// Resume from the destination's journal of an earlier attempt.
    pub resume: bool,
    /// Sessions to start again, resuming, after a failure that may pass (a network
    /// error, a busy server, a file changed while read).
    pub retries: u32,
    /// Pause before each retry.
    pub retry_wait: Duration,
    /// How long to keep connecting again to a server that answers busy (too many
    /// connections in set-up), whatever `retries` says; zero: fail at the first busy
    /// answer. See [`crate::dialer::Dialer`]'s connect.
    pub busy_wait: Duration,
    /// Fault injection for tests: each chunk read or written here waits this long (a
    /// server's `--debug-chunk-delay-ms`, passed to the third-party sessions it dials).
    pub chunk_delay: Option<Duration>,
    /// The destination keeps a resume journal.
    pub journal: bool,
    /// The destination re-reads every file after fsync and compares digests.
    pub verify: bool,
    /// Files the source cannot read are reported, and the rest is sent.
    pub continue_on_error: bool,
    /// `dmover sync`: the destination path is the copy of the (single) source itself,
    /// never its parent (the root is renamed to the destination's last component and
    /// lands in the destination's parent, which must exist).
    pub mirror: bool,
    /// The walk's filters (`--exclude`, `--include`, `--files-from`; a push's sources).
    pub filter: Option<std::sync::Arc<dmover_store::filter::Filter>>,
    /// The `--include`/`--exclude` rules as given, for a server that applies them
    /// (a push's `sync --delete`: what they exclude is not deleted there).
    pub rules: Vec<dmover_proto::control::FilterRule>,
    /// The `--files-from` file's contents as read (also parsed into `filter`), for a
    /// pull's server, which applies them to its walk ([`Op::PullListed`]).
    ///
    /// [`Op::PullListed`]: dmover_proto::control::Op::PullListed
    pub files_from: Option<Vec<u8>>,
    /// `dmover sync --delete`: after a successful transfer, delete what the mirror
    /// holds that the source does not (docs/sync.md).
    pub delete: bool,
    /// `--max-delete N`: delete at most N entries.
    pub max_delete: Option<u64>,
    /// `sync --checksum`: files of equal size are compared by content, not mtime
    /// (pushes).
    pub compare_content: bool,
    /// `sync --size-only` ([`QuickCheck::Size`]) or `--ignore-existing`
    /// ([`QuickCheck::Exists`]): which files the mirror keeps as they are, instead of
    /// those with the source's size and mtime. Push and pull, not between two servers
    /// (docs/sync.md).
    ///
    /// [`QuickCheck::Size`]: dmover_store::prune::QuickCheck::Size
    /// [`QuickCheck::Exists`]: dmover_store::prune::QuickCheck::Exists
    pub quick_check: dmover_store::prune::QuickCheck,
    /// Heartbeat interval on the control channel.
    pub heartbeat: Duration,
    /// Bandwidth limit of the transfer, all data streams together, in bytes per
    /// second, applied on this side ([`dmover_net::pace`]): a source paces its sends,
    /// a sink its reads.
    pub bwlimit: Option<u64>,
    /// Owners and extended attributes (feature `METADATA`): which a push's source
    /// reads and sends (`xattrs`; `owner` off sends no owner), which a pull's
    /// destination applies (owners only when this process is root).
    pub meta: dmover_store::meta::MetaPolicy,
}

/// A server's own user and credential ([`TransferOptions::per_server`]).
#[derive(Debug, Clone, Default)]
pub struct ServerCredential {
    /// User name sent to the server (empty: none).
    pub user: String,
    /// Shared token, if the server requires one.
    pub token: Option<Vec<u8>>,
    /// Ed25519 key (preferred over a token when both are set).
    pub key: Option<crate::access::ClientKey>,
}

impl TransferOptions {
    /// The user, token and key to present to `server` (`host:port` as dialed): its
    /// own ([`TransferOptions::per_server`]), else the options'.
    pub fn credential_for(
        &self,
        server: &str,
    ) -> (&str, Option<&[u8]>, Option<&crate::access::ClientKey>) {
        match self.per_server.get(server) {
            Some(c) => (&c.user, c.token.as_deref(), c.key.as_ref()),
            None => (&self.user, self.token.as_deref(), self.key.as_ref()),
        }
    }

    /// The options sent to the server for one attempt.
    pub fn session_options(&self, resume: bool) -> SessionOptions {
        SessionOptions {
            resume,
            journal: self.journal,
            fsync: self.fsync,
            verify: self.verify && self.checksum,
            continue_on_error: self.continue_on_error,
            heartbeat_ms: self.heartbeat.as_millis().min(u32::MAX.into()) as u32,
        }
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            chunk_delay: None,
            streams: 4,
            tune: false,
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
            per_server: std::collections::HashMap::new(),
            protection: Default::default(),
            idle_timeout: Duration::from_secs(120),
            resume: false,
            retries: 0,
            retry_wait: Duration::from_secs(5),
            busy_wait: DEFAULT_BUSY_WAIT,
            journal: true,
            verify: false,
            continue_on_error: false,
            mirror: false,
            filter: None,
            rules: Vec::new(),
            files_from: None,
            delete: false,
            max_delete: None,
            compare_content: false,
            quick_check: dmover_store::prune::QuickCheck::SizeAndMtime,
            heartbeat: HEARTBEAT,
            bwlimit: None,
            meta: dmover_store::meta::MetaPolicy {
                xattrs: dmover_proto::manifest::XattrScope::DEFAULT,
                owner: true,
            },
        }
    }
}

/// The filter of rules a client sent ([`dmover_proto::control::Prune`]).
pub fn filter_of_rules(
    rules: &[dmover_proto::control::FilterRule],
) -> Result<dmover_store::filter::Filter, Error> {
    use dmover_store::filter::{Action, Filter, Rule};
    let mut f = Filter::none();
    for r in rules {
        let action = if r.include {
            Action::Include
        } else {
            Action::Exclude
        };
        let rule = Rule::new(action, &r.pattern).map_err(|e| {
            Error::refused(
                dmover_proto::control::ErrorCode::Protocol,
                format!("filter {:?}: {e}", String::from_utf8_lossy(&r.pattern)),
            )
        })?;
        f.push(rule);
    }
    Ok(f)
}

/// [`filter_of_rules`] with a `--files-from` list (the file's contents, as
/// [`dmover_store::filter::Filter::set_files_from`] parses them): the server's filter
/// of an [`dmover_proto::control::Op::PullListed`]. A bad list is `Error{Protocol}`.
pub fn filter_of_list(
    rules: &[dmover_proto::control::FilterRule],
    list: &[u8],
) -> Result<dmover_store::filter::Filter, Error> {
    let mut f = filter_of_rules(rules)?;
    f.set_files_from(list)
        .map_err(|e| Error::refused(dmover_proto::control::ErrorCode::Protocol, e))?;
    Ok(f)
}

/// The wire form of a prune's result.
pub(crate) fn prune_report(p: dmover_store::prune::Pruned) -> dmover_proto::control::PruneReport {
    let mut unchanged: Vec<dmover_proto::control::EntryRange> = Vec::new();
    let mut idx = p.unchanged;
    idx.sort_unstable();
    for i in idx {
        match unchanged.last_mut() {
            Some(r) if r.first + r.count == i => r.count += 1,
            _ => unchanged.push(dmover_proto::control::EntryRange { first: i, count: 1 }),
        }
    }
    dmover_proto::control::PruneReport {
        deleted: p.deleted,
        deleted_bytes: p.deleted_bytes,
        over_limit: p.over_limit,
        protected: p.protected,
        paths: p.paths,
        unchanged,
        digests: p.digests,
    }
}

/// A streamed manifest's first part, in entries: about 20 KB on the wire, what a new
/// connection's first round trips carry, so the data start after one round trip
/// instead of after the whole manifest crawled through TCP's slow start (700 KB for
/// 20 000 files: six round trips).
pub const FIRST_PART: usize = 512;

/// A streamed manifest's largest part, in entries.
pub const PART_MAX: usize = 65_536;

/// Where a walked manifest of `n` entries is cut to be sent in parts (feature
/// `STREAMED`): the end of each part, the last being `n`. The first part has
/// [`FIRST_PART`] entries and each next one twice the one before (at most
/// [`PART_MAX`]): few parts, each adding its own `Grow`/`Grown` and a partly
/// filled chunk. `None` for fewer than `4 × FIRST_PART` entries (about 80 KB, what
/// slow start carries in three round trips): those go whole, since parts would save
/// a round trip at most (1024 files of 1 MiB in two parts: no gain measured, and
/// 1 % slower at 50 ms, within the runs' spread).
pub fn manifest_parts(n: usize) -> Option<Vec<usize>> {
    if n < 4 * FIRST_PART {
        return None;
    }
    let (mut ends, mut end, mut size) = (Vec::new(), 0, FIRST_PART);
    while end < n {
        end = (end + size).min(n);
        ends.push(end);
        size = (size * 2).min(PART_MAX);
    }
    Some(ends)
}

/// Chunk size for a dataset when the user leaves it to us: 16 MiB when files average
/// 16 MiB or more (fewer, larger disk I/Os; measured ~1.3× faster for 256 MiB files
/// with direct I/O on a virtio disk), otherwise 4 MiB (more chunks to spread over
/// disk threads and streams, which small files need).
pub fn auto_chunk(entries: &[Entry]) -> u32 {
    chunk_for(mean_file_size(entries))
}

/// Files of this mean size or more are large: 16 MiB chunks ([`auto_chunk`]), and a
/// tuned copy of them starts with [`TUNED_START`] streams on any link.
const LARGE_FILES: u64 = 16 << 20;

/// [`auto_chunk`] for a dataset whose files with data average `mean` bytes.
fn chunk_for(mean: Option<u64>) -> u32 {
    if mean.is_some_and(|m| m >= LARGE_FILES) {
        LARGE_FILES as u32
    } else {
        DEFAULT_CHUNK
    }
}

/// The mean size of the files that hold data (`None`: none do).
fn mean_file_size(entries: &[Entry]) -> Option<u64> {
    let (files, bytes) = entries
        .iter()
        .filter(|e| e.file_size() > 0)
        .fold((0u64, 0u64), |(n, b), e| (n + 1, b + e.file_size()));
    (files > 0).then(|| bytes / files)
}

/// The chunk of a dataset of small files (under [`SMALL_CHUNK`] on average), on any
/// link: at 4 MiB its first chunks go on one or two streams while the others idle
/// through their slow start (2000 × 8 KiB are four chunks), one disk thread reads (and
/// at the other end creates) a chunk's 512 files while the others wait, and its last
/// chunk drains alone. Pushes at 1 Gbit/s, interleaved, medians of 5–7
/// (docs/benchmarks.md, "Smaller chunks for small files on long links" and "1 MiB
/// chunks for small files on short links"): 2000 × 8 KiB 1.02 → 0.86 s at 50 ms and
/// 3.30 → 2.97 s at 200 ms; 20 000 × 8 KiB 1.75 → 1.65 s at 0 ms, 1.85 → 1.67 s at
/// 10 ms, 3.66 → 3.32 s at 50 ms and 5.46 → 5.27 s at 200 ms. (Until stop 38 only from
/// a round trip of 20 ms: in stop 29, 20 000 × 8 KiB at 0 ms took 2.71 s with 1 MiB
/// against 2.35 s; the per-chunk costs have gone since.)
pub const SMALL_CHUNK: u32 = 1 << 20;

/// A dataset of small files (under [`SMALL_CHUNK`] on average) holding less than this
/// many [`SMALL_CHUNK`]s goes in this many chunks or more, of at least
/// [`MIN_SMALL_CHUNK`] ([`auto_chunk_on`]). In a few large chunks one disk thread reads
/// each chunk's hundreds of files before its first byte leaves, a few streams carry
/// it, and one disk thread at the other end creates those files while the others
/// wait: 2000 × 8 KiB were four 4 MiB chunks, and at 0 ms their first 100 kB reached
/// the server 0.12 s in. Third-party copies of 2000 × 8 KiB at 1 Gbit/s, interleaved,
/// medians of 5 (docs/benchmarks.md, "Third-party copies", stop 36): 0.30 → 0.21 s at
/// 0 ms, 0.62 → 0.58 s at 50 ms, 2.15 → 2.04 s at 200 ms. A large dataset keeps its
/// chunk (for 20 000 × 8 KiB at 0 ms the size made no difference: "Chunks for small
/// datasets").
pub const FEW_CHUNKS: u64 = 64;
/// See [`FEW_CHUNKS`]: the smallest chunk chosen for a small dataset.
pub const MIN_SMALL_CHUNK: u32 = 256 << 10;

/// [`auto_chunk`], with [`SMALL_CHUNK`] for small files, and for a small dataset of
/// them ([`FEW_CHUNKS`]) smaller chunks. `whole`: `entries` are the whole dataset (not
/// the first part of a live walk, whose size is not known yet).
pub fn auto_chunk_on(entries: &[Entry], whole: bool) -> u32 {
    let mean = mean_file_size(entries);
    if mean.is_none_or(|m| m >= u64::from(SMALL_CHUNK)) {
        return chunk_for(mean);
    }
    let bytes: u64 = entries.iter().map(Entry::file_size).sum();
    if whole && bytes < FEW_CHUNKS * u64::from(SMALL_CHUNK) {
        let per = (bytes / FEW_CHUNKS).max(1);
        let pow2 = 1u64 << (63 - per.leading_zeros());
        return pow2.clamp(u64::from(MIN_SMALL_CHUNK), u64::from(SMALL_CHUNK)) as u32;
    }
    SMALL_CHUNK
}

/// The chunk size of a later part of a growing manifest (feature `PART_CHUNKS`,
/// docs/protocol.md "Chunks per part"): [`auto_chunk_on`] of the part's files, at
/// most the session's (every buffer's size). A part without data keeps the
/// session's. So a tree whose walk met large files first, and whose session chunks
/// are 16 MiB, sends the small files it meets later in 1 MiB chunks: at 16 MiB one
/// disk thread would read (and at the other end create) each chunk's thousands of
/// files while the others wait.
pub fn part_chunk(entries: &[Entry], session: u32) -> u32 {
    if mean_file_size(entries).is_none() {
        return session;
    }
    auto_chunk_on(entries, false).min(session)
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
    deep_buffers(mostly_aligned(entries), chunk, streams, io_threads)
}

/// Whether most of the data is in files large enough for direct I/O (see
/// [`source_buffers`]).
pub fn mostly_aligned(entries: &[Entry]) -> bool {
    let (mut total, mut aligned) = (0u64, 0u64);
    for e in entries {
        let size = e.file_size();
        total += size;
        if size >= dmover_proto::layout::ALIGN_MIN_SIZE {
            aligned += size;
        }
    }
    total > 0 && aligned * 2 >= total
}

/// [`source_buffers`] for a dataset that is `mostly_aligned` or not.
pub fn deep_buffers(mostly_aligned: bool, chunk: u32, streams: u16, io_threads: usize) -> usize {
    let base = default_buffers(streams, io_threads);
    if !mostly_aligned {
        return base;
    }
    let for_bytes = (160usize << 20).div_ceil(chunk as usize);
    base.max(for_bytes).max(base + 8)
}

/// The path of manifest entry `idx`, for messages (names joined by `/`).
pub fn entry_path(entries: &[Entry], idx: u32) -> String {
    let mut names = Vec::new();
    let mut i = idx;
    loop {
        let e = &entries[i as usize];
        names.push(String::from_utf8_lossy(&e.name).into_owned());
        if e.parent == manifest::NO_PARENT || e.parent as usize >= entries.len() {
            break;
        }
        i = e.parent;
    }
    names.reverse();
    names.join("/")
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

/// Waits briefly for the peer's `Error` after our side failed with `e`; returns the
/// peer's report if one comes, else `e`. Messages before it (answers to earlier
/// pipelined requests, e.g. `Welcome` before a refused `Auth`) are skipped.
pub(crate) async fn peer_report<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut ControlChannel<S>,
    e: Error,
) -> Error {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        match tokio::time::timeout_at(deadline, ch.recv()).await {
            Ok(Ok(Control::Error(m))) => {
                return Error::Remote {
                    peer: ch.peer().to_string(),
                    code: m.code,
                    message: m.message,
                };
            }
            Ok(Ok(_)) => {}
            _ => return e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_proto::manifest::{EntryKind, Mtime, NO_PARENT};

    #[test]
    fn a_server_of_its_own_gets_its_own_credential() {
        let mut o = TransferOptions {
            user: "alice".into(),
            token: Some(b"shared".to_vec()),
            ..TransferOptions::default()
        };
        assert_eq!(o.credential_for("a:7700").0, "alice");
        o.per_server.insert(
            "b:7700".into(),
            ServerCredential {
                user: "bob".into(),
                token: Some(b"bob's".to_vec()),
                key: None,
            },
        );
        let (user, token, key) = o.credential_for("b:7700");
        assert_eq!(
            (user, token, key.is_none()),
            ("bob", Some(&b"bob's"[..]), true)
        );
        let (user, token, _) = o.credential_for("a:7700");
        assert_eq!((user, token), ("alice", Some(&b"shared"[..])));
    }

    #[test]
    fn manifest_parts_start_small_and_double() {
        assert_eq!(manifest_parts(0), None);
        assert_eq!(manifest_parts(4 * FIRST_PART - 1), None);
        assert_eq!(
            manifest_parts(4 * FIRST_PART),
            Some(vec![FIRST_PART, 3 * FIRST_PART, 4 * FIRST_PART])
        );
        // 20 101 entries (the tiny dataset): 512, 1024, 2048, 4096, 8192, the rest.
        assert_eq!(
            manifest_parts(20_101),
            Some(vec![512, 1536, 3584, 7680, 15872, 20_101])
        );
        // Parts stop growing at PART_MAX; every end is inside, the last is n.
        let ends = manifest_parts(1_000_000).unwrap();
        assert_eq!(*ends.last().unwrap(), 1_000_000);
        let sizes: Vec<usize> = ends
            .iter()
            .scan(0, |prev, &e| {
                let s = e - *prev;
                *prev = e;
                Some(s)
            })
            .collect();
        assert!(sizes.iter().all(|&s| s > 0 && s <= PART_MAX));
        assert_eq!(
            sizes[..8],
            [512, 1024, 2048, 4096, 8192, 16_384, 32_768, PART_MAX]
        );
        assert_eq!(sizes.iter().filter(|&&s| s == PART_MAX).count(), 14);
    }

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

    /// The sink's machine enforces the server's manifest limits, in entries and in
    /// memory, as the manifest arrives.
    #[test]
    fn manifests_are_limited_in_entries_and_memory() {
        use dmover_proto::control::{ManifestEnd, ManifestPart, SessionInfo};
        use dmover_proto::session::{Limits, SessionError, SinkEvent, SinkSession};
        let mut names = files(&[1; 10]);
        for (i, e) in names.iter_mut().enumerate() {
            e.name = vec![b'a' + i as u8; 200];
        }
        for (max_entries, max_manifest_bytes, ok) in
            [(10, 1 << 20, true), (9, 1 << 20, false), (10, 1000, false)]
        {
            let now = std::time::Instant::now();
            let limits = Limits {
                max_entries,
                max_manifest_bytes,
                ..Limits::default()
            };
            let timing = crate::drive::timing(HEARTBEAT, Duration::from_secs(30));
            let mut m: SinkSession<crate::drive::Fault> =
                SinkSession::accept(now, "rx", timing, limits, now + HANDSHAKE_TIMEOUT);
            m.grant(
                now,
                SessionInfo {
                    id: 1,
                    salt: [0; 32],
                    streams: 1,
                    chunk_size: DEFAULT_CHUNK,
                    features: 0,
                },
            );
            m.handle_control(
                now,
                Control::Options(TransferOptions::default().session_options(false)),
            );
            for part in names.chunks(3) {
                let entries = part.to_vec();
                m.handle_control(now, Control::Manifest(ManifestPart { entries }));
            }
            let totals = dmover_proto::manifest::Totals::of(&names);
            m.handle_control(now, Control::ManifestEnd(ManifestEnd { totals }));
            let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
            let got = events
                .iter()
                .any(|e| matches!(e, SinkEvent::Manifest(m) if m.len() == 10));
            let refused = events
                .iter()
                .any(|e| matches!(e, SinkEvent::Failed(SessionError::Limit(_))));
            assert_eq!(
                (got, refused),
                (ok, !ok),
                "{max_entries} entries, {max_manifest_bytes} bytes: {events:?}"
            );
        }
    }

    #[test]
    fn a_parts_chunk_follows_its_files_within_the_sessions() {
        let small = files(&[8192; 3000]);
        assert_eq!(part_chunk(&small, 16 << 20), SMALL_CHUNK);
        assert_eq!(
            part_chunk(&small, 512 << 10),
            512 << 10,
            "never above the session's"
        );
        assert_eq!(part_chunk(&files(&[2 << 20; 10]), 16 << 20), DEFAULT_CHUNK);
        assert_eq!(part_chunk(&files(&[256 << 20; 2]), 16 << 20), 16 << 20);
        assert_eq!(
            part_chunk(&files(&[256 << 20; 2]), SMALL_CHUNK),
            SMALL_CHUNK
        );
        assert_eq!(part_chunk(&files(&[0, 0]), 16 << 20), 16 << 20, "no data");
        // A part is not a whole dataset: no smaller chunks for a few small files.
        assert_eq!(part_chunk(&files(&[100; 10]), 16 << 20), SMALL_CHUNK);
    }

    #[test]
    fn chunk_size_follows_the_mean_file_size() {
        assert_eq!(auto_chunk(&files(&[256 << 20; 4])), 16 << 20);
        assert_eq!(auto_chunk(&files(&[1 << 20; 100])), DEFAULT_CHUNK);
        assert_eq!(auto_chunk(&files(&[8192; 100])), DEFAULT_CHUNK);
        assert_eq!(auto_chunk(&[]), DEFAULT_CHUNK);
        // Empty files do not drag the mean down.
        assert_eq!(auto_chunk(&files(&[0, 0, 0, 64 << 20])), 16 << 20);
        // Small files: smaller chunks, on any link; not for files of 1 MiB or more.
        // (20 000 × 8 KiB: more than FEW_CHUNKS small chunks.)
        let many = files(&[8192; 20_000]);
        assert_eq!(auto_chunk_on(&many, true), SMALL_CHUNK);
        assert_eq!(auto_chunk_on(&files(&[1 << 20; 100]), true), DEFAULT_CHUNK);
        assert_eq!(auto_chunk_on(&files(&[256 << 20; 4]), true), 16 << 20);
        assert_eq!(auto_chunk_on(&[], true), DEFAULT_CHUNK);
        // A small dataset of small files: 64 chunks or more, of 256 KiB at least; but
        // not the first part of a live walk, whose whole is not known.
        let few = files(&[8192; 2000]);
        assert_eq!(auto_chunk_on(&few, true), MIN_SMALL_CHUNK);
        assert_eq!(auto_chunk_on(&few, false), SMALL_CHUNK);
        assert_eq!(auto_chunk_on(&files(&[8192; 5000]), true), 512 << 10);
        assert_eq!(auto_chunk_on(&files(&[100; 10]), true), MIN_SMALL_CHUNK);
        assert_eq!(
            auto_chunk_on(&files(&[512 << 10; 127]), true),
            SMALL_CHUNK / 2
        );
        assert_eq!(auto_chunk_on(&files(&[512 << 10; 128]), true), SMALL_CHUNK);
    }

    #[test]
    fn tuned_transfers_of_small_files_start_wider_on_long_links() {
        let ms = |n| Some(std::time::Duration::from_millis(n));
        assert_eq!(tuned_start(&files(&[8192; 100]), ms(200)), TUNED_START_WIDE);
        assert_eq!(
            tuned_start(&files(&[1 << 20; 100]), ms(150)),
            TUNED_START_WIDE
        );
        assert_eq!(tuned_start(&files(&[1 << 20; 100]), ms(100)), TUNED_START);
        assert_eq!(tuned_start(&files(&[8192; 100]), None), TUNED_START);
        assert_eq!(tuned_start(&files(&[512 << 20; 2]), ms(200)), TUNED_START);
        assert_eq!(tuned_start(&[], ms(200)), TUNED_START);
        const { assert!(TUNED_START_WIDE <= TUNED_MAX) };
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
