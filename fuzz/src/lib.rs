//! Checks shared by the fuzz targets in `fuzz_targets/`.
//!
//! Every function here panics when the protocol crate breaks one of its promises;
//! libFuzzer reports the panic as a crash and saves the input under `artifacts/`.

pub mod pair;

use dmover_proto::Error;
use dmover_proto::control::{
    Auth, AuthMethod, AuthOk, Control, Credential, DataProtection, DirectIo, EntryRange, ErrorCode,
    ErrorMsg, FailedFile, Growth, Have, Hello, LEN_PREFIX, MAX_FRAME, ManifestEnd, ManifestPart,
    Op, Open, PartialFile, Plan, SendReport, SessionInfo, SessionOptions, Summary, Want, Welcome,
};
use dmover_proto::layout::{ALIGN, Layout, Piece, align_up};
use dmover_proto::manifest::{Entry, EntryKind, Mtime, Totals};
use libfuzzer_sys::arbitrary::{Result, Unstructured};

/// The most chunks a target walks in order in one layout, so a manifest announcing
/// exabytes keeps the target fast (a walk of 10,000 chunks ran at under 400 inputs a
/// second). Past it, only the last chunks and those where files begin and end are
/// checked.
pub const MAX_WALK: u64 = 1_000;

/// Re-encodes a decoded message and checks it decodes to the same value.
pub fn check_reencode(m: &Control) {
    match m.to_frame() {
        Ok(frame) => {
            assert_eq!(
                Control::decode(&frame, MAX_FRAME),
                Ok(Some((m.clone(), frame.len()))),
                "re-encoded {} does not decode to itself",
                m.name()
            );
        }
        // Only possible for a message decoded under a limit above MAX_FRAME.
        Err(Error::TooLarge { .. }) => {}
        Err(e) => panic!("cannot re-encode a decoded {}: {e}", m.name()),
    }
}

/// Feeds `buf` to [`Control::decode`] as a stream: frame after frame until it asks
/// for more bytes or fails. Checks what it takes and what it leaves.
pub fn check_control_stream(buf: &[u8], max: usize) {
    let mut rest = buf;
    loop {
        match Control::decode(rest, max) {
            Ok(Some((m, n))) => {
                assert!(
                    n >= LEN_PREFIX && n <= rest.len(),
                    "took {n} of {}",
                    rest.len()
                );
                assert!(n - LEN_PREFIX <= max, "body of {n} over the limit {max}");
                check_reencode(&m);
                rest = &rest[n..];
            }
            Ok(None) => {
                // Only an incomplete frame may ask for more. (The prefix's top bit
                // says the body is packed: the length is the rest.)
                if let Some(prefix) = rest.first_chunk::<LEN_PREFIX>() {
                    let head = Control::frame_head(*prefix, max).expect("a prefix it took");
                    assert!(head.len <= max && rest.len() < LEN_PREFIX + head.len);
                }
                return;
            }
            Err(_) => return,
        }
    }
}

/// Reusable buffers for [`check_chunk`], so walking thousands of chunks does not
/// allocate per chunk.
#[derive(Default)]
pub struct Scratch {
    pieces: Vec<Piece>,
    merged: Vec<(usize, usize)>,
    segs: Vec<(usize, usize)>,
}

