//! TCP sockets: connect, listen, tune.
//!
//! Linux autotunes socket buffers up to `net.ipv4.tcp_rmem`/`tcp_wmem`'s maximum;
//! setting `SO_RCVBUF`/`SO_SNDBUF` explicitly turns autotuning off and is capped by
//! `net.core.rmem_max`/`wmem_max`, so buffers are only set when the user asks
//! (size them to at least the bandwidth-delay product: rate × RTT).

use std::net::SocketAddr;
use std::time::Duration;

use socket2::{SockRef, Socket};
use tokio::net::{TcpListener, TcpStream, lookup_host};

use crate::NetError;

/// Per-socket settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketOptions {
    /// Explicit send buffer in bytes (`None`: kernel autotuning).
    pub send_buffer: Option<usize>,
    /// Explicit receive buffer in bytes (`None`: kernel autotuning).
    pub recv_buffer: Option<usize>,
    /// Congestion control algorithm (e.g. `bbr`, `cubic`); `None`: system default.
    pub congestion: Option<String>,
}

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
    let addrs: Vec<SocketAddr> = lookup_host(target)
        .await
        .map_err(|e| NetError::io("resolving", target, e))?
        .collect();
    let mut last = None;
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
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

/// Binds a listening socket with `SO_REUSEADDR` and a deep accept backlog (many
/// streams arrive at once when a session starts).
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
    sock.listen(1024).map_err(err)?;
    sock.set_nonblocking(true).map_err(err)?;
    TcpListener::from_std(sock.into()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reno` is in every kernel and allowed to every process by default.
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
