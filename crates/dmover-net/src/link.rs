//! What the engine may know and ask of a data stream's connection, whatever carries
//! it: the transport-neutral knobs. The engine's tuners and a server's policy speak
//! only these terms; each transport implements them as it can.
//!
//! - [`Probe`]: a handle on one stream's connection that outlives the stream's task
//!   (the transport's [`crate::transport::DataLink::probe`]): what it delivered, its
//!   round trips and what held it back ([`StreamSample`]), and its congestion control
//!   (a name, as a hint: `cubic`, `bbr`, ...). Over TCP it is a duplicate of the
//!   socket's descriptor, read with `TCP_INFO`; it holds the connection open while it
//!   lives, so its owner drops it as soon as the stream ends.
//! - [`crate::budget::Budget`]: a session's buffer budget for its streams' connections,
//!   one direction, applied by the transport (over TCP: socket buffers held to a share
//!   or raised past the host's autotuning limit).
//! - [`SocketOptions`]: what a user pins (buffer sizes, congestion control).
//! - Congestion names: whether one can be used here ([`check_congestion`]), the host's
//!   default ([`default_congestion`]), the one that does not pace by itself
//!   ([`UNPACED`]).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::tcp;
use crate::tcpinfo::TcpMeter;

/// Settings a user pins for a transfer's data connections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketOptions {
    /// Explicit send buffer in bytes (`None`: the transport sizes it).
    pub send_buffer: Option<usize>,
    /// Explicit receive buffer in bytes (`None`: the transport sizes it).
    pub recv_buffer: Option<usize>,
    /// Congestion control algorithm (e.g. `bbr`, `cubic`); `None`: system default.
    pub congestion: Option<String>,
}

impl SocketOptions {
    /// What a session's data streams may hold together of their buffers in direction
    /// `dir` ([`crate::budget::Budget`]): none when the user pinned that buffer.
    pub fn budget(&self, dir: Direction) -> Option<u64> {
        match dir {
            Direction::Send => self.send_buffer,
            Direction::Receive => self.recv_buffer,
        }
        .is_none()
        .then(tcp::receive_budget)
    }
}

/// Which way a connection's buffer holds data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// What this end sends and the peer has not acknowledged yet, and what waits to go.
    Send,
    /// What this end received and the reader has not taken yet: the window it offers.
    Receive,
}

impl Direction {
    pub(crate) fn tcp(self) -> tcp::Buffer {
        match self {
            Direction::Send => tcp::Buffer::Send,
            Direction::Receive => tcp::Buffer::Receive,
        }
    }
}

/// One reading of a stream's connection ([`Probe::sample`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSample {
    /// Bytes the peer acknowledged in order, since the connection was made.
    pub delivered: u64,
    /// Bytes the peer holds beyond a loss (delivered, but counted in
    /// [`StreamSample::delivered`] only once what was lost before them is resent):
    /// with loss, `delivered` alone jumps by up to a window when a hole fills.
    pub delivered_beyond_loss: u64,
    /// The smallest round-trip time seen (zero: none yet).
    pub min_rtt: Duration,
    /// How long the connection had data in flight or waiting to be sent (zero where
    /// the transport does not tell).
    pub busy: Duration,
    /// How much of [`StreamSample::busy`] the sender waited on a window other than its
    /// congestion window: the receiver's or its own buffer's. More connections help
    /// such a sender; one held by its congestion control alone sends what the path
    /// gives it.
    pub window_limited: Duration,
    /// How much of [`StreamSample::window_limited`] was its own send buffer's.
    pub buffer_limited: Duration,
}

/// A handle on a data stream's connection (see the module docs). Cheap to clone: the
/// clones share one handle, which holds the connection open until the last goes.
#[derive(Debug, Clone)]
pub struct Probe(Inner);

#[derive(Debug, Clone)]
enum Inner {
    Tcp(Arc<TcpMeter>),
}

impl Probe {
    /// A probe of a TCP socket (a duplicate of its descriptor).
    pub fn tcp(socket: &impl std::os::fd::AsFd) -> io::Result<Self> {
        Ok(Probe(Inner::Tcp(Arc::new(TcpMeter::of(socket)?))))
    }

    /// The TCP socket's meter, for this crate's TCP policies.
    pub(crate) fn tcp_meter(&self) -> Option<&Arc<TcpMeter>> {
        match &self.0 {
            Inner::Tcp(m) => Some(m),
        }
    }

    /// Reads the connection's counters.
    pub fn sample(&self) -> io::Result<StreamSample> {
        match &self.0 {
            Inner::Tcp(m) => {
                let s = m.read()?;
                Ok(StreamSample {
                    delivered: s.bytes_acked,
                    delivered_beyond_loss: s.bytes_sacked,
                    min_rtt: s.min_rtt,
                    busy: s.busy,
                    window_limited: s.window_limited,
                    buffer_limited: s.sndbuf_limited,
                })
            }
        }
    }

    /// The congestion control the connection sends with.
    pub fn congestion(&self) -> io::Result<String> {
        match &self.0 {
            Inner::Tcp(m) => tcp::congestion_of(&**m),
        }
    }

    /// Makes the connection send with congestion control `name` from now on.
    pub fn set_congestion(&self, name: &str) -> io::Result<()> {
        match &self.0 {
            Inner::Tcp(m) => tcp::set_congestion(&**m, name),
        }
    }

    /// Whether the connection's congestion control paces by a model of the path (BBR)
    /// rather than backing off on loss: its rate is what the path gives, so more
    /// connections do not add to it the way they add to loss-based ones.
    pub fn model_based(&self) -> bool {
        self.congestion().is_ok_and(|cc| cc.starts_with("bbr"))
    }

    /// Applies the user's pinned settings to the connection (buffer sizes, congestion
    /// control); what cannot be set is logged and left as it was.
    pub fn apply(&self, opts: &SocketOptions) {
        match &self.0 {
            Inner::Tcp(m) => tcp::tune(socket2::SockRef::from(&**m), opts),
        }
    }
}

/// A congestion control the transport does not pace by itself: where a server's
/// connections start, and what a request-driven session (a mount's reads) asks its
/// server to send with unless told otherwise ([`tcp::UNPACED`]).
pub const UNPACED: &str = tcp::UNPACED;

/// Whether this process can send with congestion control `name`; else why not, in
/// words that name the ones it could use.
pub fn check_congestion(name: &str) -> Result<(), String> {
    tcp::check_congestion(name)
}

/// The congestion control new connections get by default; `None` when unknown.
pub fn default_congestion() -> Option<String> {
    tcp::default_congestion()
}
