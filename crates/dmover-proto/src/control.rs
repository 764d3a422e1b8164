//! Control messages and their framing.
//!
//! A control frame is a `u32` big-endian body length followed by the body: one
//! [`Control`] message encoded with postcard (varint integers, enum tags in declaration
//! order; the golden tests pin the bytes, so variants are only ever appended). Since
//! protocol 7 the length's top bit ([`PACKED`]) marks a body packed with zstd, which
//! senders use for large messages (manifests) once the peer is authenticated.
//!
//! # Message flow
//! The numbers give the order each side reads messages in. Since protocol version 3 a
//! client does not wait for the server's answers before sending its next message up
//! to (7) (push) or (6a) (pull): `Hello`, `Auth`, `Open`, `Options` (and a push's
//! manifest) go out in one flight right after the TLS handshake, and the server's
//! `Welcome`, `AuthOk`, `Session` come back in one. The server still reads them in
//! order and answers each, and it reads nothing after `Auth` until the credential is
//! verified (a refused client's later messages are never read).
//! ```text
//! client                                   server
//! Hello                              ->                  (1)
//!                                    <-    Welcome       (2)
//! Auth                               ->                  (3)
//!                                    <-    AuthOk        (4) or Error, then close
//! Open                               ->                  (5)
//!                                    <-    Session       (6) or Error
//! -- push: client is the source ---------------------------------------------
//! Manifest* ManifestEnd              ->                  (7)
//!                                    <-    Go            (8) or Error
//! (client opens data streams, sends chunks, END on each stream)
//!                                    <-    Done          (9) or Error
//! -- pull: server is the source ---------------------------------------------
//!                                    <-    Manifest* ManifestEnd  (7) or Error
//! Go                                 ->                  (8) or Error
//! (client opens data streams, server sends chunks, END on each stream)
//! Done                               ->                  (9) or Error
//! ```
//!
//! # Reliability additions (appended variants, same protocol version)
//! ```text
//! client                                   server
//!                                    <-    Session       (6)
//! Options                            ->                  (6a) always, right after Session
//! -- push, with Options.resume -----------------------------------------------
//! Manifest* ManifestEnd              ->                  (7)
//!                                    <-    Have*         (7a) parts; the last has `last`
//! Plan                               ->                  (7b)
//!                                    <-    Go            (8)
//! -- pull, with Options.resume -----------------------------------------------
//!                                    <-    Manifest* ManifestEnd  (7)
//! Have*                              ->                  (7a)
//!                                    <-    Plan          (7b)
//! Go                                 ->                  (8)
//! -- while data flows, both ways, every heartbeat interval --------------------
//! Ping                               <->   Ping
//! -- pull: before the client's Done -------------------------------------------
//!                                    <-    SendReport    (8a)
//! ```
//! Without `resume` the destination answers the manifest with `Go` at once and starts
//! a fresh journal. `Ping` may arrive at any point after `Go`; a receiver ignores it
//! beyond noting that the peer is alive.
//!
//! # Optional features (appended variants, same protocol version)
//! Switched on by bits of `Open.features`/`Session.features`
//! ([`crate::session::features`]); without its bit a message is a protocol violation.
//! ```text
//! source                                   sink
//! -- GROWING_MANIFEST: each part ends with Grow, the first in place of ManifestEnd --
//! Manifest* Grow{chunks, last}       ->                  (7) then Go as usual
//! Manifest* Grow{chunks, last}       ->                  any time, until `last`
//!                                    <-    Grown(chunks) the sink's layout covers them
//! -- PART_CHUNKS (with GROWING_MANIFEST) ------------------------------------------
//! Manifest* PartChunk(size) Grow     ->                  a later part in chunks of
//!                                                        its own size (at most the
//!                                                        session's)
//! -- RANGES --------------------------------------------------------------------
//!                                    <-    Want{chunks}  after Go: these first
//!                                    <-    OnDemand      in place of Go: request-driven,
//!                                                        only wanted chunks, until Done
//! -- LIMITS (by side, not role) -------------------------------------------------
//! dialer: Limits                     ->                  as soon as it has Session
//!                                    <-    Limits        the acceptor's answer, once
//! ```
//!
//! Either side may send [`Control::Error`] at any point after the preamble and then
//! close; the other side aborts the session. Data connections may be opened at any
//! time (the server answers their preamble with a challenge) and joined as soon as
//! `Session` has arrived; the source starts sending on them after `Go`.

use bytes::BufMut;
use serde::{Deserialize, Serialize};

use crate::manifest::{Entry, Totals};
use crate::{Error, Result};

/// The largest control frame body this side accepts by default (4 MiB).
pub const MAX_FRAME: usize = 4 << 20;
/// Size of the length prefix.
pub const LEN_PREFIX: usize = 4;

/// The length prefix's top bit (protocol 7): the body is packed, one zstd frame that
/// unpacks to the message's body. Manifests shrink about 8 × (file names, sizes and
/// times repeat), so a streamed manifest's first part fits a new connection's first
/// round trip and a large one needs fewer round trips of slow start. A length without
/// the bit is at most [`MAX_FRAME`], so the bit was never set in an older frame.
pub const PACKED: u32 = 1 << 31;

/// The smallest body packed (smaller ones gain a few bytes at most).
pub const PACK_MIN: usize = 512;

/// zstd's level for packed frames: its fastest standard one (a 20 000-entry manifest,
/// 750 KB, packs to 79 KB in about 1.3 ms here).
const PACK_LEVEL: i32 = 1;