/// Checks the layout rules on `l`: slot placement; for the first [`MAX_WALK`] chunks,
/// that pieces cover every byte of every file once, in order, at the right offsets,
/// with alignment where promised; and the same per-chunk checks for the last chunks
/// and for the chunks where each file begins and ends, however far out they are.
pub fn check_layout(l: &Layout) {
    let files = l.files();
    let chunk = l.chunk_size();
    let mut cursor = 0u64;
    for s in files {
        assert!(s.size > 0, "empty files have no slot");
        let start = if s.size >= chunk {
            cursor.div_ceil(chunk) * chunk
        } else if s.aligned() {
            align_up(cursor)
        } else {
            cursor
        };
        assert_eq!(s.start, start, "slot of entry {}", s.entry);
        cursor = if s.aligned() {
            align_up(s.end())
        } else {
            s.end()
        };
    }
    assert!(files.windows(2).all(|w| w[0].entry < w[1].entry));
    assert_eq!(l.total(), files.last().map_or(0, |s| s.end()));

    let n = l.n_chunks();
    assert_eq!(n, l.total().div_ceil(chunk));
    let walk = n.min(MAX_WALK);
    let mut covered = vec![0u64; files.len()];
    let mut next_index = vec![0u64; files.len()];
    let mut scratch = Scratch::default();
    for k in 0..walk {
        check_chunk(l, k, Some((&mut covered, &mut next_index)), &mut scratch);
    }
    if walk == n {
        for (f, s) in files.iter().enumerate() {
            assert_eq!(covered[f], s.size, "file {f} not covered exactly");
            assert_eq!(next_index[f], l.n_pieces(f as u32));
        }
    } else {
        for k in n.saturating_sub(3).max(walk)..n {
            check_chunk(l, k, None, &mut scratch);
        }
        for s in files.iter().take(MAX_WALK as usize / 2) {
            for k in [s.start / chunk, (s.end() - 1) / chunk] {
                if k >= walk {
                    check_chunk(l, k, None, &mut scratch);
                }
            }
        }
    }
    for k in [n, n.saturating_add(1), u64::MAX] {
        assert_eq!(l.pieces(k).count(), 0);
        assert_eq!(l.wire_len(k), 0);
        let (lo, hi) = l.chunk_bounds(k);
        assert_eq!(lo, hi);
    }
}

/// Checks the pieces of chunk `k`. With `progress`, also that each piece continues
/// its file exactly where the previous chunk left it.
pub fn check_chunk(
    l: &Layout,
    k: u64,
    mut progress: Option<(&mut Vec<u64>, &mut Vec<u64>)>,
    scratch: &mut Scratch,
) {
    let chunk = l.chunk_size();
    let (lo, hi) = l.chunk_bounds(k);
    assert_eq!(lo, k * chunk);
    assert!(lo < hi && hi - lo <= chunk);
    let pieces = &mut scratch.pieces;
    pieces.clear();
    pieces.extend(l.pieces(k));
    assert!(!pieces.is_empty(), "chunk {k} is all padding");
    let merged = &mut scratch.merged;
    merged.clear();
    let mut prev_end = 0usize;
    let mut wire = 0u64;
    for (j, p) in pieces.iter().enumerate() {
        let slot = l.files()[p.file as usize];
        assert!(p.len > 0);
        assert!(p.buf_offset >= prev_end, "pieces overlap or go backwards");
        prev_end = p.buf_offset + p.len;
        assert!(lo + prev_end as u64 <= hi);
        assert_eq!(slot.start + p.file_offset, lo + p.buf_offset as u64);
        assert!(p.file_offset + p.len as u64 <= slot.size);
        assert_eq!(p.last, p.file_offset + p.len as u64 == slot.size);
        assert_eq!(
            p.index,
            (slot.start + p.file_offset) / chunk - slot.start / chunk
        );
        assert_eq!(p.aligned, slot.aligned());
        if p.aligned {
            assert_eq!(p.file_offset % ALIGN, 0);
            assert_eq!(p.buf_offset as u64 % ALIGN, 0);
            assert!((p.buf_offset + p.direct_len()) as u64 <= chunk);
            if let Some(q) = pieces.get(j + 1) {
                assert!(p.buf_offset + p.direct_len() <= q.buf_offset);
            }
        }
        if let Some((covered, next_index)) = progress.as_mut() {
            let f = p.file as usize;
            assert_eq!(p.file_offset, covered[f], "file {f} skips or repeats bytes");
            assert_eq!(p.index, next_index[f]);
            covered[f] += p.len as u64;
            next_index[f] += 1;
        }
        match merged.last_mut() {
            Some((o, n)) if *o + *n == p.buf_offset => *n += p.len,
            _ => merged.push((p.buf_offset, p.len)),
        }
        wire += p.len as u64;
    }
    assert_eq!(wire, l.wire_len(k));
    l.segments(k, &mut scratch.segs);
    assert_eq!(scratch.segs, *merged);
}

