//! TCP sockets: connect, listen, tune.
//!
//! Linux autotunes socket buffers up to `net.ipv4.tcp_rmem`/`tcp_wmem`'s maximum;
//! setting `SO_RCVBUF`/`SO_SNDBUF` explicitly turns autotuning off and is capped by
//! `net.core.rmem_max`/`wmem_max` (without `CAP_NET_ADMIN`). So a data stream's
//! buffers are set only when the user asks (`--tcp-buffer`; size them to at least
//! the bandwidth-delay product: rate × RTT), or by a session, from what the stream's
//! autotuning did ([`Buffer`], [`receive_share`], [`raised_share`]; the policy is
//! [`crate::budget`]).

use std::net::SocketAddr;
use std::time::Duration;

use socket2::{SockRef, Socket};
use tokio::net::{TcpListener, TcpStream, lookup_host};

use crate::NetError;

pub use crate::link::SocketOptions;

/// `TCP_NOTSENT_LOWAT` of every socket: a socket takes more data only while less than
/// this much of what it holds is still unsent. Without it, autotuning lets every
/// stream park up to `tcp_wmem`'s maximum of unsent data in the kernel; on long fat
/// links (where that maximum must be large) many streams then push the machine into
/// TCP memory pressure (`net.ipv4.tcp_mem`), and the kernel throttles every
/// connection to a crawl (measured: 8 streams at 5 Gbit/s, 200 ms RTT stalled for
/// minutes with 1.3 GB unsent). Unsent data does not make a stream faster; 4 MiB is
/// 6.7 ms at 5 Gbit/s, which the sender refills long before it runs dry.
pub const NOTSENT_LOWAT: u32 = 4 << 20;

/// Applies `opts` to a connected or listening socket, plus `TCP_NODELAY` (frames are
/// written whole, so Nagle only adds latency) and [`NOTSENT_LOWAT`]. Failures to set
/// optional knobs are logged and ignored: the socket still works with the kernel's
/// defaults.
pub fn tune(sock: SockRef<'_>, opts: &SocketOptions) {
    if let Err(e) = sock.set_tcp_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
    }
    if let Err(e) = sock.set_tcp_notsent_lowat(NOTSENT_LOWAT) {
        tracing::debug!("TCP_NOTSENT_LOWAT: {e}");
    }
    if let Some(n) = opts.send_buffer {
        if let Err(e) = sock.set_send_buffer_size(n) {
            tracing::warn!("cannot set SO_SNDBUF to {n}: {e}");
        }
    }
    if let Some(n) = opts.recv_buffer {
        if let Err(e) = sock.set_recv_buffer_size(n) {
            tracing::warn!("cannot set SO_RCVBUF to {n}: {e}");
        }
    }
    if let Some(cc) = &opts.congestion {
        if let Err(e) = sock.set_tcp_congestion(cc.as_bytes()) {
            tracing::warn!("cannot use congestion control {cc:?}: {e}; keeping the default");
        }
    }
}

/// How much receive buffer one session's data streams may hold together: an eighth
/// of the kernel's TCP memory pressure threshold (`net.ipv4.tcp_mem`'s middle value;
/// where a network namespace hides it, a sixteenth of the memory, as the kernel sizes
/// it). Autotuning lets every socket grow to `tcp_rmem`'s maximum, which on long fat
/// links must be large; many streams of one session then hold far more than the
/// link's bandwidth-delay product, the kernel reaches memory pressure and throttles
/// every connection to a crawl (measured: 8 streams at 5 Gbit/s, 200 ms RTT with a
/// 500 MB maximum stalled 2 runs in 6; with 64 MiB none, and faster; docs/tuning.md).
/// An eighth leaves room for the sending side on the same host, other sessions and
/// the buffers' own overhead; on this 23 GB machine it is 196 MB, 1.6 × the 5 Gbit/s,
/// 200 ms link's product.
pub fn receive_budget() -> u64 {
    static BUDGET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| pressure_bytes() / 8)
}

/// The kernel's TCP memory pressure threshold in bytes.
fn pressure_bytes() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let from_sysctl = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_mem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok());
    if let Some(pages) = from_sysctl {
        return pages * page;
    }
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(4 << 30, |kib| kib * 1024);
    total / 16
}

/// One of a TCP socket's two buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// What the socket holds of what this end sends (`SO_SNDBUF`): the data in flight,
    /// until acknowledged, and what is not sent yet.
    Send,
    /// What the socket holds of what this end receives (`SO_RCVBUF`): the window it
    /// offers the peer.
    Receive,
}

