//! dmover's job service: transfers submitted, queued in a database and run by the
//! service with the library API ([`dmover_core::transfer`]), with no client connected.
//!
//! - [`model`]: what a job is (its spec, state, counters, errors by file).
//! - [`store`]: the [`store::JobStore`] interface and its SQLite implementation.
//! - [`runner`]: claims queued jobs and runs them, retrying with backoff; re-queues
//!   at start the jobs a stopped service left running.
//! - [`api`]: the REST API over HTTP/1.1 (axum on hyper), bearer tokens of the
//!   server's users.
//! - [`client`]: the API's client, for the CLI and tests.
//! - [`metrics`]: the service's Prometheus metrics.
//! - [`webhook`]: ended jobs POSTed to allowed URLs.
//!
//! The layering is one-way: dmover (CLI) → dmover-jobs → dmover-core.

#![deny(clippy::too_many_lines)]

pub mod api;
pub mod client;
pub mod metrics;
pub mod model;
pub mod runner;
pub mod store;
pub mod webhook;
