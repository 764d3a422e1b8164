//! Bandwidth limits: a token bucket shared by every data stream of a session
//! ([`Pacer`]), and a data stream that waits on it ([`Paced`]).
//!
//! A source paces its sends: [`ChunkTx::send_chunk_paced`] waits on the bucket before
//! each window of at most [`SEND_WINDOW`] payload bytes ([`DataIo`](crate::stream::DataIo)'s
//! streams send in such windows; a transport that does not override it waits for a
//! whole chunk before sending it). A sink paces its reads: [`Paced`]'s
//! [`DataLink::recv_into`] waits before each piece of at most [`SEND_WINDOW`] bytes,
//! so the sender's data waits in the socket buffers and TCP's flow control slows it.
//! Either way a 16 MiB chunk at 10 Mbit/s goes out over 13 s in 1 MiB steps rather
//! than in one burst after 13 s of silence.
//!
//! The bucket is hand-rolled rather than a crate's (`governor`): it is a few lines of
//! GCRA (virtual scheduling) that takes a caller's clock, so it is tested
//! deterministically; it hands out reservations of any size in arrival order (a
//! waiter reserves at once and sleeps its own time: no polling, no starvation of a
//! large piece by small ones), sleeps on tokio's timer, and counts bytes in `u64`
//! (governor's cells are `u32` and a request may not exceed its burst).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use dmover_proto::data::HEADER_LEN;

use crate::transport::{ChunkFrame, ChunkTx, DataLink, SEND_WINDOW};

/// How far ahead of the rate a bucket lets its users get (its depth in time): an idle
/// bucket lets `rate × BURST` bytes through at once, and a waiter woken a little late
/// (the timer's granularity, a busy core) loses no rate as long as it is later by less.
pub const BURST: Duration = Duration::from_millis(50);

/// A token bucket of `rate` bytes per second, shared by the data streams of one
/// transfer (GCRA: the theoretical time at which everything reserved so far has gone
/// out at the rate).
#[derive(Debug)]
pub struct Pacer {
    rate: u64,
    /// When everything reserved so far has gone out at the rate.
    tat: parking_lot::Mutex<Option<Instant>>,
}

impl Pacer {
    /// A bucket of `rate` bytes per second (at least 1).
    pub fn new(rate: u64) -> Arc<Self> {
        Arc::new(Pacer {
            rate: rate.max(1),
            tat: parking_lot::Mutex::new(None),
        })
    }

