//! The userspace link: one thread per direction moves packets from one namespace's
//! TUN device to the other's, through a [`Shaper`] (rate, tail-drop queue, delay) and
//! per-segment random loss, holding them in a [`Ring`] until their release time.
//!
//! Each thread blocks in `poll` on its input device and a stop `eventfd`, with a
//! timeout at the next release time, so an idle link costs nothing. Timer slack is set
//! to 1 µs so the wake-ups land close to the release times; how late they land anyway
//! is measured and reported, as is each thread's CPU time, so a user can tell when the
//! emulator rather than the tool under test is the limit.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustix::event::{PollFd, PollFlags};
use serde::{Deserialize, Serialize};

use crate::NetlabError;
use crate::packet::{self, VNET_HDR_LEN};
use crate::ring::Ring;
use crate::shaper::{Shaper, Verdict};

/// Largest packet the TUN device hands over: a 64 KiB super-packet and its header.
const MAX_PACKET: usize = 65_536 + VNET_HDR_LEN;
/// Packets read in one go before looking at the release queue again.
const READ_BATCH: usize = 64;
/// Lateness histogram buckets: bucket `i` holds `[2^(i-1), 2^i)` µs (bucket 0: < 1 µs).
const LATE_BUCKETS: usize = 32;

/// Configuration of one direction of the link.
#[derive(Debug, Clone)]
pub(crate) struct DirectionConfig {
    /// Name for the thread and reports (`a->b`).
    pub name: String,
    /// Bottleneck rate, bits per second.
    pub rate_bps: Option<u64>,
    /// Bottleneck queue, bytes.
    pub queue_bytes: u64,
    /// One-way delay.
    pub delay: Duration,
    /// Loss probability per segment.
    pub loss: f64,
    /// Ring capacity in bytes.
    pub ring_bytes: usize,
    /// CPU to pin the thread to.
    pub cpu: Option<usize>,
    /// Run under SCHED_FIFO.
    pub realtime: bool,
    /// Seed of the loss draws.
    pub seed: u64,
}

/// Counters of one direction, updated by its thread.
#[derive(Debug, Default)]
struct Counters {
    packets_in: AtomicU64,
    segments_in: AtomicU64,
    packets_out: AtomicU64,
    segments_out: AtomicU64,
    bytes_out: AtomicU64,
    loss_drops: AtomicU64,
    queue_drops: AtomicU64,
    overflow_drops: AtomicU64,
    write_errors: AtomicU64,
    peak_queue_bytes: AtomicU64,
    late_sum_ns: AtomicU64,
    late_max_ns: AtomicU64,
    late_hist: [AtomicU64; LATE_BUCKETS],
    failed: AtomicBool,
}

/// What one direction of the link has done so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectionStats {
    /// Packets read from the sending side (a super-packet counts once).
    pub packets_in: u64,
    /// Wire segments those packets stand for (MSS-sized pieces of super-packets).
    pub segments_in: u64,
    /// Packets delivered to the receiving side.
    pub packets_out: u64,
    /// Wire segments delivered.
    pub segments_out: u64,
    /// Bytes delivered, counted as on the wire (IP headers of every segment included).
    pub bytes_out: u64,
    /// Segments dropped by the random loss.
    pub loss_drops: u64,
    /// Segments tail-dropped because the bottleneck queue was full.
    pub queue_drops: u64,
    /// Segments dropped because the forwarder's ring was full (should stay 0: the ring
    /// holds the queue plus a one-way delay's worth at the link rate).
    pub overflow_drops: u64,
    /// Packets the receiving device refused.
    pub write_errors: u64,
    /// Largest bottleneck backlog seen, bytes.
    pub peak_queue_bytes: u64,
    /// CPU time of this direction's thread, seconds (includes the kernel's receive
    /// processing it triggers when it hands packets over).
    pub cpu_seconds: f64,
    /// Mean of how late packets were released after their due time, microseconds.
    pub late_mean_us: f64,
    /// Median of the release lateness (upper bound of its histogram bucket),
    /// microseconds.
    #[serde(default)]
    pub late_p50_us: f64,
    /// 99th percentile of the release lateness (upper bound of its histogram bucket),
    /// microseconds.
    pub late_p99_us: f64,
    /// Worst release lateness, microseconds.
    pub late_max_us: f64,
    /// Whether the thread stopped on an error (the link is broken).
    pub failed: bool,
}