/// A control-channel message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// (1) Client greeting.
    Hello(Hello),
    /// (2) Server greeting.
    Welcome(Welcome),
    /// (3) Client's proof of a credential.
    Auth(Auth),
    /// (4) Server accepts the client, proving it knows the credential too.
    AuthOk(AuthOk),
    /// (5) What the client wants to do.
    Open(Open),
    /// (6) The session the server opened for it.
    Session(SessionInfo),
    /// (7) Part of the source's manifest.
    Manifest(ManifestPart),
    /// (7) The manifest is complete.
    ManifestEnd(ManifestEnd),
    /// (8) The destination is prepared: start sending data.
    Go,
    /// (9) The destination has every file, verified and under its final name.
    Done(Summary),
    /// Something went wrong; the sender closes the session after this.
    Error(ErrorMsg),
    /// (6a) The client's session options, sent right after `Session`.
    Options(SessionOptions),
    /// (7a) Resume: part of what the destination already has.
    Have(Have),
    /// (7b) Resume: the source's answer to `Have`.
    Plan(Plan),
    /// Heartbeat, sent by both sides every [`SessionOptions::heartbeat_ms`] while data
    /// flows and while one side waits for the other's summary.
    Ping,
    /// (8a) The source's account of its sending, sent by a server that is the source
    /// (pull) once all chunks are acknowledged, before the client's `Done`.
    SendReport(SendReport),
    /// (7, feature `GROWING_MANIFEST`) Ends a part of a growing manifest, in place of
    /// `ManifestEnd`: the entries of the `Manifest` parts since the previous `Grow`
    /// are added, and the layout grows at its end (source to sink).
    Grow(Growth),
    /// (feature `RANGES`) The sink asks for chunks ahead of the ordinary order, or in
    /// a session it made request-driven with `OnDemand`, for the only chunks it gets
    /// (sink to source).
    Want(Want),
    /// (8, feature `RANGES`) In place of `Go`: the sink is prepared and the session is
    /// request-driven; the source sends only the chunks named by `Want`, until the
    /// sink's `Done` (sink to source).
    OnDemand,
    /// (8, feature `GROWING_MANIFEST`) The answer to a later `Grow`, as `Go` is to the
    /// first part: the sink's layout covers the chunks up to this count, so the
    /// source may send them (sink to source).
    Grown(u64),
    /// (20) Server → client, answering [`Op::Grant`]: a capability for the dialer it
    /// names (third-party transfers, [`crate::capability`]).
    Capability(crate::capability::Capability),
    /// (21) Third-party dialer → steering client ([`Op::ThirdParty`]): the copy's
    /// counters so far, about every second.
    TpcProgress(TpcProgress),
    /// (22) Third-party dialer → steering client: the copy ended, as reported.
    TpcDone(TpcReport),
    /// (23) Server → client, answering [`Op::Prune`]: what was (or, in a dry run, would
    /// be) deleted, and which files the server holds unchanged.
    Pruned(PruneReport),
    /// (24, feature `TUNING`) A decision of the source's tuner: the data streams it
    /// now uses and why (source to sink, for the sink's user to see).
    Tuned(Tuned),
    /// (25, feature `LINKS`) Regular files of the manifest that
    /// may have holes, sent before `ManifestEnd` (source to sink): the sink does not
    /// preallocate them and leaves their zero blocks unwritten.
    Sparse(SparseFiles),
    /// (26, feature `METADATA`) Owners and extended attributes of manifest entries
    /// (source to sink), after `ManifestEnd`; the part marked `last` ends them, and
    /// the sink prepares only then.
    Meta(MetaPart),
    /// (27, feature `CONTINUOUS`) Every chunk below this count is written and the files
    /// it ends are complete under their final names (sink to source, in a growing
    /// manifest's session, as the written chunks reach the end of a part): what tells
    /// a producer that a part is durable at the sink. Acknowledgements on the data
    /// streams say only that a chunk arrived.
    Stored(u64),
    /// (28, feature `CONTINUOUS`) Newer modification times of directories already in
    /// a growing manifest (source to sink, before the last `Grow`): their contents
    /// changed since their entries went out; the sink sets these at the end instead.
    Times(TimesPart),
    /// (29, feature `LIMITS`) What a side applies to the session's data streams: the
    /// dialer's in its first flight, the acceptor's in answer to it (see
    /// [`SessionLimits`]).
    Limits(SessionLimits),
    /// (30, feature `PARTS`) In a request-driven session: byte ranges of chunks the
    /// sink wants, each answered by a part frame ([`crate::data::FLAG_PART`]) of just
    /// those bytes (sink to source). A random read of a few KiB then waits for those
    /// KiB, not for a whole chunk to cross the link.
    WantPart(WantParts),
    /// (31, feature `PART_CHUNKS`) The chunk size of the next later part of a growing
    /// manifest, in bytes: a valid chunk size no larger than the session's (source to
    /// sink, before the part's `Grow`). A part without one is cut into the session's
    /// chunks. The part's files start a region of the layout cut into chunks of this
    /// size ([`crate::layout::Layout::extend_with`]).
    PartChunk(u32),
    /// (32) The answer to [`Op::Sums`] (server to client, no session): the file's
    /// catalog checksums (see [`SumsReport`]).
    Sums(SumsReport),
}