    /// The rate, in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The time `n` bytes take at the rate (rounded up to the nanosecond).
    fn time_of(&self, n: u64) -> Duration {
        let nanos = (u128::from(n) * 1_000_000_000).div_ceil(u128::from(self.rate));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Reserves `n` bytes at `now`: returns how long the caller must wait before
    /// moving them. Reservations are served in the order they are made; the wait of
    /// each is the time the bytes reserved before it, and its own, take at the rate,
    /// less [`BURST`].
    pub fn reserve_at(&self, n: u64, now: Instant) -> Duration {
        let mut tat = self.tat.lock();
        let start = match *tat {
            Some(t) if t > now => t,
            _ => now,
        };
        let end = start
            .checked_add(self.time_of(n))
            .unwrap_or(start + Duration::from_secs(1 << 40));
        *tat = Some(end);
        end.saturating_duration_since(now + BURST)
    }

    /// Waits until `n` more bytes may move.
    pub async fn take(&self, n: u64) {
        let wait = self.reserve_at(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// A data stream whose transfer is limited by a [`Pacer`] (none: the stream itself).
pub struct Paced<L> {
    inner: L,
    pacer: Option<Arc<Pacer>>,
}

impl<L> Paced<L> {
    /// Wraps `inner`, pacing it with `pacer`.
    pub fn new(inner: L, pacer: Option<Arc<Pacer>>) -> Self {
        Paced { inner, pacer }
    }

    /// The stream it wraps.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }
}

/// The chunk-writing half of a [`Paced`] stream.
pub struct PacedTx<T> {
    inner: T,
    pacer: Option<Arc<Pacer>>,
}

impl<L: DataLink> DataLink for Paced<L> {
    type Tx = PacedTx<L::Tx>;
    type Acks = L::Acks;

    fn into_source(self) -> (Self::Tx, Self::Acks) {
        let (tx, acks) = self.inner.into_source();
        (
            PacedTx {
                inner: tx,
                pacer: self.pacer,
            },
            acks,
        )
    }

    fn recv_header(&mut self) -> impl Future<Output = io::Result<[u8; HEADER_LEN]>> + Send {
        self.inner.recv_header()
    }

    fn reads_timed_by_caller(&mut self) {
        self.inner.reads_timed_by_caller();
    }

    fn probe(&self) -> Option<crate::link::Probe> {
        self.inner.probe()
    }

    async fn recv_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let Some(p) = &self.pacer else {
            return self.inner.recv_into(dst).await;
        };
        for piece in dst.chunks_mut(SEND_WINDOW) {
            p.take(piece.len() as u64).await;
            self.inner.recv_into(piece).await?;
        }
        Ok(())
    }

    fn send_ack(&mut self, frames: u64) -> impl Future<Output = io::Result<()>> + Send {
        self.inner.send_ack(frames)
    }

    fn cut(&mut self, reset: bool) {
        self.inner.cut(reset);
    }
}

impl<T: ChunkTx> ChunkTx for PacedTx<T> {
    async fn send_chunk(&mut self, f: ChunkFrame<'_>, buf: &mut [u8]) -> io::Result<()> {
        match &self.pacer {
            Some(p) => self.inner.send_chunk_paced(f, buf, p).await,
            None => self.inner.send_chunk(f, buf).await,
        }
    }

    fn send_end(&mut self, sent: u64) -> impl Future<Output = io::Result<()>> + Send {
        self.inner.send_end(sent)
    }

    fn cut(&mut self, reset: bool) {
        self.inner.cut(reset);
    }

    fn zerocopy(&mut self) -> Result<(), String> {
        self.inner.zerocopy()
    }

    fn zerocopy_stats(&self) -> Option<crate::zerocopy::ZeroCopyStats> {
        self.inner.zerocopy_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::DataIo;
    use dmover_proto::auth::Role;
    use dmover_proto::control::DataProtection;
    use dmover_proto::data::{FrameHeader, FrameLimits};

    const MS: Duration = Duration::from_millis(1);

    /// On a manual clock: an idle bucket lets [`BURST`] through at once, then every
    /// reservation waits its turn at the rate, in order, whoever makes it; idle time
    /// beyond the burst is not saved up.
    #[test]
    fn the_bucket_keeps_the_rate_on_a_manual_clock() {
        let t0 = Instant::now();
        // 1 MB/s: 1000 bytes a millisecond; the burst is 50 ms = 50 000 bytes.
        let p = Pacer::new(1_000_000);
        assert_eq!(p.reserve_at(50_000, t0), Duration::ZERO, "the burst");
        assert_eq!(p.reserve_at(1000, t0), MS, "then the rate");
        assert_eq!(p.reserve_at(10_000, t0), 11 * MS);
        // Another stream, a little later, queues behind both.
        assert_eq!(p.reserve_at(1, t0 + 5 * MS), Duration::from_micros(6001));
        // 8 MB in 1 MiB-ish pieces from four streams in turn: the last may go at
        // 8 s + what came before, less the burst, never sooner.
        let p = Pacer::new(1_000_000);
        let mut last = Duration::ZERO;
        for i in 0..8u32 {
            last = p.reserve_at(1_000_000, t0 + (i % 4) * MS);
        }
        assert_eq!(last + 3 * MS, Duration::from_secs(8) - BURST);
        // An idle bucket starts again from now with one burst, not from its past.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(p.reserve_at(50_000, later), Duration::ZERO);
        assert_eq!(p.reserve_at(2000, later), 2 * MS);
        // Rates round the wait up, never down; huge requests saturate.
        let p = Pacer::new(3);
        assert_eq!(
            p.reserve_at(1, t0) + BURST,
            Duration::from_nanos(333_333_334)
        );
        let p = Pacer::new(0);
        assert_eq!(p.rate(), 1);
        assert!(p.reserve_at(u64::MAX, t0) > Duration::from_secs(1 << 30));
    }

    fn pair() -> (
        DataIo<tokio::io::DuplexStream>,
        DataIo<tokio::io::DuplexStream>,
    ) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let key = [9u8; 32];
        let p = DataProtection::Authenticated;
        (
            DataIo::new(a, p, &key, 0, Role::Client, None),
            DataIo::new(b, p, &key, 0, Role::Server, None),
        )
    }

    /// Through real streams on tokio's paused clock: 3 MiB sent by a paced source take
    /// 3 MiB / rate (less the burst), and so do 3 MiB read by a paced sink; the bytes
    /// arrive unchanged.
    #[tokio::test(start_paused = true)]
    async fn paced_sends_and_reads_take_their_time() {
        let rate = 10 << 20; // 10 MiB/s: 3 MiB take 300 ms.
        let n = 3 * SEND_WINDOW;
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let limits = FrameLimits {
            max_payload: 1 << 26,
            max_digests: 16,
        };
        for sink_paces in [false, true] {
            let (src, dst) = pair();
            let pacer = Pacer::new(rate);
            let (src_pacer, dst_pacer) = if sink_paces {
                (None, Some(pacer))
            } else {
                (Some(pacer), None)
            };
            let (mut tx, _acks) = Paced::new(src, src_pacer).into_source();
            let mut rx = Paced::new(dst, dst_pacer);
            let start = tokio::time::Instant::now();
            let sent = data.clone();
            let sender = tokio::spawn(async move {
                let segs = [(0, n)];
                let mut buf = sent;
                let f = ChunkFrame {
                    chunk: 0,
                    crc: None,
                    digests: &[],
                    segments: &segs,
                    zeros: false,
                    part: None,
                };
                tx.send_chunk(f, &mut buf).await.unwrap();
            });
            let h = FrameHeader::decode(&rx.recv_header().await.unwrap(), &limits).unwrap();
            assert_eq!(h.payload_len as usize, n);
            let mut got = vec![0u8; n];
            rx.recv_into(&mut got).await.unwrap();
            sender.await.unwrap();
            let took = start.elapsed();
            assert!(got == data, "the payload arrives unchanged");
            let least = Duration::from_millis(300) - BURST;
            assert!(
                took >= least,
                "sink paces: {sink_paces}: {took:?} < {least:?}"
            );
            assert!(took < Duration::from_millis(400), "{took:?}");
        }
    }
}
