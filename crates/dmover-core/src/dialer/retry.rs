//! The attempts of a transfer: retried (and resumed) after failures that may pass, and
//! a server that cannot take the session yet waited for.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::{Dialer, MAX_BUSY_BACKOFF, Report};
use crate::engine::Run;
use crate::error::Result;

impl Dialer {
    /// Runs attempts of a transfer until one succeeds, retrying (and resuming) after
    /// failures that may pass, up to [`TransferOptions::retries`] times.
    pub(crate) async fn with_retries<'a, F, Fut>(
        &'a self,
        run: &Arc<Run>,
        mut once: F,
    ) -> Result<Report>
    where
        F: FnMut(Arc<Run>, bool) -> Fut,
        Fut: std::future::Future<Output = Result<Report>> + 'a,
    {
        let mut resume = self.opts.resume;
        let mut attempt = 1;
        // Refusals after authentication by a server that cannot take the session yet:
        // since when, and the last wait.
        let mut not_yet: Option<tokio::time::Instant> = None;
        let mut backoff = Duration::ZERO;
        loop {
            run.progress.attempt.store(attempt, Relaxed);
            match once(run.attempt(), resume).await {
                Ok(mut r) => {
                    r.attempts = attempt;
                    r.bytes_sent = run.progress.bytes.load(Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    // The user interrupted: that is the error, and no retry.
                    if let Some(top) = run.take_error() {
                        return Err(top);
                    }
                    // The server cannot take the session yet (its user's session
                    // limit, its memory budget): come back, as for a busy answer before
                    // TLS, within --busy-wait and whatever --retries says.
                    if e.server_busy() && !run.is_cancelled() {
                        let since = *not_yet.get_or_insert_with(tokio::time::Instant::now);
                        let spent = since.elapsed();
                        if spent < self.opts.busy_wait {
                            backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BUSY_BACKOFF);
                            let wait = backoff
                                .mul_f64(1.0 + rand::random::<f64>() / 2.0)
                                .min(self.opts.busy_wait - spent);
                            tracing::warn!(
                                "{e}; trying again in {:.1} s (for at most --busy-wait {:.0}s)",
                                wait.as_secs_f64(),
                                self.opts.busy_wait.as_secs_f64()
                            );
                            tokio::select! {
                                _ = run.cancelled() => return Err(run.take_error().unwrap_or(e)),
                                _ = tokio::time::sleep(wait) => {}
                            }
                            continue;
                        }
                    }
                    if attempt > self.opts.retries || !e.retryable() || run.is_cancelled() {
                        return Err(e);
                    }
                    tracing::warn!(
                        "attempt {attempt} failed: {e}; resuming in {:.1} s ({} retries left)",
                        self.opts.retry_wait.as_secs_f64(),
                        self.opts.retries + 1 - attempt
                    );
                    run.progress.event(crate::engine::ProgressEvent::Retry {
                        attempt,
                        error: e.to_string(),
                        wait: self.opts.retry_wait,
                    });
                    tokio::select! {
                        _ = run.cancelled() => return Err(run.take_error().unwrap_or(e)),
                        _ = tokio::time::sleep(self.opts.retry_wait) => {}
                    }
                    resume = true;
                    attempt += 1;
                }
            }
        }
    }
}
