//! The source's tuner (feature [`super::features::TUNING`]): how many of a session's
//! data streams carry chunks, chosen while the data flows.
//!
//! Why streams: on a long link each TCP connection carries at most its socket buffer
//! per round trip (Linux autotunes a socket's buffers up to `tcp_wmem`/`tcp_rmem`'s
//! maximum, 4 MiB for sending by default: 4 MiB / 200 ms = 168 Mbit/s per stream), and
//! one loss halves one stream's window, not all of them; on a short link or a busy CPU
//! more streams cost more than they bring. The best count depends on the path and the
//! hosts, so it is measured in place (seed 004; FTS3's optimizer and Falcon search the
//! same way, by throughput trend, without sweeping the whole space).
//!
//! How: a session opens all the streams it was granted, and the tuner starts with a
//! few ([`TuneConfig::start`]). It measures the rate the source sends at over a period
//! (after a settling time, so a stream that was just added has left slow start), then
//! probes: doubles the streams while each doubling gains at least
//! [`GAIN_UP`] (10 %); a probe that gains less goes back. Once settled it holds the
//! count, and every [`HOLD_PERIODS`] periods probes again, alternately up (half as
//! many more) and down (a quarter fewer; kept when the rate stays within
//! [`KEEP_DOWN`] of what it was), so it follows a path whose capacity changes and
//! sheds streams that bring nothing. Periods scale with the round-trip time the
//! caller measures (slow start takes a number of round trips), between fixed bounds.
//!
//! Sans-IO: the caller feeds it the clock and the bytes sent so far and applies the
//! decisions ([`super::SourceSession::set_active`]); it is tested alone against a
//! model of a link (below) and in the drivers.

use std::time::{Duration, Instant};

/// A probe up must raise the rate by this fraction to be kept.
pub const GAIN_UP: f64 = 0.10;
/// A probe down is kept when the rate stays above this fraction of the rate before.
pub const KEEP_DOWN: f64 = 0.95;
/// Measurement periods between two probes once settled.
pub const HOLD_PERIODS: u32 = 8;
/// Bounds of the settling time after a change and of a measurement period.
pub const PERIOD_MIN: Duration = Duration::from_secs(1);
/// See [`PERIOD_MIN`].
pub const PERIOD_MAX: Duration = Duration::from_secs(3);
/// A period lasts this many round trips (within the bounds).
pub const PERIOD_RTTS: u32 = 10;
/// A probe up starts only when the data left would take at least this many periods
/// at the rate just measured: one to settle, one to measure, and two to gain from what
/// it found. Streams a probe adds start in slow start beside streams at full rate, so
/// a probe the copy ends during costs and brings nothing: at 200 ms, 1 Gbit/s, tuned
/// pushes of 7 and 13 s that probed were 0.3–1.5 s behind `-P 4` (docs/benchmarks.md,
/// "Issue 13's cells").
pub const PAYBACK_PERIODS: u32 = 4;
/// A period in which fewer bytes were acknowledged says nothing of the streams (the
/// source had next to nothing ready: set-up, whose handshakes count, a slow first
/// read, checksums on a busy CPU): it is measured again instead of decided on. Found
/// by `bench transfer --tune`: a first period of join handshakes only "measured" 0
/// Mbit/s, and the next, with data, a gain of billions of percent over it.
pub const MIN_PERIOD_BYTES: u64 = 256 << 10;
/// The first probe up is skipped when the streams' congestion control does not take
/// loss for congestion (BBR) and they waited on a window (the receiver's or their send
/// buffer's) for less than this share of the time they were busy: their congestion
/// control alone held them, at what it measured the path to give, so more streams
/// would only share it. At 1 Gbit/s and 50 ms four BBR streams fill the link (0–1.4 %
/// of their time window-limited, by `ss -ti`), and the probe to 8 and back cost
/// 0.26–0.5 s (docs/benchmarks.md, "Issue 13's cells" and "The tuner's trajectory").
/// Loss-based control (cubic) is probed as before: with random loss, more streams
/// recover more of the rate. Later re-probes are not skipped.
pub const WINDOW_LIMITED_MIN: f64 = 0.10;

