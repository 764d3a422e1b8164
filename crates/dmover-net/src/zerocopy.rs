//! Zero-copy TCP sends with `MSG_ZEROCOPY` (Linux ≥ 4.14), with completion reaping.
//!
//! With `SO_ZEROCOPY` enabled, `sendmsg(…, MSG_ZEROCOPY)` pins the caller's pages
//! instead of copying them into the socket buffer. The pages must stay unchanged until the
//! kernel reports the send complete on the socket's error queue: each notification covers
//! a range of send calls (numbered from 0) and says whether the kernel had to copy after
//! all (`SO_EE_CODE_ZEROCOPY_COPIED`: always on loopback, and when the device cannot do
//! scatter-gather DMA). Notifications must be reaped, or the socket's option memory fills
//! and sends fail with `ENOBUFS`.
//!
//! Waiting for socket space cannot go through tokio's readiness of the socket: every
//! completion raises `EPOLLERR`, mio reads `EPOLLOUT | EPOLLERR` as "write side closed",
//! and tokio keeps that state for good, so an `EAGAIN` loop on it never sleeps and, on a
//! current-thread runtime, starves the task that would drain the other end. [`ZeroCopy`]
//! therefore keeps its own level-triggered epoll set holding only this socket and waits on
//! that set's descriptor; once zero-copy is on, every write to the socket (zero-copy or
//! not) must go through [`ZeroCopy::send_all`] or [`ZeroCopy::send_copied`].
//!
//! [`ZeroCopy`] counts sends and completions so a caller can report how many sends were
//! really zero-copy; [`ZeroCopy::enable`] fails on kernels without the feature, and callers
//! fall back to ordinary sends and say so.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;

/// `SO_ZEROCOPY` (asm-generic value, used by x86 and arm64).
const SO_ZEROCOPY: libc::c_int = 60;
/// Notification origin of zero-copy completions.
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// Set in a completion when the kernel copied the data after all.
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// Counters of one socket's zero-copy sends.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCopyStats {
    /// `sendmsg` calls made with `MSG_ZEROCOPY`.
    pub sends: u64,
    /// Of those, calls whose completion has been reaped.
    pub completed: u64,
    /// Of those, calls the kernel reported as copied (not zero-copy).
    pub copied: u64,
}

/// Zero-copy sending state of one socket.
#[derive(Debug)]
pub struct ZeroCopy {
    fd: RawFd,
    /// An epoll set holding only `fd` (level-triggered `EPOLLOUT`; `EPOLLERR` always
    /// comes along), registered with the runtime: readable when the socket has room or
    /// completions are waiting.
    waiter: AsyncFd<OwnedFd>,
    stats: ZeroCopyStats,
}