impl Buffer {
    /// The sysctl whose maximum autotuning grows this buffer to.
    pub fn sysctl(self) -> &'static str {
        match self {
            Buffer::Send => "net.ipv4.tcp_wmem",
            Buffer::Receive => "net.ipv4.tcp_rmem",
        }
    }

    /// The sysctl that caps what a process without `CAP_NET_ADMIN` may set.
    fn explicit_max(self) -> &'static str {
        match self {
            Buffer::Send => "net.core.wmem_max",
            Buffer::Receive => "net.core.rmem_max",
        }
    }

    /// The largest this buffer of a socket grows to by autotuning in this process's
    /// network namespace (the sysctl's maximum); `None` when unreadable.
    pub fn autotune_max(self) -> Option<u64> {
        sysctl_field(self.sysctl(), 2)
    }

    /// The buffer's size now, as the kernel counts it (with its overhead: twice what
    /// was set, when it was set).
    pub fn size(self, fd: impl std::os::fd::AsFd) -> std::io::Result<u64> {
        let s = SockRef::from(&fd);
        match self {
            Buffer::Send => s.send_buffer_size(),
            Buffer::Receive => s.recv_buffer_size(),
        }
        .map(|n| n as u64)
    }

    /// Sets the buffer to `bytes` (which turns autotuning off for it; the kernel
    /// doubles the value): with `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`, which needs
    /// `CAP_NET_ADMIN`, else within `net.core.wmem_max`/`rmem_max`. A value above
    /// that without the capability is refused, and the socket left as it was (a
    /// buffer cut to the maximum would cripple a long link).
    pub fn set(self, fd: impl std::os::fd::AsFd, bytes: u64) -> std::io::Result<()> {
        let (force, plain) = match self {
            Buffer::Send => (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
            Buffer::Receive => (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        };
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX / 2);
        match set_int(fd.as_fd(), libc::SOL_SOCKET, force, v) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                let max = sysctl_field(self.explicit_max(), 0).unwrap_or(0);
                if bytes <= max {
                    set_int(fd.as_fd(), libc::SOL_SOCKET, plain, v)
                } else {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "a buffer of {bytes} bytes is above {} ({max}) and needs \
                             CAP_NET_ADMIN",
                            self.explicit_max()
                        ),
                    ))
                }
            }
            r => r,
        }
    }
}

/// Field `i` of a sysctl's value (`net.ipv4.tcp_rmem` is read from
/// `/proc/sys/net/ipv4/tcp_rmem`).
fn sysctl_field(name: &str, i: usize) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/{}", name.replace('.', "/")))
        .ok()?
        .split_whitespace()
        .nth(i)?
        .parse()
        .ok()
}

/// The smallest receive buffer a data stream is held to, whatever the budget.
pub const MIN_RECEIVE_SHARE: u64 = 1 << 20;

/// What each of `streams` data streams may hold of a session's receive `budget`
/// (the value for `SO_RCVBUF`, which the kernel doubles for its overhead): `None`
/// when autotuning alone stays within the share (its maximum `autotune_max` is at most
/// the doubled share), so short links keep the kernel's own small buffers.
pub fn receive_share(budget: u64, streams: usize, autotune_max: u64) -> Option<u64> {
    let share = share_of(budget, streams);
    (share.saturating_mul(2) < autotune_max).then_some(share)
}

/// What each of `streams` data streams may hold of a session's `budget` of one of
/// their buffers, where the host's limit is below it: the value to set (the kernel
/// doubles it) once a stream's autotuning reached `autotune_max` and still wanted
/// more (see [`Buffer`]). `None` when the doubled share is not above the limit:
/// autotuning alone may grow each stream's buffer as far as the share would.
pub fn raised_share(budget: u64, streams: usize, autotune_max: u64) -> Option<u64> {
    let share = share_of(budget, streams);
    (share.saturating_mul(2) > autotune_max).then_some(share)
}

/// `budget` shared by `streams` (none count as one), never below
/// [`MIN_RECEIVE_SHARE`], and within what `SO_RCVBUF`/`SO_SNDBUF` take.
fn share_of(budget: u64, streams: usize) -> u64 {
    (budget / streams.max(1) as u64)
        .max(MIN_RECEIVE_SHARE)
        .min(i32::MAX as u64 / 2)
}