impl Control {
    /// A short name of the message kind, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello(_) => "Hello",
            Control::Welcome(_) => "Welcome",
            Control::Auth(_) => "Auth",
            Control::AuthOk(_) => "AuthOk",
            Control::Open(_) => "Open",
            Control::Session(_) => "Session",
            Control::Manifest(_) => "Manifest",
            Control::ManifestEnd(_) => "ManifestEnd",
            Control::Go => "Go",
            Control::Done(_) => "Done",
            Control::Error(_) => "Error",
            Control::Options(_) => "Options",
            Control::Have(_) => "Have",
            Control::Plan(_) => "Plan",
            Control::Ping => "Ping",
            Control::SendReport(_) => "SendReport",
            Control::Grow(_) => "Grow",
            Control::Want(_) => "Want",
            Control::OnDemand => "OnDemand",
            Control::Grown(_) => "Grown",
            Control::Capability(_) => "Capability",
            Control::TpcProgress(_) => "TpcProgress",
            Control::TpcDone(_) => "TpcDone",
            Control::Pruned(_) => "Pruned",
            Control::Tuned(_) => "Tuned",
            Control::Sparse(_) => "Sparse",
            Control::Meta(_) => "Meta",
            Control::Stored(_) => "Stored",
            Control::Times(_) => "Times",
            Control::Limits(_) => "Limits",
            Control::WantPart(_) => "WantPart",
            Control::PartChunk(_) => "PartChunk",
            Control::Sums(_) => "Sums",
        }
    }

    /// Encodes the message as one frame (length prefix and body) onto `out`, never
    /// packed.
    pub fn encode(&self, out: &mut impl BufMut) -> Result<()> {
        let body = self.body()?;
        out.put_u32(body.len() as u32);
        out.put_slice(&body);
        Ok(())
    }

    /// Encodes the message as one frame onto `out`, packed ([`PACKED`]) when its body
    /// has at least [`PACK_MIN`] bytes and zstd makes it smaller. `Hello` and `Auth` are
    /// never packed: a server reads them before it knows who speaks, and takes packed
    /// frames only from a client it authenticated.
    pub fn encode_packed(&self, out: &mut impl BufMut) -> Result<()> {
        let body = self.body()?;
        if body.len() >= PACK_MIN && !matches!(self, Control::Hello(_) | Control::Auth(_)) {
            let z = zstd::bulk::compress(&body, PACK_LEVEL)
                .map_err(|e| Error::Malformed(format!("packing a control frame: {e}")))?;
            if z.len() < body.len() {
                out.put_u32(PACKED | z.len() as u32);
                out.put_slice(&z);
                return Ok(());
            }
        }
        out.put_u32(body.len() as u32);
        out.put_slice(&body);
        Ok(())
    }

    /// The message's postcard body, at most [`MAX_FRAME`] bytes.
    fn body(&self) -> Result<Vec<u8>> {
        let body = postcard::to_stdvec(self).map_err(|e| Error::Malformed(e.to_string()))?;
        if body.len() > MAX_FRAME {
            return Err(Error::TooLarge {
                what: "control frame",
                value: body.len() as u64,
                limit: MAX_FRAME as u64,
            });
        }
        Ok(body)
    }

    /// Encodes the message as one frame into a new vector.
    pub fn to_frame(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.encode(&mut v)?;
        Ok(v)
    }

    /// Reads a frame's prefix: its body length, rejecting bodies above `max`, and
    /// whether the body is packed.
    pub fn frame_head(prefix: [u8; LEN_PREFIX], max: usize) -> Result<FrameHead> {
        let word = u32::from_be_bytes(prefix);
        let n = (word & !PACKED) as usize;
        if n > max {
            return Err(Error::TooLarge {
                what: "control frame",
                value: n as u64,
                limit: max as u64,
            });
        }
        Ok(FrameHead {
            len: n,
            packed: word & PACKED != 0,
        })
    }

    /// Decodes a frame body. Trailing bytes after the message are an error.
    pub fn decode_body(body: &[u8]) -> Result<Self> {
        let (msg, rest) =
            postcard::take_from_bytes(body).map_err(|e| Error::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(Error::Malformed(format!(
                "{} trailing bytes after the message",
                rest.len()
            )));
        }
        Ok(msg)
    }

    /// Decodes a packed frame's body: one zstd frame that states its content size, at
    /// most `max` bytes (checked before anything is allocated for it), holding one
    /// message's body.
    pub fn decode_packed(body: &[u8], max: usize) -> Result<Self> {
        let n = match zstd::zstd_safe::get_frame_content_size(body) {
            Ok(Some(n)) => n,
            _ => {
                return Err(Error::Malformed(
                    "a packed control frame without its size".into(),
                ));
            }
        };
        if n > max as u64 {
            return Err(Error::TooLarge {
                what: "unpacked control frame",
                value: n,
                limit: max as u64,
            });
        }
        let mut out = vec![0; n as usize];
        match zstd::bulk::decompress_to_buffer(body, &mut out[..]) {
            Ok(got) if got as u64 == n => Self::decode_body(&out),
            Ok(got) => Err(Error::Malformed(format!(
                "a packed control frame of {got} bytes that said {n}"
            ))),
            Err(e) => Err(Error::Malformed(format!(
                "a packed control frame that does not unpack: {e}"
            ))),
        }
    }

    /// Decodes one whole frame, packed or not, from the front of `buf` if it holds one,
    /// returning the message and the number of bytes it took. `Ok(None)`: more bytes
    /// are needed. `max` bounds the body as sent and, packed, as unpacked.
    pub fn decode(buf: &[u8], max: usize) -> Result<Option<(Self, usize)>> {
        let Some(prefix) = buf.first_chunk::<LEN_PREFIX>() else {
            return Ok(None);
        };
        let head = Self::frame_head(*prefix, max)?;
        let Some(body) = buf.get(LEN_PREFIX..LEN_PREFIX + head.len) else {
            return Ok(None);
        };
        let msg = if head.packed {
            Self::decode_packed(body, max)?
        } else {
            Self::decode_body(body)?
        };
        Ok(Some((msg, LEN_PREFIX + head.len)))
    }
}

