//! SIGINT (Ctrl-C) and SIGTERM during a transfer: the transfer is cancelled and ends
//! cleanly (its sessions end, staging files are removed, the destination keeps its
//! journal for `--resume`), reports "interrupted by SIGINT" (or SIGTERM), and dmover
//! exits with 128 + the signal's number (130, 143), as a shell reports a process the
//! signal killed. A second signal exits at once with that code, without waiting for the
//! clean stop (what it leaves is what a killed client leaves: staging files under
//! `.dmv.` names that a resume removes, never a partial file under a final name).
//!
//! [`sweep`]: the same signals during a long measurement (`dmover bench`, `dmover tune`).

pub mod sweep;

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::Context;
use dmover_core::transfer::Canceller;

/// Cancels the transfer of `cancel` on Ctrl-C.
pub fn cancel_on_ctrl_c(rt: &tokio::runtime::Runtime, cancel: Canceller) {
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel("interrupted");
        }
    });
}

/// A signal that stopped a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGINT (Ctrl-C): exit code 130.
    Int,
    /// SIGTERM: exit code 143.
    Term,
}

impl Stop {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Int => "SIGINT",
            Stop::Term => "SIGTERM",
        }
    }

    /// 128 + the signal's number.
    pub fn exit_code(self) -> u8 {
        match self {
            Stop::Int => 128 + 2,
            Stop::Term => 128 + 15,
        }
    }

    fn from_code(code: i32) -> Option<Stop> {
        [Stop::Int, Stop::Term]
            .into_iter()
            .find(|s| i32::from(s.exit_code()) == code)
    }
}

/// Which signal, if any, stopped the transfer ([`cancel_on_signals`]).
#[derive(Debug, Clone)]
pub struct Signals(Arc<AtomicI32>);

impl Signals {
    /// The first SIGINT or SIGTERM that arrived.
    pub fn caught(&self) -> Option<Stop> {
        Stop::from_code(self.0.load(Ordering::SeqCst))
    }
}

/// Cancels the transfer of `cancel` on the first SIGINT or SIGTERM (the handlers are
/// installed before this returns); a second one exits the process at once.
pub fn cancel_on_signals(
    rt: &tokio::runtime::Runtime,
    cancel: Canceller,
) -> anyhow::Result<Signals> {
    use tokio::signal::unix::{SignalKind, signal};
    let _guard = rt.enter();
    let mut int = signal(SignalKind::interrupt()).context("catching SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("catching SIGTERM")?;
    let caught = Arc::new(AtomicI32::new(0));
    let c = caught.clone();
    rt.spawn(async move {
        let Some(first) = next_stop(&mut int, &mut term).await else {
            return;
        };
        c.store(first.exit_code().into(), Ordering::SeqCst);
        cancel.cancel(format!("interrupted by {}", first.name()));
        eprintln!(
            "dmover: {}: stopping cleanly (a second signal exits at once)",
            first.name()
        );
        if let Some(second) = next_stop(&mut int, &mut term).await {
            eprintln!("dmover: {}: exiting without cleaning up", second.name());
            std::process::exit(second.exit_code().into());
        }
    });
    Ok(Signals(caught))
}

/// The next SIGINT or SIGTERM (`None` if neither can arrive any more).
async fn next_stop(
    int: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
) -> Option<Stop> {
    tokio::select! {
        Some(()) = int.recv() => Some(Stop::Int),
        Some(()) = term.recv() => Some(Stop::Term),
        else => None,
    }
}
