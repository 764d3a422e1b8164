//! Data streams after their join: plain bytes or AES-256-GCM records
//! ([`dmover_proto::record`]), with idle timeouts.
//!
//! Sealing and opening happen in the task that reads or writes the stream, so a
//! session's N streams spread the cryptography over the runtime's threads: throughput
//! scales with cores as streams do.
//!
//! A client may start sending right behind its join proof, before the server's answer
//! ([`DataIo::awaiting_join`]): the answer (status and server proof, see
//! [`dmover_proto::data`]) is then read and checked before anything else the stream
//! receives, so no acknowledgement or frame is ever trusted before the server proved it
//! belongs to the session; a failed join fails every later read and write with a
//! [`JoinFailed`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use dmover_proto::auth::{Role, proofs_equal, record_key};
use dmover_proto::control::DataProtection;
use dmover_proto::data::{JOIN_PROOF_LEN, JoinStatus};
use dmover_proto::record::{self, HEADER_LEN, MAX_RECORD, TAG_LEN};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::chunkio::{ChunkOut, DataWrite, IN_PLACE_MIN};

/// The AES-256-GCM protection of one direction of a data stream (a stream's key for one
/// writing end): every record a data stream seals or opens goes through
/// [`RecordCipher::seal`] or [`RecordCipher::open`]. Public so that `dmover bench cpu`
/// measures the very calls the data streams make.
pub struct RecordCipher {
    key: LessSafeKey,
    encrypt: bool,
}

impl RecordCipher {
    /// A cipher with the record key `key`. `encrypt`: encrypt record bodies (else
    /// authenticate only: the tag is a GMAC over header and body).
    pub fn new(key: &[u8; 32], encrypt: bool) -> Self {
        RecordCipher {
            key: LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"),
            ),
            encrypt,
        }
    }

    /// Seals record number `seq`, whose header is `header`, and returns its tag.
    /// Encrypted: `run[body_at..]` is the body, encrypted in place, with the header as
    /// associated data. Authenticated: `run` is the header's bytes followed by the body
    /// (the MAC covers them as one run) and is left as it is.
    pub fn seal(
        &self,
        seq: u64,
        header: [u8; HEADER_LEN],
        run: &mut [u8],
        body_at: usize,
    ) -> [u8; TAG_LEN] {
        let nonce = Nonce::assume_unique_for_key(record::nonce(seq));
        let tag = if self.encrypt {
            self.key
                .seal_in_place_separate_tag(nonce, Aad::from(header), &mut run[body_at..])
        } else {
            debug_assert_eq!(run[..HEADER_LEN], header);
            self.key
                .seal_in_place_separate_tag(nonce, Aad::from(&*run), &mut [])
        }
        .expect("sealing a record within AES-GCM's limits");
        tag.as_ref().try_into().expect("a 16-byte tag")
    }

    /// Opens record number `seq` with tag `tag`, laid out as for [`RecordCipher::seal`]:
    /// an encrypted body is decrypted in place. `false` if the record fails
    /// authentication (an encrypted body's bytes are then unspecified).
    pub fn open(
        &self,
        seq: u64,
        header: [u8; HEADER_LEN],
        run: &mut [u8],
        body_at: usize,
        tag: &[u8; TAG_LEN],
    ) -> bool {
        let nonce = Nonce::assume_unique_for_key(record::nonce(seq));
        if self.encrypt {
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(header), tag, &mut run[body_at..])
                .is_ok()
        } else {
            debug_assert_eq!(run[..HEADER_LEN], header);
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(&*run), tag, &mut [])
                .is_ok()
        }
    }
}

/// A stream carrying AES-256-GCM records: authenticated (GMAC over the plaintext) or
/// encrypted, as [`DataProtection`] says.
pub struct Sealed<S> {
    io: S,
    encrypt: bool,
    wkey: RecordCipher,
    wseq: u64,
    /// Sealed bytes not yet written, from `wpos`.
    wbuf: Vec<u8>,
    wpos: usize,
    rkey: RecordCipher,
    rseq: u64,
    /// The record being received, then its opened plaintext at `pstart..pend`.
    rbuf: Box<[u8]>,
    rlen: usize,
    pstart: usize,
    pend: usize,
    /// The body length of the record being received straight into a caller's buffer
    /// by [`DataRead::read_exact_into`] (its header is in `rbuf`), if one is.
    direct: Option<usize>,
    /// Bytes of that record's body and tag received so far.
    dgot: usize,
    /// That record's tag.
    tag: [u8; TAG_LEN],
    /// Bytes read from `io`, to tell progress while a read is pending.
    rx: u64,
}