/// A control frame's prefix, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// The body's length as sent.
    pub len: usize,
    /// The body is packed ([`PACKED`]).
    pub packed: bool,
}

/// (1) The client's greeting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Software name and version, for logs (e.g. `dmover 0.1.0`).
    pub software: String,
    /// A fresh random nonce. Not part of the authentication transcript since protocol
    /// version 3 (the client sends `Auth` without waiting for it; the TLS channel
    /// binding makes each transcript unique); kept so the message's layout stays.
    pub nonce: [u8; 32],
}

/// How a server wants clients to authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthMethod {
    /// No credential needed (the server listens on loopback only).
    None,
    /// A user name and a credential ([`Credential::Token`] or [`Credential::Key`]).
    Required,
}

/// (2) The server's greeting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// Software name and version.
    pub software: String,
    /// A fresh random nonce. Not part of the authentication transcript since protocol
    /// version 3 (the client sends `Auth` without waiting for it; the TLS channel
    /// binding makes each transcript unique); kept so the message's layout stays.
    pub nonce: [u8; 32],
    /// What the client must prove.
    pub auth: AuthMethod,
}

/// (3) Who the client is and its proof (see [`crate::auth`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// The user name (empty: none given; a server with one shared token accepts any).
    pub user: String,
    /// The proof.
    pub credential: Credential,
}

/// A proof of identity, bound to the TLS connection by [`crate::auth::transcript`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Credential {
    /// No credential (accepted only by a server without authentication).
    None,
    /// A token proof ([`crate::auth::client_token_proof`]).
    Token {
        /// The proof.
        proof: [u8; 32],
    },
    /// An Ed25519 signature of [`crate::auth::key_auth_message`].
    Key {
        /// The client's Ed25519 public key.
        public: [u8; 32],
        /// The signature (64 bytes).
        signature: Vec<u8>,
    },
    /// A third-party capability issued by this server ([`crate::capability`]): valid
    /// only from the TLS peer whose key it names, once, for its scope.
    Capability(crate::capability::Capability),
}

/// (4) Authentication succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthOk {
    /// The server's token proof ([`crate::auth::server_token_proof`], mutual
    /// authentication) when the client proved a token.
    pub proof: Option<[u8; 32]>,
}

/// What a session does, seen from the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Client → server. `dest` is a path relative to the server's root (empty: the
    /// root itself).
    Push {
        /// Destination path on the server.
        dest: Vec<u8>,
    },
    /// Server → client. Each source is a path relative to the server's root.
    Pull {
        /// Source paths on the server.
        sources: Vec<Vec<u8>>,
    },
    /// A memory-to-memory network test: no files on either end (see [`MemTest`]).
    MemTest(MemTest),
    /// Asks for a capability that lets another server run one session here (a
    /// third-party transfer); answered with [`Control::Capability`], no session.
    Grant(GrantRequest),
    /// Runs one session with another server, as its dialer, for the client (a
    /// third-party transfer); reported with [`Control::TpcProgress`] and
    /// [`Control::TpcDone`]. `Open`'s streams, chunk size, checksums, direct I/O and
    /// protection, and `Options`, are those of that session.
    ThirdParty(ThirdParty),
    /// `dmover sync --delete` / `--dry-run` (appended, 5): after `Options`, the client
    /// sends its source's manifest (`Manifest* ManifestEnd`, one root, the mirror's
    /// source); the server deletes what the mirror holds that the manifest does not
    /// list (see [`Prune`]) and answers [`Control::Pruned`]; no session.
    Prune(Prune),
    /// A pull whose sources the server walks through filters (appended, 6): what the
    /// rules exclude is not in the manifest. A plain pull is [`Op::Pull`].
    PullFiltered(PullFiltered),
    /// Renames one entry on the server (appended, 7; `dmover mount --rw`): after
    /// `Options`, the server renames `from` to `to` (see [`Rename`]) and answers
    /// [`Control::Done`] with an empty [`Summary`], or [`Control::Error`]; no session.
    Rename(Rename),
    /// `dmover sync --checksum` on a pull (appended, 8): after `Options`, the client
    /// sends its destination's manifest (`Manifest* ManifestEnd`, one root: the mirror
    /// as it is now); the server answers [`Control::Pruned`] whose only field set is
    /// `digests`: the content digest of each regular file the source `source` holds
    /// with the size that manifest gives it (see [`Digests`]); no session. It needs
    /// read rights only and changes nothing.
    Digests(Digests),
    /// A pull whose sources the server walks through a `--files-from` list and filter
    /// rules (appended, 9): [`Op::PullFiltered`] with the list (see [`PullListed`]).
    PullListed(PullListed),
    /// A third-party copy with a sync's options or filters (appended, 10; offered
    /// with feature bit [`crate::session::features::SYNC_BETWEEN`]): as
    /// [`Op::ThirdParty`], the dialer applying them as a client would (see
    /// [`ThirdPartySync`]).
    ThirdPartySync(ThirdPartySync),
    /// `dmover sync --size-only` / `--ignore-existing` on a push (appended, 11; offered
    /// with feature bit [`crate::session::features::KEEP`]): [`Op::Prune`] whose answer's
    /// `unchanged` lists, dry run or not, the regular files of the manifest that the
    /// mirror holds as `keep` says it keeps them (see [`PruneKeep`]); the client leaves
    /// them out of its session's manifest.
    PruneKeep(PruneKeep),
    /// `dmover sum dmover://HOST/PATH` (appended, 12; offered with feature bit
    /// [`crate::session::features::SUMS`]): after `Options`, the server answers
    /// [`Control::Sums`] with the catalog checksums of the regular file `path` (see
    /// [`Sums`]), from its cache or read (and cached) there; no session. It needs read
    /// rights only.
    Sums(Sums),
}