/// Holds a TCP socket's receive buffer to `bytes` (`SO_RCVBUF`, which turns
/// autotuning off for it; the kernel doubles the value), and its window clamp
/// (`TCP_WINDOW_CLAMP`) to what that buffer holds. Above `net.core.rmem_max` this
/// needs `CAP_NET_ADMIN` (`SO_RCVBUFFORCE`); without it the socket is left as it was
/// and the error says so (a buffer cut to `rmem_max` would cripple a long link).
///
/// The clamp matters on a connection that already carried data: the kernel sets its
/// window clamp from the buffer it had when it measured the first segments (about
/// 85 KiB from the default 128 KiB), and only autotuning raised it since. Setting
/// `SO_RCVBUF` leaves the clamp where it was and stops autotuning, so a stream held
/// before it carried its first chunk could stay at an 85 KiB window for good (7 Mbit/s
/// at 100 ms: one 16 MiB chunk took 19 s; seen as 1 GiB copies taking 27 s instead of
/// 10, docs/benchmarks.md).
pub fn cap_receive(fd: impl std::os::fd::AsFd, bytes: u64) -> std::io::Result<()> {
    Buffer::Receive.set(fd.as_fd(), bytes)?;
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX / 2);
    // The window never passes the free space of the buffer (`2 * v`, less the
    // kernel's overhead) whatever the clamp; a lower clamp also lowers the window the
    // socket grows toward, so a share that shrinks is not overrun.
    set_int(
        fd.as_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_WINDOW_CLAMP,
        v.saturating_mul(2),
    )
}

/// Sets an integer socket option.
fn set_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the value and its length describe a c_int; the fd is open.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&raw const v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Pending TCP Fast Open connections a listener accepts before their handshake ends
/// (`TCP_FASTOPEN`'s queue; beyond it a SYN's data waits for the handshake).
pub const FAST_OPEN_QUEUE: libc::c_int = 1024;

/// The window clamp of a TCP socket (`TCP_WINDOW_CLAMP`).
pub fn window_clamp(fd: impl std::os::fd::AsFd) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the value and its length describe a c_int; the fd is open.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    if r == 0 {
        Ok(u64::try_from(v).unwrap_or(0))
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A congestion control the kernel does not pace by itself (on a qdisc that does not
/// pace): where a server's connections start, and what a request-driven session (a
/// mount's reads) asks its server to send with unless told otherwise. BBR asks the
/// kernel to pace a socket, and the socket stays paced whatever it switches to later;
/// on a request, one chunk, then quiet, BBR never sees the link's bandwidth and paces
/// each answer at a few Mbit/s (docs/remote.md, "Random reads over long links").
pub const UNPACED: &str = "cubic";

/// The longest congestion control name the kernel knows (`TCP_CA_NAME_MAX` less its
/// NUL).
pub const MAX_CONGESTION_NAME: usize = 15;

/// Sets congestion control `name` on `fd`, a TCP socket (connected or not: an
/// established connection switches at once).
pub fn set_congestion(fd: impl std::os::fd::AsFd, name: &str) -> std::io::Result<()> {
    SockRef::from(&fd).set_tcp_congestion(name.as_bytes())
}

/// The congestion control `fd`, a TCP socket, uses.
pub fn congestion_of(fd: impl std::os::fd::AsFd) -> std::io::Result<String> {
    let name = SockRef::from(&fd).tcp_congestion()?;
    Ok(String::from_utf8_lossy(&name)
        .trim_end_matches('\0')
        .to_string())
}

/// The congestion control new TCP sockets get (`net.ipv4.tcp_congestion_control`), as
/// a fresh socket reads it; `None` when none can be made.
pub fn default_congestion() -> Option<String> {
    let s = fresh_socket().ok()?;
    congestion_of(&s).ok()
}

fn fresh_socket() -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
        .or_else(|_| Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)))
}

/// Whether this process can send with congestion control `name`, tried on a fresh
/// socket; else why not, in words that name the algorithms it could use (the kernel's
/// `tcp_available_congestion_control`, or for a process without `CAP_NET_ADMIN` its
/// `tcp_allowed_congestion_control`).
pub fn check_congestion(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_CONGESTION_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(format!(
            "{:?} is not a congestion control name",
            name.escape_debug().to_string()
        ));
    }
    let s = fresh_socket().map_err(|e| format!("no socket to try congestion control on: {e}"))?;
    let Err(e) = set_congestion(&s, name) else {
        return Ok(());
    };
    let sysctl = |key: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{key}"))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    Err(match e.raw_os_error() {
        Some(libc::ENOENT) => format!(
            "congestion control {name:?} is not available (the kernel has: {})",
            sysctl("tcp_available_congestion_control")
        ),
        Some(libc::EPERM) => format!(
            "congestion control {name:?} is not allowed (allowed: {})",
            sysctl("tcp_allowed_congestion_control")
        ),
        _ => format!("congestion control {name:?} cannot be set: {e}"),
    })
}