impl<S> Sealed<S> {
    /// Wraps `io`, the `me` end of data stream `stream` of the session with
    /// `session_key`. `encrypt`: encrypt record bodies (else authenticate only).
    pub fn new(io: S, session_key: &[u8; 32], stream: u16, me: Role, encrypt: bool) -> Self {
        let peer = match me {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        };
        Sealed {
            io,
            encrypt,
            wkey: RecordCipher::new(&record_key(session_key, stream, me), encrypt),
            wseq: 0,
            wbuf: Vec::with_capacity(HEADER_LEN + MAX_RECORD + TAG_LEN),
            wpos: 0,
            rkey: RecordCipher::new(&record_key(session_key, stream, peer), encrypt),
            rseq: 0,
            rbuf: vec![0u8; HEADER_LEN + MAX_RECORD + TAG_LEN].into_boxed_slice(),
            rlen: 0,
            pstart: 0,
            pend: 0,
            direct: None,
            dgot: 0,
            tag: [0; TAG_LEN],
            rx: 0,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// Seals `bufs` (up to one record's worth) into `wbuf`; returns the bytes taken.
    fn seal(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        self.wbuf.clear();
        self.wpos = 0;
        self.wbuf.extend_from_slice(&[0; HEADER_LEN]);
        let mut taken = 0;
        for b in bufs {
            let k = b.len().min(MAX_RECORD - taken);
            self.wbuf.extend_from_slice(&b[..k]);
            taken += k;
            if taken == MAX_RECORD {
                break;
            }
        }
        if taken == 0 {
            self.wbuf.clear();
            return 0;
        }
        let header = record::encode_header(taken);
        self.wbuf[..HEADER_LEN].copy_from_slice(&header);
        let tag = self
            .wkey
            .seal(self.wseq, header, &mut self.wbuf, HEADER_LEN);
        self.wseq += 1;
        self.wbuf.extend_from_slice(&tag);
        taken
    }

    /// Seals the next record, whose header is `header`, and returns its tag. Encrypted:
    /// `run[body_at..]` is the body, encrypted in place. Authenticated: `run` is the
    /// header's bytes followed by the body (the MAC covers them as one run).
    fn seal_tag(
        &mut self,
        header: [u8; HEADER_LEN],
        run: &mut [u8],
        body_at: usize,
    ) -> [u8; TAG_LEN] {
        let tag = self.wkey.seal(self.wseq, header, run, body_at);
        self.wseq += 1;
        tag
    }

    /// Closes the copied record open at `copied[start..]` (header room, then body), if
    /// it has a body.
    fn close_copied(&mut self, out: &mut ChunkOut, open: &mut Option<usize>) {
        let Some(start) = open.take() else { return };
        let copied = out.copied_mut();
        let body = copied.len() - start - HEADER_LEN;
        if body == 0 {
            copied.truncate(start);
            return;
        }
        let header = record::encode_header(body);
        copied[start..start + HEADER_LEN].copy_from_slice(&header);
        let mut run = std::mem::take(copied);
        let tag = self.seal_tag(header, &mut run[start..], HEADER_LEN);
        run.extend_from_slice(&tag);
        let end = run.len();
        *out.copied_mut() = run;
        out.push_copied_range(start..end);
    }

    /// Appends `bytes` to copied records, opening and closing them as they fill.
    fn add_copied(&mut self, out: &mut ChunkOut, open: &mut Option<usize>, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let start = match *open {
                Some(s) => s,
                None => {
                    let s = out.copied_mut().len();
                    out.copied_mut().extend_from_slice(&[0; HEADER_LEN]);
                    *open = Some(s);
                    s
                }
            };
            let have = out.copied_mut().len() - start - HEADER_LEN;
            let k = bytes.len().min(MAX_RECORD - have);
            out.copied_mut().extend_from_slice(&bytes[..k]);
            bytes = &bytes[k..];
            if have + k == MAX_RECORD {
                self.close_copied(out, open);
            }
        }
    }

    /// See [`DataWrite::seal_chunk`]. Every in-place record of an authenticated stream
    /// starts at least [`HEADER_LEN`] bytes into its segment (the segment's first bytes
    /// go into the copied record before it), so its header can borrow the bytes before
    /// it, and so the receiver, which reads a chunk segment by segment, can open it in
    /// its own buffer too (`poll_fill`).
    fn seal_chunk(
        &mut self,
        head: &[&[u8]],
        buf: &mut [u8],
        segments: &[(usize, usize)],
        out: &mut ChunkOut,
    ) {
        out.clear();
        let mut open = None;
        for h in head {
            self.add_copied(out, &mut open, h);
        }
        for &(o, l) in segments {
            if l < IN_PLACE_MIN {
                self.add_copied(out, &mut open, &buf[o..o + l]);
                continue;
            }
            let mut a = o;
            if !self.encrypt {
                self.add_copied(out, &mut open, &buf[a..a + HEADER_LEN]);
                a += HEADER_LEN;
            }
            self.close_copied(out, &mut open);
            while a < o + l {
                let b = (a + MAX_RECORD).min(o + l);
                let header = record::encode_header(b - a);
                let tag = if self.encrypt {
                    self.seal_tag(header, &mut buf[a..b], 0)
                } else {
                    // Borrow the bytes before the body for the header, give them back.
                    let run = &mut buf[a - HEADER_LEN..b];
                    let saved: [u8; HEADER_LEN] = run[..HEADER_LEN].try_into().unwrap();
                    run[..HEADER_LEN].copy_from_slice(&header);
                    let tag = self.seal_tag(header, run, HEADER_LEN);
                    run[..HEADER_LEN].copy_from_slice(&saved);
                    tag
                };
                out.push_record(header, a..b, tag);
                a = b;
            }
        }
        self.close_copied(out, &mut open);
    }

    /// Opens the complete record in `rbuf[..total]`, leaving its plaintext at
    /// `pstart..pend`.
    fn open(&mut self, body: usize) -> io::Result<()> {
        let end = HEADER_LEN + body;
        let header: [u8; HEADER_LEN] = self.rbuf[..HEADER_LEN].try_into().unwrap();
        let tag: [u8; TAG_LEN] = self.rbuf[end..end + TAG_LEN].try_into().unwrap();
        let ok = self
            .rkey
            .open(self.rseq, header, &mut self.rbuf[..end], HEADER_LEN, &tag);
        self.rseq += 1;
        if !ok {
            return Err(self.forged());
        }
        self.pstart = HEADER_LEN;
        self.pend = HEADER_LEN + body;
        Ok(())
    }

    /// The error of a record that failed authentication (the last one opened).
    fn forged(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "data record {} failed authentication: the data was altered, injected or \
                 replayed on the way",
                self.rseq - 1
            ),
        )
    }

    /// Opens the record whose header is in `rbuf`, body in `dst[at..]` and tag in `tag`,
    /// leaving its plaintext in `dst[at..]`.
    fn open_direct(&mut self, dst: &mut [u8], at: usize) -> io::Result<()> {
        let seq = self.rseq;
        self.rseq += 1;
        let header: [u8; HEADER_LEN] = self.rbuf[..HEADER_LEN].try_into().unwrap();
        let ok = if self.encrypt {
            self.rkey.open(seq, header, dst, at, &self.tag)
        } else {
            // The MAC covers header and body as one run of bytes: the header borrows the
            // HEADER_LEN bytes before the body (plaintext this read already delivered
            // there) and gives them back.
            let aad = &mut dst[at - HEADER_LEN..];
            let saved: [u8; HEADER_LEN] = aad[..HEADER_LEN].try_into().unwrap();
            aad[..HEADER_LEN].copy_from_slice(&header);
            let ok = self.rkey.open(seq, header, aad, HEADER_LEN, &self.tag);
            aad[..HEADER_LEN].copy_from_slice(&saved);
            ok
        };
        if ok { Ok(()) } else { Err(self.forged()) }
    }

    /// Whether a read cancelled inside a record left the stream unusable; forgets a
    /// direct record none of whose body had arrived (its header stays in `rbuf`).
    fn check_direct(&mut self) -> io::Result<()> {
        match self.direct {
            Some(_) if self.dgot > 0 => Err(io::Error::other(
                "a read of this data stream was cancelled inside a record",
            )),
            Some(_) => {
                self.direct = None;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

fn ended_inside_record() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the data stream ended inside a record",
    )
}

impl<S: AsyncRead + Unpin> Sealed<S> {
    /// Fills `dst[*pos..]`, advancing `*pos`. A record whose body fits in what is left
    /// of `dst` is received into it and opened there (the header and tag go to the
    /// record buffer); others go through the record buffer and are copied.
    /// Authenticated records also need `*pos >= HEADER_LEN` (see `open_direct`).
    fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        dst: &mut [u8],
        pos: &mut usize,
    ) -> Poll<io::Result<()>> {
        loop {
            if *pos == dst.len() {
                return Poll::Ready(Ok(()));
            }
            if let Some(body) = self.direct {
                if self.dgot < body + TAG_LEN {
                    let mut rb = if self.dgot < body {
                        ReadBuf::new(&mut dst[*pos + self.dgot..*pos + body])
                    } else {
                        ReadBuf::new(&mut self.tag[self.dgot - body..])
                    };
                    ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
                    let n = rb.filled().len();
                    if n == 0 {
                        return Poll::Ready(Err(ended_inside_record()));
                    }
                    self.dgot += n;
                    self.rx += n as u64;
                    continue;
                }
                self.open_direct(&mut dst[..*pos + body], *pos)?;
                *pos += body;
                self.direct = None;
                self.dgot = 0;
                self.rlen = 0;
                continue;
            }
            if self.pstart == self.pend && self.rlen < HEADER_LEN {
                let mut rb = ReadBuf::new(&mut self.rbuf[self.rlen..HEADER_LEN]);
                ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
                let n = rb.filled().len();
                if n == 0 {
                    return Poll::Ready(Err(if self.rlen == 0 {
                        io::Error::new(io::ErrorKind::UnexpectedEof, "the data stream ended")
                    } else {
                        ended_inside_record()
                    }));
                }
                self.rlen += n;
                self.rx += n as u64;
                if self.rlen == HEADER_LEN {
                    let body = record::decode_header(&self.rbuf[..HEADER_LEN])
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    if body <= dst.len() - *pos && (self.encrypt || *pos >= HEADER_LEN) {
                        self.direct = Some(body);
                        self.dgot = 0;
                    }
                }
                continue;
            }
            let mut rb = ReadBuf::new(&mut dst[*pos..]);
            ready!(Pin::new(&mut *self).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the data stream ended",
                )));
            }
            *pos += n;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sealed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        me.check_direct()?;
        loop {
            if me.pstart < me.pend {
                let n = buf.remaining().min(me.pend - me.pstart);
                buf.put_slice(&me.rbuf[me.pstart..me.pstart + n]);
                me.pstart += n;
                if me.pstart == me.pend {
                    me.pstart = 0;
                    me.pend = 0;
                    me.rlen = 0;
                }
                return Poll::Ready(Ok(()));
            }
            // Read exactly up to the end of the header, then of the record: nothing of
            // the next record is ever buffered, so nothing needs moving.
            let want = if me.rlen < HEADER_LEN {
                HEADER_LEN
            } else {
                let body = record::decode_header(&me.rbuf[..HEADER_LEN])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let total = HEADER_LEN + body + TAG_LEN;
                if me.rlen == total {
                    me.open(body)?;
                    continue;
                }
                total
            };
            let mut rb = ReadBuf::new(&mut me.rbuf[me.rlen..want]);
            ready!(Pin::new(&mut me.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                if me.rlen == 0 {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(ended_inside_record()));
            }
            me.rlen += n;
            me.rx += n as u64;
        }
    }
}

