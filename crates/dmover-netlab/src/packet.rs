//! Packets as the TUN device hands them over with `IFF_VNET_HDR`: a `virtio_net_hdr`
//! followed by an IP packet, which may be a TCP super-packet (TSO) or a UDP one (USO,
//! `VIRTIO_NET_HDR_GSO_UDP_L4`: a burst of datagrams of `gso_size` bytes each, the last
//! maybe shorter, from a sender using `UDP_SEGMENT`) of up to 64 KiB that stands for
//! many wire segments.
//!
//! Loss is drawn per segment, so a super-packet with a lost segment is cut into runs of
//! surviving consecutive segments, each written as a packet of its own
//! ([`write_run`]): IPv4 total length, ID and header checksum, and the TCP sequence
//! number, flags and pseudo-header checksum (or the UDP length and pseudo-header
//! checksum) are rewritten the way the kernel's own GSO segmentation does. No I/O here.

/// Size of `struct virtio_net_hdr` (without `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum is partial, completed from
/// `csum_start`/`csum_offset`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation offload (Linux 6.2+).
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN` flag bit of `gso_type`.
pub const GSO_ECN: u8 = 0x80;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// The parsed `virtio_net_hdr` (little-endian on the wire, as on every host we run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    /// `F_NEEDS_CSUM` and friends.
    pub flags: u8,
    /// `GSO_*`.
    pub gso_type: u8,
    /// Length of the headers (IP + TCP).
    pub hdr_len: u16,
    /// MSS of a super-packet.
    pub gso_size: u16,
    /// Where the checksummed data starts.
    pub csum_start: u16,
    /// Where, from `csum_start`, the checksum goes.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header from the first [`VNET_HDR_LEN`] bytes.
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        if b.len() < VNET_HDR_LEN {
            return None;
        }
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    /// Writes the header into the first [`VNET_HDR_LEN`] bytes.
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }
}

/// How a packet divides into segments on the emulated wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segments {
    /// Number of wire segments (1 for an ordinary packet).
    pub count: u32,
    /// Bytes on the wire: the IP packet, plus the headers repeated for every segment
    /// after the first.
    pub wire_bytes: u64,
    /// How to cut the packet, when it is a splittable TCPv4 or UDPv4 super-packet.
    pub split: Option<SplitInfo>,
}

/// What [`write_run`] needs to cut a TCPv4 or UDPv4 super-packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitInfo {
    /// IPv4 header length.
    pub ip_hlen: usize,
    /// IPv4 + TCP (or UDP) header length.
    pub hdr_len: usize,
    /// MSS (for UDP: the payload of each datagram but the last).
    pub mss: usize,
    /// TCP (or UDP) payload length.
    pub payload: usize,
    /// A UDP super-packet (`GSO_UDP_L4`): every segment is a datagram of its own.
    pub udp: bool,
}

/// Classifies a packet (vnet header + IP packet) read from the TUN device.
pub fn segments(pkt: &[u8]) -> Segments {
    let ip_len = pkt.len().saturating_sub(VNET_HDR_LEN) as u64;
    let single = Segments {
        count: 1,
        wire_bytes: ip_len,
        split: None,
    };
    let Some(v) = VnetHdr::parse(pkt) else {
        return single;
    };
    if v.gso_type & !GSO_ECN == GSO_NONE || v.gso_size == 0 {
        return single;
    }
    let ip = &pkt[VNET_HDR_LEN..];
    let mss = v.gso_size as usize;
    // The headers, from the packet itself (not trusting hdr_len).
    let udp = v.gso_type & !GSO_ECN == GSO_UDP_L4;
    let hdr = if v.gso_type & !GSO_ECN == GSO_TCPV4 {
        tcpv4_headers(ip)
    } else if udp {
        udpv4_headers(ip)
    } else {
        None
    };
    let Some((ip_hlen, hdr_len)) = hdr else {
        // Another GSO kind (TCPv6, UDPv6): count segments, but never split it.
        let h = v.hdr_len as usize;
        let payload = ip.len().saturating_sub(h);
        let count = payload.div_ceil(mss).max(1) as u32;
        return Segments {
            count,
            wire_bytes: ip_len + (count as u64 - 1) * h as u64,
            split: None,
        };
    };
    let payload = ip.len() - hdr_len;
    let count = payload.div_ceil(mss).max(1) as u32;
    Segments {
        count,
        wire_bytes: ip_len + (count as u64 - 1) * hdr_len as u64,
        split: (v.flags & F_NEEDS_CSUM != 0).then_some(SplitInfo {
            ip_hlen,
            hdr_len,
            mss,
            payload,
            udp,
        }),
    }
}

/// `(IPv4 header length, IPv4 + UDP header length)` of a well-formed IPv4/UDP packet
/// whose total length matches the buffer.
fn udpv4_headers(ip: &[u8]) -> Option<(usize, usize)> {
    if ip.len() < 28 || ip[0] >> 4 != 4 || ip[9] != 17 {
        return None;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || total != ip.len() || ip.len() < ihl + 8 {
        return None;
    }
    Some((ihl, ihl + 8))
}

/// `(IPv4 header length, IPv4 + TCP header length)` of a well-formed IPv4/TCP
/// packet whose total length matches the buffer.
fn tcpv4_headers(ip: &[u8]) -> Option<(usize, usize)> {
    if ip.len() < 40 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    // A super-packet's total length may be 0 when it exceeds 64 KiB (BIG TCP); we only
    // split packets whose length field is exact.
    if ihl < 20 || total != ip.len() || ip.len() < ihl + 20 {
        return None;
    }
    let doff = (ip[ihl + 12] >> 4) as usize * 4;
    if doff < 20 || ip.len() < ihl + doff {
        return None;
    }
    Some((ihl, ihl + doff))
}

/// Ones' complement sum of big-endian 16-bit words, not folded.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [b] = chunks.remainder() {
        acc += (*b as u32) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The IPv4 header checksum of `hdr` (its checksum field taken as zero).
pub fn ipv4_header_checksum(hdr: &[u8]) -> u16 {
    let acc = sum16(&hdr[..10], 0);
    let acc = sum16(&hdr[12..], acc);
    !fold(acc)
}

/// The partial TCP checksum the kernel stores with `CHECKSUM_PARTIAL`: the folded,
/// uncomplemented sum of the IPv4 pseudo-header for a TCP segment of `tcp_len`.
pub fn tcpv4_pseudo_partial(src: [u8; 4], dst: [u8; 4], tcp_len: usize) -> u16 {
    pseudo_partial(src, dst, 6, tcp_len)
}

/// [`tcpv4_pseudo_partial`] for any IPv4 protocol (`proto` 17: UDP, `len` the UDP
/// length).
pub fn pseudo_partial(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u16 {
    let acc = sum16(&src, 0);
    let acc = sum16(&dst, acc);
    fold(acc + proto as u32 + len as u32)
}

/// Writes segments `first..end` of super-packet `pkt` as one packet (vnet header
/// included) into `out`, returning its length: a TCP segment or a UDP datagram when
/// it is one segment, else a smaller super-packet of the same kind. `out` must hold `VNET_HDR_LEN +
/// hdr_len + (end - first) × mss` bytes.
pub fn write_run(pkt: &[u8], info: &SplitInfo, first: usize, end: usize, out: &mut [u8]) -> usize {
    let v = VnetHdr::parse(pkt).expect("checked by segments()");
    let ip = &pkt[VNET_HDR_LEN..];
    let n = info.payload.div_ceil(info.mss);
    debug_assert!(first < end && end <= n);
    let from = first * info.mss;
    let to = (end * info.mss).min(info.payload);
    let seg_len = to - from;
    let total = info.hdr_len + seg_len;

    let o = &mut out[VNET_HDR_LEN..VNET_HDR_LEN + total];
    o[..info.hdr_len].copy_from_slice(&ip[..info.hdr_len]);
    o[info.hdr_len..].copy_from_slice(&ip[info.hdr_len + from..info.hdr_len + to]);

    // IPv4: total length, ID (the kernel numbers a super-packet's segments
    // consecutively), header checksum.
    o[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    let id = u16::from_be_bytes([ip[4], ip[5]]).wrapping_add(first as u16);
    o[4..6].copy_from_slice(&id.to_be_bytes());
    o[10..12].fill(0);
    let c = ipv4_header_checksum(&o[..info.ip_hlen]);
    o[10..12].copy_from_slice(&c.to_be_bytes());

    let t = info.ip_hlen;
    let src: [u8; 4] = ip[12..16].try_into().expect("4 bytes");
    let dst: [u8; 4] = ip[16..20].try_into().expect("4 bytes");
    let segs = end - first;
    if info.udp {
        // UDP: the length (of the whole run, as the kernel's own super-packet has it:
        // receive-side segmentation fixes it per datagram) and the pseudo-header
        // partial checksum for that length.
        let udp_len = total - t;
        o[t + 4..t + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        let partial = pseudo_partial(src, dst, 17, udp_len);
        o[t + 6..t + 8].copy_from_slice(&partial.to_be_bytes());
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if segs > 1 { GSO_UDP_L4 } else { GSO_NONE },
            hdr_len: info.hdr_len as u16,
            gso_size: if segs > 1 { info.mss as u16 } else { 0 },
            csum_start: t as u16,
            csum_offset: 6,
        };
        hdr.write(out);
        return VNET_HDR_LEN + total;
    }

    // TCP: sequence number, flags (CWR only on the first segment, FIN and PSH only on
    // the last), pseudo-header partial checksum for the new length.
    let seq =
        u32::from_be_bytes([ip[t + 4], ip[t + 5], ip[t + 6], ip[t + 7]]).wrapping_add(from as u32);
    o[t + 4..t + 8].copy_from_slice(&seq.to_be_bytes());
    let mut flags = ip[t + 13];
    if first > 0 {
        flags &= !TCP_CWR;
    }
    if end < n {
        flags &= !(TCP_FIN | TCP_PSH);
    }
    o[t + 13] = flags;
    let partial = tcpv4_pseudo_partial(src, dst, total - info.ip_hlen);
    o[t + 16..t + 18].copy_from_slice(&partial.to_be_bytes());

    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if segs > 1 {
            GSO_TCPV4 | if first == 0 { v.gso_type & GSO_ECN } else { 0 }
        } else {
            GSO_NONE
        },
        hdr_len: info.hdr_len as u16,
        gso_size: if segs > 1 { info.mss as u16 } else { 0 },
        csum_start: info.ip_hlen as u16,
        csum_offset: 16,
    };
    hdr.write(out);
    VNET_HDR_LEN + total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCPv4 super-packet as the kernel hands it over: `payload` bytes with MSS
    /// `mss`, flags PSH|ACK|CWR|FIN.
    fn superpacket(payload: usize, mss: u16) -> Vec<u8> {
        let mut p = vec![0u8; VNET_HDR_LEN + 20 + 32 + payload];
        let ip_total = 20 + 32 + payload;
        {
            let ip = &mut p[VNET_HDR_LEN..];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(ip_total as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&0xfffeu16.to_be_bytes());
            ip[6] = 0x40;
            ip[8] = 64;
            ip[9] = 6;
            ip[12..16].copy_from_slice(&[10, 200, 0, 1]);
            ip[16..20].copy_from_slice(&[10, 200, 0, 2]);
            let c = ipv4_header_checksum(&ip[..20]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            let t = &mut ip[20..];
            t[0..2].copy_from_slice(&40000u16.to_be_bytes());
            t[2..4].copy_from_slice(&7700u16.to_be_bytes());
            t[4..8].copy_from_slice(&0xffff_f000u32.to_be_bytes());
            t[12] = 8 << 4;
            t[13] = TCP_CWR | 0x10 | TCP_PSH | TCP_FIN;
            let partial = tcpv4_pseudo_partial([10, 200, 0, 1], [10, 200, 0, 2], 32 + payload);
            t[16..18].copy_from_slice(&partial.to_be_bytes());
            for (i, b) in t[32..].iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
        }
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 52,
            gso_size: mss,
            csum_start: 20,
            csum_offset: 16,
        }
        .write(&mut p);
        p
    }

    #[test]
    fn vnet_header_round_trip() {
        let h = VnetHdr {
            flags: 1,
            gso_type: GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut b = [0u8; VNET_HDR_LEN];
        h.write(&mut b);
        assert_eq!(b, [1, 1, 52, 0, 0xa8, 0x05, 20, 0, 16, 0]);
        assert_eq!(VnetHdr::parse(&b), Some(h));
    }

    #[test]
    fn counts_segments_and_wire_bytes() {
        let p = superpacket(10_000, 1448);
        let s = segments(&p);
        assert_eq!(s.count, 7);
        assert_eq!(s.wire_bytes, (52 + 10_000 + 6 * 52) as u64);
        let info = s.split.expect("splittable");
        assert_eq!(
            (info.ip_hlen, info.hdr_len, info.mss, info.payload, info.udp),
            (20, 52, 1448, 10_000, false)
        );
        // An ordinary packet is one segment.
        let mut small = superpacket(100, 1448);
        small[1] = GSO_NONE;
        small[4..6].fill(0);
        assert_eq!(segments(&small).count, 1);
        assert_eq!(segments(&small).wire_bytes, 152);
    }

    #[test]
    fn the_kernels_partial_checksum_is_what_we_compute() {
        // The fixture stores what __tcp_v4_send_check stores; a run covering the whole
        // packet must reproduce the packet exactly.
        let p = superpacket(5000, 1000);
        let info = segments(&p).split.expect("splittable");
        let mut out = vec![0u8; p.len()];
        let n = write_run(&p, &info, 0, 5, &mut out);
        assert_eq!(n, p.len());
        assert_eq!(out, p);
    }

    #[test]
    fn runs_reassemble_the_stream() {
        let p = superpacket(10_000, 1448);
        let info = segments(&p).split.expect("splittable");
        // Lose segment 2 of 7: runs 0..2 and 3..7.
        let mut a = vec![0u8; p.len()];
        let la = write_run(&p, &info, 0, 2, &mut a);
        let mut b = vec![0u8; p.len()];
        let lb = write_run(&p, &info, 3, 7, &mut b);
        let (a, b) = (&a[..la], &b[..lb]);
        let ip_a = &a[VNET_HDR_LEN..];
        let ip_b = &b[VNET_HDR_LEN..];
        // Lengths, IDs, checksums.
        assert_eq!(
            u16::from_be_bytes([ip_a[2], ip_a[3]]) as usize,
            52 + 2 * 1448
        );
        assert_eq!(
            u16::from_be_bytes([ip_b[2], ip_b[3]]) as usize,
            52 + 10_000 - 3 * 1448
        );
        assert_eq!(u16::from_be_bytes([ip_a[4], ip_a[5]]), 0xfffe);
        assert_eq!(u16::from_be_bytes([ip_b[4], ip_b[5]]), 0x0001, "ID wraps");
        for ip in [ip_a, ip_b] {
            assert_eq!(
                fold(sum16(&ip[..20], 0)),
                0xffff,
                "valid IPv4 header checksum"
            );
        }
        // Sequence numbers (wrapping) and flags.
        let seq = |ip: &[u8]| u32::from_be_bytes(ip[24..28].try_into().unwrap());
        assert_eq!(seq(ip_a), 0xffff_f000);
        assert_eq!(seq(ip_b), 0xffff_f000u32.wrapping_add(3 * 1448));
        assert_eq!(
            ip_a[33],
            TCP_CWR | 0x10,
            "CWR stays on the first, FIN/PSH go"
        );
        assert_eq!(
            ip_b[33],
            0x10 | TCP_PSH | TCP_FIN,
            "FIN/PSH stay on the last"
        );
        // Payload bytes are the right slices.
        assert_eq!(
            &ip_a[52..],
            &p[VNET_HDR_LEN + 52..VNET_HDR_LEN + 52 + 2 * 1448]
        );
        assert_eq!(&ip_b[52..], &p[VNET_HDR_LEN + 52 + 3 * 1448..]);
        // Complete the partial checksum as a NIC would and check it verifies.
        for ip in [ip_a, ip_b] {
            let tcp_len = ip.len() - 20;
            let mut full = ip.to_vec();
            let sum = sum16(&full[20..], 0);
            let c = !fold(sum);
            full[36..38].copy_from_slice(&c.to_be_bytes());
            let verify = sum16(&full[12..20], 6 + tcp_len as u32);
            assert_eq!(fold(sum16(&full[20..], verify)), 0xffff);
        }
        // vnet headers: GSO for runs of 2+, none for a single segment.
        let va = VnetHdr::parse(a).unwrap();
        assert_eq!(
            (va.gso_type, va.gso_size, va.csum_start),
            (GSO_TCPV4, 1448, 20)
        );
        let mut c = vec![0u8; p.len()];
        let lc = write_run(&p, &info, 6, 7, &mut c);
        let vc = VnetHdr::parse(&c[..lc]).unwrap();
        assert_eq!((vc.gso_type, vc.gso_size), (GSO_NONE, 0));
        assert_eq!(lc, VNET_HDR_LEN + 52 + 10_000 - 6 * 1448);
    }

    /// A UDPv4 super-packet as a `UDP_SEGMENT` sender's kernel hands it over:
    /// `payload` bytes in datagrams of `size`.
    fn udp_superpacket(payload: usize, size: u16) -> Vec<u8> {
        let mut p = vec![0u8; VNET_HDR_LEN + 28 + payload];
        let ip_total = 28 + payload;
        {
            let ip = &mut p[VNET_HDR_LEN..];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(ip_total as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
            ip[6] = 0x40;
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&[10, 200, 0, 1]);
            ip[16..20].copy_from_slice(&[10, 200, 0, 2]);
            let c = ipv4_header_checksum(&ip[..20]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            let u = &mut ip[20..];
            u[0..2].copy_from_slice(&40000u16.to_be_bytes());
            u[2..4].copy_from_slice(&4433u16.to_be_bytes());
            u[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
            let partial = pseudo_partial([10, 200, 0, 1], [10, 200, 0, 2], 17, 8 + payload);
            u[6..8].copy_from_slice(&partial.to_be_bytes());
            for (i, b) in u[8..].iter_mut().enumerate() {
                *b = (i % 253) as u8;
            }
        }
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_UDP_L4,
            hdr_len: 28,
            gso_size: size,
            csum_start: 20,
            csum_offset: 6,
        }
        .write(&mut p);
        p
    }

    #[test]
    fn udp_superpackets_are_cut_into_datagrams() {
        let p = udp_superpacket(10 * 1200 + 500, 1200);
        let s = segments(&p);
        assert_eq!(s.count, 11);
        assert_eq!(s.wire_bytes, (28 + 12_500 + 10 * 28) as u64);
        let info = s.split.expect("splittable");
        assert!(info.udp);
        assert_eq!((info.ip_hlen, info.hdr_len, info.mss), (20, 28, 1200));
        // The whole run is the packet itself.
        let mut out = vec![0u8; p.len()];
        assert_eq!(write_run(&p, &info, 0, 11, &mut out), p.len());
        assert_eq!(out, p);
        // One datagram: the 4th (index 3), an ordinary UDP packet.
        let n = write_run(&p, &info, 3, 4, &mut out);
        assert_eq!(n, VNET_HDR_LEN + 28 + 1200);
        let ip = &out[VNET_HDR_LEN..n];
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 1228);
        assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 0x1237);
        assert_eq!(fold(sum16(&ip[..20], 0)), 0xffff);
        assert_eq!(u16::from_be_bytes([ip[24], ip[25]]), 1208, "UDP length");
        assert_eq!(
            &ip[28..],
            &p[VNET_HDR_LEN + 28 + 3600..VNET_HDR_LEN + 28 + 4800]
        );
        // Completing the partial checksum gives a datagram that verifies.
        let mut full = ip.to_vec();
        let c = !fold(sum16(&full[20..], 0));
        full[26..28].copy_from_slice(&c.to_be_bytes());
        let verify = sum16(&full[12..20], 17 + 1208);
        assert_eq!(fold(sum16(&full[20..], verify)), 0xffff);
        let v = VnetHdr::parse(&out[..n]).unwrap();
        assert_eq!((v.gso_type, v.gso_size, v.csum_offset), (GSO_NONE, 0, 6));
        // A run of the last three: a smaller super-packet ending with the short one.
        let n = write_run(&p, &info, 8, 11, &mut out);
        assert_eq!(n, VNET_HDR_LEN + 28 + 2 * 1200 + 500);
        let v = VnetHdr::parse(&out[..n]).unwrap();
        assert_eq!((v.gso_type, v.gso_size), (GSO_UDP_L4, 1200));
        assert_eq!(segments(&out[..n]).count, 3);
    }

    #[test]
    fn malformed_packets_are_never_split() {
        let mut p = superpacket(3000, 1000);
        p[VNET_HDR_LEN + 2] = 0xff; // total length no longer matches
        let s = segments(&p);
        assert_eq!(s.count, 3);
        assert!(s.split.is_none());
        assert_eq!(segments(&[1, 2, 3]).count, 1);
        let mut q = superpacket(3000, 1000);
        q.truncate(VNET_HDR_LEN + 30);
        assert!(segments(&q).split.is_none());
    }
}
