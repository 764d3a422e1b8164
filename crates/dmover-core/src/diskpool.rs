//! A fixed pool of disk I/O threads shared by every session of a process.
//!
//! Network tasks never touch the disk and disk threads never touch a socket: a network
//! task hands a filled buffer (receive side) or an empty one (send side) to this pool
//! as a job, and the job hands the buffer on when done. However many sessions a server
//! runs, it has this many disk threads (mdtmFTP's I/O-centric design, seed 002 §3.3.7).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, unbounded};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Fixed disk threads executing jobs in submission order.
#[derive(Debug)]
pub struct DiskPool {
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// Nanoseconds the threads spent running jobs, all together.
    busy_ns: Arc<AtomicU64>,
    /// Jobs run.
    jobs: Arc<AtomicU64>,
}

impl DiskPool {
    /// Starts `n` threads (at least 1) named `name-N`.
    pub fn new(n: usize, name: &str) -> Self {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = unbounded();
        let busy_ns = Arc::new(AtomicU64::new(0));
        let jobs = Arc::new(AtomicU64::new(0));
        let threads = (0..n.max(1))
            .map(|i| {
                let rx = rx.clone();
                let (busy_ns, jobs) = (busy_ns.clone(), jobs.clone());
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        for job in rx {
                            let t = Instant::now();
                            // A panicking job must not shrink the pool; its session sees
                            // the dropped result and fails with an error.
                            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err()
                            {
                                tracing::error!("a disk job panicked; its session is aborted");
                            }
                            let ns = t.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                            busy_ns.fetch_add(ns, Ordering::Relaxed);
                            jobs.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .expect("spawning a disk thread")
            })
            .collect();
        DiskPool {
            tx: Some(tx),
            threads,
            busy_ns,
            jobs,
        }
    }

    /// Seconds the threads spent running jobs, all threads together (a job that
    /// waits, e.g. on injected slowness, counts as busy), and the jobs run.
    pub fn busy(&self) -> (f64, u64) {
        (
            self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.jobs.load(Ordering::Relaxed),
        )
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Queues a job. Jobs are bounded by the buffers that travel with them, so the
    /// queue needs no bound of its own.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        if let Some(tx) = &self.tx {
            // Only fails after shutdown started, when nobody waits for results.
            let _ = tx.send(Box::new(job));
        }
    }

    /// Runs `f` on a disk thread and awaits its result (`None` if the job panicked or
    /// the pool is shutting down).
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.spawn(move || {
            let _ = tx.send(f());
        });
        rx.await.ok()
    }
}

impl Drop for DiskPool {
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