impl<S: AsyncWrite + Unpin> Sealed<S> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.wpos < self.wbuf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wpos += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sealed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        ready!(me.poll_drain(cx))?;
        let taken = me.seal(bufs);
        // Start sending at once; what the socket does not take now goes out on the
        // next write or flush.
        if let Poll::Ready(Err(e)) = me.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A deadline that runs only while an operation waits: reset by any progress.
struct Idle {
    limit: Option<Duration>,
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl Idle {
    fn new(limit: Option<Duration>) -> Self {
        Idle {
            limit,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: false,
        }
    }

    /// Called when an operation is pending: whether it has waited too long.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        if !self.armed {
            self.sleep.as_mut().reset(Instant::now() + limit);
            self.armed = true;
        }
        self.sleep.as_mut().poll(cx).is_ready()
    }

    /// Passes `r` through: ready resets the deadline, pending for longer than the limit
    /// becomes a `TimedOut` error naming `what` the operation was doing.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        what: &str,
        r: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(self.error(what))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn error(&self, what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no progress {what} for {} s",
                self.limit.unwrap_or_default().as_secs()
            ),
        )
    }
}

/// Stream bytes a client may write while its join's answer is outstanding
/// ([`DataIo::awaiting_join`]); further writes wait for the answer. The first round trip
/// of a TCP connection carries at most its initial congestion window (10 segments,
/// ~14 KiB on Linux), so this never delays a transfer; it bounds what a data port that
/// cannot prove itself receives before the client finds out.
pub const EARLY_BYTES: usize = 1 << 20;

/// Why a data stream's join failed on the client side: the error inside the
/// [`io::Error`]s a [`DataIo`] awaiting its join answer returns (find it with
/// `e.get_ref().and_then(|e| e.downcast_ref::<JoinFailed>())`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinFailed {
    /// The server refused the join with this status.
    #[error("data stream {stream} refused: {status:?}")]
    Refused {
        /// The stream index.
        stream: u16,
        /// The server's status.
        status: JoinStatus,
    },
    /// The server answered with a status byte that means nothing.
    #[error("data stream {stream}: unknown join status {value}")]
    BadStatus {
        /// The stream index.
        stream: u16,
        /// The byte received.
        value: u8,
    },
    /// The server's proof did not match: whoever answered does not know the session key.
    #[error("data stream {stream}: the data port could not prove it belongs to the session")]
    BadProof {
        /// The stream index.
        stream: u16,
    },
    /// No answer within the limit.
    #[error("data stream {stream}: no join answer within {secs} s")]
    Timeout {
        /// The stream index.
        stream: u16,
        /// The limit.
        secs: u64,
    },
    /// The connection ended or failed before the whole answer arrived.
    #[error("{message}")]
    Broken {
        /// The stream index.
        stream: u16,
        /// What the connection's error was (`UnexpectedEof`: it was closed).
        kind: io::ErrorKind,
        /// Its message.
        message: String,
    },
}

