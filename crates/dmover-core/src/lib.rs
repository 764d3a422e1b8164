//! The dmover transfer engine.
//!
//! A transfer is a session between a client and a server: one control connection and
//! N data streams. The source side walks its tree into a manifest
//! ([`dmover_store::walk`]), both sides lay the files out as one virtual byte space
//! ([`dmover_proto::layout`]), and chunks of it flow through a bounded buffer pool
//! ([`pool`]) between a fixed set of disk threads ([`diskpool`]), which run a
//! [`dmover_store::Source`] or [`dmover_store::Sink`], and the data streams ([`engine`]).
//! The file-backed sink writes each file under a staging name and renames it into place
//! once it is complete and its digest matches ([`dmover_store::sink`]).
//!
//! - [`transfer`]: the library's front door: describe a transfer ([`TransferSpec`]: sources,
//!   destination, options), run it ([`Transfer::run`]), hear its [`Event`]s, get its
//!   report; cancel it from anywhere. `dmover cp` and `dmover sync` run through it.
//! - [`client::Client`] pushes or pulls; [`server::Server`] serves many clients at once.
//! - [`dialer`]: the dialing side of a session, the client's and a server's that dials
//!   another for a third-party copy.
//! - [`access`]: exports, users, credentials and the server's configuration file.
//! - [`memtest`]: the memory-to-memory network test (`dmover bench net`).
//! - [`monitor`]: the server's live sessions and counters (`dmover serve --metrics`).
//! - [`remote`]: reading a server's files in place, chunk by chunk (issue 14).
//! - [`relay`]: a copy between two servers through the client (`cp --via-client`).
//! - Storage (trees, paths, walks, sources and sinks, the resume journal) is
//!   [`dmover_store`]; its errors arrive here as [`Error::Store`].

#![deny(clippy::too_many_lines)]

pub mod access;
pub mod client;
pub mod dialer;
pub mod diskpool;
pub mod disktune;
pub mod drive;
pub mod engine;
pub mod error;
#[cfg(any(test, feature = "testing"))]
pub mod harness;
mod livewalk;
pub mod manifests;
pub mod memtest;
pub mod monitor;
pub mod policy;
pub mod pool;
pub mod relay;
pub mod remote;
mod roles;
pub mod server;
pub mod session;
pub mod transfer;

pub use error::{Error, Result};
pub use transfer::{Endpoint, Engine, Event, Transfer, TransferSpec};

pub use dmover_proto::control::DirectIo;
