//! Disk parallelism chosen while the data flow (issue 13): how many disk threads
//! read a source's chunks or write a sink's.
//!
//! Why: storage differs in how many I/Os it serves at once. One virtio disk or a
//! laptop's SSD gives nothing past a few (a tiny push took the same time with 2, 4 or
//! 8 server threads on this project's test machine, docs/benchmarks.md), an NVMe
//! array or a parallel file system (Lustre, GPFS, where each read waits on a network
//! round trip) gives more the more I/Os are in flight: mdtmFTP assigns threads per
//! device for that reason (seed 002). The right count is the storage's, found in
//! place.
//!
//! How: the session's side with an elastic [`crate::diskpool::DiskPool`] measures, over
//! periods of [`PERIOD`] after letting a change settle for [`SETTLE`], the rate its
//! data moved and the mean number of disk jobs that waited for a thread (the queue's
//! length, by Little's law the time jobs waited divided by the period). Jobs that
//! wait mean the threads are what the data wait on: when at least [`QUEUE_MIN`]
//! waited on average, and the rate held within [`GAIN_UP`] of the period before (a
//! copy whose network still ramps up moves more each period whatever its threads), it
//! adds a thread for each job that waited (at least doubling,
//! at most [`MAX_STEP`] times as many), keeps them when the rate rose by [`GAIN_UP`]
//! or more (and goes on while jobs still wait), and otherwise
//! goes back and holds, for twice [`HOLD_PERIODS`] periods after the first probe that
//! went back and twice as long after each further one (a machine whose CPU, not its
//! storage, limits the jobs: many small files on two cores). A probe starts only when the data left would take
//! [`PAYBACK_PERIODS`] periods at the rate measured. It never goes below the threads
//! it started with: idle threads cost nothing.
//!
//! Sans-IO: the caller feeds the clock, its bytes so far and the pool's wait so far,
//! and applies the decisions; tested alone against a model of storage (below) and in
//! the drivers.

use std::time::{Duration, Instant};

/// A change must settle this long before a period is measured (a disk has no slow
/// start: the queue it had drains in a fraction of this).
pub const SETTLE: Duration = Duration::from_millis(250);
/// A measurement period: 25–50 chunk-sized I/Os per thread at the rates of the storage
/// it pays on (tens of ms an I/O), enough to see a doubling.
pub const PERIOD: Duration = Duration::from_millis(500);
/// The threads are what the data wait on when at least this many jobs waited for a
/// thread, on average over a period.
pub const QUEUE_MIN: f64 = 0.5;
/// A probe up must raise the rate by this fraction to be kept.
pub const GAIN_UP: f64 = 0.10;
/// The base of the hold after a probe went back: each probe that goes back doubles the
/// periods held before the next (16 after the first), up to 8 times this; a probe
/// kept resets it.
pub const HOLD_PERIODS: u32 = 8;
/// A probe starts only when the data left would take this many settlings and periods
/// at the rate just measured: one to try, one to gain. Fewer than the stream tuner's
/// (`PAYBACK_PERIODS`, 4): threads start at once where streams start in slow start, so
/// a probe that does not pay costs little.
pub const PAYBACK_PERIODS: u32 = 2;
/// A probe up tries at most this many times the threads in use (see
/// [`DiskTuner::step_up`]).
pub const MAX_STEP: usize = 8;
/// A period that moved less says nothing (set-up, a pause of a growing manifest).
pub const MIN_PERIOD_BYTES: u64 = 1 << 20;

/// A change of the disk threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskDecision {
    /// Threads from now on.
    pub threads: usize,
    /// The rate measured before it, in bytes per second.
    pub rate: u64,
    /// Why, for logs.
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting for the first bytes.
    Idle,
    /// Letting a change take effect until then.
    Settling(Instant),
    /// Measuring since `(time, bytes, seconds jobs waited)`.
    Measuring(Instant, u64, f64),
}

/// The disk tuner (see the module docs).
#[derive(Debug, Clone)]
pub struct DiskTuner {
    threads: usize,
    max: usize,
    phase: Phase,
    /// A probe up from `(threads, rate)`.
    probe: Option<(usize, f64)>,
    /// Periods held since the last probe, and to hold before the next.
    holds: u32,
    hold_for: u32,
    remaining: Option<u64>,
    changes: u32,
    note: Option<String>,
    /// A note was made since the last change (one is enough).
    noted: bool,
    /// The rate of the last period measured with the threads in use.
    last: Option<f64>,
}