impl JoinFailed {
    /// The [`JoinFailed`] inside `e`, if `e` is one.
    pub fn of(e: &io::Error) -> Option<&JoinFailed> {
        e.get_ref().and_then(|e| e.downcast_ref::<JoinFailed>())
    }

    fn to_io(&self) -> io::Error {
        let kind = match self {
            JoinFailed::Timeout { .. } => io::ErrorKind::TimedOut,
            JoinFailed::Broken { kind, .. } => *kind,
            _ => io::ErrorKind::PermissionDenied,
        };
        io::Error::new(kind, self.clone())
    }
}

/// A join answer not yet read (see [`DataIo::awaiting_join`]).
struct PendingJoin {
    stream: u16,
    /// The server proof the answer must carry.
    want: [u8; JOIN_PROOF_LEN],
    /// Status byte and proof received so far.
    got: [u8; 1 + JOIN_PROOF_LEN],
    have: usize,
    /// Stream bytes the caller may still write before the answer.
    early: usize,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    /// A write waiting for the answer (past [`EARLY_BYTES`], or holding an error).
    writer: Option<Waker>,
    failed: Option<JoinFailed>,
}

impl PendingJoin {
    /// Records the outcome `f` and wakes a waiting write.
    fn fail(&mut self, f: JoinFailed) -> io::Error {
        let e = f.to_io();
        self.failed = Some(f);
        if let Some(w) = self.writer.take() {
            w.wake();
        }
        e
    }
}

enum Inner<S> {
    Plain(S),
    Sealed(Box<Sealed<S>>),
}

/// A joined data stream: plain or sealed, with a limit on how long a read or write may
/// wait without progress (so a silent or stalled peer cannot hold a session forever).
pub struct DataIo<S = TcpStream> {
    inner: Inner<S>,
    read_idle: Idle,
    write_idle: Idle,
    /// The join answer still to read, on a client that sent data behind its proof.
    join: Option<Box<PendingJoin>>,
    /// A write error held until the join answer says whether it is the real story.
    write_err: Option<io::Error>,
}

impl<S> DataIo<S> {
    /// Wraps a joined stream. `session_key`, `stream` and `me` key the records when
    /// `protection` asks for them; `idle` bounds waits without progress (`None`: none).
    pub fn new(
        io: S,
        protection: DataProtection,
        session_key: &[u8; 32],
        stream: u16,
        me: Role,
        idle: Option<Duration>,
    ) -> Self {
        let inner = match protection {
            DataProtection::Plain => Inner::Plain(io),
            DataProtection::Authenticated => {
                Inner::Sealed(Box::new(Sealed::new(io, session_key, stream, me, false)))
            }
            DataProtection::Encrypted => {
                Inner::Sealed(Box::new(Sealed::new(io, session_key, stream, me, true)))
            }
        };
        DataIo {
            inner,
            read_idle: Idle::new(idle),
            write_idle: Idle::new(idle),
            join: None,
            write_err: None,
        }
    }

    /// The client end of data stream `stream`, whose `DataHello` and proof have gone
    /// out but whose answer has not been read: the caller may write at once. The
    /// answer (status [`JoinStatus::Accepted`] and `server_proof`) is read, before
    /// any byte a read returns, by the first read ([`DataIo::finish_join`] waits for
    /// it alone); it must arrive within `limit` of this call. Until it has been checked:
    /// - reads return nothing else;
    /// - writes take at most [`EARLY_BYTES`], then wait for the answer (so a caller
    ///   that writes more must also be reading, from the same task or another);
    /// - a write that fails waits for the answer too, so that a server that refused
    ///   the join and closed the connection is reported as refusing it, not as a
    ///   broken pipe (the connection's error is returned if the answer was good).
    ///
    /// A bad or missing answer fails this and every later read and write with a
    /// [`JoinFailed`] inside the [`io::Error`].
    pub fn awaiting_join(
        mut self,
        stream: u16,
        server_proof: [u8; JOIN_PROOF_LEN],
        limit: Duration,
    ) -> Self {
        self.join = Some(Box::new(PendingJoin {
            stream,
            want: server_proof,
            got: [0; 1 + JOIN_PROOF_LEN],
            have: 0,
            early: EARLY_BYTES,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            writer: None,
            failed: None,
        }));
        self
    }

    /// Whether the join's answer has yet to be read and found good (also after it was
    /// found bad: the stream is then unusable).
    pub fn join_pending(&self) -> bool {
        self.join.is_some()
    }

    /// The underlying connection when the stream is plain (bytes written to it arrive
    /// unchanged), for zero-copy sends; `None` for sealed streams, and while the join's
    /// answer is pending (writes must go through [`DataIo`] then).
    pub fn plain(&self) -> Option<&S> {
        match &self.inner {
            Inner::Plain(s) if self.join.is_none() => Some(s),
            _ => None,
        }
    }

    /// The underlying connection.
    pub fn get_ref(&self) -> &S {
        match &self.inner {
            Inner::Plain(s) => s,
            Inner::Sealed(s) => s.get_ref(),
        }
    }
}

/// The first `n` bytes of `bufs`.
fn truncated<'a>(bufs: &'a [IoSlice<'_>], mut n: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if n == 0 {
            break;
        }
        let k = b.len().min(n);
        out.push(IoSlice::new(&b[..k]));
        n -= k;
    }
    out
}

