//! Whole sessions on the production drivers ([`crate::drive`]) in one process, no
//! sockets, no files: [`pair`] wires a dialer and an acceptor together (in-memory
//! control connection and data streams, the production dialer's joins and the
//! acceptor's join table), [`script`] runs scripted sessions on it (what moves, what
//! goes wrong) on tokio's paused clock. The pair schedules and driver tests are its
//! tests; the `drive_pair` fuzz target uses it through the `testing` feature. It sits
//! above the drivers and the dialer, and nothing but tests depends on it.

pub mod pair;
pub mod script;

#[cfg(test)]
mod cases;
#[cfg(test)]
mod drivers;
#[cfg(test)]
mod props;
