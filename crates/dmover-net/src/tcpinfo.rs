//! What the kernel knows of a data stream's TCP connection (`TCP_INFO`): the bytes
//! the peer acknowledged and the round-trip times, read while the stream runs.
//!
//! A source's tuner measures its rate with these, not with the chunks it handed to
//! its sockets: a chunk (up to 64 MiB) leaves the application at once and then drains
//! for seconds, so counting whole chunks over a period of a second or two is off by
//! a chunk either way, while the kernel counts acknowledged bytes exactly.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

/// A data stream's TCP connection, for reading its counters. It holds a duplicate of
/// the socket's descriptor: while it lives, closing the stream does not close the
/// connection (no FIN), so its owner drops it as soon as the stream ends.
#[derive(Debug)]
pub struct TcpMeter {
    fd: OwnedFd,
}

impl AsFd for TcpMeter {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One reading of [`TcpMeter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSample {
    /// Bytes the peer acknowledged, since the connection was made.
    pub bytes_acked: u64,
    /// Bytes the peer holds beyond a hole (selectively acknowledged, `tcpi_sacked`
    /// segments of `tcpi_snd_mss`): delivered, but counted in
    /// [`TcpSample::bytes_acked`] only once the lost segment before them is resent.
    /// With loss, `bytes_acked` alone jumps by up to a window when a hole fills, which
    /// over a one-second period of a long link reads as ±20 % swings of the rate.
    pub bytes_sacked: u64,
    /// The smallest round-trip time seen (zero: none yet).
    pub min_rtt: Duration,
    /// The smoothed round-trip time.
    pub rtt: Duration,
    /// How long the connection has had data in flight or waiting to be sent
    /// (`tcpi_busy_time`; zero on kernels before 4.10).
    pub busy: Duration,
    /// How much of [`TcpSample::busy`] the sender waited on a window other than its
    /// congestion window: the receiver's (`tcpi_rwnd_limited`) or its own send buffer's
    /// (`tcpi_sndbuf_limited`). More connections help such a sender; one held by its
    /// congestion control alone is sending what the path gives it.
    pub window_limited: Duration,
    /// How much of [`TcpSample::window_limited`] was its own send buffer's: the
    /// sender had more to send, its congestion window allowed it, and the buffer was
    /// full of data in flight (`tcpi_sndbuf_limited`).
    pub sndbuf_limited: Duration,
}

impl TcpMeter {
    /// A meter of `socket` (a TCP socket).
    pub fn of(socket: &impl AsFd) -> io::Result<Self> {
        let fd = rustix::io::fcntl_dupfd_cloexec(socket.as_fd(), 0)?;
        Ok(TcpMeter { fd })
    }

    /// Reads the counters.
    pub fn read(&self) -> io::Result<TcpSample> {
        // SAFETY: tcp_info is plain old data; zeroed is a valid value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: the buffer and its length describe `info`; the fd is open.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&raw mut info).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // Kernels before 4.6 end the structure before tcpi_min_rtt; before 4.1,
        // before tcpi_bytes_acked.
        let has = |end: usize| len as usize >= end;
        let acked_end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
        let min_rtt_end = std::mem::offset_of!(libc::tcp_info, tcpi_min_rtt) + 4;
        if !has(acked_end) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this kernel's TCP_INFO has no acknowledged byte count",
            ));
        }
        let min_rtt = if has(min_rtt_end) {
            info.tcpi_min_rtt
        } else {
            0
        };
        let limits_end = std::mem::offset_of!(libc::tcp_info, tcpi_sndbuf_limited) + 8;
        let (busy, window_limited, sndbuf_limited) = if has(limits_end) {
            (
                info.tcpi_busy_time,
                info.tcpi_rwnd_limited
                    .saturating_add(info.tcpi_sndbuf_limited),
                info.tcpi_sndbuf_limited,
            )
        } else {
            (0, 0, 0)
        };
        Ok(TcpSample {
            bytes_acked: info.tcpi_bytes_acked,
            bytes_sacked: u64::from(info.tcpi_sacked) * u64::from(info.tcpi_snd_mss),
            min_rtt: Duration::from_micros(u64::from(min_rtt)),
            rtt: Duration::from_micros(u64::from(info.tcpi_rtt)),
            busy: Duration::from_micros(busy),
            window_limited: Duration::from_micros(window_limited),
            sndbuf_limited: Duration::from_micros(sndbuf_limited),
        })
    }
}

/// The smallest round trip a TCP socket has seen (`None`: none yet, or the kernel
/// does not tell): on a control connection once TLS is up, its handshake's and TLS's.
pub fn min_rtt(socket: &impl AsFd) -> Option<Duration> {
    let s = TcpMeter::of(socket).ok()?.read().ok()?;
    (!s.min_rtt.is_zero()).then_some(s.min_rtt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// Two ends of a loopback TCP connection: the one that connected, the accepted.
    fn pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    #[test]
    fn counts_what_the_peer_acknowledged() {
        let (mut a, mut b) = pair();
        let m = TcpMeter::of(&a).unwrap();
        let before = m.read().unwrap();
        let data = vec![7u8; 1 << 20];
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 1 << 20];
            b.read_exact(&mut got).unwrap();
            b
        });
        a.write_all(&data).unwrap();
        let b = reader.join().unwrap();
        // Acknowledgements may trail the reader by a moment.
        let mut after = m.read().unwrap();
        for _ in 0..100 {
            if after.bytes_acked >= before.bytes_acked + (1 << 20) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            after = m.read().unwrap();
        }
        assert_eq!(after.bytes_acked - before.bytes_acked, 1 << 20);
        assert!(after.rtt > Duration::ZERO);
        drop((b, a));
        // A meter of something that is not a TCP socket says so.
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(TcpMeter::of(&f).unwrap().read().is_err());
    }

    #[test]
    fn a_sender_the_receiver_holds_back_is_window_limited() {
        let (mut a, mut b) = pair();
        let m = TcpMeter::of(&a).unwrap();
        // The receiver reads nothing for a while: its window closes and the sender
        // waits on it.
        let writer = std::thread::spawn(move || {
            a.write_all(&vec![1u8; 64 << 20]).unwrap();
            a
        });
        let mut s = m.read().unwrap();
        for _ in 0..200 {
            std::thread::sleep(Duration::from_millis(10));
            s = m.read().unwrap();
            if s.window_limited >= Duration::from_millis(50) {
                break;
            }
        }
        assert!(s.window_limited >= Duration::from_millis(50), "{s:?}");
        assert!(s.busy >= s.window_limited, "{s:?}");
        std::io::copy(&mut (&mut b).take(64 << 20), &mut std::io::sink()).unwrap();
        drop(writer.join().unwrap());
    }
}
