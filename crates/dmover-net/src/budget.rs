//! A session's buffer budget for its data streams' connections, one direction
//! ([`Budget`]): a sink's receive buffers, a source's send buffers, within the
//! session's budget ([`crate::link::SocketOptions::budget`], [`tcp::receive_budget`]),
//! shared among the streams that joined (of a tuning source, among those it sends
//! on). docs/tuning.md, "Socket buffers". The engine names only the budget and the
//! streams ([`Probe`]s); how a budget is applied is the transport's: over TCP, as
//! below. A stream of another transport is left to that transport's own sizing.
//!
//! Linux autotunes each buffer from what the connection measures: a receiver's from
//! the bytes its reader took in a round trip, a sender's from its congestion window.
//! Both stop at the host's maximum (`net.ipv4.tcp_rmem`/`tcp_wmem`'s third value).
//! Two things go wrong with that on the links a data mover serves:
//!
//! - The maximum is far above one session's share (a host tuned for long fat links):
//!   many streams of a session may together hold far more than the link's
//!   bandwidth-delay product, and push the machine into TCP memory pressure. A sink
//!   then holds every stream's receive buffer to its share ([`tcp::receive_share`]).
//! - The maximum is below what a stream needs (Linux's defaults, 4 MiB for sending and
//!   6 MiB for receiving: 168 Mbit/s a stream at 200 ms): each stream's window stops
//!   there, whatever the link. A stream whose buffer reached the host's maximum and
//!   still wanted more — a sink's receive buffer that autotuning grew to the maximum,
//!   a source's send buffer at the maximum while the stream waited on it
//!   (`tcpi_sndbuf_limited`, 10 % of its busy time or more) — is raised to its share
//!   ([`tcp::raised_share`]), checked every [`CHECK`] (and as it joins).
//!
//! A raised buffer is a limit, not memory taken: what a stream holds is its congestion
//! window's data in flight (about the round trip × the rate, which TCP measures) and
//! at most [`tcp::NOTSENT_LOWAT`] not yet sent. It is raised to the session's share
//! rather than to a measured round trip × rate because while the buffer is what holds
//! the stream back, the rate measured is what the buffer allows: sized from it, the
//! buffer could never grow past itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::link::{Direction, Probe};
use crate::tcp::{self, Buffer};
use crate::tcpinfo::TcpMeter;

/// How often a stream's buffer is looked at while it may still be raised.
pub const CHECK: Duration = Duration::from_millis(250);

/// The share of its busy time a stream must have waited on its send buffer for the
/// buffer to be raised (as [`dmover_proto::session::tune::WINDOW_LIMITED_MIN`]).
pub const SNDBUF_LIMITED_MIN: f64 = 0.10;

/// Whether a stream's buffer of `size` bytes (as the kernel counts it) should be
/// raised above the host's `autotune_max`: it reached the maximum, and, for a send
/// buffer, the stream waited on it for `limited` of its `busy` time since the last
/// look ([`SNDBUF_LIMITED_MIN`] or more). A receive buffer at the maximum is enough:
/// autotuning grows it only as far as the bytes taken per round trip ask.
pub fn wants_more(
    dir: Buffer,
    size: u64,
    autotune_max: u64,
    busy: Duration,
    limited: Duration,
) -> bool {
    size >= autotune_max
        && match dir {
            Buffer::Receive => true,
            Buffer::Send => {
                !busy.is_zero() && limited.as_secs_f64() >= SNDBUF_LIMITED_MIN * busy.as_secs_f64()
            }
        }
}

/// Sets a stream's buffer to `share`: a receive buffer with its window clamp
/// ([`tcp::cap_receive`]: the window may grow to what the buffer holds).
fn hold(dir: Buffer, meter: &TcpMeter, share: u64) -> std::io::Result<()> {
    match dir {
        Buffer::Receive => tcp::cap_receive(meter, share),
        Buffer::Send => dir.set(meter, share),
    }
}

/// One stream's buffer.
struct Held {
    /// Holds the stream's connection open: it goes when the stream ends or is lost.
    meter: Arc<TcpMeter>,
    /// Raised above the host's maximum: set again with every new share.
    raised: bool,
    /// Its busy and send-buffer-limited times at the last look.
    last: (Duration, Duration),
}