/// What [`Op::Sums`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sums {
    /// A regular file, relative to the server's root (not followed if a symlink).
    pub path: Vec<u8>,
    /// The types, by their catalog names (`adler32`, `md5`, `crc32c`), at most 8.
    pub types: Vec<String>,
    /// Whether the server may answer from the file's cache and store there what it
    /// computes (false: it reads the file and leaves the cache as it is).
    pub cache: bool,
}

/// The answer to [`Op::Sums`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SumsReport {
    /// The file's size in bytes.
    pub size: u64,
    /// `(type, value)` of each type asked, in their order, values as catalogs write
    /// them (lower-case hex).
    pub sums: Vec<(String, String)>,
    /// Every value came from the file's cache (the file was not read).
    pub cached: bool,
    /// The values read were stored in the file's cache.
    pub stored: bool,
}

/// What [`Op::PruneKeep`] asks for: a prune, and which of the mirror's files stay as
/// they are instead of the quick check's (size and mtime).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneKeep {
    /// The prune, as [`Op::Prune`]'s (its `checksum` must be false).
    pub prune: Prune,
    /// Which files the mirror keeps.
    pub keep: Keep,
}

/// Which files a sync leaves as the mirror holds them ([`PruneKeep`]), besides those
/// with the manifest's size and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Keep {
    /// `--size-only`: a regular file with the manifest's size, whatever its mtime.
    SameSize,
    /// `--ignore-existing`: any regular file at the manifest's path, whatever its size,
    /// mtime or content (also where the manifest's file is empty).
    Existing,
}

/// What [`Op::ThirdPartySync`] asks for: the copy, and the options the dialer's walk
/// (push) or request (pull) and the destination's mirror take, as a two-party
/// `dmover sync` (or a filtered `dmover cp`) would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThirdPartySync {
    /// The copy, as [`Op::ThirdParty`]'s.
    pub copy: ThirdParty,
    /// `dmover sync`: the destination is the mirror itself (its capability's scope is
    /// [`crate::capability::Scope::Mirror`] or `MirrorSource`); else a filtered copy.
    pub mirror: bool,
    /// `--delete` (a sync): what the mirror holds that the source does not is deleted.
    pub delete: bool,
    /// `--max-delete` (`u64::MAX`: no limit).
    pub max_delete: u64,
    /// `--checksum` (a sync): files of equal size are compared by content.
    pub checksum: bool,
    /// `--include`/`--exclude` rules, in order (paths relative to the source root).
    pub rules: Vec<FilterRule>,
    /// The `--files-from` file's contents, as [`PullListed::list`].
    pub files_from: Option<Vec<u8>>,
}

/// What [`Op::Digests`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digests {
    /// The pull's source, a path relative to the server's root, resolved as
    /// [`Op::Pull`]'s sources are: the manifest's root stands for it, and its entries
    /// are matched by their names below it.
    pub source: Vec<u8>,
}

/// What [`Op::Rename`] asks for: rename(2) of `from` to `to`, both paths relative to
/// the server's root and in the same export. POSIX semantics: an existing `to` is
/// replaced atomically (a directory only by a directory, and only if it is empty).
/// Both parents are resolved beneath the export (no `..`, no absolute path, no symlink
/// leading out); the last components are not followed. Names starting with `.dmv.`
/// (staging files, journals) are refused on either side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rename {
    /// The entry to rename.
    pub from: Vec<u8>,
    /// Its new path.
    pub to: Vec<u8>,
}

/// What [`Op::PullFiltered`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullFiltered {
    /// Source paths on the server, as [`Op::Pull`]'s.
    pub sources: Vec<Vec<u8>>,
    /// `--include`/`--exclude` rules, in order, applied to the server's walk (paths
    /// relative to each source root).
    pub rules: Vec<FilterRule>,
    /// The client will delete what the manifest does not list (`sync --delete`), so
    /// the server reports the count of entries its walk skipped (special files,
    /// vanished files) in `SendReport.failed`, as one `FailedFile` with entry
    /// `u32::MAX` and the count in decimal as its message (none when 0).
    pub report_skipped: bool,
}

/// What [`Op::PullListed`] asks for: [`PullFiltered`]'s fields and a `--files-from`
/// list, applied by the server to its walk as a push applies them to its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullListed {
    /// Source paths on the server, as [`Op::Pull`]'s.
    pub sources: Vec<Vec<u8>>,
    /// `--include`/`--exclude` rules, as [`PullFiltered::rules`].
    pub rules: Vec<FilterRule>,
    /// As [`PullFiltered::report_skipped`].
    pub report_skipped: bool,
    /// The `--files-from` file's contents as read (paths relative to each source root,
    /// one per line); the server parses them (a bad list is `Error{Protocol}`). The
    /// whole `Open` must fit in [`MAX_FRAME`].
    pub list: Vec<u8>,
}

