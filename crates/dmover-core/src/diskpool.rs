//! A pool of disk I/O threads shared by every session of a process.
//!
//! Network tasks never touch the disk and disk threads never touch a socket: a network
//! task hands a filled buffer (receive side) or an empty one (send side) to this pool
//! as a job, and the job hands the buffer on when done. However many sessions a server
//! runs, it has this many disk threads (mdtmFTP's I/O-centric design, seed 002 §3.3.7).
//!
//! The pool is fixed ([`DiskPool::new`], `--io-threads N`) or elastic
//! ([`DiskPool::elastic`]): then a session's disk tuner ([`crate::disktune`]) may add
//! threads while it runs, when jobs wait for a thread and more threads move more data
//! (storage with parallelism to spare: NVMe queues, a parallel file system), and take
//! them back when they did not help. A job's time in the queue is counted
//! ([`DiskPool::waited`]): by Little's law the mean number of jobs waiting over a
//! period is that time's growth divided by the period.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, unbounded};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The most threads an elastic pool grows to.
pub const MAX_THREADS: usize = 64;
/// Threads a pool starts with unless the user says.
pub const DEFAULT_THREADS: usize = 8;

/// The threads a pool starts with and the most it may have, from the user's
/// `--io-threads` (a number pins them; none: [`DEFAULT_THREADS`], elastic to
/// [`MAX_THREADS`]).
pub fn threads_from(pinned: Option<usize>) -> (usize, usize) {
    match pinned {
        Some(n) => (n, n),
        None => (DEFAULT_THREADS, MAX_THREADS),
    }
}

/// What the threads share.
#[derive(Debug, Default)]
struct Shared {
    /// Nanoseconds the threads spent running jobs, all together.
    busy_ns: AtomicU64,
    /// Nanoseconds jobs waited in the queue for a thread, all together.
    waited_ns: AtomicU64,
    /// Jobs run.
    jobs: AtomicU64,
    /// Threads running, and how many there should be (a thread above it leaves after
    /// its next job).
    live: AtomicUsize,
    target: AtomicUsize,
}

/// Disk threads executing jobs in submission order.
#[derive(Debug)]
pub struct DiskPool {
    tx: Option<Sender<(Instant, Job)>>,
    rx: Receiver<(Instant, Job)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    shared: Arc<Shared>,
    name: String,
    /// Threads it starts with, and the most it may have (equal: fixed).
    base: usize,
    max: usize,
    spawned: AtomicUsize,
    /// Runs each job at once on the thread that queues it ([`DiskPool::inline`]).
    inline: bool,
}

impl DiskPool {
    /// A fixed pool of `n` threads (at least 1) named `name-N`.
    pub fn new(n: usize, name: &str) -> Self {
        Self::elastic(n, n, name)
    }

    /// A pool of `n` threads (at least 1) that may grow to `max` ([`DiskPool::grow_to`]).
    pub fn elastic(n: usize, max: usize, name: &str) -> Self {
        let (tx, rx) = unbounded();
        let base = n.max(1);
        let pool = DiskPool {
            tx: Some(tx),
            rx,
            threads: Mutex::new(Vec::new()),
            shared: Arc::new(Shared::default()),
            name: name.to_string(),
            base,
            max: max.max(base),
            spawned: AtomicUsize::new(0),
            inline: false,
        };
        pool.grow_to(base);
        pool
    }

    /// A pool without threads that runs each job at once, on the thread that queues
    /// it: for tests of whole sessions on tokio's paused clock, whose time must not
    /// move while a job runs elsewhere (the clock moves when every task waits).
    pub fn inline() -> Self {
        let (tx, rx) = unbounded();
        let shared = Arc::new(Shared::default());
        shared.target.store(1, Ordering::Relaxed);
        DiskPool {
            tx: Some(tx),
            rx,
            threads: Mutex::new(Vec::new()),
            shared,
            name: "inline".to_string(),
            base: 1,
            max: 1,
            spawned: AtomicUsize::new(0),
            inline: true,
        }
    }

    /// Seconds the threads spent running jobs, all threads together (a job that
    /// waits, e.g. on injected slowness, counts as busy), and the jobs run.
    pub fn busy(&self) -> (f64, u64) {
        (
            self.shared.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.shared.jobs.load(Ordering::Relaxed),
        )
    }

