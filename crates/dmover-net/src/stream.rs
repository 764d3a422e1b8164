//! Data streams after their join: plain bytes or AES-256-GCM records
//! ([`dmover_proto::record`]), with idle timeouts.
//!
//! Sealing and opening happen in the task that reads or writes the stream, so a
//! session's N streams spread the cryptography over the runtime's threads: throughput
//! scales with cores as streams do.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use dmover_proto::auth::{Role, record_key};
use dmover_proto::control::DataProtection;
use dmover_proto::record::{self, HEADER_LEN, MAX_RECORD, TAG_LEN};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

fn key(k: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k).expect("a 32-byte AES-256 key"))
}

/// A stream carrying AES-256-GCM records: authenticated (GMAC over the plaintext) or
/// encrypted, as [`DataProtection`] says.
pub struct Sealed<S> {
    io: S,
    encrypt: bool,
    wkey: LessSafeKey,
    wseq: u64,
    /// Sealed bytes not yet written, from `wpos`.
    wbuf: Vec<u8>,
    wpos: usize,
    rkey: LessSafeKey,
    rseq: u64,
    /// The record being received, then its opened plaintext at `pstart..pend`.
    rbuf: Box<[u8]>,
    rlen: usize,
    pstart: usize,
    pend: usize,
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
            wkey: key(&record_key(session_key, stream, me)),
            wseq: 0,
            wbuf: Vec::with_capacity(HEADER_LEN + MAX_RECORD + TAG_LEN),
            wpos: 0,
            rkey: key(&record_key(session_key, stream, peer)),
            rseq: 0,
            rbuf: vec![0u8; HEADER_LEN + MAX_RECORD + TAG_LEN].into_boxed_slice(),
            rlen: 0,
            pstart: 0,
            pend: 0,
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
        let nonce = Nonce::assume_unique_for_key(record::nonce(self.wseq));
        self.wseq += 1;
        let tag = if self.encrypt {
            self.wkey.seal_in_place_separate_tag(
                nonce,
                Aad::from(header),
                &mut self.wbuf[HEADER_LEN..],
            )
        } else {
            self.wkey
                .seal_in_place_separate_tag(nonce, Aad::from(&self.wbuf[..]), &mut [])
        }
        .expect("sealing a record within AES-GCM's limits");
        self.wbuf.extend_from_slice(tag.as_ref());
        taken
    }

    /// Opens the complete record in `rbuf[..total]`, leaving its plaintext at
    /// `pstart..pend`.
    fn open(&mut self, body: usize) -> io::Result<()> {
        let nonce = Nonce::assume_unique_for_key(record::nonce(self.rseq));
        self.rseq += 1;
        let total = HEADER_LEN + body + TAG_LEN;
        let ok = if self.encrypt {
            let header: [u8; HEADER_LEN] = self.rbuf[..HEADER_LEN].try_into().unwrap();
            self.rkey
                .open_in_place(nonce, Aad::from(header), &mut self.rbuf[HEADER_LEN..total])
                .is_ok()
        } else {
            let (aad, tag) = self.rbuf[..total].split_at_mut(HEADER_LEN + body);
            self.rkey
                .open_in_place(nonce, Aad::from(&*aad), tag)
                .is_ok()
        };
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "data record {} failed authentication: the data was altered, injected or \
                     replayed on the way",
                    self.rseq - 1
                ),
            ));
        }
        self.pstart = HEADER_LEN;
        self.pend = HEADER_LEN + body;
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sealed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
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
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the data stream ended inside a record",
                )));
            }
            me.rlen += n;
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
        }
    }

    /// The underlying connection when the stream is plain (bytes written to it arrive
    /// unchanged), for zero-copy sends; `None` for sealed streams.
    pub fn plain(&self) -> Option<&S> {
        match &self.inner {
            Inner::Plain(s) => Some(s),
            Inner::Sealed(_) => None,
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
        let r = match &mut me.inner {
            Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Sealed(s) => Pin::new(&mut **s).poll_read(cx, buf),
        };
        match r {
            Poll::Ready(r) => {
                me.read_idle.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending if me.read_idle.expired(cx) => {
                Poll::Ready(Err(me.read_idle.error("receiving")))
            }
            Poll::Pending => Poll::Pending,
        }
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
        let me = &mut *self;
        let r = match &mut me.inner {
            Inner::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Sealed(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        };
        match r {
            Poll::Ready(r) => {
                me.write_idle.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending if me.write_idle.expired(cx) => {
                Poll::Ready(Err(me.write_idle.error("sending")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Plain(s) => s.is_write_vectored(),
            Inner::Sealed(_) => true,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let r = match &mut me.inner {
            Inner::Plain(s) => Pin::new(s).poll_flush(cx),
            Inner::Sealed(s) => Pin::new(&mut **s).poll_flush(cx),
        };
        match r {
            Poll::Ready(r) => {
                me.write_idle.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending if me.write_idle.expired(cx) => {
                Poll::Ready(Err(me.write_idle.error("sending")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Inner::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Sealed(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
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
}