/// See the module docs.
pub struct Budget {
    dir: Buffer,
    /// `None`: the user set the buffers (`--tcp-buffer`), or not TCP.
    budget: Option<u64>,
    /// The host's autotuning maximum of this buffer.
    autotune_max: Option<u64>,
    live: HashMap<u16, Held>,
    /// The streams a tuning source sends on (a source's tuner, or a sink's latest
    /// `Tuned`): the others idle and hold nothing, so the budget is shared among these.
    sending: Option<u16>,
    /// The share last set on a stream, if not yet taken ([`Budget::take_set`]).
    set: Option<u64>,
    /// The share last reported, to log only changes.
    reported: u64,
    peer: String,
    /// A raise was refused (no `CAP_NET_ADMIN`, above `net.core.*mem_max`): no more
    /// tries, it was said once.
    refused: bool,
    /// Said once at `info` that a buffer was raised.
    told: bool,
    /// When to look at the streams again.
    next: Option<Instant>,
}

impl Budget {
    /// A session's `budget` of bytes for its streams' buffers in direction `dir`
    /// (`None`: the user pinned them, nothing is managed), toward `peer` (for the log).
    pub fn new(dir: Direction, budget: Option<u64>, peer: &str) -> Self {
        let dir = dir.tcp();
        Budget {
            dir,
            budget,
            autotune_max: budget.and_then(|_| dir.autotune_max()),
            live: HashMap::new(),
            sending: None,
            set: None,
            reported: 0,
            peer: peer.to_string(),
            refused: false,
            told: false,
            next: None,
        }
    }

    /// Stream `stream` joined; `probe`: its connection (a stream without one, or of a
    /// transport that sizes its own buffers, is left alone).
    pub fn join(&mut self, now: Instant, stream: u16, probe: Option<&Probe>) {
        if self.budget.is_none() {
            return;
        }
        if let Some(meter) = probe.and_then(Probe::tcp_meter) {
            // A send buffer is judged by what its stream waited on since the last look.
            let last = match self.dir {
                Buffer::Send => meter.read().ok(),
                Buffer::Receive => None,
            }
            .map_or((Duration::ZERO, Duration::ZERO), |s| {
                (s.busy, s.sndbuf_limited)
            });
            self.live.insert(
                stream,
                Held {
                    meter: meter.clone(),
                    raised: false,
                    last,
                },
            );
            self.apply();
            self.next = Some(now);
            self.check(now);
        }
    }

    /// A tuning source sends on `streams` from now on.
    pub fn sending(&mut self, streams: u16) {
        if self.sending != Some(streams) {
            self.sending = Some(streams);
            self.apply();
        }
    }

    /// A stream ended, lost or closed. The others keep their shares: streams end
    /// together with the session, and a lost one is soon replaced (which sets the
    /// shares again).
    pub fn retire(&mut self, stream: u16) {
        self.live.remove(&stream);
    }

    /// Every stream ended.
    pub fn retire_all(&mut self) {
        self.live.clear();
    }

    /// The streams the budget is shared among.
    fn streams(&self) -> usize {
        self.sending.map_or(self.live.len(), |n| {
            self.live.len().min(usize::from(n).max(1))
        })
    }

    /// The share last set on the streams' buffers, once after each time it is set
    /// (for the report: 0 never comes, the kernel's autotuning is the default).
    pub fn take_set(&mut self) -> Option<u64> {
        self.set.take()
    }

    /// Notes that `share` was set on the streams' buffers; `Some(old)` the first time
    /// it differs from the share reported before (`old`).
    fn report(&mut self, share: u64) -> Option<u64> {
        self.set = Some(share);
        let old = std::mem::replace(&mut self.reported, share);
        (old != share).then_some(old)
    }

    /// Sets the streams' shares: every stream's receive buffer where autotuning could
    /// grow it past its share; the streams already raised where the host's maximum
    /// is below it.
    fn apply(&mut self) {
        let (Some(budget), Some(max)) = (self.budget, self.autotune_max) else {
            return;
        };
        if self.live.is_empty() {
            return;
        }
        let streams = self.streams();
        let held = match self.dir {
            Buffer::Receive => tcp::receive_share(budget, streams, max),
            Buffer::Send => None,
        };
        let (share, all) = match (held, tcp::raised_share(budget, streams, max)) {
            (Some(share), _) => (share, true),
            (None, Some(share)) => (share, false),
            (None, None) => return,
        };
        let mut set = 0;
        for h in self.live.values().filter(|h| all || h.raised) {
            match hold(self.dir, &h.meter, share) {
                Ok(()) => set += 1,
                Err(e) if !self.refused => {
                    self.refused = true;
                    tracing::debug!("{} buffers left to autotuning: {e}", self.name());
                }
                Err(_) => {}
            }
        }
        if set > 0 && self.report(share).is_some() {
            tracing::debug!(
                "{} buffer of each of {set} data streams set to {share} bytes ({streams} \
                 sending share a {budget}-byte budget; autotuning grows each to at most \
                 {max})",
                self.name()
            );
        }
    }