    /// Seconds jobs waited in the queue for a thread, all jobs together.
    pub fn waited(&self) -> f64 {
        self.shared.waited_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Threads there should be now (those leaving after a shrink are not counted).
    pub fn threads(&self) -> usize {
        self.shared.target.load(Ordering::Relaxed)
    }

    /// The most threads it may have (its base when fixed).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether it may grow.
    pub fn elastic_pool(&self) -> bool {
        self.max > self.base
    }

    /// Sets the threads to `n`, within the base and the most. New threads start at
    /// once; threads above `n` leave after their next job (each is sent an empty one).
    pub fn grow_to(&self, n: usize) -> usize {
        if self.inline {
            return 1;
        }
        let n = n.clamp(self.base, self.max);
        let Some(tx) = &self.tx else { return 0 };
        self.shared.target.store(n, Ordering::Relaxed);
        let live = self.shared.live.load(Ordering::Relaxed);
        if n < live {
            for _ in n..live {
                let _ = tx.send((Instant::now(), Box::new(|| {})));
            }
            return n;
        }
        let mut handles = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        // The handles of threads that left go (they ended).
        handles.retain(|h| !h.is_finished());
        for _ in live..n {
            let i = self.spawned.fetch_add(1, Ordering::Relaxed);
            self.shared.live.fetch_add(1, Ordering::Relaxed);
            let (rx, shared) = (self.rx.clone(), self.shared.clone());
            let h = std::thread::Builder::new()
                .name(format!("{}-{i}", self.name))
                .spawn(move || run(rx, shared));
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The machine gives no more threads: the pool keeps those it has.
                    self.shared.live.fetch_sub(1, Ordering::Relaxed);
                    self.shared.target.store(
                        self.shared.live.load(Ordering::Relaxed).max(1),
                        Ordering::Relaxed,
                    );
                    tracing::warn!("cannot start a disk thread: {e}");
                    break;
                }
            }
        }
        self.threads()
    }

    /// Queues a job. Jobs are bounded by the buffers that travel with them, so the
    /// queue needs no bound of its own.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        if self.inline {
            return run_one(&self.shared, Instant::now(), Box::new(job));
        }
        if let Some(tx) = &self.tx {
            // Only fails after shutdown started, when nobody waits for results.
            let _ = tx.send((Instant::now(), Box::new(job)));
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

/// Runs one job queued at `queued`, counting its wait and its time.
fn run_one(s: &Shared, queued: Instant, job: Job) {
    let t = Instant::now();
    let waited = t.saturating_duration_since(queued).as_nanos();
    s.waited_ns
        .fetch_add(waited.min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    // A panicking job must not shrink the pool; its session sees the dropped result
    // and fails with an error.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
        tracing::error!("a disk job panicked; its session is aborted");
    }
    let ns = t.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
    s.busy_ns.fetch_add(ns, Ordering::Relaxed);
    s.jobs.fetch_add(1, Ordering::Relaxed);
}

/// A disk thread: jobs until the pool shuts down or has more threads than it should.
fn run(rx: Receiver<(Instant, Job)>, s: Arc<Shared>) {
    for (queued, job) in rx.iter() {
        run_one(&s, queued, job);
        // One thread above the target leaves.
        let leave = s
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                (live > s.target.load(Ordering::Relaxed)).then(|| live - 1)
            })
            .is_ok();
        if leave {
            return;
        }
    }
    s.live.fetch_sub(1, Ordering::Relaxed);
}

impl Drop for DiskPool {
    fn drop(&mut self) {
        self.tx.take();
        let handles = std::mem::take(self.threads.get_mut().unwrap_or_else(|e| e.into_inner()));
        for t in handles {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn wait_for(mut f: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < end, "timed out");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_fixed_pool_stays_as_it_is() {
        let p = DiskPool::new(3, "t");
        assert_eq!(p.grow_to(10), 3);
        assert_eq!(p.grow_to(1), 3);
        assert!(!p.elastic_pool());
    }

    #[test]
    fn an_elastic_pool_grows_and_shrinks_within_its_bounds() {
        let p = DiskPool::elastic(2, 6, "t");
        assert!(p.elastic_pool());
        assert_eq!(p.grow_to(100), 6);
        assert_eq!(p.shared.live.load(Ordering::Relaxed), 6);
        // Six jobs that each hold a thread until all six run at once.
        let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
        let running = Arc::new(AtomicUsize::new(0));
        for _ in 0..6 {
            let (r, go) = (running.clone(), go_rx.clone());
            p.spawn(move || {
                r.fetch_add(1, Ordering::SeqCst);
                let _ = go.recv();
            });
        }
        wait_for(|| running.load(Ordering::SeqCst) == 6);
        for _ in 0..6 {
            go_tx.send(()).unwrap();
        }
        assert_eq!(p.grow_to(0), 2);
        wait_for(|| p.shared.live.load(Ordering::Relaxed) == 2);
        // What is left still runs jobs, and growing again starts threads anew.
        let n = Arc::new(AtomicUsize::new(0));
        for _ in 0..20 {
            let n = n.clone();
            p.spawn(move || {
                n.fetch_add(1, Ordering::SeqCst);
            });
        }
        wait_for(|| n.load(Ordering::SeqCst) == 20);
        assert_eq!(p.grow_to(4), 4);
        assert_eq!(p.shared.live.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn the_time_jobs_wait_for_a_thread_is_counted() {
        let p = DiskPool::new(1, "t");
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let d = done.clone();
            p.spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                d.fetch_add(1, Ordering::SeqCst);
            });
        }
        wait_for(|| done.load(Ordering::SeqCst) == 3);
        // The second job waited ~20 ms, the third ~40 ms.
        assert!(p.waited() >= 0.055, "waited {}", p.waited());
    }
}
