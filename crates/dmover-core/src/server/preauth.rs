//! Connections before authentication, counted per source address (issue 46, item 5):
//! a control connection from its accept until it has authenticated, a data connection
//! until it has joined its session. One address may have at most
//! [`ServerConfig::max_unauthenticated_per_address`](super::ServerConfig) of them at
//! once, and its unauthenticated control connections may hold at most half of the
//! session places (taken at the preamble): one host that opens connections and stalls
//! them can no longer take every set-up slot or every session place from the others.
//! IPv6 addresses count per /64 (one host's share of a network); an IPv4 address
//! mapped into IPv6 counts as itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// The default of [`ServerConfig::max_unauthenticated_per_address`](super::ServerConfig).
pub const MAX_UNAUTHENTICATED_PER_ADDRESS: usize = 64;

/// The unauthenticated connections of each source address.
#[derive(Debug)]
pub(crate) struct PerAddress {
    counts: Mutex<HashMap<IpAddr, Count>>,
    /// Connections per address (0: no limit).
    cap: usize,
    /// Session places per address held by unauthenticated control connections (0: no
    /// limit).
    places: usize,
}

#[derive(Debug, Default)]
struct Count {
    conns: usize,
    places: usize,
}

/// What one address is counted under: IPv6 by its /64.
fn key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

impl PerAddress {
    /// At most `cap` connections per address (0: no limit), and session places for
    /// half of `max_sessions` (at least one, at most `cap`).
    pub(crate) fn new(cap: usize, max_sessions: usize) -> Arc<Self> {
        let places = if cap == 0 {
            0
        } else {
            (max_sessions / 2).clamp(1, cap)
        };
        Arc::new(PerAddress {
            counts: Mutex::new(HashMap::new()),
            cap,
            places,
        })
    }

    /// The limit per address (0: none).
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// The session places one address's unauthenticated connections may hold (0: no
    /// limit).
    pub(crate) fn places(&self) -> usize {
        self.places
    }

    /// Counts a new connection from `ip`, or `None` if the address has its limit.
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr) -> Option<AddrHold> {
        let ip = key(ip);
        let mut m = self.counts.lock();
        let c = m.entry(ip).or_default();
        if self.cap != 0 && c.conns >= self.cap {
            return None;
        }
        c.conns += 1;
        Some(AddrHold {
            table: self.clone(),
            ip,
            place: false,
        })
    }

    /// Unauthenticated connections counted for `ip` now.
    #[cfg(test)]
    fn count(&self, ip: IpAddr) -> usize {
        self.counts.lock().get(&key(ip)).map_or(0, |c| c.conns)
    }
}

/// One unauthenticated connection, counted against its address until dropped (at
/// authentication, at the join, or when the connection ends).
#[derive(Debug)]
pub(crate) struct AddrHold {
    table: Arc<PerAddress>,
    ip: IpAddr,
    place: bool,
}

impl AddrHold {
    /// Counts the session place this (control) connection takes at its preamble
    /// against its address: `false` if the address's unauthenticated connections hold
    /// their share of places already.
    pub(crate) fn take_place(&mut self) -> bool {
        if self.place {
            return true;
        }
        let mut m = self.table.counts.lock();
        let c = m.entry(self.ip).or_default();
        if self.table.places != 0 && c.places >= self.table.places {
            return false;
        }
        c.places += 1;
        self.place = true;
        true
    }

    /// The address counted.
    pub(crate) fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl Drop for AddrHold {
    fn drop(&mut self) {
        let mut m = self.table.counts.lock();
        if let Some(c) = m.get_mut(&self.ip) {
            c.conns = c.conns.saturating_sub(1);
            if self.place {
                c.places = c.places.saturating_sub(1);
            }
            if c.conns == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cap holds per address, places hold at half the sessions, and both come
    /// back when the holds are dropped; IPv6 counts per /64.
    #[test]
    fn addresses_are_counted_apart_and_released() {
        let t = PerAddress::new(3, 4);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let mut held: Vec<_> = (0..3).map(|_| t.take(a).unwrap()).collect();
        assert!(t.take(a).is_none());
        let other = t.take(b).unwrap();
        assert!(held[0].take_place());
        assert!(held[1].take_place());
        assert!(!held[2].take_place(), "two places: half of four sessions");
        held.remove(0);
        assert!(held[1].take_place());
        assert!(t.take(a).is_some());
        drop(held);
        drop(other);
        assert_eq!(t.count(a), 0);
        assert!(t.counts.lock().is_empty());

        let v6a: IpAddr = "2001:db8::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8::2:1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        let _h: Vec<_> = (0..3).map(|_| t.take(v6a).unwrap()).collect();
        assert!(t.take(v6b).is_none(), "the same /64");
        let _m = t.take(mapped).unwrap();
        assert_eq!(t.count(a), 1);

        let free = PerAddress::new(0, 4);
        let mut many: Vec<_> = (0..100).map(|_| free.take(a).unwrap()).collect();
        assert!(many.iter_mut().all(|h| h.take_place()));
    }
}