/// Applies `opts` to an accepted or connected tokio stream.
pub fn tune_stream(s: &TcpStream, opts: &SocketOptions) {
    tune(SockRef::from(s), opts)
}

/// Resolves `host:port` and connects to the first address that answers, within
/// `timeout` per address.
pub async fn connect(
    target: &str,
    opts: &SocketOptions,
    timeout: Duration,
) -> Result<TcpStream, NetError> {
    connect_with(target, opts, timeout, false).await
}

/// [`connect`] asking for TCP Fast Open, for a protocol in which this side writes
/// first: where the name resolves to one address, the socket asks for it
/// (`TCP_FASTOPEN_CONNECT`). With a cookie from an earlier connection to that server,
/// the kernel then returns at once, without a SYN, and sends the SYN with the first
/// bytes written (a preamble, a TLS ClientHello), so the server answers them one round
/// trip sooner; until something is written nothing is sent, so a caller that waited to
/// read first would wait forever. Without a cookie (the first connection, a server
/// that does not offer it, the sysctl off) it connects as [`connect`]. So with one
/// address the connection may fail only at the first read ([`never_connected`] tells
/// that failure); with several, a dead one must fail here for the next to be tried,
/// and Fast Open is not asked for.
pub async fn connect_fast_open(
    target: &str,
    opts: &SocketOptions,
    timeout: Duration,
) -> Result<TcpStream, NetError> {
    connect_with(target, opts, timeout, true).await
}

async fn connect_with(
    target: &str,
    opts: &SocketOptions,
    timeout: Duration,
    fast_open: bool,
) -> Result<TcpStream, NetError> {
    let addrs: Vec<SocketAddr> = lookup_host(target)
        .await
        .map_err(|e| NetError::io("resolving", target, e))?
        .collect();
    let fast_open = fast_open && addrs.len() == 1;
    let mut last = None;
    for addr in addrs {
        let socket = match match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        } {
            Ok(s) => s,
            // No socket of this family (IPv6 off, say): the next address may do.
            Err(e) => {
                last = Some(NetError::io("connecting to", addr, e));
                continue;
            }
        };
        if fast_open {
            use std::os::fd::AsFd;
            if let Err(e) = set_int(
                socket.as_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_FASTOPEN_CONNECT,
                1,
            ) {
                tracing::debug!("TCP_FASTOPEN_CONNECT: {e}");
            }
        }
        match tokio::time::timeout(timeout, socket.connect(addr)).await {
            Ok(Ok(s)) => {
                tune(SockRef::from(&s), opts);
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(NetError::io("connecting to", addr, e)),
            Err(_) => {
                last = Some(NetError::Timeout {
                    peer: addr.to_string(),
                    what: "connect",
                    secs: timeout.as_secs(),
                })
            }
        }
    }
    Err(last.unwrap_or_else(|| NetError::Io {
        what: "resolving",
        peer: target.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no addresses"),
    }))
}

/// Whether `e`, from a connection's first read or write, says it was never made: the
/// server refused it or could not be reached. With TCP Fast Open
/// ([`connect_fast_open`]) that is where a dead server shows, and the caller reports it
/// as a failed connect. Only the system's own errors count: a server's busy answer is
/// a refusal too ([`crate::control::Busy`], carried inside the error).
pub fn never_connected(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    e.raw_os_error().is_some()
        && matches!(
            e.kind(),
            ConnectionRefused | HostUnreachable | NetworkUnreachable
        )
}

