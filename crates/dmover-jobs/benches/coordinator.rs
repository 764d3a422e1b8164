//! The PostgreSQL job store under agents claiming and ending jobs at once: completions
//! per second and claim latency (request to row back) at 1, 4, 16 and 64 agents
//! (issue 42, "a coordinator benchmark"). A benchmark, not a test:
//!
//! ```sh
//! cargo bench -p dmover-jobs --bench coordinator [-- AGENTS... [--jobs N]]
//! ```
//!
//! It starts a PostgreSQL server of its own (Debian's `postgresql`, as the tests do:
//! tests/common/pg.rs) with its defaults for durability: `fsync` and
//! `synchronous_commit` on. Each agent is a thread with its own store (one connection,
//! as a job service has). A completion is one job claimed (`JobStore::claim`: the
//! fair-share choice under the claim lock) and ended (`JobStore::finish`), each a
//! durable transaction: batch size 1, the job store's unit today. The database and
//! the agents share the machine's cores.

#[path = "../tests/common/pg.rs"]
mod pg;

use std::time::{Duration, Instant};

use dmover_jobs::model::{Counters, JobKind, JobOptions, JobSpec, Outcome, now_ms};
use dmover_jobs::store::pg::{Lease, PgOptions, PgStore};
use dmover_jobs::store::{JobStore, Policy};

fn main() {
    let mut agents: Vec<usize> = Vec::new();
    let mut jobs = 2000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--jobs" => jobs = args.next().and_then(|n| n.parse().ok()).expect("--jobs N"),
            "--bench" => {}
            n => agents.push(n.parse().expect("AGENTS: a number")),
        }
    }
    if agents.is_empty() {
        agents = vec![1, 4, 16, 64];
    }
    let Some(pg) = pg::PgServer::start_with(&[("fsync", "on"), ("synchronous_commit", "on")])
    else {
        return;
    };
    println!("agents,jobs,seconds,completions_per_s,claim_p50_ms,claim_p99_ms,claim_max_ms");
    for n in agents {
        let r = run(&pg, n, jobs);
        println!(
            "{n},{jobs},{:.2},{:.0},{:.2},{:.2},{:.2}",
            r.elapsed.as_secs_f64(),
            jobs as f64 / r.elapsed.as_secs_f64(),
            ms(r.quantile(0.5)),
            ms(r.quantile(0.99)),
            ms(r.quantile(1.0)),
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Run {
    elapsed: Duration,
    claims: Vec<Duration>,
}

impl Run {
    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.claims.len() - 1) as f64 * q).round() as usize;
        self.claims[i]
    }
}

fn options(pg: &pg::PgServer, schema: &str, agent: String) -> PgOptions {
    PgOptions {
        url: pg.url(),
        password: None,
        schema: Some(schema.into()),
        agent,
        lease: Lease::default(),
        policy: Policy {
            link_concurrency: 1_000_000,
            max_unfinished_per_user: None,
        },
        ca: None,
    }
}

/// `jobs` jobs of 16 users over 32 links, claimed and ended by `n` agents.
fn run(pg: &pg::PgServer, n: usize, jobs: usize) -> Run {
    let schema = format!("bench_{n}_{}", now_ms());
    let stores: Vec<PgStore> = (0..n)
        .map(|i| PgStore::open(options(pg, &schema, format!("agent{i}"))).unwrap())
        .collect();
    for i in 0..jobs {
        let spec = JobSpec {
            sources: vec![format!("dmover://src{}/f{i}", i % 32)],
            destination: "dmover://dst/in".into(),
            options: JobOptions::default(),
        };
        stores[0]
            .submit(&format!("user{}", i % 16), JobKind::Copy, &spec)
            .unwrap();
    }
    let started = Instant::now();
    let mut claims: Vec<Duration> = std::thread::scope(|scope| {
        let threads: Vec<_> = stores
            .iter()
            .map(|s| {
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let t = Instant::now();
                        let Some(j) = s.claim(now_ms()).unwrap() else {
                            return mine;
                        };
                        mine.push(t.elapsed());
                        s.finish(j.id, &Outcome::Done(Counters::default())).unwrap();
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let elapsed = started.elapsed();
    assert_eq!(claims.len(), jobs, "every job claimed once");
    claims.sort_unstable();
    Run { elapsed, claims }
}