// ---------------------------------------------------------------------------------
// Structured inputs, built by hand from `Unstructured` (no derives needed in the
// protocol crate)

/// Up to `max` arbitrary bytes.
pub fn bytes(u: &mut Unstructured<'_>, max: usize) -> Result<Vec<u8>> {
    let n = u.int_in_range(0..=max)?;
    Ok(u.bytes(n)?.to_vec())
}

fn entry(u: &mut Unstructured<'_>) -> Result<Entry> {
    let kind = match u.int_in_range(0..=2u8)? {
        0 => EntryKind::File {
            size: u.arbitrary()?,
        },
        1 => EntryKind::Dir,
        _ => EntryKind::Symlink {
            target: bytes(u, 64)?,
        },
    };
    Ok(Entry {
        parent: u.arbitrary()?,
        name: bytes(u, 64)?,
        kind,
        mode: u.arbitrary()?,
        mtime: Mtime {
            sec: u.arbitrary()?,
            nsec: u.arbitrary()?,
        },
    })
}

/// Any control message, valid or not as far as the protocol goes.
pub fn arbitrary_control(u: &mut Unstructured<'_>) -> Result<Control> {
    Ok(match u.int_in_range(0..=24u8)? {
        0 => Control::Hello(Hello {
            software: u.arbitrary()?,
            nonce: u.arbitrary()?,
        }),
        1 => Control::Welcome(Welcome {
            software: u.arbitrary()?,
            nonce: u.arbitrary()?,
            auth: if u.arbitrary()? {
                AuthMethod::Required
            } else {
                AuthMethod::None
            },
        }),
        2 => Control::Auth(Auth {
            user: u.arbitrary()?,
            credential: match u.int_in_range(0..=2u8)? {
                0 => Credential::None,
                1 => Credential::Token {
                    proof: u.arbitrary()?,
                },
                _ => Credential::Key {
                    public: u.arbitrary()?,
                    signature: bytes(u, 80)?,
                },
            },
        }),
        3 => Control::AuthOk(AuthOk {
            proof: u.arbitrary()?,
        }),
        4 => Control::Open(Open {
            op: if u.arbitrary()? {
                Op::Push {
                    dest: bytes(u, 256)?,
                }
            } else {
                let n = u.int_in_range(0..=16)?;
                let sources = (0..n).map(|_| bytes(u, 64)).collect::<Result<_>>()?;
                Op::Pull { sources }
            },
            streams: u.arbitrary()?,
            chunk_size: u.arbitrary()?,
            checksum: u.arbitrary()?,
            direct_io: *u.choose(&[DirectIo::Never, DirectIo::Auto, DirectIo::Always])?,
            protection: *u.choose(&[
                DataProtection::Plain,
                DataProtection::Authenticated,
                DataProtection::Encrypted,
            ])?,
            features: u.arbitrary()?,
        }),
        5 => Control::Session(SessionInfo {
            id: u.arbitrary()?,
            salt: u.arbitrary()?,
            streams: u.arbitrary()?,
            chunk_size: u.arbitrary()?,
            features: u.arbitrary()?,
        }),
        6 => {
            let n = u.int_in_range(0..=64)?;
            let entries = (0..n).map(|_| entry(u)).collect::<Result<_>>()?;
            Control::Manifest(ManifestPart { entries })
        }
        7 => Control::ManifestEnd(ManifestEnd {
            totals: Totals {
                entries: u.arbitrary()?,
                files: u.arbitrary()?,
                dirs: u.arbitrary()?,
                symlinks: u.arbitrary()?,
                bytes: u.arbitrary()?,
            },
        }),
        8 => Control::Go,
        9 => Control::Done(Summary {
            bytes: u.arbitrary()?,
            files: u.arbitrary()?,
            dirs: u.arbitrary()?,
            symlinks: u.arbitrary()?,
            chunks: u.arbitrary()?,
            verified: u.arbitrary()?,
        }),
        11 => Control::Options(SessionOptions {
            resume: u.arbitrary()?,
            journal: u.arbitrary()?,
            fsync: u.arbitrary()?,
            verify: u.arbitrary()?,
            continue_on_error: u.arbitrary()?,
            heartbeat_ms: u.arbitrary()?,
        }),
        12 => {
            let n = u.int_in_range(0..=64)?;
            let done = (0..n)
                .map(|_| {
                    Ok(EntryRange {
                        first: u.arbitrary()?,
                        count: u.arbitrary()?,
                    })
                })
                .collect::<Result<_>>()?;
            let n = u.int_in_range(0..=8)?;
            let partial = (0..n)
                .map(|_| {
                    Ok(PartialFile {
                        entry: u.arbitrary()?,
                        pieces: u.arbitrary()?,
                    })
                })
                .collect::<Result<_>>()?;
            Control::Have(Have {
                done,
                partial,
                last: u.arbitrary()?,
            })
        }
        13 => Control::Plan(Plan {
            stale: u.arbitrary()?,
        }),
        14 => Control::Ping,
        15 => Control::SendReport(SendReport {
            chunks_resent: u.arbitrary()?,
            streams_lost: u.arbitrary()?,
            failed: vec![FailedFile {
                entry: u.arbitrary()?,
                message: u.arbitrary()?,
            }],
        }),
        16 => Control::Grow(Growth {
            totals: Totals {
                entries: u.arbitrary()?,
                files: u.arbitrary()?,
                dirs: u.arbitrary()?,
                symlinks: u.arbitrary()?,
                bytes: u.arbitrary()?,
            },
            chunks: u.int_in_range(0..=80)?,
            last: u.arbitrary()?,
        }),
        17 => {
            let n = u.int_in_range(0..=8)?;
            let chunks = (0..n)
                .map(|_| {
                    let start = u.int_in_range(0..=80)?;
                    Ok(start..start + u.int_in_range(0..=8)?)
                })
                .collect::<Result<_>>()?;
            Control::Want(Want { chunks })
        }
        18 => Control::OnDemand,
        19 => Control::Grown(u.int_in_range(0..=80)?),
        20 => Control::Tuned(dmover_proto::control::Tuned {
            at_ms: u.arbitrary()?,
            streams: u.int_in_range(0..=16)?,
            rate: u.arbitrary()?,
            reason: u.arbitrary()?,
        }),
        21 => Control::Meta(dmover_proto::control::MetaPart {
            entries: (0..u.int_in_range(0..=4u8)?)
                .map(|_| {
                    Ok(dmover_proto::manifest::EntryMeta {
                        entry: u.int_in_range(0..=12)?,
                        uid: u.arbitrary()?,
                        gid: u.arbitrary()?,
                        xattrs: (0..u.int_in_range(0..=3u8)?)
                            .map(|_| {
                                Ok(dmover_proto::manifest::Xattr {
                                    name: u.arbitrary()?,
                                    value: u.arbitrary()?,
                                })
                            })
                            .collect::<Result<_>>()?,
                    })
                })
                .collect::<Result<_>>()?,
            last: u.arbitrary()?,
        }),
        22 => Control::Stored(u.int_in_range(0..=80)?),
        23 => Control::Times(dmover_proto::control::TimesPart {
            entries: (0..u.int_in_range(0..=4u8)?)
                .map(|_| {
                    Ok((
                        u.int_in_range(0..=12)?,
                        dmover_proto::manifest::Mtime {
                            sec: u.arbitrary()?,
                            nsec: u.int_in_range(0..=999_999_999)?,
                        },
                    ))
                })
                .collect::<Result<_>>()?,
        }),
        _ => Control::Error(ErrorMsg {
            code: *u.choose(&[
                ErrorCode::Protocol,
                ErrorCode::Auth,
                ErrorCode::NotFound,
                ErrorCode::PermissionDenied,
                ErrorCode::PathEscape,
                ErrorCode::ReadOnly,
                ErrorCode::Io,
                ErrorCode::Checksum,
                ErrorCode::Busy,
                ErrorCode::Aborted,
                ErrorCode::Unsupported,
                ErrorCode::Changed,
            ])?,
            message: u.arbitrary()?,
        }),
    })
}