impl DirectionStats {
    /// Fraction of offered segments lost to the random loss.
    pub fn loss_fraction(&self) -> f64 {
        if self.segments_in == 0 {
            0.0
        } else {
            self.loss_drops as f64 / self.segments_in as f64
        }
    }
}

/// What the forwarder has done since the lab came up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForwarderStats {
    /// Seconds since the forwarder started.
    pub elapsed_seconds: f64,
    /// Traffic from host a to host b.
    pub a_to_b: DirectionStats,
    /// Traffic from host b to host a.
    pub b_to_a: DirectionStats,
    /// What made the link (with [`crate::Emulator::Netem`] the counters stay zero).
    #[serde(default)]
    pub emulator: crate::Emulator,
    /// Whether the TUN devices hand over UDP super-packets (UDP segmentation offload):
    /// without it, a `UDP_SEGMENT` sender's datagrams cross one read each.
    #[serde(default)]
    pub uso: bool,
}

/// A forwarder thread busier than this fraction of a core is the link's limit, not
/// the tool's: it has no slack left to absorb bursts, and past it packets queue in
/// the TUN device, unseen by the shaper, and leave late.
pub const LIMIT_CPU_FRACTION: f64 = 0.8;
/// Release lateness (99th percentile) above which the emulated delay is no longer
/// what was asked: 1 ms is 10 % of a 10 ms RTT and what a TCP RTT estimate and a
/// pacing rate start to notice.
pub const LIMIT_LATE_P99_US: f64 = 1000.0;

impl ForwarderStats {
    /// The forwarder's CPU use over its life, in cores (1.0 = one core busy).
    pub fn cpu_cores(&self) -> f64 {
        if self.elapsed_seconds <= 0.0 {
            0.0
        } else {
            (self.a_to_b.cpu_seconds + self.b_to_a.cpu_seconds) / self.elapsed_seconds
        }
    }

    /// The busiest direction's CPU use, as a fraction of one core (each direction is
    /// one thread, so 1.0 is its ceiling).
    pub fn busiest_thread_cpu(&self) -> f64 {
        if self.elapsed_seconds <= 0.0 {
            0.0
        } else {
            self.a_to_b.cpu_seconds.max(self.b_to_a.cpu_seconds) / self.elapsed_seconds
        }
    }