impl DiskTuner {
    /// A tuner starting with `start` threads, which it may raise to `max`.
    pub fn new(start: usize, max: usize) -> Self {
        let start = start.max(1);
        DiskTuner {
            threads: start,
            max: max.max(start),
            phase: Phase::Idle,
            probe: None,
            holds: HOLD_PERIODS,
            hold_for: HOLD_PERIODS,
            remaining: None,
            changes: 0,
            note: None,
            noted: false,
            last: None,
        }
    }

    /// Threads in use now.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The threads the search kept: those in use, or while a probe runs, those it
    /// started from.
    pub fn kept(&self) -> usize {
        self.probe.map_or(self.threads, |(from, _)| from)
    }

    /// Changes made so far.
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// Bytes still to move, as far as the caller knows (`None`: unknown).
    pub fn set_remaining(&mut self, bytes: Option<u64>) {
        self.remaining = bytes;
    }

    /// Why the tuner held where it might have probed, once (for logs).
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// When [`DiskTuner::tick`] is next due (`None`: call it when bytes moved).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Idle => None,
            Phase::Settling(t) => Some(t),
            Phase::Measuring(t, ..) => Some(t + PERIOD),
        }
    }

    /// Nothing to move for now: the current period is dropped.
    pub fn pause(&mut self) {
        if !matches!(self.phase, Phase::Idle) {
            self.phase = Phase::Idle;
        }
    }

    /// The clock, the bytes moved so far and the seconds disk jobs waited for a thread
    /// so far; returns a change to apply.
    pub fn tick(&mut self, now: Instant, bytes: u64, waited: f64) -> Option<DiskDecision> {
        match self.phase {
            Phase::Idle => {
                if bytes > 0 {
                    self.phase = Phase::Settling(now + SETTLE);
                }
                None
            }
            Phase::Settling(t) => {
                if now >= t {
                    self.phase = Phase::Measuring(now, bytes, waited);
                }
                None
            }
            Phase::Measuring(t, b, w) => {
                let took = now.saturating_duration_since(t);
                if took < PERIOD {
                    return None;
                }
                let moved = bytes.saturating_sub(b);
                self.phase = Phase::Measuring(now, bytes, waited);
                if moved < MIN_PERIOD_BYTES {
                    return None;
                }
                let secs = took.as_secs_f64();
                self.decide(now, moved as f64 / secs, (waited - w).max(0.0) / secs)
            }
        }
    }

    fn noting(&mut self, note: String) {
        if !self.noted {
            self.note = Some(note);
            self.noted = true;
        }
    }

    fn change(&mut self, now: Instant, to: usize, rate: f64, reason: String) -> DiskDecision {
        self.noted = false;
        self.last = None;
        self.threads = to;
        self.changes += 1;
        self.phase = Phase::Settling(now + SETTLE);
        DiskDecision {
            threads: to,
            rate: rate as u64,
            reason,
        }
    }

    /// The threads a probe up tries, with `queue` jobs waiting on average: a thread
    /// for each (what Little's law says would leave none waiting, if the storage
    /// serves them all), at least twice and at most [`MAX_STEP`] times the threads in
    /// use, within the most.
    fn step_up(&self, queue: f64) -> usize {
        let n = self.threads;
        (n + queue.ceil() as usize)
            .clamp(n * 2, n * MAX_STEP)
            .min(self.max)
    }

    fn worth_probing(&self, rate: f64) -> bool {
        match self.remaining {
            Some(left) if rate > 0.0 => {
                left as f64 / rate >= ((SETTLE + PERIOD) * PAYBACK_PERIODS).as_secs_f64()
            }
            _ => true,
        }
    }

    /// A period that moved `rate` bytes/s with `queue` jobs waiting for a thread on
    /// average.
    fn decide(&mut self, now: Instant, rate: f64, queue: f64) -> Option<DiskDecision> {
        let n = self.threads;
        let before = self.last.replace(rate);
        if let Some((from, base)) = self.probe.take() {
            let gain = rate / base.max(1.0) - 1.0;
            if gain < GAIN_UP {
                self.holds = 0;
                self.hold_for = (self.hold_for * 2).min(HOLD_PERIODS * 8);
                let reason = format!(
                    "{n} disk threads moved {} against {from}'s {}: back to {from}",
                    pct(gain),
                    rate_text(base)
                );
                return Some(self.change(now, from, rate, reason));
            }
            self.hold_for = HOLD_PERIODS;
            if queue >= QUEUE_MIN && n < self.max && self.worth_probing(rate) {
                let to = self.step_up(queue);
                let reason = format!(
                    "{n} disk threads moved {} more than {from}, and {queue:.1} jobs still \
                     waited for one: trying {to}",
                    pct(gain)
                );
                self.probe = Some((n, rate));
                return Some(self.change(now, to, rate, reason));
            }
            self.holds = 0;
            self.noting(format!(
                "{n} disk threads moved {} more than {from}: keeping {n}",
                pct(gain)
            ));
            return None;
        }
        if queue < QUEUE_MIN || n >= self.max {
            return None;
        }
        if self.holds < self.hold_for {
            self.holds += 1;
            return None;
        }
        if !self.worth_probing(rate) {
            self.noting(format!(
                "{queue:.1} jobs waited for a disk thread, but the data left end before \
                 more threads could pay: {n} stay"
            ));
            return None;
        }
        // Only from a steady rate: while the network still ramps up (slow start, the
        // first seconds of a copy) the rate rises whatever the threads, and a probe
        // would take that rise for its own.
        if !before.is_some_and(|b| (rate / b.max(1.0) - 1.0).abs() < GAIN_UP) {
            return None;
        }
        let to = self.step_up(queue);
        self.probe = Some((n, rate));
        let reason = format!(
            "{queue:.1} disk jobs waited for one of {n} threads at {}: trying {to}",
            rate_text(rate)
        );
        Some(self.change(now, to, rate, reason))
    }
}

