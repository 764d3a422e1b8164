//! Benchmark support for dmover.
//!
//! - [`mkdata`]: a fast, deterministic dataset generator with the benchmark profiles the project
//!   measures against (`tiny`, `losf`, `medium`, `large`, `mixed`, `demo`). The CLI exposes it as
//!   `dmover bench mkdata DIR --profile P [--scale F] [--seed S]`, and `scripts/bench-core.sh`
//!   uses it to build the datasets it copies with dmover and the peer tools.

pub mod mkdata;