/// One `--include` / `--exclude` rule as the user wrote it (rsync's pattern syntax).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterRule {
    /// `--include` (else `--exclude`).
    pub include: bool,
    /// The pattern.
    pub pattern: Vec<u8>,
}

/// What a client asks of [`Op::Prune`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prune {
    /// The mirror, a path relative to the server's root (the directory itself, not
    /// its parent).
    pub dest: Vec<u8>,
    /// The transfer's filters, in order: entries they exclude are neither sent nor
    /// deleted.
    pub rules: Vec<FilterRule>,
    /// Delete at most this many entries (`u64::MAX`: no limit).
    pub max_delete: u64,
    /// Change nothing: report what would be deleted and which files are unchanged.
    pub dry_run: bool,
    /// Delete only entries whose kind conflicts with the manifest's (a directory where
    /// the source has a file, or the reverse), before the transfer.
    pub conflicts_only: bool,
    /// `--checksum`: also answer the content digest of each regular file the mirror
    /// holds with the manifest's size ([`PruneReport::digests`]).
    pub checksum: bool,
}

/// What [`Op::Prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    /// Entries deleted (each file, symlink and directory counts one).
    pub deleted: u64,
    /// Bytes of the regular files deleted.
    pub deleted_bytes: u64,
    /// Entries left because of `max_delete`.
    pub over_limit: u64,
    /// Entries kept because the filters exclude them.
    pub protected: u64,
    /// The paths deleted, relative to the mirror (directories end with `/`); at most
    /// the first 10 000.
    pub paths: Vec<Vec<u8>>,
    /// Dry run: manifest entries of the regular files the server holds with the
    /// manifest's size and mtime (not sent by a sync), as ranges.
    pub unchanged: Vec<EntryRange>,
    /// With `checksum`: `(manifest entry, content digest)` of each regular file the
    /// mirror holds with the manifest's size (the digest: 4 MiB pieces' xxh3-64 hashes
    /// combined as a transfer's file digest, `dmover_store::prune::content_digest`).
    pub digests: Vec<(u32, u64)>,
}

/// What a client asks of the server that will accept a third-party session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRequest {
    /// The session the capability allows.
    pub scope: crate::capability::Scope,
    /// The key fingerprint of the server that will dial (the client's pin for it).
    pub dialer: String,
    /// The address (`host:port`) the client named this server by. Informational: a
    /// server names only its own address in a capability, never one a client asks
    /// for (docs/third-party.md, "Trust").
    pub addr: String,
}

/// Which server dials in a third-party transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TpcMode {
    /// The source dials the destination and pushes.
    Push,
    /// The destination dials the source and pulls.
    Pull,
}

/// What a client asks of the dialing server of a third-party transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThirdParty {
    /// Push (this server is the source) or pull (the destination).
    pub mode: TpcMode,
    /// The other server's address: the one the capability names (the dialer dials
    /// nothing else).
    pub peer: String,
    /// The other server's key fingerprint (the client's pin for it).
    pub peer_key: String,
    /// The other server's capability for this one.
    pub capability: crate::capability::Capability,
    /// Paths here: the sources (push) or the destination, one path (pull).
    pub paths: Vec<Vec<u8>>,
}

/// (feature `TUNING`) A decision of the source's tuner
/// ([`crate::session::tune::Tuner`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuned {
    /// Milliseconds since the first chunk went out.
    pub at_ms: u64,
    /// Data streams the source sends on from now on (of the session's streams).
    pub streams: u16,
    /// The rate measured with the settings before this decision, in bytes per second
    /// (0: none measured yet).
    pub rate: u64,
    /// Why, in a few words (at most [`MAX_TUNED_REASON`] bytes).
    pub reason: String,
}

/// (feature `LINKS`) Files that may have holes: manifest entry indices of regular
/// files, strictly ascending. A long list comes in several messages, each ascending
/// after the one before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparseFiles {
    /// The entries.
    pub entries: Vec<u32>,
}

/// (feature `METADATA`) Part of the manifest's metadata
/// ([`crate::manifest::EntryMeta`]), in ascending entry order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPart {
    /// Entries' owners and extended attributes (entries without any may be absent).
    pub entries: Vec<crate::manifest::EntryMeta>,
    /// The last part.
    pub last: bool,
}

/// (feature `CONTINUOUS`) Newer modification times of manifest entries
/// (directories), by entry index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimesPart {
    /// (entry, its modification time now).
    pub entries: Vec<(u32, crate::manifest::Mtime)>,
}

/// (feature `LIMITS`) The limits a side applies to a session's data streams. Each side
/// sends one: the dialer as soon as `Session` shows the feature, the acceptor in answer
/// to the dialer's (so an acceptor answers only a dialer that asked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLimits {
    /// The sender's bandwidth limit for the session, all its data streams together, in
    /// bytes per second (0: none). The dialer's: its own (`--bwlimit`); the acceptor's:
    /// the one it paces the session with (a server: the lowest of its user's and its
    /// exports' `bwlimit`).
    pub bwlimit: u64,
    /// Congestion control. The dialer's: the algorithm it asks the acceptor to set
    /// (`TCP_CONGESTION`) on its ends of the data streams it sends on (empty: the
    /// acceptor's default). The acceptor's: the algorithm those ends use, when the
    /// dialer asked for one (empty otherwise).
    pub congestion: String,
    /// The acceptor's: why it could not use the algorithm the dialer asked for (empty:
    /// it uses it, or none was asked); its ends then keep its default, which
    /// `congestion` names. The dialer's: empty.
    pub refused: String,
}