    /// Why a measurement over this interval was limited by the forwarder rather than
    /// the tool under test, if it was: a thread above [`LIMIT_CPU_FRACTION`] of a core,
    /// or a 99th-percentile release lateness above [`LIMIT_LATE_P99_US`].
    pub fn limited(&self) -> Option<String> {
        if self.emulator != crate::Emulator::Forwarder {
            return None;
        }
        let mut why = Vec::new();
        let cpu = self.busiest_thread_cpu();
        if cpu > LIMIT_CPU_FRACTION {
            why.push(format!("cpu {:.0}% of a core", cpu * 100.0));
        }
        let late = self.a_to_b.late_p99_us.max(self.b_to_a.late_p99_us);
        if late > LIMIT_LATE_P99_US {
            why.push(format!("late p99 {late:.0} us"));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }

    /// The change from `earlier` to `self`, for measuring one interval (counters and
    /// CPU are subtracted; lateness and peaks are kept from `self`, which covers the
    /// whole life).
    pub fn since(&self, earlier: &ForwarderStats) -> ForwarderStats {
        fn d(a: &DirectionStats, b: &DirectionStats) -> DirectionStats {
            DirectionStats {
                packets_in: a.packets_in - b.packets_in,
                segments_in: a.segments_in - b.segments_in,
                packets_out: a.packets_out - b.packets_out,
                segments_out: a.segments_out - b.segments_out,
                bytes_out: a.bytes_out - b.bytes_out,
                loss_drops: a.loss_drops - b.loss_drops,
                queue_drops: a.queue_drops - b.queue_drops,
                overflow_drops: a.overflow_drops - b.overflow_drops,
                write_errors: a.write_errors - b.write_errors,
                cpu_seconds: a.cpu_seconds - b.cpu_seconds,
                ..a.clone()
            }
        }
        ForwarderStats {
            elapsed_seconds: self.elapsed_seconds - earlier.elapsed_seconds,
            a_to_b: d(&self.a_to_b, &earlier.a_to_b),
            b_to_a: d(&self.b_to_a, &earlier.b_to_a),
            emulator: self.emulator,
            uso: self.uso,
        }
    }
}

/// The running forwarder: two threads, stopped and joined on drop.
pub(crate) struct Forwarder {
    threads: Vec<(JoinHandle<()>, Arc<Counters>)>,
    stop: OwnedFd,
    started: Instant,
    uso: bool,
}

impl Forwarder {
    /// Starts forwarding `a` → `b` and `b` → `a` (TUN files opened by [`crate::tun::open`];
    /// `uso`: whether they have UDP segmentation offload, for the reports).
    pub fn start(
        a: File,
        b: File,
        uso: bool,
        a_to_b: DirectionConfig,
        b_to_a: DirectionConfig,
    ) -> Result<Forwarder, NetlabError> {
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| NetlabError::io("creating an eventfd", e.into()))?;
        let a2 = a
            .try_clone()
            .map_err(|e| NetlabError::io("duplicating the TUN fd", e))?;
        let b2 = b
            .try_clone()
            .map_err(|e| NetlabError::io("duplicating the TUN fd", e))?;
        let started = Instant::now();
        let mut fwd = Forwarder {
            threads: Vec::new(),
            stop,
            started,
            uso,
        };
        for (input, output, cfg) in [(a, b2, a_to_b), (b, a2, b_to_a)] {
            let counters = Arc::new(Counters::default());
            let stop = fwd
                .stop
                .try_clone()
                .map_err(|e| NetlabError::io("duplicating the eventfd", e))?;
            let c = counters.clone();
            let name = format!("dmnl {}", cfg.name);
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let mut d = Direction::new(input, output, cfg, c, started);
                    d.run(stop);
                })
                .map_err(|e| NetlabError::io(format!("starting thread {name}"), e))?;
            fwd.threads.push((handle, counters));
        }
        Ok(fwd)
    }

    /// Current statistics.
    pub fn stats(&self) -> ForwarderStats {
        let mut dirs = self.threads.iter().map(|(h, c)| {
            let mut s = snapshot(c);
            s.cpu_seconds = thread_cpu(h).as_secs_f64();
            s
        });
        ForwarderStats {
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
            a_to_b: dirs.next().unwrap_or_default(),
            b_to_a: dirs.next().unwrap_or_default(),
            emulator: crate::Emulator::Forwarder,
            uso: self.uso,
        }
    }

    /// Stops both threads and waits for them; returns the final statistics.
    pub fn stop(mut self) -> ForwarderStats {
        self.shutdown()
    }

    fn shutdown(&mut self) -> ForwarderStats {
        let stats = self.stats();
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        for (h, _) in self.threads.drain(..) {
            let _ = h.join();
        }
        stats
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.shutdown();
        }
    }
}

/// CPU time consumed so far by a running thread.
fn thread_cpu(h: &JoinHandle<()>) -> Duration {
    if h.is_finished() {
        return Duration::ZERO;
    }
    let mut clock: libc::clockid_t = 0;
    // std hands out a u64; libc's pthread_t is an integer on glibc, a pointer on musl.
    #[allow(clippy::unnecessary_cast)]
    let thread = h.as_pthread_t() as libc::pthread_t;
    // SAFETY: the thread has not been joined (we hold its handle), so its pthread_t
    // is valid; `clock` is a valid out pointer.
    if unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } != 0 {
        return Duration::ZERO;
    }
    // SAFETY: an all-zero timespec is valid; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `clock` came from pthread_getcpuclockid, `ts` is a valid out pointer.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn snapshot(c: &Counters) -> DirectionStats {
    let hist: Vec<u64> = c.late_hist.iter().map(|b| b.load(Relaxed)).collect();
    let count: u64 = hist.iter().sum();
    let quantile = |q: f64| {
        if count == 0 {
            return 0.0;
        }
        let want = (count as f64 * q).ceil() as u64;
        let mut acc = 0;
        let mut bucket = 0;
        for (i, n) in hist.iter().enumerate() {
            acc += n;
            if acc >= want {
                bucket = i;
                break;
            }
        }
        // Upper bound of bucket i is 2^i µs (bucket 0: 1 µs).
        (1u64 << bucket) as f64
    };
    DirectionStats {
        packets_in: c.packets_in.load(Relaxed),
        segments_in: c.segments_in.load(Relaxed),
        packets_out: c.packets_out.load(Relaxed),
        segments_out: c.segments_out.load(Relaxed),
        bytes_out: c.bytes_out.load(Relaxed),
        loss_drops: c.loss_drops.load(Relaxed),
        queue_drops: c.queue_drops.load(Relaxed),
        overflow_drops: c.overflow_drops.load(Relaxed),
        write_errors: c.write_errors.load(Relaxed),
        peak_queue_bytes: c.peak_queue_bytes.load(Relaxed),
        cpu_seconds: 0.0,
        late_mean_us: if count == 0 {
            0.0
        } else {
            c.late_sum_ns.load(Relaxed) as f64 / count as f64 / 1e3
        },
        late_p50_us: quantile(0.5),
        late_p99_us: quantile(0.99),
        late_max_us: c.late_max_ns.load(Relaxed) as f64 / 1e3,
        failed: c.failed.load(Relaxed),
    }
}

