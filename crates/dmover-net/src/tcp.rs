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
