//! Faults injected at the transport seam, for tests (the idea of WDT's network error
//! simulator): a [`Faulty`] data stream behaves as the one it wraps, except that it
//! may break the connection in the middle of a chunk, or go silent there (nothing
//! moves on it any more and nobody is told, as when a path blackholes). With no plan it is the stream it
//! wraps (one branch per chunk). Slow storage is the storage's fault, not the
//! transport's: `dmover serve --debug-chunk-delay-ms` slows the server's reads and
//! writes.
//!
//! The plan comes from the application (`dmover serve`'s hidden `--debug-*` flags, or
//! a test); no option struct of the engine carries it.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dmover_proto::data::HEADER_LEN;

use crate::pace::Pacer;
use crate::transport::{ChunkFrame, ChunkTx, DataLink};

/// What goes wrong, shared by every data stream it is given to.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// The first stream whose chunk payload passes this many bytes (sent or received)
    /// is cut in the middle of that chunk; `true`: with a TCP reset. Once per plan.
    pub cut_after: Option<(u64, bool)>,
    /// The stream goes silent there instead of being cut ([`FaultPlan::silence`]).
    silent: bool,
    cut_done: AtomicBool,
    /// Chunk payload bytes moved on the streams it was given to.
    moved: AtomicU64,
}

/// What happens to the stream a plan picks.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// Cut (`true`: with a reset).
    Cut(bool),
    /// Silent from then on: every send and receive waits for ever.
    Silence,
}

impl FaultPlan {
    /// A plan that cuts one stream.
    pub fn new(cut_after: Option<(u64, bool)>) -> Arc<Self> {
        Arc::new(FaultPlan {
            cut_after,
            silent: false,
            cut_done: AtomicBool::new(false),
            moved: AtomicU64::new(0),
        })
    }

    /// A plan that silences the first stream whose chunk payload passes `after` bytes,
    /// in the middle of that chunk: from then on its sends and receives never finish
    /// and it is not closed (the other end must notice by time).
    pub fn silence(after: u64) -> Arc<Self> {
        Arc::new(FaultPlan {
            cut_after: Some((after, false)),
            silent: true,
            cut_done: AtomicBool::new(false),
            moved: AtomicU64::new(0),
        })
    }

    /// Whether a stream was cut.
    pub fn cut_done(&self) -> bool {
        self.cut_done.load(Ordering::SeqCst)
    }

    /// Chunk payload bytes moved (sent or received) on the streams given this plan.
    pub fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// Whether a stream that moved `moved` bytes and is about to move `more` is the one
    /// to cut or silence (once per plan).
    fn fate(&self, moved: u64, more: u64) -> Option<Fate> {
        let (after, reset) = self.cut_after?;
        let picked = moved + more > after && !self.cut_done.swap(true, Ordering::SeqCst);
        picked.then_some(if self.silent {
            Fate::Silence
        } else {
            Fate::Cut(reset)
        })
    }
}

/// What a silenced stream's calls do: wait for ever.
async fn silence<T>() -> io::Result<T> {
    std::future::pending().await
}

fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "connection cut (fault injection)",
    )
}

/// A data stream with faults from a [`FaultPlan`] (none: the stream itself).
pub struct Faulty<L> {
    inner: L,
    plan: Option<Arc<FaultPlan>>,
    moved: u64,
    cut: bool,
    silent: bool,
}

impl<L> Faulty<L> {
    /// Wraps `inner` with `plan`'s faults.
    pub fn new(inner: L, plan: Option<Arc<FaultPlan>>) -> Self {
        Faulty {
            inner,
            plan,
            moved: 0,
            cut: false,
            silent: false,
        }
    }

    /// The stream it wraps.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }
}

/// The chunk-writing half of a [`Faulty`] stream.
pub struct FaultyTx<T> {
    inner: T,
    plan: Option<Arc<FaultPlan>>,
    moved: u64,
    cut: bool,
    silent: bool,
}