impl ZeroCopy {
    /// Enables `SO_ZEROCOPY` on `stream`; fails where the kernel does not have it. The
    /// socket must outlive the returned value.
    pub fn enable(stream: &TcpStream) -> io::Result<ZeroCopy> {
        let fd = stream.as_raw_fd();
        let one: libc::c_int = 1;
        // SAFETY: fd is an open socket; the option value is a c_int that outlives the call.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_ZEROCOPY,
                (&raw const one).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: ep was just created and is owned by nothing else.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLOUT as u32,
            u64: 0,
        };
        // SAFETY: both descriptors are open; ev outlives the call.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the OwnedFd is a valid epoll descriptor that only the AsyncFd owns and
        // closes.
        let waiter = unsafe { AsyncFd::register_with_interest(ep, Interest::READABLE)? };
        Ok(ZeroCopy {
            fd,
            waiter,
            stats: ZeroCopyStats::default(),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> ZeroCopyStats {
        self.stats
    }

    /// Sends all of `bufs` with `MSG_ZEROCOPY`, waiting for socket space as needed and
    /// reaping completions on the way. The buffers' contents must not change until
    /// [`ZeroCopy::drain`] has returned.
    pub async fn send_all(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.send(bufs, true).await
    }

    /// Sends all of `bufs` the ordinary way (copied at once; the buffers may change as
    /// soon as this returns), in order with the zero-copy sends.
    pub async fn send_copied(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.send(bufs, false).await
    }

    async fn send(&mut self, bufs: &[IoSlice<'_>], zerocopy: bool) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut sent = 0usize;
        while sent < total {
            match self.sendmsg(bufs, sent, zerocopy) {
                Ok(n) => {
                    if zerocopy {
                        self.stats.sends += 1;
                    }
                    sent += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.reap()?;
                    self.writable().await?;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Too many notifications outstanding: reap; if none has arrived yet,
                    // give the kernel a moment (the socket may well be writable, so the
                    // epoll set would not wait).
                    if self.reap()? == 0 {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            self.reap()?;
        }
        Ok(())
    }

    /// Waits until the socket has room or completions are waiting.
    async fn writable(&self) -> io::Result<()> {
        loop {
            let mut guard = self.waiter.readable().await?;
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
            // SAFETY: the epoll descriptor is open; ev has room for the one event asked.
            let n = unsafe { libc::epoll_wait(self.waiter.as_raw_fd(), ev.as_mut_ptr(), 1, 0) };
            if n > 0 {
                return Ok(());
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // Nothing ready now; the set is level-triggered, so the next change wakes us.
            guard.clear_ready();
        }
    }

    /// One non-blocking `sendmsg` of `bufs` from byte `skip` on.
    fn sendmsg(&self, bufs: &[IoSlice<'_>], mut skip: usize, zerocopy: bool) -> io::Result<usize> {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(bufs.len());
        for b in bufs {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            iov.push(libc::iovec {
                iov_base: b[skip..].as_ptr() as *mut libc::c_void,
                iov_len: b.len() - skip,
            });
            skip = 0;
        }
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        let mut flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        if zerocopy {
            flags |= libc::MSG_ZEROCOPY;
        }
        // SAFETY: msg points to iovecs over live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(self.fd, &msg, flags) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Reads every pending completion from the error queue without blocking; returns how
    /// many send calls they covered.
    pub fn reap(&mut self) -> io::Result<u64> {
        let mut covered = 0;
        loop {
            let mut control = [0u64; 16];
            // SAFETY: as above; the control buffer is 8-byte aligned and outlives the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of_val(&control) as _;
            // SAFETY: msg describes a valid control buffer and no data buffers.
            let r = unsafe {
                libc::recvmsg(self.fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT)
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(covered),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            // SAFETY: the kernel filled msg's control buffer; CMSG_* walk it in bounds.
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(&msg);
                while !cm.is_null() {
                    let c = &*cm;
                    let ip_err = (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                        || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR);
                    if ip_err {
                        let ee = std::ptr::read_unaligned(
                            libc::CMSG_DATA(cm).cast::<libc::sock_extended_err>(),
                        );
                        if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY && ee.ee_errno == 0 {
                            let n = u64::from(ee.ee_data.wrapping_sub(ee.ee_info)) + 1;
                            covered += n;
                            self.stats.completed += n;
                            if ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0 {
                                self.stats.copied += n;
                            }
                        }
                    }
                    cm = libc::CMSG_NXTHDR(&msg, cm);
                }
            }
        }
    }

    /// Waits (polling every millisecond, at most `limit`) until every send has completed,
    /// so the buffers may be reused or freed. `false` if some are still outstanding.
    pub async fn drain(&mut self, limit: std::time::Duration) -> io::Result<bool> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            self.reap()?;
            if self.stats.completed >= self.stats.sends {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= until {
                return Ok(false);
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// On a current-thread runtime the reader only runs while the sender waits, so a
    /// sender that spins on `EAGAIN` (as it did on tokio's readiness) hangs here.
    #[tokio::test]
    async fn zero_copy_sends_arrive_and_complete() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), l.accept());
        let (client, (mut server, _)) = (client.unwrap(), server.unwrap());
        let mut zc = match ZeroCopy::enable(&client) {
            Ok(z) => z,
            Err(e) => {
                eprintln!("SO_ZEROCOPY unsupported here ({e}); nothing to test");
                return;
            }
        };
        let payload: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            got
        });
        const ROUNDS: u32 = 32;
        let send = async {
            for round in 0..ROUNDS {
                zc.send_copied(&[IoSlice::new(&round.to_le_bytes())])
                    .await
                    .unwrap();
                zc.send_all(&[IoSlice::new(b"head"), IoSlice::new(&payload)])
                    .await
                    .unwrap();
            }
            assert!(zc.drain(Duration::from_secs(10)).await.unwrap());
        };
        tokio::time::timeout(Duration::from_secs(60), send)
            .await
            .expect("zero-copy sends stalled");
        let st = zc.stats();
        assert!(
            st.sends >= u64::from(ROUNDS) && st.completed == st.sends,
            "{st:?}"
        );
        // Loopback cannot DMA: the kernel reports every send as copied.
        assert!(st.copied <= st.completed);
        drop(zc);
        drop(client);
        let got = reader.await.unwrap();
        let frame = 4 + 4 + payload.len();
        assert_eq!(got.len(), ROUNDS as usize * frame);
        for (round, f) in got.chunks(frame).enumerate() {
            assert_eq!(&f[..4], &(round as u32).to_le_bytes());
            assert_eq!(&f[4..8], b"head");
            assert!(f[8..] == payload[..], "round {round} payload differs");
        }
    }
}
