//! A server's listening endpoint and the connections it accepts before each says what
//! it is: its preamble names a control connection (TLS follows) or a data connection
//! (a join follows). TCP here; the server's policy (set-up limits, busy answers,
//! deadlines) stays with the server, which names no socket type.
//!
//! - [`Listener::accept`] gives an [`Incoming`] connection, tuned with the server's
//!   socket settings; [`Listener::start_on`] sets the congestion control connections
//!   start on (each sending session then sets its own).
//! - An [`Incoming`] reads and answers the preamble, becomes the control connection's
//!   stream ([`Incoming::into_control`]) or joins a session ([`Incoming::join`]), or
//!   is closed without a reset ([`Incoming::close_gracefully`]).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use dmover_proto::preamble::Preamble;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::NetError;
use crate::control::{ControlTcp, read_preamble, write_preamble};
use crate::join::{AcceptError, JoinTable};
use crate::link::SocketOptions;
use crate::tcp;

/// How long a connection closed for load is read (and what it sent discarded) after
/// our side is shut down, so that the close is no reset.
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// Bytes a connection closed for load is read at most before it is dropped.
const DRAIN_BYTES: usize = 64 << 10;

/// A server's listening socket.
#[derive(Debug)]
pub struct Listener(TcpListener);

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener(l)
    }
}

impl Listener {
    /// Listens on `addr` with `opts`' buffer settings, a deep accept backlog (many
    /// streams arrive at once when a session starts) and TCP Fast Open where the host
    /// offers it.
    pub fn bind(addr: SocketAddr, opts: &SocketOptions) -> Result<Self, NetError> {
        tcp::listen(addr, opts).map(Listener)
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    /// Accepted connections start with congestion control `name`.
    pub fn start_on(&self, name: &str) -> io::Result<()> {
        tcp::set_congestion(&self.0, name)
    }

    /// The next connection, tuned with `opts` (no-delay, the unsent-data limit, the
    /// user's buffer sizes and congestion control), and who dialed it.
    pub async fn accept(&self, opts: &SocketOptions) -> io::Result<(Incoming, SocketAddr)> {
        let (stream, peer) = self.0.accept().await?;
        tcp::tune_stream(&stream, opts);
        Ok((Incoming(stream), peer))
    }
}

/// An accepted connection, before (or just after) its preamble.
#[derive(Debug)]
pub struct Incoming(TcpStream);

impl Incoming {
    /// Reads the dialer's preamble.
    pub async fn read_preamble(&mut self, peer: &str) -> Result<Preamble, NetError> {
        read_preamble(&mut self.0, peer).await
    }

    /// Writes a preamble (the answer to the dialer's).
    pub async fn write_preamble(&mut self, p: Preamble, peer: &str) -> Result<(), NetError> {
        write_preamble(&mut self.0, p, peer).await
    }

    /// Writes a preamble if the socket takes it now (a fresh connection's always
    /// does), without waiting: whether it was written whole.
    pub fn try_write_preamble(&self, p: Preamble) -> bool {
        let b = p.encode();
        matches!(self.0.try_write(&b), Ok(n) if n == b.len())
    }

    /// The stream of a control connection, for TLS.
    pub fn into_control(self) -> ControlTcp {
        ControlTcp::new(self.0)
    }

    /// A data connection's join to a session of `table` (see [`JoinTable::accept`]).
    pub async fn join(self, table: &JoinTable, peer: &str) -> Result<(), AcceptError> {
        table.accept(self.0, peer).await
    }

    /// Closes the connection without a reset: our side shut down, then what the peer
    /// sent read and discarded until it closes too (briefly, and at most 64 KiB).
    /// Closing with the peer's bytes unread would reset the connection, and the peer
    /// could lose what was written to it before (a busy answer).
    pub async fn close_gracefully(mut self) {
        let _ = self.0.shutdown().await;
        let _ = tokio::time::timeout(DRAIN_WAIT, async {
            let mut sink = [0u8; 4096];
            let mut left = DRAIN_BYTES;
            while left > 0 {
                match self.0.read(&mut sink).await {
                    Ok(n) if n > 0 => left = left.saturating_sub(n),
                    _ => break,
                }
            }
        })
        .await;
    }
}