    fn name(&self) -> &'static str {
        match self.dir {
            Buffer::Send => "send",
            Buffer::Receive => "receive",
        }
    }

    /// When to call [`Budget::check`] next: `None` while nothing may be raised.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let (Some(budget), Some(max)) = (self.budget, self.autotune_max) else {
            return None;
        };
        if self.refused
            || tcp::raised_share(budget, self.streams(), max).is_none()
            || self.live.values().all(|h| h.raised)
        {
            return None;
        }
        self.next
    }

    /// Raises the buffer of each stream that reached the host's maximum and wants
    /// more ([`wants_more`]), once [`Budget::poll_timeout`] has come.
    pub fn check(&mut self, now: Instant) {
        let Some(at) = self.poll_timeout() else {
            return;
        };
        if now < at {
            return;
        }
        self.next = Some(now + CHECK);
        let (Some(budget), Some(max)) = (self.budget, self.autotune_max) else {
            return;
        };
        let streams = self.streams();
        let Some(share) = tcp::raised_share(budget, streams, max) else {
            return;
        };
        let dir = self.dir;
        let mut raised = Vec::new();
        for (&i, h) in self.live.iter_mut().filter(|(_, h)| !h.raised) {
            let meter = &h.meter;
            let Ok(size) = dir.size(&**meter) else {
                continue;
            };
            // Only a send buffer's stream is read (`TCP_INFO`): a receive buffer at the
            // maximum is enough.
            let sample = match dir {
                Buffer::Send => meter.read().ok(),
                Buffer::Receive => None,
            };
            let (busy, limited) = match sample {
                Some(s) => {
                    let d = (
                        s.busy.saturating_sub(h.last.0),
                        s.sndbuf_limited.saturating_sub(h.last.1),
                    );
                    h.last = (s.busy, s.sndbuf_limited);
                    d
                }
                None => (Duration::ZERO, Duration::ZERO),
            };
            if !wants_more(dir, size, max, busy, limited) {
                continue;
            }
            match hold(dir, &h.meter, share) {
                Ok(()) => {
                    h.raised = true;
                    raised.push((i, size, busy, limited));
                }
                Err(e) => {
                    self.refused = true;
                    tracing::info!(
                        "{} buffers of the transfer with {}: stream {i}'s reached this \
                         host's limit ({} maximum {max} bytes) and wants more, but \
                         cannot be raised to the session's share of {share} bytes ({e}); \
                         raise {}'s maximum to at least twice the link's bandwidth-delay \
                         product (dmover doctor), or more streams (-P) make up for it",
                        self.name(),
                        self.peer,
                        dir.sysctl(),
                        dir.sysctl(),
                    );
                    // Those raised before the refusal are reported below.
                    break;
                }
            }
        }
        let Some(&(i, size, busy, limited)) = raised.first() else {
            return;
        };
        self.report(share);
        let why = match dir {
            Buffer::Receive => String::new(),
            Buffer::Send => format!(
                " while the stream waited on it {:.0} % of its busy time",
                100.0 * limited.as_secs_f64() / busy.as_secs_f64()
            ),
        };
        let msg = format!(
            "{} buffers of the transfer with {}: stream {i}'s reached this host's limit \
             ({} maximum {max} bytes, at {size}){why}: raised to the session's share, \
             {share} bytes ({} stream(s) raised so far)",
            self.name(),
            self.peer,
            dir.sysctl(),
            self.live.values().filter(|h| h.raised).count(),
        );
        if self.told {
            tracing::debug!("{msg}");
        } else {
            self.told = true;
            tracing::info!("{msg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_raised_only_at_the_hosts_maximum_and_a_send_buffer_only_when_waited_on() {
        let ms = Duration::from_millis;
        let max = 4 << 20;
        // A receive buffer autotuning grew to the maximum: the reader took that much
        // per round trip.
        assert!(wants_more(Buffer::Receive, max, max, ms(0), ms(0)));
        assert!(!wants_more(Buffer::Receive, max - 1, max, ms(0), ms(0)));
        // A send buffer at the maximum that the stream waited on for 10 % of its busy
        // time or more.
        assert!(wants_more(Buffer::Send, max, max, ms(250), ms(25)));
        assert!(wants_more(Buffer::Send, max + 1, max, ms(250), ms(250)));
        // Not waited on (the congestion window, the receiver's window or the
        // application held it back), or not at the maximum, or idle: left alone.
        assert!(!wants_more(Buffer::Send, max, max, ms(250), ms(24)));
        assert!(!wants_more(Buffer::Send, max - 1, max, ms(250), ms(250)));
        assert!(!wants_more(Buffer::Send, max, max, ms(0), ms(0)));
    }
}
