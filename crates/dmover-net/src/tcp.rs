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

/// Applies `opts` to a connected or listening socket, plus `TCP_NODELAY` (frames are
/// written whole, so Nagle only adds latency). Failures to set optional knobs are
/// logged and ignored: the socket still works with the kernel's defaults.
pub fn tune(sock: SockRef<'_>, opts: &SocketOptions) {
    if let Err(e) = sock.set_tcp_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
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
    // Accepted sockets inherit buffer sizes from the listener.
    tune(SockRef::from(&sock), opts);
    sock.bind(&addr.into()).map_err(err)?;
    sock.listen(1024).map_err(err)?;
    sock.set_nonblocking(true).map_err(err)?;
    TcpListener::from_std(sock.into()).map_err(err)
}