/// Draws which segments are lost: a geometric countdown to the next loss, so the
/// cost is per loss, not per segment, and the draws are exactly i.i.d. per segment.
struct LossDraw {
    p: f64,
    ln_keep: f64,
    until_loss: u64,
    rng: SmallRng,
}

impl LossDraw {
    fn new(p: f64, seed: u64) -> LossDraw {
        let mut d = LossDraw {
            p,
            ln_keep: (1.0 - p).ln(),
            until_loss: u64::MAX,
            rng: SmallRng::seed_from_u64(seed),
        };
        d.until_loss = d.next_gap();
        d
    }

    /// Segments kept before the next lost one.
    fn next_gap(&mut self) -> u64 {
        if self.p <= 0.0 {
            return u64::MAX;
        }
        // U in (0, 1]: floor(ln U / ln(1-p)) is geometric with success p.
        let u: f64 = 1.0 - self.rng.random::<f64>();
        let g = (u.ln() / self.ln_keep).floor();
        if g >= u64::MAX as f64 {
            u64::MAX
        } else {
            g as u64
        }
    }

    /// Fills `lost` with the indices of the lost segments among the next `count`.
    fn draw(&mut self, count: u64, lost: &mut Vec<u64>) {
        lost.clear();
        let mut i = 0u64;
        while self.until_loss < count - i {
            i += self.until_loss;
            lost.push(i);
            i += 1;
            self.until_loss = self.next_gap();
        }
        self.until_loss -= count - i;
    }
}

/// One direction's state, owned by its thread.
struct Direction {
    input: File,
    output: File,
    cfg: DirectionConfig,
    shaper: Shaper,
    loss: LossDraw,
    ring: Ring,
    counters: Arc<Counters>,
    base: Instant,
    scratch: Vec<u8>,
    lost: Vec<u64>,
}