/// Longest [`SessionLimits::congestion`] and [`SessionLimits::refused`] a receiver
/// accepts.
pub const MAX_LIMITS_TEXT: usize = 256;

/// Longest [`Tuned::reason`] a sink accepts.
pub const MAX_TUNED_REASON: usize = 256;

/// A third-party copy's counters so far (all attempts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TpcProgress {
    /// Payload bytes that crossed the data streams.
    pub bytes: u64,
    /// Bytes the copy moves, once known.
    pub total: u64,
    /// Bytes the destination already held.
    pub held: u64,
    /// Data streams that broke.
    pub streams_lost: u32,
    /// The attempt running.
    pub attempt: u32,
}

/// How a third-party copy ended (the dialer's report of its session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpcReport {
    /// The sink's summary (the destination's verification).
    pub summary: Summary,
    /// Totals of the manifest.
    pub totals: crate::manifest::Totals,
    /// Data streams and chunk size used.
    pub streams: u16,
    /// Chunk size used.
    pub chunk_size: u32,
    /// Bytes and files the destination already held (resume).
    pub held_bytes: u64,
    /// Files the destination already held.
    pub held_files: u64,
    /// Chunks sent again after stream losses.
    pub chunks_resent: u64,
    /// Data streams that broke.
    pub streams_lost: u32,
    /// Sessions the copy took.
    pub attempts: u32,
    /// Files the source could not read (`path: why`).
    pub failed: Vec<String>,
    /// Which server dialed the other (its address as the client named it).
    pub dialer: String,
}

/// A memory-to-memory test of the data streams (`dmover bench net`).
///
/// An ordinary session of the role machines over a growing manifest
/// ([`crate::session::features::GROWING_MANIFEST`], required): the sender is the source,
/// its manifest's parts are files of whole chunks of zeros announced ahead of the data
/// until `millis` after the first chunk, then a last, empty part; the receiver checks
/// each chunk's CRC32C (when the session's `checksum` is set), keeps nothing and answers
/// `Done` with the bytes and chunks it received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemTest {
    /// Which way the data flows.
    pub direction: MemDirection,
    /// How long the sender sends, in milliseconds (a server caps it).
    pub millis: u32,
    /// Whether the sender uses zero-copy sends (`MSG_ZEROCOPY`), falling back to ordinary
    /// sends where the kernel lacks them.
    pub zerocopy: bool,
    /// Congestion control for the server's ends of the data streams (empty: its default).
    pub congestion: String,
}

/// Direction of a [`MemTest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemDirection {
    /// Client → server.
    ToServer,
    /// Server → client.
    FromServer,
}

/// (5) Open a transfer session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// Push or pull, with paths.
    pub op: Op,
    /// Number of parallel data streams the client wants.
    pub streams: u16,
    /// Chunk size in bytes (a multiple of 4096 between the layout's bounds), or 0 to
    /// let the source side choose (only meaningful for a pull: a pushing client is the
    /// source and sends its choice).
    pub chunk_size: u32,
    /// Whether chunks carry CRC32C and files get end-to-end digests.
    pub checksum: bool,
    /// When the server should bypass its page cache for large files.
    pub direct_io: DirectIo,
    /// How the session's data streams are protected.
    pub protection: DataProtection,
    /// The optional features the client speaks ([`crate::session::features`]).
    pub features: u64,
}

/// How data streams carry their bytes after the join (see [`crate::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DataProtection {
    /// Frames as they are: the join is authenticated, the bytes after it are only
    /// checked by CRC32C and the end-to-end digests (not against an attacker).
    Plain,
    /// Records authenticated with AES-256-GCM (the data as associated data): nothing
    /// can be injected, altered, replayed or cut, but the data is readable on the wire.
    #[default]
    Authenticated,
    /// Records encrypted and authenticated with AES-256-GCM.
    Encrypted,
}

/// When to bypass the page cache (`O_DIRECT`) for files of at least
/// [`crate::layout::ALIGN_MIN_SIZE`] bytes, the ones the layout aligns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DirectIo {
    /// Always through the page cache.
    Never,
    /// Writes direct (received data is rarely read again soon); reads direct unless
    /// the data is already in the page cache.
    #[default]
    Auto,
    /// Always direct.
    Always,
}

/// (6) The session the server opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Session identifier, named by every data stream.
    pub id: u64,
    /// Random salt of the session key's derivation (see [`crate::auth`]); data
    /// streams never send it, they prove they hold the key derived with it.
    pub salt: [u8; 32],
    /// Number of data streams the client must open (the server may lower the request).
    pub streams: u16,
    /// Chunk size in bytes both sides use.
    pub chunk_size: u32,
    /// The optional features the session uses: the client's, less those the server
    /// does not speak ([`crate::session::features::negotiate`]).
    pub features: u64,
}

/// (7) A batch of manifest entries, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestPart {
    /// The next entries of the manifest.
    pub entries: Vec<Entry>,
}

/// (7) End of the manifest, with totals to cross-check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEnd {
    /// Totals over all entries sent.
    pub totals: Totals,
}