impl<L: DataLink> DataLink for Faulty<L> {
    type Tx = FaultyTx<L::Tx>;
    type Acks = L::Acks;

    fn into_source(self) -> (Self::Tx, Self::Acks) {
        let (tx, acks) = self.inner.into_source();
        (
            FaultyTx {
                inner: tx,
                plan: self.plan,
                moved: self.moved,
                cut: self.cut,
                silent: self.silent,
            },
            acks,
        )
    }

    async fn recv_header(&mut self) -> io::Result<[u8; HEADER_LEN]> {
        if self.silent {
            return silence().await;
        }
        if self.cut {
            return Err(cut_error());
        }
        self.inner.recv_header().await
    }

    fn reads_timed_by_caller(&mut self) {
        self.inner.reads_timed_by_caller();
    }

    fn probe(&self) -> Option<crate::link::Probe> {
        self.inner.probe()
    }

    async fn recv_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        if self.silent {
            return silence().await;
        }
        if self.cut {
            return Err(cut_error());
        }
        let more = dst.len() as u64;
        match self.plan.as_ref().and_then(|p| p.fate(self.moved, more)) {
            // In the middle of a frame: its chunk is lost with the stream.
            Some(Fate::Cut(reset)) => {
                self.cut = true;
                self.inner.cut(reset);
                return Err(cut_error());
            }
            Some(Fate::Silence) => {
                self.silent = true;
                return silence().await;
            }
            None => {}
        }
        self.inner.recv_into(dst).await?;
        self.moved += more;
        if let Some(p) = &self.plan {
            p.moved.fetch_add(more, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn send_ack(&mut self, frames: u64) -> io::Result<()> {
        if self.silent {
            return silence().await;
        }
        if self.cut {
            return Err(cut_error());
        }
        self.inner.send_ack(frames).await
    }

    fn cut(&mut self, reset: bool) {
        self.cut = true;
        self.inner.cut(reset);
    }
}

impl<T: ChunkTx> FaultyTx<T> {
    /// Whether the stream is (now) cut or silent before a chunk of `more` payload
    /// bytes: a cut is an error, a silent stream waits for ever.
    async fn cuts(&mut self, more: u64) -> io::Result<()> {
        if self.silent {
            return silence().await;
        }
        if self.cut {
            return Err(cut_error());
        }
        if let Some(p) = &self.plan {
            match p.fate(self.moved, more) {
                Some(Fate::Cut(reset)) => {
                    self.cut = true;
                    self.inner.cut(reset);
                    return Err(cut_error());
                }
                Some(Fate::Silence) => {
                    self.silent = true;
                    return silence().await;
                }
                None => {
                    self.moved += more;
                    p.moved.fetch_add(more, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }
}

impl<T: ChunkTx> ChunkTx for FaultyTx<T> {
    async fn send_chunk(&mut self, f: ChunkFrame<'_>, buf: &mut [u8]) -> io::Result<()> {
        self.cuts(f.payload_len() as u64).await?;
        self.inner.send_chunk(f, buf).await
    }

    async fn send_chunk_paced<'a>(
        &'a mut self,
        f: ChunkFrame<'a>,
        buf: &'a mut [u8],
        pacer: &'a Pacer,
    ) -> io::Result<()> {
        self.cuts(f.payload_len() as u64).await?;
        self.inner.send_chunk_paced(f, buf, pacer).await
    }

    async fn send_end(&mut self, sent: u64) -> io::Result<()> {
        if self.silent {
            return silence().await;
        }
        if self.cut {
            return Err(cut_error());
        }
        self.inner.send_end(sent).await
    }

    fn cut(&mut self, reset: bool) {
        self.cut = true;
        self.inner.cut(reset);
    }

    fn zerocopy(&mut self) -> Result<(), String> {
        self.inner.zerocopy()
    }

    fn zerocopy_stats(&self) -> Option<crate::zerocopy::ZeroCopyStats> {
        self.inner.zerocopy_stats()
    }
}