impl Direction {
    fn new(
        input: File,
        output: File,
        cfg: DirectionConfig,
        counters: Arc<Counters>,
        base: Instant,
    ) -> Direction {
        Direction {
            shaper: Shaper::new(cfg.rate_bps, cfg.queue_bytes, cfg.delay.as_nanos() as u64),
            loss: LossDraw::new(cfg.loss, cfg.seed),
            ring: Ring::new(cfg.ring_bytes),
            input,
            output,
            cfg,
            counters,
            base,
            scratch: vec![0u8; MAX_PACKET],
            lost: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn setup_thread(&self) {
        // Wake-ups within 1 µs of the asked time instead of the default 50 µs slack.
        // SAFETY: PR_SET_TIMERSLACK takes an integer argument and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
        if self.cfg.realtime {
            // SAFETY: sched_param is plain integers (musl's has more fields than
            // glibc's); all zeroes is a valid value.
            let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
            param.sched_priority = 10;
            // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                tracing::debug!(
                    "netlab {}: no SCHED_FIFO: {}",
                    self.cfg.name,
                    std::io::Error::last_os_error()
                );
            }
        }
        if let Some(cpu) = self.cfg.cpu {
            let mut set = rustix::thread::CpuSet::new();
            set.set(cpu);
            if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
                tracing::debug!("netlab {}: cannot pin to CPU {cpu}: {e}", self.cfg.name);
            }
        }
    }

    fn run(&mut self, stop: OwnedFd) {
        self.setup_thread();
        loop {
            let now = self.release_due();
            let timeout = self.ring.front_release().map(|r| {
                let ns = r.saturating_sub(now);
                rustix::event::Timespec {
                    tv_sec: (ns / 1_000_000_000) as _,
                    tv_nsec: (ns % 1_000_000_000) as _,
                }
            });
            let (input_ready, stopped) = {
                let mut fds = [
                    PollFd::new(&self.input, PollFlags::IN),
                    PollFd::new(&stop, PollFlags::IN),
                ];
                match rustix::event::poll(&mut fds, timeout.as_ref()) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::error!("netlab {}: poll: {e}", self.cfg.name);
                        self.counters.failed.store(true, Relaxed);
                        return;
                    }
                }
                let bad = PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL;
                if fds[0].revents().intersects(bad) {
                    tracing::error!("netlab {}: input device went away", self.cfg.name);
                    self.counters.failed.store(true, Relaxed);
                    return;
                }
                (
                    fds[0].revents().contains(PollFlags::IN),
                    !fds[1].revents().is_empty(),
                )
            };
            if stopped {
                return;
            }
            if input_ready && !self.read_batch() {
                self.counters.failed.store(true, Relaxed);
                return;
            }
        }
    }

    /// Writes every packet whose release time has come; returns the current time.
    fn release_due(&mut self) -> u64 {
        let mut now = self.now();
        loop {
            let Some((release, pkt)) = self.ring.front() else {
                return now;
            };
            if release > now {
                now = self.base.elapsed().as_nanos() as u64;
                if release > now {
                    return now;
                }
            }
            let segs = packet::segments(pkt);
            match rustix::io::write(&self.output, pkt) {
                Ok(_) => {
                    let c = &self.counters;
                    c.packets_out.fetch_add(1, Relaxed);
                    c.segments_out.fetch_add(segs.count as u64, Relaxed);
                    c.bytes_out.fetch_add(segs.wire_bytes, Relaxed);
                }
                Err(e) => {
                    if self.counters.write_errors.fetch_add(1, Relaxed) == 0 {
                        tracing::warn!("netlab {}: delivering a packet: {e}", self.cfg.name);
                    }
                }
            }
            let late = now - release;
            let c = &self.counters;
            c.late_sum_ns.fetch_add(late, Relaxed);
            c.late_max_ns.fetch_max(late, Relaxed);
            let us = late / 1000;
            let bucket = (64 - us.leading_zeros() as usize).min(LATE_BUCKETS - 1);
            c.late_hist[bucket].fetch_add(1, Relaxed);
            self.ring.pop();
        }
    }

    /// Reads packets until the device is empty, a batch is done, or a release is due.
    /// Returns false when the device failed.
    fn read_batch(&mut self) -> bool {
        for _ in 0..READ_BATCH {
            let (n, in_ring) = {
                let (buf, in_ring) = match self.ring.reserve(MAX_PACKET) {
                    Some(b) => (b, true),
                    None => (&mut self.scratch[..], false),
                };
                match rustix::io::read(&self.input, buf) {
                    Ok(0) => return true,
                    Ok(n) => (n, in_ring),
                    Err(rustix::io::Errno::AGAIN) => return true,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::error!("netlab {}: reading: {e}", self.cfg.name);
                        return false;
                    }
                }
            };
            self.accept(n, in_ring);
            if self.ring.front_release().is_some_and(|r| r <= self.now()) {
                return true;
            }
        }
        true
    }

    /// Decides the fate of the packet just read (`n` bytes, in the ring's reserved
    /// space or, when the ring was full, in the scratch buffer).
    ///
    /// Loss and the bottleneck queue act per segment, as on a real link of MTU-sized
    /// packets: a super-packet with lost segments is cut around them, and one that
    /// only partly fits the queue keeps the segments that fit (tail-drop of the rest).
    /// The common case, nothing lost and room in the queue, queues the packet where
    /// it was read, without a copy.
    fn accept(&mut self, n: usize, in_ring: bool) {
        let now = self.now();
        let c = self.counters.clone();
        c.packets_in.fetch_add(1, Relaxed);
        if !in_ring {
            let segs = packet::segments(&self.scratch[..n]);
            c.segments_in.fetch_add(segs.count as u64, Relaxed);
            c.overflow_drops.fetch_add(segs.count as u64, Relaxed);
            return;
        }
        let room = self.shaper.room(now);
        // Look at the packet where it was read, in the ring's reserved space.
        let segs = {
            let buf = self
                .ring
                .reserve(MAX_PACKET)
                .expect("space reserved just before");
            let segs = packet::segments(&buf[..n]);
            self.loss.draw(segs.count as u64, &mut self.lost);
            let cut = segs.split.is_some()
                && (!self.lost.is_empty() || segs.wire_bytes > room)
                && self.lost.len() < segs.count as usize;
            if cut {
                self.scratch[..n].copy_from_slice(&buf[..n]);
            }
            segs
        };
        let count = segs.count as u64;
        c.segments_in.fetch_add(count, Relaxed);
        c.loss_drops.fetch_add(self.lost.len() as u64, Relaxed);
        let Some(info) = segs.split else {
            // An ordinary packet, or one we cannot cut: all or nothing.
            if !self.lost.is_empty() {
                c.loss_drops
                    .fetch_add(count - self.lost.len() as u64, Relaxed);
            } else if segs.wire_bytes > room {
                c.queue_drops.fetch_add(count, Relaxed);
            } else {
                self.enqueue(now, n, segs.wire_bytes, count);
            }
            return;
        };
        if self.lost.is_empty() && segs.wire_bytes <= room {
            self.enqueue(now, n, segs.wire_bytes, count);
            return;
        }
        // Cut: the runs between lost segments, each trimmed to what the queue takes.
        let lost = std::mem::take(&mut self.lost);
        let seg_wire = (info.hdr_len + info.mss) as u64;
        let mut first = 0u64;
        for end in lost.iter().copied().chain([count]) {
            if end > first {
                let room = self.shaper.room(now);
                let payload =
                    (end * info.mss as u64).min(info.payload as u64) - first * info.mss as u64;
                let run_wire = payload + (end - first) * info.hdr_len as u64;
                let run_end = if run_wire <= room {
                    end
                } else {
                    first + (end - first).min(room / seg_wire)
                };
                if run_end > first {
                    let Some(buf) = self.ring.reserve(MAX_PACKET) else {
                        c.overflow_drops.fetch_add(end - first, Relaxed);
                        first = end + 1;
                        continue;
                    };
                    let len = packet::write_run(
                        &self.scratch[..n],
                        &info,
                        first as usize,
                        run_end as usize,
                        buf,
                    );
                    let wire =
                        (len - VNET_HDR_LEN) as u64 + (run_end - first - 1) * info.hdr_len as u64;
                    self.enqueue(now, len, wire, run_end - first);
                }
                c.queue_drops.fetch_add(end - run_end, Relaxed);
            }
            first = end + 1;
        }
        self.lost = lost;
    }

    /// Offers the packet in the reserved space (`len` bytes, `segments` on the wire)
    /// to the bottleneck and queues it.
    fn enqueue(&mut self, now: u64, len: usize, wire_bytes: u64, segments: u64) {
        let backlog = self.shaper.backlog(now);
        match self.shaper.offer(now, wire_bytes) {
            Verdict::Release(t) => {
                self.counters
                    .peak_queue_bytes
                    .fetch_max(backlog + wire_bytes, Relaxed);
                self.ring.commit(len, t);
            }
            Verdict::QueueDrop => {
                self.counters.queue_drops.fetch_add(segments, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_draws_are_per_segment_at_the_asked_rate() {
        let mut d = LossDraw::new(0.01, 7);
        let mut lost = Vec::new();
        let mut total_lost = 0u64;
        let mut total = 0u64;
        for i in 0..200_000u64 {
            let count = 1 + i % 45;
            d.draw(count, &mut lost);
            assert!(lost.windows(2).all(|w| w[0] < w[1]));
            assert!(lost.iter().all(|&l| l < count));
            total_lost += lost.len() as u64;
            total += count;
        }
        let f = total_lost as f64 / total as f64;
        assert!((0.0095..0.0105).contains(&f), "loss fraction {f}");
        let mut none = LossDraw::new(0.0, 1);
        none.draw(1000, &mut lost);
        assert!(lost.is_empty());
    }
}