/// What a source's streams waited on, as the kernel counts it (`TCP_INFO`), summed
/// over its streams since they started; the tuner takes each period's share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// Time the streams had data in flight or queued.
    pub busy: Duration,
    /// Of that, time they waited on the receiver's window or their send buffer.
    pub window_limited: Duration,
    /// Every stream's congestion control is model-based (BBR), not loss-based.
    pub model_based: bool,
}

/// What the tuner may choose from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneConfig {
    /// Streams to start with.
    pub start: u16,
    /// Fewest streams.
    pub min: u16,
    /// Most streams (the session's).
    pub max: u16,
}

impl TuneConfig {
    /// Starts with `start` (the untuned default), between 1 and `max`.
    pub fn new(start: u16, max: u16) -> Self {
        let max = max.max(1);
        TuneConfig {
            start: start.clamp(1, max),
            min: 1,
            max,
        }
    }
}

/// A change of the streams in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Streams to send on from now on.
    pub streams: u16,
    /// The rate measured before it, in bytes per second.
    pub rate: u64,
    /// Why, for logs and the sink.
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Probe {
    /// No probe running: measuring the current count.
    None,
    /// Trying more streams than `from` (which measured `base`).
    Up { from: u16, base: f64 },
    /// Trying fewer streams than `from`.
    Down { from: u16, base: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting for data: at the start (or after a pause, `None`) any byte, which
    /// lets the first settling time overlap the set-up; after a period without data
    /// (`Some(count)`), [`MIN_PERIOD_BYTES`] acknowledged past that count.
    Idle(Option<u64>),
    /// Letting a change take effect until then.
    Settling(Instant),
    /// Measuring since `(time, bytes)`.
    Measuring(Instant, u64),
}

/// The tuner (see the module docs).
#[derive(Debug, Clone)]
pub struct Tuner {
    cfg: TuneConfig,
    streams: u16,
    phase: Phase,
    probe: Probe,
    /// Probes so far settled: hold, then probe again.
    settled: bool,
    holds: u32,
    /// Periods to hold before the next probe: [`HOLD_PERIODS`], doubled after each
    /// probe that went back (up to 8 times as long), reset by one that was kept.
    hold_for: u32,
    /// The next re-probe goes up (else down).
    next_up: bool,
    /// The rate of the last period at the current count.
    last_rate: Option<f64>,
    rtt: Option<Duration>,
    /// Bytes still to send (`None`: unknown, e.g. a manifest that grows).
    remaining: Option<u64>,
    changes: u32,
    settled_at: Option<Instant>,
    started: Option<Instant>,
    /// The streams' pressure as last read, and at the start of the period measured.
    pressure: Option<Pressure>,
    pressure_at: Option<Pressure>,
    /// Why the tuner last held where it might have probed ([`Tuner::take_note`]).
    note: Option<String>,
}

impl Tuner {
    /// A tuner within `cfg`; it starts with `cfg.start` streams.
    pub fn new(cfg: TuneConfig) -> Self {
        Tuner {
            cfg,
            streams: cfg.start,
            phase: Phase::Idle(None),
            probe: Probe::None,
            settled: false,
            holds: 0,
            hold_for: HOLD_PERIODS,
            next_up: true,
            last_rate: None,
            rtt: None,
            remaining: None,
            changes: 0,
            settled_at: None,
            started: None,
            pressure: None,
            pressure_at: None,
            note: None,
        }
    }

    /// Streams in use now.
    pub fn streams(&self) -> u16 {
        self.streams
    }

    /// The streams the search settled on: those in use, or while a probe runs, those
    /// it started from.
    pub fn kept(&self) -> u16 {
        match self.probe {
            Probe::Up { from, .. } | Probe::Down { from, .. } if self.settled => from,
            _ => self.streams,
        }
    }

    /// Changes made so far.
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// How long after the first byte the search first settled (`None`: not yet).
    pub fn settled_after(&self) -> Option<Duration> {
        match (self.started, self.settled_at) {
            (Some(s), Some(c)) => Some(c.saturating_duration_since(s)),
            _ => None,
        }
    }

    /// The last rate measured with the streams in use, in bytes per second.
    pub fn rate(&self) -> Option<u64> {
        self.last_rate.map(|r| r as u64)
    }

    /// The round-trip time seen on the data streams (the smallest so far), which sets
    /// the length of the periods.
    pub fn set_rtt(&mut self, rtt: Duration) {
        self.rtt = Some(rtt);
    }

    /// The bytes the source still has to send, as far as it knows (`None`: it does
    /// not, and every probe is worth trying).
    pub fn set_remaining(&mut self, bytes: Option<u64>) {
        self.remaining = bytes;
    }

    /// What the streams waited on so far ([`Pressure`]; `None`: the kernel does not
    /// say, or not every stream is TCP). Read before each [`Tuner::tick`].
    pub fn set_pressure(&mut self, p: Option<Pressure>) {
        self.pressure = p;
    }

    /// Why the tuner held where it might have changed, once (for logs).
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// The share of the period just measured the streams spent waiting on a window,
    /// if known, when their congestion control is model-based.
    fn window_share(&self) -> Option<f64> {
        let (Some(now), Some(at)) = (self.pressure, self.pressure_at) else {
            return None;
        };
        if !now.model_based {
            return None;
        }
        let busy = now.busy.saturating_sub(at.busy);
        if busy.is_zero() {
            return None;
        }
        let limited = now.window_limited.saturating_sub(at.window_limited);
        Some(limited.as_secs_f64() / busy.as_secs_f64())
    }

    /// Whether a probe up can pay back before the data ends, at `rate` (bytes/s):
    /// see [`PAYBACK_PERIODS`].
    fn worth_probing_up(&self, rate: f64) -> bool {
        match self.remaining {
            Some(left) if rate > 0.0 => {
                left as f64 / rate >= (self.period() * PAYBACK_PERIODS).as_secs_f64()
            }
            _ => true,
        }
    }

    fn period(&self) -> Duration {
        let base = self.rtt.map_or(Duration::from_secs(1), |r| r * PERIOD_RTTS);
        base.clamp(PERIOD_MIN, PERIOD_MAX)
    }

    /// When [`Tuner::tick`] is next due (`None`: before the first byte, call it
    /// whenever bytes went out).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Idle(_) => None,
            Phase::Settling(t) => Some(t),
            Phase::Measuring(t, _) => Some(t + self.period()),
        }
    }

    /// The source has nothing to send for now: the current period is dropped, and
    /// measuring starts again (after settling) once bytes flow.
    pub fn pause(&mut self) {
        self.phase = Phase::Idle(None);
    }

    /// The clock and the bytes sent so far (all streams); returns a change to apply.
    pub fn tick(&mut self, now: Instant, bytes: u64) -> Option<Decision> {
        match self.phase {
            Phase::Idle(base) => {
                let enough = match base {
                    None => bytes > 0,
                    Some(b) => bytes >= b.saturating_add(MIN_PERIOD_BYTES),
                };
                self.phase = if enough {
                    self.started.get_or_insert(now);
                    Phase::Settling(now + self.period())
                } else {
                    Phase::Idle(base)
                };
                None
            }
            Phase::Settling(t) => {
                if now >= t {
                    self.phase = Phase::Measuring(now, bytes);
                    self.pressure_at = self.pressure;
                }
                None
            }
            Phase::Measuring(t, b) => {
                let took = now.saturating_duration_since(t);
                if took < self.period() {
                    return None;
                }
                let sent = bytes.saturating_sub(b);
                if sent < MIN_PERIOD_BYTES {
                    // Next to nothing was ready to send: wait for data again, then
                    // settle and measure afresh (a period that straddles the data's
                    // return would measure a fraction of it).
                    self.phase = Phase::Idle(Some(bytes));
                    return None;
                }
                let share = self.window_share();
                self.phase = Phase::Measuring(now, bytes);
                self.pressure_at = self.pressure;
                self.decide(now, sent as f64 / took.as_secs_f64(), share)
            }
        }
    }

    fn change(&mut self, now: Instant, to: u16, rate: f64, reason: String) -> Option<Decision> {
        let to = to.clamp(self.cfg.min, self.cfg.max);
        if to == self.streams {
            return None;
        }
        self.streams = to;
        self.changes += 1;
        self.phase = Phase::Settling(now + self.period());
        Some(Decision {
            streams: to,
            rate: rate as u64,
            reason,
        })
    }

    /// Starts a probe from the streams in use (which sent `rate`) to `to`.
    fn probe(
        &mut self,
        now: Instant,
        to: u16,
        up: bool,
        rate: f64,
        reason: String,
    ) -> Option<Decision> {
        let (from, base) = (self.streams, rate);
        self.probe = if up {
            Probe::Up { from, base }
        } else {
            Probe::Down { from, base }
        };
        self.change(now, to, rate, reason)
    }

    /// A probe from `from` (which sent `base`) did not pay, sending `rate`: back to
    /// `from`, and hold (`down`: the probe was down).
    fn back(
        &mut self,
        now: Instant,
        from: u16,
        base: f64,
        rate: f64,
        down: bool,
    ) -> Option<Decision> {
        let n = self.streams;
        self.hold(now, down, false);
        self.last_rate = Some(base);
        let reason = format!(
            "{n} streams sent {} against {from}'s {}: back to {from}",
            pct(rate / base.max(1.0) - 1.0),
            rate_text(base)
        );
        self.change(now, from, rate, reason)
    }

    /// Decides on a period that sent `rate`, in which the streams waited on a window
    /// for `window_share` of their busy time (if known, see [`Tuner::window_share`]).
    fn decide(&mut self, now: Instant, rate: f64, window_share: Option<f64>) -> Option<Decision> {
        let n = self.streams;
        let probe = self.probe;
        self.probe = Probe::None;
        self.last_rate = Some(rate);
        match probe {
            Probe::Up { from, base } => {
                let gain = rate / base.max(1.0) - 1.0;
                if gain < GAIN_UP {
                    return self.back(now, from, base, rate, false);
                }
                if n >= self.cfg.max || !self.worth_probing_up(rate) {
                    self.hold(now, false, true);
                    return None;
                }
                // Searching: double; settled: the path changed, climb by half.
                let step = if self.settled { (n / 2).max(1) } else { n };
                let to = n.saturating_add(step).min(self.cfg.max);
                let reason = format!(
                    "{n} streams sent {} more than {from}: trying {to}",
                    pct(gain)
                );
                self.probe(now, to, true, rate, reason)
            }
            Probe::Down { from, base } => {
                if rate < base * KEEP_DOWN {
                    return self.back(now, from, base, rate, true);
                }
                self.hold(now, true, true);
                None
            }
            Probe::None if !self.settled => {
                // The first measurement: probe up when there is room and time, and
                // the streams are not already sending what the path gives them.
                if n >= self.cfg.max || !self.worth_probing_up(rate) {
                    self.hold(now, false, true);
                    return None;
                }
                if let Some(share) = window_share.filter(|s| *s < WINDOW_LIMITED_MIN) {
                    self.note = Some(format!(
                        "{n} streams send {}, waiting on a window {} of the time: \
                         their congestion control holds them, so {n} stay",
                        rate_text(rate),
                        share_text(share)
                    ));
                    self.hold(now, false, true);
                    return None;
                }
                let to = n.saturating_mul(2).min(self.cfg.max);
                let waited = window_share.map_or(String::new(), |s| {
                    format!(", waiting on a window {} of the time", share_text(s))
                });
                let reason = format!("{n} streams send {}{waited}: trying {to}", rate_text(rate));
                self.probe(now, to, true, rate, reason)
            }
            Probe::None => {
                self.holds += 1;
                if self.holds < self.hold_for {
                    return None;
                }
                let up = self.next_up;
                if up && !self.worth_probing_up(rate) {
                    // Too close to the end to gain from more; hold on.
                    return None;
                }
                self.holds = 0;
                self.next_up = !up;
                let to = if up && n < self.cfg.max {
                    n.saturating_add((n / 2).max(1)).min(self.cfg.max)
                } else if n > self.cfg.min {
                    n - (n / 4).max(1)
                } else {
                    return None;
                };
                let reason = format!(
                    "checking again: {n} streams send {}: trying {to}",
                    rate_text(rate)
                );
                self.probe(now, to, to > n, rate, reason)
            }
        }
    }

    /// The search settled (for now); `down`: the probe was down, so the next one goes
    /// up; `kept`: the probe's setting was kept (else it went back, and the next probe
    /// waits longer).
    fn hold(&mut self, now: Instant, down: bool, kept: bool) {
        self.settled_at.get_or_insert(now);
        if !self.settled || kept {
            self.hold_for = HOLD_PERIODS;
        } else {
            self.hold_for = (self.hold_for * 2).min(HOLD_PERIODS * 8);
        }
        self.settled = true;
        self.holds = 0;
        self.next_up = down;
    }
}