fn pct(x: f64) -> String {
    format!("{:+.0} %", x * 100.0)
}

fn rate_text(bytes_per_s: f64) -> String {
    format!("{:.0} Mbit/s", bytes_per_s * 8.0 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Storage that serves `parallel` I/Os at once, each of `chunk` bytes taking
    /// `latency`, behind a network of `net` bytes/s; jobs wait for a thread when the
    /// storage is what limits the data.
    struct Model {
        parallel: usize,
        latency: f64,
        chunk: f64,
        net: f64,
    }

    impl Model {
        /// `parallel` I/Os at once, each of `chunk_mib` MiB taking `latency_ms`, behind
        /// a network of `net_gbit` Gbit/s.
        fn new(parallel: usize, latency_ms: f64, chunk_mib: f64, net_gbit: f64) -> Self {
            Model {
                parallel,
                latency: latency_ms / 1000.0,
                chunk: chunk_mib * 1048576.0,
                net: net_gbit * 1.25e8,
            }
        }

        /// Rate and mean queue with `threads` threads.
        fn run(&self, threads: usize) -> (f64, f64) {
            let disk = threads.min(self.parallel) as f64 * self.chunk / self.latency;
            if disk < self.net {
                // Jobs pile up behind the threads, as many as the buffers allow.
                (disk, 4.0)
            } else {
                (self.net, 0.0)
            }
        }
    }

    /// Runs the tuner against `model` for `ms` simulated milliseconds, in 50 ms steps.
    /// Its first probe comes 1.3 s in (two periods after the first settling), the
    /// next decisions [`SETTLE`] + [`PERIOD`] apart while it changes, and a period
    /// apart while it holds.
    fn simulate(t: &mut DiskTuner, model: &Model, ms: u64, total: Option<u64>) -> f64 {
        let start = Instant::now();
        let (mut bytes, mut waited) = (0f64, 0f64);
        let mut last = 0.0;
        for step in 1..=ms / 50 {
            let (rate, queue) = model.run(t.threads());
            bytes += rate * 0.05;
            waited += queue * 0.05;
            last = rate;
            t.set_remaining(total.map(|tot| tot.saturating_sub(bytes as u64)));
            let now = start + Duration::from_millis(step * 50);
            t.tick(now, bytes as u64, waited);
        }
        last
    }

    #[test]
    fn storage_with_parallelism_to_spare_gets_the_threads_it_serves() {
        // A parallel file system: 32 I/Os at once, 20 ms each, 4 MiB chunks, a
        // 100 Gbit/s network.
        let model = Model::new(32, 20.0, 4.0, 100.0);
        let mut t = DiskTuner::new(8, 64);
        let rate = simulate(&mut t, &model, 10_000, None);
        assert_eq!(t.threads(), 32, "changes {}", t.changes());
        assert!(rate >= 0.99 * 32.0 * 4.0 * 1048576.0 / 0.020 - 1.0);
        // 8 → 16 → 32 kept, 64 tried and back.
        assert_eq!(t.changes(), 4);
    }

    #[test]
    fn a_rate_that_still_climbs_is_not_probed() {
        // Jobs wait (small files created on a busy CPU) while the network ramps up:
        // the rate rises 30 % a period whatever the threads.
        let mut t = DiskTuner::new(8, 64);
        let start = Instant::now();
        let (mut bytes, mut waited, mut rate) = (0u64, 0f64, 20e6);
        for step in 1..=60u64 {
            if step % 10 == 0 {
                rate *= 1.3;
            }
            bytes += (rate * 0.05) as u64;
            waited += 2.0 * 0.05;
            t.tick(start + Duration::from_millis(step * 50), bytes, waited);
        }
        assert_eq!(t.changes(), 0);
        // Once it holds steady, it is probed (and, as threads give nothing here, the
        // probe goes back).
        for step in 61..=100u64 {
            bytes += (rate * 0.05) as u64;
            waited += 2.0 * 0.05;
            t.tick(start + Duration::from_millis(step * 50), bytes, waited);
        }
        assert_eq!((t.changes(), t.threads()), (2, 8));
    }

    #[test]
    fn many_jobs_waiting_take_a_larger_step() {
        let mut t = DiskTuner::new(8, 64);
        assert_eq!(t.step_up(0.6), 16, "at least double");
        assert_eq!(t.step_up(20.0), 28, "a thread for each job that waited");
        assert_eq!(
            t.step_up(2500.0),
            64,
            "at most eight times, within the most"
        );
        t.threads = 4;
        assert_eq!(t.step_up(2500.0), 32);
    }

    #[test]
    fn a_network_bound_transfer_keeps_its_threads() {
        let model = Model::new(64, 1.0, 4.0, 1.0);
        let mut t = DiskTuner::new(8, 64);
        simulate(&mut t, &model, 30_000, None);
        assert_eq!((t.threads(), t.changes()), (8, 0));
    }

    #[test]
    fn storage_without_parallelism_is_probed_once_then_held_longer() {
        // One device that serves 4 at once: the probe to 16 gains nothing.
        let model = Model::new(4, 10.0, 1.0, 10.0);
        let mut t = DiskTuner::new(8, 64);
        // The first probe comes two periods after the first settling (the second
        // finds the rate steady), and goes back a period after its own.
        simulate(&mut t, &model, 2_500, None);
        assert_eq!(t.changes(), 2, "up and back");
        assert_eq!(t.threads(), 8);
        // Then 16 periods (twice the hold) pass before the next.
        let mut t2 = DiskTuner::new(8, 64);
        simulate(&mut t2, &model, 10_000, None);
        assert_eq!(t2.changes(), 2, "held for 16 periods");
        let mut t3 = DiskTuner::new(8, 64);
        simulate(&mut t3, &model, 12_000, None);
        assert_eq!(t3.changes(), 4, "a second probe, back again");
        assert_eq!(t3.threads(), 8);
    }

    #[test]
    fn a_transfer_about_to_end_is_not_probed() {
        let model = Model::new(32, 20.0, 4.0, 100.0);
        // 8 threads move 1.7 GB/s: at the first period's end (0.8 s in) 3 GB have
        // 1.0 s left, under two settlings and periods.
        let mut t = DiskTuner::new(8, 64);
        simulate(&mut t, &model, 1_000, Some(3_000_000_000));
        assert_eq!(t.changes(), 0);
        assert!(t.take_note().is_some_and(|n| n.contains("could pay")));
    }

    #[test]
    fn it_never_goes_past_its_bounds() {
        let model = Model::new(1000, 100.0, 1.0, 8000.0);
        let mut t = DiskTuner::new(8, 24);
        simulate(&mut t, &model, 10_000, None);
        assert_eq!(t.threads(), 24);
        let mut fixed = DiskTuner::new(8, 8);
        simulate(&mut fixed, &model, 10_000, None);
        assert_eq!((fixed.threads(), fixed.changes()), (8, 0));
    }
}
