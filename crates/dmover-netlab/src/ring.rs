//! A pre-allocated byte ring holding packets in release order.
//!
//! Each direction of the link keeps its queued and in-flight packets here. Release
//! times are monotone within a direction (a FIFO bottleneck followed by a constant
//! delay), so a ring is the whole time-ordered queue: append at the tail, release from
//! the head. Packets are read from the TUN device straight into the ring and written
//! out of it, so the forwarder allocates nothing per packet.
//!
//! Layout of an entry: `release_ns: u64`, `len: u32`, 4 bytes of padding, then `len`
//! bytes, padded to 8. An entry with `len == u32::MAX` (or fewer than 16 bytes left
//! before the end) marks the end of the data before the wrap to offset 0.

/// Bytes of an entry's header.
const HDR: usize = 16;
/// `len` of a wrap marker.
const WRAP: u32 = u32::MAX;

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// A FIFO of variable-size packets with release times, in one contiguous buffer.
pub struct Ring {
    buf: Box<[u8]>,
    /// Offset of the oldest entry.
    head: usize,
    /// Offset where the next entry goes.
    tail: usize,
    /// Bytes in use, headers and wrap padding included.
    used: usize,
    /// Entries (packets) in the ring.
    count: usize,
    /// Payload bytes in the ring (what the packets add up to).
    payload: usize,
}