fn pct(f: f64) -> String {
    format!("{:+.0} %", f * 100.0)
}

/// A share (0 to 1) as an unsigned percentage.
fn share_text(f: f64) -> String {
    format!("{:.0} %", f * 100.0)
}

/// A rate in bytes per second as text, in bits per second.
pub fn rate_text(bytes_per_s: f64) -> String {
    let bits = bytes_per_s * 8.0;
    if bits >= 1e9 {
        format!("{:.2} Gbit/s", bits / 1e9)
    } else {
        format!("{:.0} Mbit/s", bits / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link where each stream carries at most `per_stream` bytes/s (its window per
    /// round trip), all together at most `cap`, and each stream beyond `knee` costs
    /// `overhead` of the total (a busy CPU).
    #[derive(Clone, Copy)]
    struct Model {
        per_stream: f64,
        cap: f64,
        knee: u16,
        overhead: f64,
    }

    impl Model {
        fn rate(&self, n: u16) -> f64 {
            let r = (n as f64 * self.per_stream).min(self.cap);
            let extra = n.saturating_sub(self.knee) as f64;
            r * (1.0 - self.overhead * extra).max(0.1)
        }
    }

    /// Runs the tuner for `secs` against `model` (noise: ± `noise` per period, from a
    /// fixed sequence), in 50 ms steps; returns the streams at the end and the changes.
    fn run(cfg: TuneConfig, model: impl Fn(u16, f64) -> f64, secs: f64) -> (Tuner, Vec<Decision>) {
        let t0 = Instant::now();
        let mut t = Tuner::new(cfg);
        t.set_rtt(Duration::from_millis(100));
        let (mut bytes, mut now, mut out) = (0f64, t0, Vec::new());
        let step = Duration::from_millis(50);
        while (now - t0).as_secs_f64() < secs {
            now += step;
            let at = (now - t0).as_secs_f64();
            bytes += model(t.streams(), at) * step.as_secs_f64();
            if let Some(d) = t.tick(now, bytes as u64) {
                out.push(d);
            }
        }
        (t, out)
    }

    /// [`run`] with the streams' [`Pressure`] fed too: each busy all the time, waiting
    /// on a window `share` of it, under model-based control or not.
    fn run_pressed(
        cfg: TuneConfig,
        model: impl Fn(u16) -> f64,
        share: f64,
        model_based: bool,
        secs: f64,
    ) -> (Tuner, Vec<Decision>, Vec<String>) {
        let t0 = Instant::now();
        let mut t = Tuner::new(cfg);
        t.set_rtt(Duration::from_millis(50));
        let (mut bytes, mut now, mut out, mut notes) = (0f64, t0, Vec::new(), Vec::new());
        let mut p = Pressure {
            model_based,
            ..Pressure::default()
        };
        let step = Duration::from_millis(50);
        while (now - t0).as_secs_f64() < secs {
            now += step;
            bytes += model(t.streams()) * step.as_secs_f64();
            p.busy += step * u32::from(t.streams());
            p.window_limited += (step * u32::from(t.streams())).mul_f64(share);
            t.set_pressure(Some(p));
            if let Some(d) = t.tick(now, bytes as u64) {
                out.push(d);
            }
            notes.extend(t.take_note());
        }
        (t, out, notes)
    }

    #[test]
    fn does_not_probe_streams_their_congestion_control_holds() {
        // Four BBR streams fill a 1 Gbit/s link; more would bring nothing. No probe
        // until the first re-check, and the log says why.
        let fill = |n: u16| (n as f64 * 60e6).min(125e6);
        let (t, d, notes) = run_pressed(TuneConfig::new(4, 16), fill, 0.01, true, 8.0);
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(t.kept(), 4);
        assert!(t.settled_after().is_some());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("so 4 stay"), "{notes:?}");
        // Streams that wait on their windows, or under loss-based control, are probed.
        let (_, d, notes) = run_pressed(TuneConfig::new(4, 16), fill, 0.5, true, 8.0);
        assert_eq!(d.first().map(|d| d.streams), Some(8), "{d:?}");
        assert!(
            d[0].reason.contains("waiting on a window 50 % of the time"),
            "{d:?}"
        );
        assert!(notes.is_empty(), "{notes:?}");
        let (_, d, _) = run_pressed(TuneConfig::new(4, 16), fill, 0.01, false, 8.0);
        assert_eq!(d.first().map(|d| d.streams), Some(8), "{d:?}");
        // Later re-checks still probe, up too: a share of a busier link may be won.
        let (_, d, _) = run_pressed(TuneConfig::new(4, 16), fill, 0.01, true, 40.0);
        let mut n = 4;
        let ups = d
            .iter()
            .filter(|d| {
                let up = d.streams > n && d.reason.starts_with("checking again");
                n = d.streams;
                up
            })
            .count();
        assert!(ups >= 1, "{d:?}");
    }

    #[test]
    fn finds_the_knee_of_a_window_limited_link() {
        // 4 MiB per stream per 200 ms round trip, a 1 Gbit/s link: 6 streams fill it.
        let m = Model {
            per_stream: 21e6,
            cap: 125e6,
            knee: 64,
            overhead: 0.0,
        };
        let (t, d) = run(TuneConfig::new(4, 32), |n, _| m.rate(n), 30.0);
        assert!(
            (6..=16).contains(&t.kept()),
            "{} streams after {d:?}",
            t.kept()
        );
        assert!(d[0].streams == 8, "first probe doubles: {d:?}");
        // It settled: no more than the probes of the search and two re-checks.
        assert!(d.len() <= 8, "{d:?}");
        let settled = t.settled_after().expect("settled");
        assert!(settled < Duration::from_secs(10), "{settled:?}");
    }

    #[test]
    fn goes_back_when_more_streams_bring_nothing() {
        // One stream already fills the link; more cost 5 % each.
        let m = Model {
            per_stream: 200e6,
            cap: 125e6,
            knee: 4,
            overhead: 0.05,
        };
        let (t, d) = run(TuneConfig::new(4, 16), |n, _| m.rate(n), 20.0);
        assert_eq!(d[0].streams, 8);
        assert_eq!(d[1].streams, 4, "{d:?}");
        assert!(d[1].reason.contains("back to 4"), "{}", d[1].reason);
        // Later re-checks may try fewer (as good: kept) but never keep more.
        assert!(t.kept() <= 4, "{d:?}");
    }

    #[test]
    fn sheds_streams_that_bring_nothing() {
        // Flat: any count gives the same rate; a probe down is kept.
        let (t, d) = run(TuneConfig::new(8, 8), |_, _| 100e6, 60.0);
        assert!(t.kept() < 8, "{d:?}");
        assert!(t.kept() >= 1);
    }

    #[test]
    fn follows_a_path_that_gets_longer() {
        // After 30 s each stream carries a quarter as much (the round trip quadrupled):
        // the re-checks raise the count.
        let fast = Model {
            per_stream: 60e6,
            cap: 125e6,
            knee: 64,
            overhead: 0.0,
        };
        let slow = Model {
            per_stream: 15e6,
            ..fast
        };
        let (t, d) = run(
            TuneConfig::new(2, 32),
            |n, at| {
                if at < 30.0 {
                    fast.rate(n)
                } else {
                    slow.rate(n)
                }
            },
            120.0,
        );
        assert!(t.kept() >= 6, "{} streams after {d:?}", t.kept());
    }

    #[test]
    fn stays_within_its_bounds_and_waits_for_data() {
        let mut t = Tuner::new(TuneConfig::new(4, 2));
        assert_eq!(t.streams(), 2);
        let now = Instant::now();
        assert_eq!(t.poll_timeout(), None);
        assert_eq!(t.tick(now, 0), None);
        assert_eq!(t.poll_timeout(), None, "no data, no clock");
        assert_eq!(t.tick(now, 1), None);
        assert!(t.poll_timeout().is_some());
        let (t, d) = run(TuneConfig::new(1, 1), |n, _| n as f64 * 1e6, 30.0);
        assert_eq!(t.streams(), 1);
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn periods_without_data_are_measured_again() {
        // 10 s of join handshakes and nothing ready (a trickle of bytes), then data:
        // no decision before the data, and the first compares data with data.
        let m = Model {
            per_stream: 20e6,
            cap: 1e9,
            knee: 64,
            overhead: 0.0,
        };
        let (_, d) = run(
            TuneConfig::new(4, 16),
            |n, at| if at < 10.0 { 100.0 } else { m.rate(n) },
            30.0,
        );
        let first = d.first().expect("a probe once data flows");
        assert_eq!(first.streams, 8, "{d:?}");
        assert!(first.rate as f64 >= 0.9 * m.rate(4), "{d:?}");
        // 4 → 8 doubled the rate: kept, and 16 tried, with the gain it measured.
        let second = d.get(1).expect("a second probe");
        assert_eq!(second.streams, 16, "{d:?}");
        assert!(
            second.reason.starts_with("8 streams sent +") && second.reason.contains(" % more"),
            "{d:?}"
        );
        let gain: f64 = second.reason["8 streams sent +".len()..]
            .split(' ')
            .next()
            .and_then(|g| g.parse().ok())
            .expect("a percentage");
        assert!((80.0..=120.0).contains(&gain), "{d:?}");
    }

    #[test]
    fn no_probe_up_the_copy_ends_during() {
        // A window-limited link where 8 streams would send twice as much, but at the
        // first measurement (4 s in: 2 s to settle, 2 to measure at 200 ms) only 5 s of
        // data are left at the rate measured: under 4 periods (8 s), so no probe.
        let m = Model {
            per_stream: 20e6,
            cap: 1e9,
            knee: 64,
            overhead: 0.0,
        };
        let total = 4.0 * 20e6 * 9.0;
        let t0 = Instant::now();
        let mut t = Tuner::new(TuneConfig::new(4, 16));
        t.set_rtt(Duration::from_millis(200));
        let (mut bytes, mut now, mut out) = (0f64, t0, Vec::new());
        let step = Duration::from_millis(50);
        while bytes < total {
            now += step;
            bytes += m.rate(t.streams()) * step.as_secs_f64();
            t.set_remaining(Some((total - bytes).max(0.0) as u64));
            out.extend(t.tick(now, bytes as u64));
        }
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(t.streams(), 4);
        assert!(t.settled_after().is_some(), "it settled on 4");
        // The same copy with three times the data probes at once.
        let total = 4.0 * 20e6 * 27.0;
        let mut t = Tuner::new(TuneConfig::new(4, 16));
        t.set_rtt(Duration::from_millis(200));
        let (mut bytes, mut now, mut out) = (0f64, t0, Vec::new());
        while bytes < total {
            now += step;
            bytes += m.rate(t.streams()) * step.as_secs_f64();
            t.set_remaining(Some((total - bytes).max(0.0) as u64));
            out.extend(t.tick(now, bytes as u64));
        }
        assert_eq!(out.first().map(|d| d.streams), Some(8), "{out:?}");
    }

    #[test]
    fn periods_follow_the_round_trip() {
        let mut t = Tuner::new(TuneConfig::new(4, 8));
        t.set_rtt(Duration::from_millis(1));
        assert_eq!(t.period(), PERIOD_MIN);
        t.set_rtt(Duration::from_millis(200));
        assert_eq!(t.period(), Duration::from_secs(2));
        t.set_rtt(Duration::from_secs(2));
        assert_eq!(t.period(), PERIOD_MAX);
    }
}
