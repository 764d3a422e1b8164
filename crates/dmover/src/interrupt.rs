//! Ctrl-C during a transfer: the transfer is cancelled and ends cleanly (staging files
//! removed, the destination's journal kept for `--resume`), then reports "interrupted".

use dmover_core::transfer::Canceller;

/// Cancels the transfer of `cancel` on Ctrl-C.
pub fn cancel_on_ctrl_c(rt: &tokio::runtime::Runtime, cancel: Canceller) {
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel("interrupted");
        }
    });
}