/// Binds a listening socket with `SO_REUSEADDR` and a deep accept backlog (many
/// streams arrive at once when a session starts, 17 per client by default): 4096, as
/// far as `net.core.somaxconn` allows (its default since Linux 5.4). A full backlog
/// drops connections' handshakes, which their clients send again after 1, 2, 4 s...:
/// 1024 clients started at once on a 2-core machine had some wait out a 15 s connect
/// timeout behind a 1024-deep backlog.
pub fn listen(addr: SocketAddr, opts: &SocketOptions) -> Result<TcpListener, NetError> {
    let err = |e| NetError::io("listening on", addr, e);
    let sock = Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(err)?;
    sock.set_reuse_address(true).map_err(err)?;
    // `[::]` takes IPv4 too (as v4-mapped addresses), whatever the system's default.
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        sock.set_only_v6(false).map_err(err)?;
    }
    // Accepted sockets inherit buffer sizes from the listener.
    tune(SockRef::from(&sock), opts);
    sock.bind(&addr.into()).map_err(err)?;
    sock.listen(4096).map_err(err)?;
    // Taken up only where `net.ipv4.tcp_fastopen` has bit 2 (see `connect`).
    {
        use std::os::fd::AsFd;
        if let Err(e) = set_int(
            sock.as_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_FASTOPEN,
            FAST_OPEN_QUEUE,
        ) {
            tracing::debug!("TCP_FASTOPEN: {e}");
        }
    }
    sock.set_nonblocking(true).map_err(err)?;
    TcpListener::from_std(sock.into()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reno` is in every kernel and allowed to every process by default.
    #[test]
    fn a_receive_share_divides_the_budget_and_leaves_short_links_to_autotuning() {
        // 196 MB among 8 streams against a 500 MB autotuning maximum: held.
        assert_eq!(receive_share(196 << 20, 8, 500 << 20), Some(196 << 17));
        // Fewer streams, more each; one stream may take the whole budget.
        assert_eq!(receive_share(196 << 20, 4, 500 << 20), Some(49 << 20));
        assert_eq!(receive_share(196 << 20, 1, 500 << 20), Some(196 << 20));
        // Autotuning's own maximum (32 MiB) is within twice the share: left alone.
        assert_eq!(receive_share(196 << 20, 4, 32 << 20), None);
        assert_eq!(receive_share(196 << 20, 8, 49 << 20), None);
        // Never below the floor, and no streams count as one.
        assert_eq!(
            receive_share(8 << 20, 64, 500 << 20),
            Some(MIN_RECEIVE_SHARE)
        );
        assert_eq!(receive_share(8 << 20, 0, 500 << 20), Some(8 << 20));
        assert!(receive_budget() >= 1 << 20);
    }

    #[test]
    fn a_raised_share_is_only_for_hosts_whose_limit_is_below_it() {
        // Linux's default 4 MiB send limit against a 196 MB budget among 4 streams.
        assert_eq!(raised_share(196 << 20, 4, 4 << 20), Some(49 << 20));
        // A host whose limit is at or above twice the share: autotuning may grow each
        // buffer as far as the share would (and a receive buffer is held to it).
        assert_eq!(raised_share(196 << 20, 4, 98 << 20), None);
        assert_eq!(raised_share(196 << 20, 4, 1 << 30), None);
        assert_eq!(receive_share(196 << 20, 4, 1 << 30), Some(49 << 20));
        // Never below the floor.
        assert_eq!(raised_share(8 << 20, 64, 1 << 20), Some(MIN_RECEIVE_SHARE));
    }

    #[test]
    fn a_send_buffer_is_set_and_read_back_doubled_or_says_why_not() {
        let s = fresh_socket().unwrap();
        // Within net.core.wmem_max's default (212992): allowed to any process.
        Buffer::Send.set(&s, 100_000).unwrap();
        assert_eq!(Buffer::Send.size(&s).unwrap(), 200_000);
        match Buffer::Send.set(&s, 64 << 20) {
            Ok(()) => assert_eq!(Buffer::Send.size(&s).unwrap(), 128 << 20),
            Err(e) => {
                // Only a process without CAP_NET_ADMIN, above wmem_max, is refused,
                // and the socket keeps what it had.
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
                assert!(e.to_string().contains("net.core.wmem_max"), "{e}");
                assert_eq!(Buffer::Send.size(&s).unwrap(), 200_000);
            }
        }
        for b in [Buffer::Send, Buffer::Receive] {
            assert!(b.autotune_max().is_some_and(|m| m > 0), "{}", b.sysctl());
        }
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(Buffer::Send.set(&f, 100_000).is_err());
        assert!(Buffer::Receive.size(&f).is_err());
    }

    #[test]
    fn a_capped_receive_buffer_reads_back_doubled_or_says_why_not() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        // A stream that carried a little (a join's hello and proof) before its buffer
        // is held: the kernel has measured its segments and set its window clamp from
        // the buffer it had then.
        a.write_all(&[7; 88]).unwrap();
        b.read_exact(&mut [0; 88]).unwrap();
        let want = 24u64 << 20;
        match cap_receive(&b, want) {
            Ok(()) => {
                let got = SockRef::from(&b).recv_buffer_size().unwrap() as u64;
                assert_eq!(got, 2 * want, "the kernel doubles SO_RCVBUF");
                // The window may grow to what the buffer holds, not stay clamped to
                // the default buffer's (the stalled stream of docs/benchmarks.md).
                let clamp = window_clamp(&b).unwrap();
                assert!(
                    clamp >= want,
                    "window clamp {clamp} below the {want}-byte share"
                );
                // Held lower again, the clamp follows.
                cap_receive(&b, 2 << 20).unwrap();
                assert_eq!(window_clamp(&b).unwrap(), 4 << 20);
            }
            Err(e) => {
                // Only a process without CAP_NET_ADMIN, above rmem_max, is refused.
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
                assert!(e.to_string().contains("rmem_max"), "{e}");
            }
        }
        // Not a socket: an error, not a panic.
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(cap_receive(&f, want).is_err());
        drop(a);
    }

    #[test]
    fn a_congestion_control_is_checked_set_and_read_back() {
        assert_eq!(check_congestion("reno"), Ok(()));
        let s = fresh_socket().unwrap();
        set_congestion(&s, "reno").unwrap();
        assert_eq!(congestion_of(&s).unwrap(), "reno");
        assert!(default_congestion().is_some_and(|d| !d.is_empty()));
        let e = check_congestion("nosuchcc").unwrap_err();
        assert!(
            e.contains("\"nosuchcc\" is not available (the kernel has: ") && e.contains("reno"),
            "{e}"
        );
        for bad in ["", "a b", "sixteen_letters_", "x\u{0}y", "é"] {
            let e = check_congestion(bad).unwrap_err();
            assert!(
                e.ends_with("is not a congestion control name"),
                "{bad:?}: {e}"
            );
        }
    }

    /// A connection asking for TCP Fast Open works as any: what the dialer writes
    /// first reaches the server (in the SYN, once the host lets listeners offer Fast
    /// Open and a cookie came), and a dead server shows as refused.
    #[tokio::test]
    async fn a_fast_open_connection_carries_what_is_written_first() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = listen(([127, 0, 0, 1], 0).into(), &SocketOptions::default()).unwrap();
        let target = l.local_addr().unwrap().to_string();
        // Twice: the first connection may fetch a cookie (where the host's
        // `tcp_fastopen` lets listeners offer one), the second then use it.
        for _ in 0..2 {
            let client = async {
                let mut c =
                    connect_fast_open(&target, &SocketOptions::default(), Duration::from_secs(5))
                        .await
                        .unwrap();
                c.write_all(b"preamble").await.unwrap();
                let mut b = [0u8; 9];
                c.read_exact(&mut b).await.unwrap();
                b
            };
            let server = async {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 8];
                s.read_exact(&mut b).await.unwrap();
                assert_eq!(&b, b"preamble");
                s.write_all(b"challenge").await.unwrap();
            };
            let (answer, ()) = tokio::join!(client, server);
            assert_eq!(&answer, b"challenge");
        }
        // Nobody listening: refused, at the connect or at the first read.
        drop(l);
        let refused = async {
            let mut c =
                connect_fast_open(&target, &SocketOptions::default(), Duration::from_secs(5))
                    .await?;
            let _ = c.write_all(b"preamble").await;
            let mut b = [0u8; 1];
            c.read_exact(&mut b)
                .await
                .map_err(|e| NetError::io("reading from", &target, e))?;
            Ok::<_, NetError>(())
        };
        match refused.await {
            Err(NetError::Io { source, .. }) => assert!(never_connected(&source), "{source}"),
            r => panic!("{r:?}"),
        }
    }

    /// `[::]` takes IPv4 connections too (dual stack), so a server's default listen
    /// address serves both families.
    #[tokio::test]
    async fn unspecified_ipv6_listens_for_ipv4_too() {
        let any = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
        let Ok(l) = listen(any, &SocketOptions::default()) else {
            eprintln!("skipped: IPv6 is off on this host");
            return;
        };
        let port = l.local_addr().unwrap().port();
        for target in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
            let opts = SocketOptions::default();
            let c = connect(&target, &opts, Duration::from_secs(5));
            let (c, a) = tokio::join!(c, l.accept());
            c.unwrap_or_else(|e| panic!("{target}: {e}"));
            a.unwrap();
        }
    }
}
