//! Benchmark support for dmover: the instruments behind `dmover bench`.
//!
//! - [`mkdata`]: a fast, deterministic dataset generator with the benchmark profiles the project
//!   measures against (`tiny`, `losf`, `medium`, `large`, `mixed`, `demo`).
//! - [`stats`]: medians, percentiles and spread of repeated measurements and latency samples.
//! - [`report`]: the machine, tools and parameters of a run, and its rows, written as
//!   `results.csv` and `results.json`.
//! - [`storage`]: the elbencho-style storage sweep (write then read files of one size, buffered
//!   or direct, N threads, per-I/O latency).
//! - [`peers`]: the peer copy tools (cp, rsync daemon and over ssh, scp, GridFTP, XRootD)
//!   and dmover itself: their servers on loopback and their copy commands.
//! - Copies made by any tool are checked against their source with
//!   `dmover_store::verify::compare` (its content comparison).
//! - [`plot`]: SVG/PNG figures of results (lines over file size or streams, bars per tool,
//!   trajectories over time); with the `plot` feature (default).

pub mod mkdata;
pub mod peers;
#[cfg(feature = "plot")]
pub mod plot;
pub mod report;
pub mod stats;
pub mod storage;