/// (7, feature `GROWING_MANIFEST`) The end of a part of a growing manifest.
///
/// A source that streams its walk sends `Manifest* Grow` for each part instead of
/// `Manifest* ManifestEnd` once; the first `Grow` stands for `ManifestEnd` (the sink
/// answers it with `Go`), later ones may come at any time until the one marked `last`.
/// Each part's files start on a fresh chunk, so a part's chunks are exactly
/// `previous chunks..chunks` and earlier chunks never change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Growth {
    /// Totals over every entry sent so far, all parts included.
    pub totals: Totals,
    /// Chunks in the layout of every entry sent so far (never fewer than before).
    pub chunks: u64,
    /// Whether the manifest is complete: nothing is added after this part.
    pub last: bool,
}

/// (feature `RANGES`) Chunks the sink wants, by index in the layout.
///
/// A mount reading a byte range of a file maps it to chunks with the layout
/// ([`crate::layout::Layout`]) and asks for those. In an ordinary session the source
/// sends them before the rest of its order (chunks already sent are not sent again);
/// in a request-driven one (`OnDemand`) it sends each chunk named, again if it was
/// sent before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    /// Half-open ranges of chunk indices, in the order wanted.
    pub chunks: Vec<std::ops::Range<u64>>,
}

/// (feature `PARTS`) Byte ranges of chunks a request-driven sink wants, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantParts {
    /// The ranges.
    pub parts: Vec<Part>,
}

/// `len` bytes of chunk `chunk` from `offset` (into the chunk's virtual range; the
/// bytes lie within one piece of the chunk, i.e. in one file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Part {
    /// The chunk, by index in the layout.
    pub chunk: u64,
    /// Where the bytes start in the chunk.
    pub offset: u32,
    /// How many (at least 1).
    pub len: u32,
}

/// (9) What the destination side did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Bytes of regular file data written.
    pub bytes: u64,
    /// Regular files finalised.
    pub files: u64,
    /// Directories created or updated.
    pub dirs: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Chunks received.
    pub chunks: u64,
    /// Whether every file's digest was compared and matched.
    pub verified: bool,
}

/// Broad classes of failure, so a client can choose an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The peer broke the protocol.
    Protocol,
    /// Authentication failed or is required.
    Auth,
    /// A named path does not exist.
    NotFound,
    /// The operating system refused access.
    PermissionDenied,
    /// A path would leave the server's root.
    PathEscape,
    /// The server is read-only.
    ReadOnly,
    /// A read or write failed.
    Io,
    /// A checksum or digest did not match.
    Checksum,
    /// The server is at a limit (sessions, memory); try later.
    Busy,
    /// The peer gave up (interrupted, or another stream failed).
    Aborted,
    /// A feature this side does not support.
    Unsupported,
    /// A source file changed while it was being read (a new session sends it again).
    Changed,
}

/// An error report. The sender closes the session after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMsg {
    /// Class of failure.
    pub code: ErrorCode,
    /// Human-readable detail naming the file, path or limit involved.
    pub message: String,
}

/// (6a) Options of a session that do not fit in [`Open`], sent by the client right
/// after [`SessionInfo`] arrives, in both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOptions {
    /// Resume: the destination looks up its journal for this transfer and answers the
    /// manifest with [`Have`] instead of `Go`. Without it, the destination forgets any
    /// earlier attempt and starts over.
    pub resume: bool,
    /// The destination keeps a resume journal (off: a failed transfer cannot be
    /// resumed, and the destination does no journal writes or `syncfs` calls).
    pub journal: bool,
    /// The destination `fsync`s each file before renaming it into place.
    pub fsync: bool,
    /// The destination re-reads each file from storage after `fsync` and compares its
    /// digest before renaming it (needs checksums).
    pub verify: bool,
    /// The source reports files it cannot read (vanished, unreadable, changed while
    /// read) and goes on with the rest, instead of stopping the session.
    pub continue_on_error: bool,
    /// Interval between heartbeats both sides send while data flows, in milliseconds.
    /// A side that hears nothing for four intervals declares its peer silent.
    pub heartbeat_ms: u32,
}

/// A run of manifest entries, `first..first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRange {
    /// First entry index.
    pub first: u32,
    /// Number of entries.
    pub count: u32,
}

/// Pieces of a file the destination holds in its staging file, journaled and durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialFile {
    /// The file's manifest entry index.
    pub entry: u32,
    /// `(piece index, piece hash)` of each piece held, in increasing index order. Only
    /// files of at least one chunk have partial pieces (their pieces do not depend on
    /// what else the transfer holds), and a file's last piece is never listed.
    pub pieces: Vec<(u64, u64)>,
}

/// (7a) Part of what the destination of a resumed transfer already has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    /// Regular files complete under their final names, with the size and mtime the
    /// manifest gives them (entries in these ranges that are not regular files with
    /// data are to be ignored).
    pub done: Vec<EntryRange>,
    /// Files partly received.
    pub partial: Vec<PartialFile>,
    /// Whether this is the last part.
    pub last: bool,
}

/// (7b) The source's answer to [`Have`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Entries of partial files whose held pieces no longer match the source (the file
    /// changed): they are sent whole. Every other file the destination listed is not
    /// sent again (done) or only its missing pieces are (partial).
    pub stale: Vec<u32>,
}

/// A source file that could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedFile {
    /// The file's manifest entry index.
    pub entry: u32,
    /// Why, naming the file.
    pub message: String,
}

/// (8a) The source's account of its sending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendReport {
    /// Chunks sent again because the data stream that carried them broke.
    pub chunks_resent: u64,
    /// Data streams that broke.
    pub streams_lost: u32,
    /// Files skipped because they could not be read (with `continue_on_error`).
    pub failed: Vec<FailedFile>,
}