impl Ring {
    /// A ring of `capacity` bytes (rounded up to 8), its memory faulted in up front.
    pub fn new(capacity: usize) -> Ring {
        let cap = align8(capacity.max(HDR * 4));
        let mut buf = vec![0u8; cap].into_boxed_slice();
        // Fault every page in now: a page fault (or a transparent huge page's
        // compaction) in the middle of forwarding would hold packets past their
        // release time.
        for i in (0..cap).step_by(4096) {
            // SAFETY: `i < cap`, inside the allocation; a volatile write so the
            // compiler cannot drop a store of the zero that is already there.
            unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 0) };
        }
        Ring {
            buf,
            head: 0,
            tail: 0,
            used: 0,
            count: 0,
            payload: 0,
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Packets queued.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no packet is queued.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of the queued packets.
    pub fn queued_bytes(&self) -> usize {
        self.payload
    }

    /// Contiguous space for a packet of up to `max` bytes at the tail, or `None` when
    /// the ring is too full. Nothing is queued until [`Ring::commit`].
    pub fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        let need = HDR + align8(max);
        let cap = self.buf.len();
        if self.used == 0 {
            self.head = 0;
            self.tail = 0;
        }
        let start = if self.tail >= self.head && !(self.tail == self.head && self.used > 0) {
            // Free space: [tail, cap) and [0, head).
            if cap - self.tail >= need {
                self.tail
            } else if self.head >= need {
                // Mark the end and wrap. The marker is consumed by the reader.
                let rest = cap - self.tail;
                if rest >= HDR {
                    self.buf[self.tail + 8..self.tail + 12].copy_from_slice(&WRAP.to_ne_bytes());
                }
                self.used += rest;
                self.tail = 0;
                0
            } else {
                return None;
            }
        } else if self.head - self.tail >= need {
            self.tail
        } else {
            return None;
        };
        Some(&mut self.buf[start + HDR..start + need])
    }

    /// Queues the first `len` bytes of the space returned by the last
    /// [`Ring::reserve`], to be released at `release_ns`.
    pub fn commit(&mut self, len: usize, release_ns: u64) {
        let t = self.tail;
        debug_assert!(len < WRAP as usize && t + HDR + len <= self.buf.len());
        self.buf[t..t + 8].copy_from_slice(&release_ns.to_ne_bytes());
        self.buf[t + 8..t + 12].copy_from_slice(&(len as u32).to_ne_bytes());
        let step = HDR + align8(len);
        self.tail += step;
        if self.tail == self.buf.len() {
            self.tail = 0;
        }
        self.used += step;
        self.count += 1;
        self.payload += len;
    }

    /// Skips a wrap marker at the head, if any.
    fn skip_wrap(&mut self) {
        if self.used == 0 {
            return;
        }
        let cap = self.buf.len();
        let rest = cap - self.head;
        if rest < HDR || self.len_at(self.head) == WRAP {
            self.used -= rest;
            self.head = 0;
        }
    }

    fn len_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.buf[at + 8..at + 12].try_into().expect("4 bytes"))
    }

    /// The release time and bytes of the oldest packet.
    pub fn front(&mut self) -> Option<(u64, &[u8])> {
        self.skip_wrap();
        if self.count == 0 {
            return None;
        }
        let h = self.head;
        let release = u64::from_ne_bytes(self.buf[h..h + 8].try_into().expect("8 bytes"));
        let len = self.len_at(h) as usize;
        Some((release, &self.buf[h + HDR..h + HDR + len]))
    }

    /// The release time of the oldest packet.
    pub fn front_release(&mut self) -> Option<u64> {
        self.front().map(|(r, _)| r)
    }

    /// Removes the oldest packet.
    pub fn pop(&mut self) {
        self.skip_wrap();
        if self.count == 0 {
            return;
        }
        let len = self.len_at(self.head) as usize;
        let step = HDR + align8(len);
        self.head += step;
        if self.head == self.buf.len() {
            self.head = 0;
        }
        self.used -= step;
        self.count -= 1;
        self.payload -= len;
        if self.count == 0 {
            // Only wrap padding can be left; start over at 0.
            self.used = 0;
            self.head = 0;
            self.tail = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn fifo_and_wrap() {
        let mut r = Ring::new(256);
        for round in 0..50u64 {
            let n = 20 + (round as usize * 7) % 60;
            let s = r.reserve(n).expect("space");
            s[..n].fill(round as u8);
            r.commit(n, round);
            let (rel, p) = r.front().expect("one packet");
            assert_eq!(rel, round);
            assert_eq!(p.len(), n);
            assert!(p.iter().all(|&b| b == round as u8));
            r.pop();
            assert!(r.is_empty());
        }
    }

    #[test]
    fn full_ring_refuses() {
        let mut r = Ring::new(128);
        assert!(r.reserve(200).is_none());
        let _ = r.reserve(40).expect("space");
        r.commit(40, 1);
        let _ = r.reserve(40).expect("space");
        r.commit(40, 2);
        assert!(r.reserve(40).is_none());
        r.pop();
        // 56 bytes free at the start, 16 at the end: wraps.
        let _ = r.reserve(40).expect("space after wrap");
        r.commit(40, 3);
        assert_eq!(r.front_release(), Some(2));
        r.pop();
        assert_eq!(r.front_release(), Some(3));
        r.pop();
        assert_eq!(r.front_release(), None);
    }

    proptest! {
        /// The ring behaves as a FIFO of byte strings, refusing only when full.
        #[test]
        fn behaves_like_a_queue(ops in proptest::collection::vec((any::<bool>(), 1usize..300), 1..400)) {
            let mut r = Ring::new(1024);
            let mut model: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
            let mut next = 0u64;
            for (push, n) in ops {
                if push {
                    let free_bytes: usize = 1024 - model.iter().map(|(_, p)| HDR + align8(p.len())).sum::<usize>();
                    match r.reserve(n) {
                        Some(s) => {
                            let data: Vec<u8> = (0..n).map(|i| (i as u64 + next) as u8).collect();
                            s[..n].copy_from_slice(&data);
                            r.commit(n, next);
                            model.push_back((next, data));
                            next += 1;
                        }
                        None => prop_assert!(free_bytes < 2 * (HDR + align8(n)) + 1024 / 2,
                            "refused {n} with {free_bytes} free"),
                    }
                } else {
                    let m = model.pop_front();
                    match (r.front(), &m) {
                        (None, None) => {}
                        (Some((rel, p)), Some((mr, mp))) => {
                            prop_assert_eq!(rel, *mr);
                            prop_assert_eq!(p, &mp[..]);
                        }
                        (a, b) => prop_assert!(false, "ring {:?} vs model {:?}", a.map(|x| x.0), b.as_ref().map(|x| x.0)),
                    }
                    r.pop();
                }
                prop_assert_eq!(r.len(), model.len());
                prop_assert_eq!(r.queued_bytes(), model.iter().map(|(_, p)| p.len()).sum::<usize>());
            }
        }
    }
}
