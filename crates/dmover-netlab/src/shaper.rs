//! The link model of one direction, without I/O: a FIFO bottleneck of a given rate
//! with a tail-drop queue, followed by a constant one-way delay.
//!
//! A packet of `w` wire bytes arriving at `t` starts serialising when the bottleneck is
//! free (`max(t, busy_until)`) and has left it `w × 8 / rate` later; it is delivered
//! one one-way delay after that. The backlog it sees is the time the bottleneck is
//! still busy, in bytes; when that plus the packet would exceed the queue limit, the
//! packet is dropped (tail-drop), unless the queue is empty. Without a rate there is
//! no bottleneck, only the delay. Release times come out monotone, which is what lets
//! [`crate::ring::Ring`] be the whole queue.

/// What happened to a packet offered to the bottleneck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver at this time (ns on the forwarder's clock).
    Release(u64),
    /// The bottleneck queue was full: tail-drop.
    QueueDrop,
}

/// One direction's bottleneck and delay.
#[derive(Debug, Clone)]
pub struct Shaper {
    rate_bps: Option<u64>,
    delay_ns: u64,
    queue_bytes: u64,
    busy_until: u64,
}

impl Shaper {
    /// A bottleneck of `rate_bps` (none: unlimited) with a `queue_bytes` tail-drop
    /// queue, followed by `delay_ns` of propagation delay.
    pub fn new(rate_bps: Option<u64>, queue_bytes: u64, delay_ns: u64) -> Shaper {
        Shaper {
            rate_bps,
            delay_ns,
            queue_bytes,
            busy_until: 0,
        }
    }

    /// Offers a packet of `wire_bytes` arriving at `now_ns`.
    pub fn offer(&mut self, now_ns: u64, wire_bytes: u64) -> Verdict {
        let Some(rate) = self.rate_bps else {
            return Verdict::Release(now_ns + self.delay_ns);
        };
        let start = self.busy_until.max(now_ns);
        let backlog = ((start - now_ns) as u128 * rate as u128 / 8_000_000_000) as u64;
        if backlog > 0 && backlog + wire_bytes > self.queue_bytes {
            return Verdict::QueueDrop;
        }
        let tx_ns = (wire_bytes as u128 * 8_000_000_000 / rate as u128) as u64;
        self.busy_until = start + tx_ns;
        Verdict::Release(self.busy_until + self.delay_ns)
    }

    /// How many wire bytes a packet arriving at `now_ns` may have and still be
    /// queued (`u64::MAX` when the queue is empty or there is no bottleneck: any
    /// packet goes).
    pub fn room(&self, now_ns: u64) -> u64 {
        let backlog = self.backlog(now_ns);
        if self.rate_bps.is_none() || backlog == 0 {
            u64::MAX
        } else {
            self.queue_bytes.saturating_sub(backlog)
        }
    }

    /// Bytes waiting in the bottleneck queue at `now_ns`.
    pub fn backlog(&self, now_ns: u64) -> u64 {
        match self.rate_bps {
            Some(rate) => {
                (self.busy_until.saturating_sub(now_ns) as u128 * rate as u128 / 8_000_000_000)
                    as u64
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn delay_only() {
        let mut s = Shaper::new(None, 0, 25 * MS);
        assert_eq!(s.offer(0, 1_000_000), Verdict::Release(25 * MS));
        assert_eq!(s.offer(1, 1_000_000), Verdict::Release(25 * MS + 1));
    }

    #[test]
    fn serialises_at_the_rate() {
        // 1 Gbit/s: 125 000 bytes take 1 ms.
        let mut s = Shaper::new(Some(1_000_000_000), 10_000_000, 10 * MS);
        assert_eq!(s.offer(0, 125_000), Verdict::Release(11 * MS));
        // Arrives while the first is still serialising: queued behind it.
        assert_eq!(s.offer(0, 125_000), Verdict::Release(12 * MS));
        assert_eq!(s.backlog(0), 250_000);
        // Arrives after the bottleneck went idle.
        assert_eq!(s.offer(5 * MS, 125_000), Verdict::Release(16 * MS));
    }

    #[test]
    fn tail_drop_when_the_queue_is_full() {
        let mut s = Shaper::new(Some(1_000_000_000), 200_000, 0);
        assert_eq!(s.offer(0, 150_000), Verdict::Release(1_200_000));
        // Backlog 150 000 + 100 000 > 200 000.
        assert_eq!(s.offer(0, 100_000), Verdict::QueueDrop);
        assert_eq!(s.offer(0, 50_000), Verdict::Release(1_600_000));
        assert_eq!(s.room(0), 0);
        assert_eq!(s.room(1_000_000), 125_000);
        assert_eq!(s.room(2_000_000), u64::MAX);
        // An empty queue always takes a packet, even one larger than the limit.
        let mut s = Shaper::new(Some(1_000_000_000), 1000, 0);
        assert!(matches!(s.offer(0, 65_000), Verdict::Release(_)));
    }

    #[test]
    fn long_run_rate_is_exact() {
        let rate = 5_000_000_000u64;
        let mut s = Shaper::new(Some(rate), u64::MAX / 4, 0);
        let mut last = 0;
        let mut bytes = 0u64;
        for i in 0..100_000u64 {
            let w = 1500 + (i * 7919) % 64_000;
            bytes += w;
            match s.offer(0, w) {
                Verdict::Release(t) => {
                    assert!(t >= last, "release times are monotone");
                    last = t;
                }
                Verdict::QueueDrop => unreachable!(),
            }
        }
        let expect = bytes as f64 * 8.0 / rate as f64 * 1e9;
        assert!((last as f64 - expect).abs() / expect < 1e-4);
    }
}
