//! The dmover transfer engine.
//!
//! A transfer is a session between a client and a server: one control connection and
//! N data streams. The source side walks its tree into a manifest ([`walk`]), both
//! sides lay the files out as one virtual byte space ([`dmover_proto::layout`]), and
//! chunks of it flow through a bounded buffer pool ([`pool`]) between a fixed set of
//! disk threads ([`diskpool`]) and the data streams ([`engine`]). The destination
//! writes each file under a staging name and renames it into place once it is
//! complete and its digest matches ([`sink`]).
//!
//! - [`client::Client`] pushes or pulls; [`server::Server`] serves many clients at once.
//! - [`access`]: exports, users, credentials and the server's configuration file.
//! - [`memtest`]: the memory-to-memory network test (`dmover bench net`).
//! - Every file operation goes through directory handles ([`tree`], [`paths`], [`sys`]),
//!   so a server never follows a path out of its root.

pub mod access;
pub mod client;
pub mod diskpool;
pub mod engine;
pub mod error;
pub mod journal;
pub mod memtest;
pub mod paths;
pub mod pool;
pub mod resume;
pub mod server;
pub mod session;
pub mod sink;
pub mod source;
pub mod sys;
pub mod track;
pub mod tree;
pub mod verify;
pub mod walk;

pub use error::{Error, Result};

pub use dmover_proto::control::DirectIo;