impl<S> DataIo<S> {
    /// A write of `bufs` by `write` through the join's gate: while the answer is
    /// outstanding, at most the early allowance goes, and a write error waits for the
    /// answer (see [`DataIo::awaiting_join`]). Every write of a data stream, ordinary
    /// or of sealed chunks, goes through here.
    fn gated_write(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
        write: impl FnOnce(&mut Inner<S>, &mut Context<'_>, &[IoSlice<'_>]) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let r = match self.poll_write_gate(cx, true) {
            Poll::Ready(Ok(())) => {
                let cut;
                let bufs = match self.join.as_deref() {
                    Some(j) if bufs.iter().map(|b| b.len()).sum::<usize>() > j.early => {
                        cut = truncated(bufs, j.early);
                        &cut[..]
                    }
                    _ => bufs,
                };
                let r = write(&mut self.inner, cx, bufs);
                self.after_write(cx, r, |n| *n)
            }
            other => other.map_ok(|()| 0),
        };
        self.write_idle.watch(cx, "sending", r)
    }

    /// Before a write: while the join's answer is outstanding, a write that would go
    /// past [`EARLY_BYTES`] (`adds`), or follows a failed one, waits for it; a failed
    /// join fails the write. `Ready(Ok(()))`: go ahead.
    fn poll_write_gate(&mut self, cx: &mut Context<'_>, adds: bool) -> Poll<io::Result<()>> {
        let Some(j) = self.join.as_deref_mut() else {
            return Poll::Ready(match self.write_err.take() {
                Some(e) => Err(e),
                None => Ok(()),
            });
        };
        if let Some(f) = &j.failed {
            return Poll::Ready(Err(f.to_io()));
        }
        if self.write_err.is_some() || (adds && j.early == 0) {
            j.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    /// After a write: while the join's answer is outstanding, counts the bytes taken
    /// against [`EARLY_BYTES`] and holds an error until the answer is in.
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
        taken: impl FnOnce(&T) -> usize,
    ) -> Poll<io::Result<T>> {
        let Some(j) = self.join.as_deref_mut() else {
            return r;
        };
        match r {
            Poll::Ready(Ok(v)) => {
                j.early = j.early.saturating_sub(taken(&v));
                Poll::Ready(Ok(v))
            }
            Poll::Ready(Err(e)) => {
                self.write_err = Some(e);
                j.writer = Some(cx.waker().clone());
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> DataIo<S> {
    /// Reads and checks the pending join answer, if any (see [`DataIo::awaiting_join`]).
    fn poll_join(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(j) = self.join.as_deref_mut() else {
            return Poll::Ready(Ok(()));
        };
        if let Some(f) = &j.failed {
            return Poll::Ready(Err(f.to_io()));
        }
        let io = match &mut self.inner {
            Inner::Plain(s) => s,
            Inner::Sealed(s) => &mut s.io,
        };
        let stream = j.stream;
        while j.have < j.got.len() {
            // The status alone first: a refusal is that one byte, then the server closes.
            let end = if j.have == 0 { 1 } else { j.got.len() };
            let mut rb = ReadBuf::new(&mut j.got[j.have..end]);
            match Pin::new(&mut *io).poll_read(cx, &mut rb) {
                Poll::Pending => {
                    if j.deadline.as_mut().poll(cx).is_ready() {
                        let secs = j.limit.as_secs();
                        return Poll::Ready(Err(j.fail(JoinFailed::Timeout { stream, secs })));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(j.fail(JoinFailed::Broken {
                        stream,
                        kind: e.kind(),
                        message: e.to_string(),
                    })));
                }
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        return Poll::Ready(Err(j.fail(JoinFailed::Broken {
                            stream,
                            kind: io::ErrorKind::UnexpectedEof,
                            message: format!(
                                "the server closed data stream {stream} before answering its join"
                            ),
                        })));
                    }
                    if j.have == 0 {
                        let f = match JoinStatus::decode(j.got[0]) {
                            Ok(JoinStatus::Accepted) => None,
                            Ok(status) => Some(JoinFailed::Refused { stream, status }),
                            Err(_) => Some(JoinFailed::BadStatus {
                                stream,
                                value: j.got[0],
                            }),
                        };
                        if let Some(f) = f {
                            return Poll::Ready(Err(j.fail(f)));
                        }
                    }
                    j.have += n;
                }
            }
        }
        let theirs: &[u8; JOIN_PROOF_LEN] = j.got[1..].try_into().expect("33-byte answer");
        if !proofs_equal(&j.want, theirs) {
            return Poll::Ready(Err(j.fail(JoinFailed::BadProof { stream })));
        }
        if let Some(w) = j.writer.take() {
            w.wake();
        }
        self.join = None;
        Poll::Ready(Ok(()))
    }

    /// Waits for the join's answer and checks it; at once `Ok` when none is pending.
    /// Errors carry a [`JoinFailed`].
    pub async fn finish_join(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_join(cx)).await
    }
}

impl<S> std::fmt::Debug for DataIo<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.inner {
            Inner::Plain(_) => "DataIo(plain)",
            Inner::Sealed(ref s) if s.encrypt => "DataIo(encrypted)",
            Inner::Sealed(_) => "DataIo(authenticated)",
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for DataIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let r = match me.poll_join(cx) {
            Poll::Ready(Ok(())) => match &mut me.inner {
                Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
                Inner::Sealed(s) => Pin::new(&mut **s).poll_read(cx, buf),
            },
            other => other,
        };
        me.read_idle.watch(cx, "receiving", r)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for DataIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.gated_write(cx, bufs, |inner, cx, bufs| match inner {
            Inner::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Sealed(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        })
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Plain(s) => s.is_write_vectored(),
            Inner::Sealed(_) => true,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let r = match me.poll_write_gate(cx, false) {
            Poll::Ready(Ok(())) => {
                let r = match &mut me.inner {
                    Inner::Plain(s) => Pin::new(s).poll_flush(cx),
                    Inner::Sealed(s) => Pin::new(&mut **s).poll_flush(cx),
                };
                me.after_write(cx, r, |_| 0)
            }
            other => other,
        };
        me.write_idle.watch(cx, "sending", r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        ready!(me.poll_write_gate(cx, false))?;
        let r = match &mut me.inner {
            Inner::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Sealed(s) => Pin::new(&mut **s).poll_shutdown(cx),
        };
        me.after_write(cx, r, |_| 0)
    }
}

/// What the engine needs of a data stream beyond [`AsyncRead`]: filling a caller's buffer
/// exactly (the engine reads chunk payloads into its pool buffers; [`DataIo`] opens
/// sealed records straight into the buffer instead of copying them out of its record
/// buffer), and turning off the read idle limit where the engine times reads itself.
pub trait DataRead: AsyncRead + Unpin + Send {
    /// Fills `dst` from the stream; an end of stream before it is full is an
    /// `UnexpectedEof` error. If the returned future is dropped before it completes,
    /// the stream may be unusable (later reads fail): it is meant for streams that are
    /// abandoned when a read is cancelled.
    fn read_exact_into<'a>(
        &'a mut self,
        dst: &'a mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        async move {
            tokio::io::AsyncReadExt::read_exact(self, dst).await?;
            Ok(())
        }
    }

    /// Reads are timed by the caller from now on: a stream's own limit on waiting
    /// without progress no longer applies to them (the source's acknowledgement reader,
    /// rightly idle while nothing is in flight on its stream). Writes keep theirs.
    fn reads_timed_by_caller(&mut self) {}
}

