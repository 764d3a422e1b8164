//! The job service's Prometheus metrics, served beside the server's own on
//! `dmover serve --metrics` (docs/metrics.md): jobs in the store by state (the queue's
//! depth is `state="queued"`), jobs submitted, and runs ended by outcome.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::model::{Outcome, State};
use crate::store::StoreError;

/// What the service counts since it started.
#[derive(Debug, Default)]
pub struct JobCounters {
    submitted: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    requeued: AtomicU64,
}

impl JobCounters {
    /// A job accepted.
    pub(crate) fn submitted(&self) {
        self.submitted.fetch_add(1, Relaxed);
    }

    /// A run that ended as `o` says.
    pub(crate) fn ended(&self, o: &Outcome) {
        match o {
            Outcome::Done(_) => &self.done,
            Outcome::Failed { .. } => &self.failed,
            Outcome::Cancelled(_) => &self.cancelled,
            Outcome::Requeue { .. } => &self.requeued,
        }
        .fetch_add(1, Relaxed);
    }
}

/// The metrics in Prometheus' text format: `counts` (the store's jobs by state, read
/// by the caller) and `c`.
pub fn prometheus(counts: &[(State, u64)], c: &JobCounters) -> String {
    let reading = Reading {
        by_state: [
            State::Queued,
            State::Running,
            State::Done,
            State::Failed,
            State::Cancelled,
        ]
        .map(|s| {
            let n = counts.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n);
            (s.as_str(), n)
        }),
        submitted: c.submitted.load(Relaxed),
        runs: [
            ("done", c.done.load(Relaxed)),
            ("failed", c.failed.load(Relaxed)),
            ("cancelled", c.cancelled.load(Relaxed)),
            ("requeued", c.requeued.load(Relaxed)),
        ],
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(reading));
    let mut out = String::with_capacity(1024);
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

/// One scrape's values.
#[derive(Debug)]
struct Reading {
    by_state: [(&'static str, u64); 5],
    submitted: u64,
    runs: [(&'static str, u64); 4],
}

impl Collector for Reading {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        {
            let g = ConstGauge::new(0i64);
            let mut family = enc.encode_descriptor(
                "dmover_jobs",
                "Jobs in the job service's store now, by state (queued: the queue's depth).",
                None,
                g.metric_type(),
            )?;
            for (state, n) in self.by_state {
                ConstGauge::new(n as i64).encode(family.encode_family(&[("state", state)])?)?;
            }
        }
        {
            let c = ConstCounter::new(self.submitted);
            let metric = enc.encode_descriptor(
                "dmover_jobs_submitted",
                "Jobs submitted to the job service since it started.",
                None,
                c.metric_type(),
            )?;
            c.encode(metric)?;
        }
        let c = ConstCounter::new(0u64);
        let mut family = enc.encode_descriptor(
            "dmover_job_runs",
            "Runs of jobs ended since the service started, by outcome (requeued: failed, \
             to be tried again after a backoff).",
            None,
            c.metric_type(),
        )?;
        for (outcome, n) in self.runs {
            ConstCounter::new(n).encode(family.encode_family(&[("outcome", outcome)])?)?;
        }
        Ok(())
    }
}

/// [`prometheus`] of `service`, reading its store.
pub fn of_service(service: &crate::runner::Service) -> Result<String, StoreError> {
    let counts = service.store().counts()?;
    Ok(prometheus(&counts, service.counters()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Counters;

    #[test]
    fn every_state_and_outcome_is_a_series() {
        let c = JobCounters::default();
        c.submitted();
        c.submitted();
        c.ended(&Outcome::Done(Counters::default()));
        c.ended(&Outcome::Requeue {
            counters: Counters::default(),
            error: String::new(),
            not_before_ms: 0,
        });
        let text = prometheus(&[(State::Queued, 7), (State::Done, 1)], &c);
        for line in [
            "dmover_jobs{state=\"queued\"} 7",
            "dmover_jobs{state=\"running\"} 0",
            "dmover_jobs{state=\"done\"} 1",
            "dmover_jobs{state=\"cancelled\"} 0",
            "dmover_jobs_submitted_total 2",
            "dmover_job_runs_total{outcome=\"done\"} 1",
            "dmover_job_runs_total{outcome=\"requeued\"} 1",
            "dmover_job_runs_total{outcome=\"failed\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
    }
}