impl DataRead for TcpStream {}
impl DataRead for tokio::io::DuplexStream {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> DataRead for DataIo<S> {
    fn reads_timed_by_caller(&mut self) {
        self.read_idle = Idle::new(None);
    }

    async fn read_exact_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        if let Inner::Sealed(s) = &mut self.inner {
            s.check_direct()?;
        }
        let mut pos = 0;
        std::future::poll_fn(|cx| {
            let me = &mut *self;
            match me.poll_join(cx) {
                Poll::Ready(Ok(())) => {}
                r => return me.read_idle.watch(cx, "receiving", r),
            }
            let (r, progressed) = match &mut me.inner {
                Inner::Plain(s) => {
                    let start = pos;
                    let r = loop {
                        if pos == dst.len() {
                            break Poll::Ready(Ok(()));
                        }
                        let mut rb = ReadBuf::new(&mut dst[pos..]);
                        match Pin::new(&mut *s).poll_read(cx, &mut rb) {
                            Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                                break Poll::Ready(Err(io::Error::new(
                                    io::ErrorKind::UnexpectedEof,
                                    "the data stream ended",
                                )));
                            }
                            Poll::Ready(Ok(())) => pos += rb.filled().len(),
                            other => break other,
                        }
                    };
                    (r, pos != start)
                }
                Inner::Sealed(s) => {
                    let rx = s.rx;
                    let r = s.poll_fill(cx, dst, &mut pos);
                    (r, s.rx != rx)
                }
            };
            if progressed {
                me.read_idle.armed = false;
            }
            me.read_idle.watch(cx, "receiving", r)
        })
        .await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> DataWrite for DataIo<S> {
    fn seal_chunk(
        &mut self,
        head: &[&[u8]],
        buf: &mut [u8],
        segments: &[(usize, usize)],
        out: &mut ChunkOut,
    ) {
        match &mut self.inner {
            Inner::Plain(_) => out.plain(head, segments),
            Inner::Sealed(s) => s.seal_chunk(head, buf, segments, out),
        }
    }

    fn poll_write_sealed(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // Through the join's gate, as `poll_write_vectored`.
        self.gated_write(cx, bufs, |inner, cx, bufs| match inner {
            Inner::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            // Records sealed by the ordinary writes go first: they came first.
            Inner::Sealed(s) => match s.poll_drain(cx) {
                Poll::Ready(Ok(())) => Pin::new(&mut s.io).poll_write_vectored(cx, bufs),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    async fn round_trip(protection: DataProtection) {
        let (a, b) = duplex(1 << 16);
        let k = [3u8; 32];
        let mut w = DataIo::new(a, protection, &k, 5, Role::Server, None);
        let mut r = DataIo::new(b, protection, &k, 5, Role::Client, None);
        let payload = data(MAX_RECORD * 3 + 12345);
        let p2 = payload.clone();
        let writer = tokio::spawn(async move {
            let (x, y) = p2.split_at(1000);
            let mut iov = [IoSlice::new(b"hdr"), IoSlice::new(x), IoSlice::new(y)];
            let mut iov: &mut [IoSlice<'_>] = &mut iov;
            while !iov.is_empty() {
                let n = w.write_vectored(iov).await.unwrap();
                IoSlice::advance_slices(&mut iov, n);
            }
            w.write_all(b"end").await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        let mut want = b"hdr".to_vec();
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"end");
        assert_eq!(got.len(), want.len());
        assert!(got == want);
    }

    #[tokio::test]
    async fn records_round_trip() {
        round_trip(DataProtection::Plain).await;
        round_trip(DataProtection::Authenticated).await;
        round_trip(DataProtection::Encrypted).await;
    }

    /// Seals `payload` as the server end of stream 0 and returns the wire bytes.
    async fn wire(protection: DataProtection, payload: &[u8]) -> Vec<u8> {
        let (a, mut b) = duplex(4 << 20);
        let mut w = DataIo::new(a, protection, &[1; 32], 0, Role::Server, None);
        w.write_all(payload).await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        out
    }

    async fn read_back(
        protection: DataProtection,
        wire: Vec<u8>,
        stream: u16,
    ) -> io::Result<Vec<u8>> {
        let (mut a, b) = duplex(4 << 20);
        a.write_all(&wire).await.unwrap();
        drop(a);
        let mut r = DataIo::new(b, protection, &[1; 32], stream, Role::Client, None);
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.map(|_| got)
    }

    #[tokio::test]
    async fn tampering_is_detected() {
        let payload = data(300_000);
        for p in [DataProtection::Authenticated, DataProtection::Encrypted] {
            let clean = wire(p, &payload).await;
            assert_eq!(read_back(p, clean.clone(), 0).await.unwrap(), payload);
            if p == DataProtection::Encrypted {
                assert!(!clean.windows(64).any(|w| payload.starts_with(w)));
            }
            // A flipped bit anywhere (header, body, tag, second record).
            for at in [1, 10, 5000, HEADER_LEN + MAX_RECORD + 2, clean.len() - 1] {
                let mut bad = clean.clone();
                bad[at] ^= 0x10;
                let e = read_back(p, bad, 0).await.unwrap_err();
                assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                    ),
                    "{p:?} flip at {at}: {e}"
                );
            }
            // Records swapped, a record dropped, the stream cut, another stream's key.
            let first = HEADER_LEN + MAX_RECORD + TAG_LEN;
            let mut swapped = clean[first..].to_vec();
            swapped.extend_from_slice(&clean[..first]);
            assert!(read_back(p, swapped, 0).await.is_err());
            assert!(read_back(p, clean[first..].to_vec(), 0).await.is_err());
            assert!(
                read_back(p, clean[..clean.len() - 3].to_vec(), 0)
                    .await
                    .is_err()
            );
            assert!(read_back(p, clean.clone(), 1).await.is_err());
            // An oversized length prefix is refused before anything is buffered.
            let mut huge = vec![0xff, 0xff, 0xff, 0xff];
            huge.extend_from_slice(&[0; 64]);
            assert_eq!(
                read_back(p, huge, 0).await.unwrap_err().kind(),
                io::ErrorKind::InvalidData
            );
        }
    }

    /// `read_exact_into` in pieces of the sizes in `cuts` (cycled), as the engine reads
    /// a frame header, then a payload: records that fit are opened in the caller's
    /// buffer, others (straddling two reads, or an authenticated one at the start of a
    /// read) go through the record buffer. Returns what was read.
    async fn read_in_pieces(
        r: &mut DataIo<tokio::io::DuplexStream>,
        total: usize,
        cuts: &[usize],
    ) -> io::Result<Vec<u8>> {
        let mut got = vec![0u8; total];
        let mut at = 0;
        for &c in cuts.iter().cycle() {
            if at == total {
                break;
            }
            let n = c.min(total - at);
            r.read_exact_into(&mut got[at..at + n]).await?;
            at += n;
        }
        Ok(got)
    }

    #[tokio::test]
    async fn read_exact_into_opens_records_in_place() {
        let payload = data(MAX_RECORD * 5 + 777);
        let cuts: &[&[usize]] = &[
            &[payload.len()],
            &[3, MAX_RECORD * 2 + 10, 1, MAX_RECORD],
            &[HEADER_LEN + MAX_RECORD, 2, MAX_RECORD - 2, 4096],
            &[MAX_RECORD + 1],
        ];
        for p in [
            DataProtection::Plain,
            DataProtection::Authenticated,
            DataProtection::Encrypted,
        ] {
            // Records of every size: one write per record, of varying length.
            let (a, mut b) = duplex(8 << 20);
            let mut w = DataIo::new(a, p, &[1; 32], 0, Role::Server, None);
            let mut sizes = [MAX_RECORD, 1, 1000, MAX_RECORD, 5, 70_000].iter().cycle();
            let mut at = 0;
            while at < payload.len() {
                let n = (*sizes.next().unwrap()).min(payload.len() - at);
                w.write_all(&payload[at..at + n]).await.unwrap();
                w.flush().await.unwrap();
                at += n;
            }
            w.shutdown().await.unwrap();
            drop(w);
            let mut wire = Vec::new();
            b.read_to_end(&mut wire).await.unwrap();
            for c in cuts {
                let (mut x, y) = duplex(8 << 20);
                x.write_all(&wire).await.unwrap();
                drop(x);
                let mut r = DataIo::new(y, p, &[1; 32], 0, Role::Client, None);
                let got = read_in_pieces(&mut r, payload.len(), c).await.unwrap();
                assert!(got == payload, "{p:?} {c:?}");
                // The stream ends cleanly after the last record.
                let mut one = [0u8; 1];
                let e = r.read_exact_into(&mut one).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{p:?}");
            }
            if p == DataProtection::Plain {
                continue;
            }
            // A flipped bit in a record opened in place is caught, and so is a cut.
            for at in [HEADER_LEN + MAX_RECORD + TAG_LEN + 9000, wire.len() - 3] {
                let mut bad = wire.clone();
                bad[at] ^= 1;
                let (mut x, y) = duplex(8 << 20);
                x.write_all(&bad).await.unwrap();
                drop(x);
                let mut r = DataIo::new(y, p, &[1; 32], 0, Role::Client, None);
                let e = read_in_pieces(&mut r, payload.len(), &[7, payload.len()])
                    .await
                    .unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{p:?} at {at}: {e}");
                assert!(e.to_string().contains("failed authentication"), "{e}");
            }
            let (mut x, y) = duplex(8 << 20);
            x.write_all(&wire[..wire.len() / 2]).await.unwrap();
            drop(x);
            let mut r = DataIo::new(y, p, &[1; 32], 0, Role::Client, None);
            let e = read_in_pieces(&mut r, payload.len(), &[payload.len()])
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{p:?}: {e}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn read_exact_into_times_out_only_without_progress() {
        // A peer that sends a record slowly (a byte every 4 s, limit 5 s) is making
        // progress; one that stops is cut off.
        let (mut a, b) = duplex(1 << 20);
        let mut r = DataIo::new(
            b,
            DataProtection::Plain,
            &[0; 32],
            0,
            Role::Server,
            Some(Duration::from_secs(5)),
        );
        let feeder = tokio::spawn(async move {
            for i in 0..4u8 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                a.write_all(&[i]).await.unwrap();
            }
            a
        });
        let mut got = [0u8; 4];
        r.read_exact_into(&mut got).await.unwrap();
        assert_eq!(got, [0, 1, 2, 3]);
        let _a = feeder.await.unwrap();
        let e = r.read_exact_into(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Where the caller times its reads, the stream's limit is off.
        r.reads_timed_by_caller();
        let t = tokio::time::timeout(Duration::from_secs(60), r.read_exact_into(&mut got)).await;
        assert!(t.is_err(), "the read should still be waiting: {t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out() {
        let (a, _b) = duplex(1024);
        let mut r = DataIo::new(
            a,
            DataProtection::Plain,
            &[0; 32],
            0,
            Role::Server,
            Some(Duration::from_secs(5)),
        );
        let mut b = [0u8; 1];
        let e = r.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    /// A client end awaiting its join answer (server proof `[9; 32]`), and the server's end.
    fn awaiting(
        protection: DataProtection,
    ) -> (DataIo<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (a, b) = duplex(4 << 20);
        let io = DataIo::new(a, protection, &[1; 32], 3, Role::Client, None).awaiting_join(
            3,
            [9; 32],
            Duration::from_secs(30),
        );
        (io, b)
    }

    fn join_failed(e: &io::Error) -> JoinFailed {
        JoinFailed::of(e)
            .unwrap_or_else(|| panic!("not a join failure: {e}"))
            .clone()
    }

    #[tokio::test]
    async fn data_goes_out_before_the_join_answer_and_nothing_is_read_before_it() {
        for p in [
            DataProtection::Plain,
            DataProtection::Authenticated,
            DataProtection::Encrypted,
        ] {
            let (mut c, mut s) = awaiting(p);
            // Writes go out at once, up to the early allowance.
            c.write_all(&data(1000)).await.unwrap();
            c.flush().await.unwrap();
            assert!(c.join_pending());
            assert!(c.plain().is_none());
            let mut got = vec![0u8; 100];
            s.read_exact(&mut got).await.unwrap();
            // The server's answer, then its first bytes (a record when sealed).
            let (x, mut y) = duplex(1 << 16);
            let mut w = DataIo::new(x, p, &[1; 32], 3, Role::Server, None);
            w.write_all(b"ack").await.unwrap();
            w.shutdown().await.unwrap();
            drop(w);
            let mut answer = vec![0u8];
            answer.extend_from_slice(&[9; 32]);
            y.read_to_end(&mut answer).await.unwrap();
            s.write_all(&answer).await.unwrap();
            let mut b = [0u8; 3];
            c.read_exact_into(&mut b).await.unwrap();
            assert_eq!(&b, b"ack", "{p:?}");
            assert!(!c.join_pending());
        }
    }

    #[tokio::test]
    async fn a_bad_answer_fails_every_read_and_write() {
        let mut bad_proof = vec![0u8];
        bad_proof.extend_from_slice(&[8; 32]);
        let cases: [(&[u8], JoinFailed); 4] = [
            (&bad_proof, JoinFailed::BadProof { stream: 3 }),
            (
                &[2],
                JoinFailed::Refused {
                    stream: 3,
                    status: JoinStatus::BadProof,
                },
            ),
            (
                &[7],
                JoinFailed::BadStatus {
                    stream: 3,
                    value: 7,
                },
            ),
            (
                &bad_proof[..20],
                JoinFailed::Broken {
                    stream: 3,
                    kind: io::ErrorKind::UnexpectedEof,
                    message: "the server closed data stream 3 before answering its join".into(),
                },
            ),
        ];
        for (answer, want) in cases {
            let (mut c, mut s) = awaiting(DataProtection::Authenticated);
            c.write_all(b"chunk").await.unwrap();
            c.flush().await.unwrap();
            // What follows the answer (a forged acknowledgement) is never returned.
            s.write_all(answer).await.unwrap();
            if matches!(want, JoinFailed::Broken { .. }) {
                drop(s);
                let (x, y) = duplex(64);
                drop(x);
                s = y;
            } else {
                s.write_all(&[0; 64]).await.unwrap();
            }
            let mut b = [0u8; 8];
            let e = c.read(&mut b).await.unwrap_err();
            assert_eq!(join_failed(&e), want);
            let e = c.read_exact_into(&mut b).await.unwrap_err();
            assert_eq!(join_failed(&e), want);
            let e = c.write_all(b"more").await.unwrap_err();
            assert_eq!(join_failed(&e), want);
            assert!(c.join_pending());
            drop(s);
        }
    }

    #[tokio::test]
    async fn a_refusal_is_reported_instead_of_the_write_error_it_caused() {
        // The server refused the join and closed: the client's writes fail, but what
        // it reports is the refusal (the status byte it had not read yet).
        let (c, mut s) = awaiting(DataProtection::Encrypted);
        s.write_all(&[JoinStatus::UnknownSession as u8])
            .await
            .unwrap();
        drop(s);
        let (mut rd, mut wr) = tokio::io::split(c);
        let writer = async {
            let big = data(EARLY_BYTES / 2);
            loop {
                wr.write_all(&big).await?;
                wr.flush().await?;
            }
            #[allow(unreachable_code)]
            Ok::<(), io::Error>(())
        };
        let reader = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut b = [0u8; 8];
            rd.read(&mut b).await
        };
        let (w, r) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(writer, reader)
        })
        .await
        .expect("the writer should not hang");
        let want = JoinFailed::Refused {
            stream: 3,
            status: JoinStatus::UnknownSession,
        };
        assert_eq!(join_failed(&w.unwrap_err()), want);
        assert_eq!(join_failed(&r.unwrap_err()), want);
    }

    #[tokio::test]
    async fn writes_past_the_early_allowance_wait_for_the_answer() {
        let (mut c, mut s) = awaiting(DataProtection::Plain);
        let (mut rd, mut wr) = tokio::io::split(&mut c);
        let n = EARLY_BYTES + 4096;
        let payload = data(n);
        let write = async {
            wr.write_all(&payload).await.unwrap();
            wr.flush().await.unwrap();
        };
        tokio::pin!(write);
        // Without the answer, the write stops at the allowance.
        let stalled = tokio::time::timeout(Duration::from_millis(300), &mut write).await;
        assert!(
            stalled.is_err(),
            "the write should wait for the join answer"
        );
        let mut got = vec![0u8; EARLY_BYTES];
        s.read_exact(&mut got).await.unwrap();
        let mut extra = [0u8; 1];
        let more = tokio::time::timeout(Duration::from_millis(100), s.read(&mut extra)).await;
        assert!(more.is_err(), "bytes past the allowance went out: {more:?}");
        // The answer comes; a read takes it, and the write goes on.
        let mut answer = vec![0u8];
        answer.extend_from_slice(&[9; 32]);
        s.write_all(&answer).await.unwrap();
        let read = async {
            let mut b = [0u8; 1];
            rd.read(&mut b).await
        };
        let drain = async {
            let mut rest = vec![0u8; n - EARLY_BYTES];
            s.read_exact(&mut rest).await.unwrap();
            got.extend_from_slice(&rest);
            s.write_all(b"x").await.unwrap();
        };
        let (_, r, ()) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(write, read, drain)
        })
        .await
        .expect("the write should go on after the answer");
        assert_eq!(r.unwrap(), 1);
        assert!(got == payload);
    }

    /// The chunk writer's path (`poll_write_sealed`) is held at the allowance too.
    #[tokio::test]
    async fn sealed_writes_past_the_early_allowance_wait_for_the_answer() {
        let (mut c, mut s) = awaiting(DataProtection::Authenticated);
        let bytes = data(EARLY_BYTES + 4096);
        let mut taken = 0usize;
        let write = std::future::poll_fn(|cx| {
            while taken < bytes.len() {
                let n = ready!(c.poll_write_sealed(cx, &[IoSlice::new(&bytes[taken..])]))?;
                taken += n;
            }
            Poll::Ready(Ok::<_, io::Error>(()))
        });
        let stalled = tokio::time::timeout(Duration::from_millis(300), write).await;
        assert!(
            stalled.is_err(),
            "the write should wait for the join answer"
        );
        assert_eq!(taken, EARLY_BYTES);
        let mut got = vec![0u8; EARLY_BYTES];
        s.read_exact(&mut got).await.unwrap();
        let mut extra = [0u8; 1];
        let more = tokio::time::timeout(Duration::from_millis(100), s.read(&mut extra)).await;
        assert!(more.is_err(), "bytes past the allowance went out: {more:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_join_answer_times_out() {
        let (mut c, _s) = awaiting(DataProtection::Authenticated);
        let mut b = [0u8; 8];
        let e = c.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            join_failed(&e),
            JoinFailed::Timeout {
                stream: 3,
                secs: 30
            }
        );
    }
}
