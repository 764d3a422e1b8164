//! The job store on a real PostgreSQL server (started by the tests: common/pg.rs),
//! shared by several agents: a job's life, concurrent claims, leases and fencing, one
//! name one service, a database restart, two clusters on one database, and job
//! services failing over on real servers.
//!
//! Each test works in a schema of its own on the binary's one server (the restart
//! test has a server of its own). Leases here are a few hundred milliseconds; the
//! bounds checked are generous.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::{Lab, Running, bytes, staging};
use dmover_jobs::model::{
    Counters, FileError, Job, JobId, JobKind, JobOptions, JobSpec, Outcome, State, now_ms,
};
use dmover_jobs::store::pg::{Lease, PgOptions, PgStore};
use dmover_jobs::store::{JobStore, Page, Policy, RunState, StoreError};

/// A lease of 5 × 100 ms.
fn quick() -> Lease {
    Lease {
        heartbeat: Duration::from_millis(100),
        heartbeats: 5,
    }
}

fn options(pg: &PgServer, schema: &str, agent: &str) -> PgOptions {
    PgOptions {
        url: pg.url(),
        password: None,
        schema: Some(schema.into()),
        agent: agent.into(),
        lease: quick(),
        policy: Policy::default(),
        ca: None,
    }
}

fn open(pg: &PgServer, schema: &str, agent: &str) -> PgStore {
    PgStore::open(options(pg, schema, agent)).unwrap()
}

fn spec(src: &str, dst: &str, name: &str) -> JobSpec {
    JobSpec {
        sources: vec![format!("dmover://{src}/{name}")],
        destination: format!("dmover://{dst}/in"),
        options: JobOptions::default(),
    }
}

fn counters(bytes: u64) -> Counters {
    Counters {
        bytes,
        bytes_total: 100,
        bytes_resumed: 0,
        files_done: 1,
        files_total: 2,
        rate: 5.0,
    }
}

#[test]
fn a_job_goes_through_its_life_on_postgres() {
    let Some(pg) = PgServer::shared() else { return };
    let s = open(pg, "life", "dtn1");
    let mut sp = spec("a", "b", "x");
    sp.options.notify = Some("https://hooks.example/x".into());
    let j = s.submit("alice", JobKind::Copy, &sp).unwrap();
    assert_eq!(
        (j.state, j.owner.as_str(), j.attempts),
        (State::Queued, "alice", 0)
    );
    assert_eq!(j.link, "a:7700 -> b:7700");
    let c = s.claim(now_ms()).unwrap().unwrap();
    assert_eq!(
        (c.id, c.state, c.attempts, c.tries),
        (j.id, State::Running, 1, 1)
    );
    assert_eq!(s.claim(now_ms()).unwrap(), None, "one job, claimed once");
    assert_eq!(s.progress(j.id, &counters(40)).unwrap(), RunState::Running);
    let p = s.get(j.id).unwrap();
    assert_eq!((p.bytes, p.files_done, p.rate), (40, 1, 5.0));
    // A cancel asked (here, or through another agent) reaches the run.
    assert!(s.cancel(j.id).unwrap().cancel_requested);
    assert_eq!(
        s.progress(j.id, &counters(50)).unwrap(),
        RunState::CancelAsked
    );
    let failed = Outcome::Failed {
        counters: counters(60),
        error: "1 file(s) could not be copied".into(),
        files: vec![FileError {
            path: "x/f".into(),
            error: "permission denied".into(),
        }],
    };
    let f = s.finish(j.id, &failed).unwrap();
    assert_eq!((f.state, f.files_failed, f.bytes), (State::Failed, 1, 60));
    assert_eq!(f.file_errors[0].path, "x/f");
    assert!(!f.cancel_requested);
    let pending = s.webhooks_pending(10).unwrap();
    assert_eq!(pending.iter().map(|j| j.id).collect::<Vec<_>>(), [j.id]);
    s.webhook_result(j.id, Err("refused".into())).unwrap();
    assert_eq!(
        s.get(j.id).unwrap().webhook_error.as_deref(),
        Some("refused")
    );
    assert!(s.webhooks_pending(10).unwrap().is_empty());
    assert!(matches!(s.cancel(j.id), Err(StoreError::Conflict(_))));
    // Retried: queued again, its tries from zero; a second run ends it done.
    let r = s.retry(j.id).unwrap();
    assert_eq!((r.state, r.tries, r.webhook), (State::Queued, 0, None));
    s.claim(now_ms()).unwrap().unwrap();
    let d = s.finish(j.id, &Outcome::Done(counters(100))).unwrap();
    assert_eq!((d.state, d.attempts, d.bytes), (State::Done, 2, 100));
    assert!(d.file_errors.is_empty());
    // Pages newest first, counts, and a requeue's backoff.
    let k = s
        .submit("bob", JobKind::Copy, &spec("a", "c", "y"))
        .unwrap();
    let page = s
        .list(Page {
            owner: None,
            before: None,
            limit: 1,
        })
        .unwrap();
    assert_eq!(page.iter().map(|j| j.id).collect::<Vec<_>>(), [k.id]);
    let older = s
        .list(Page {
            owner: None,
            before: Some(k.id),
            limit: 5,
        })
        .unwrap();
    assert_eq!(older.iter().map(|j| j.id).collect::<Vec<_>>(), [j.id]);
    let bobs = s
        .list(Page {
            owner: Some("bob"),
            before: None,
            limit: 5,
        })
        .unwrap();
    assert_eq!(bobs.len(), 1);
    let mut counts = s.counts().unwrap();
    counts.sort_by_key(|(st, _)| st.as_str());
    assert_eq!(counts, [(State::Done, 1), (State::Queued, 1)]);
    let now = now_ms();
    s.claim(now).unwrap().unwrap();
    let requeue = Outcome::Requeue {
        counters: counters(1),
        error: "attempt 1: connection reset".into(),
        not_before_ms: now + 60_000,
    };
    assert_eq!(s.finish(k.id, &requeue).unwrap().state, State::Queued);
    assert_eq!(s.claim(now).unwrap(), None, "waiting for its backoff");
    assert_eq!(s.next_due(now).unwrap(), Some(now + 60_000));
    assert_eq!(s.claim(now + 60_000).unwrap().map(|j| j.id), Some(k.id));
    // Purge: only what ended before the time.
    assert_eq!(s.purge(now_ms() + 1).unwrap(), 1);
    assert!(matches!(s.get(j.id), Err(StoreError::NotFound(_))));
    assert_eq!(s.get(k.id).unwrap().state, State::Running);
    // The database outlives the store: another start reads it back.
    drop(s);
    let again = reopen(pg, "life", "dtn1");
    assert_eq!(again.get(k.id).unwrap().spec.sources[0], "dmover://a/y");
}

/// `agent` opened again once the last store under its name has let go of it (its
/// connection's end reaches the server a moment after the drop).
fn reopen(pg: &PgServer, schema: &str, agent: &str) -> PgStore {
    let t = Instant::now();
    loop {
        match PgStore::open(options(pg, schema, agent)) {
            Ok(s) => return s,
            Err(StoreError::AgentInUse(_)) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Four agents claim and end 120 jobs at once from one database: no job is run twice,
/// no link ever has more than its limit running, every job ends.
#[test]
fn agents_claiming_at_once_never_share_a_job_or_pass_a_link_limit() {
    let Some(pg) = PgServer::shared() else { return };
    let limit = 2;
    let stores: Vec<PgStore> = (0..4)
        .map(|i| {
            let mut o = options(pg, "claims", &format!("dtn{i}"));
            o.policy = Policy {
                link_concurrency: limit,
                max_unfinished_per_user: None,
            };
            PgStore::open(o).unwrap()
        })
        .collect();
    let dsts = ["b", "c", "d"];
    for i in 0..120 {
        let owner = format!("u{}", i % 4);
        let sp = spec("a", dsts[i % dsts.len()], &i.to_string());
        stores[0].submit(&owner, JobKind::Copy, &sp).unwrap();
    }
    // Running by link as the agents see it: raised after a claim returns, lowered
    // before its end is recorded, so never above what the database holds.
    let running: Mutex<HashMap<String, u32>> = Mutex::new(HashMap::new());
    let most = Mutex::new(0u32);
    let ran: Vec<(String, JobId)> = std::thread::scope(|scope| {
        let threads: Vec<_> = stores
            .iter()
            .map(|s| {
                let (running, most) = (&running, &most);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    let mut idle = 0;
                    while idle < 20 {
                        let Some(j) = s.claim(now_ms()).unwrap() else {
                            idle += 1;
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        };
                        idle = 0;
                        {
                            let mut r = running.lock().unwrap();
                            let n = r.entry(j.link.clone()).or_default();
                            *n += 1;
                            let mut m = most.lock().unwrap();
                            *m = (*m).max(*n);
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        *running.lock().unwrap().get_mut(&j.link).unwrap() -= 1;
                        s.finish(j.id, &Outcome::Done(counters(100))).unwrap();
                        mine.push((s.agent().to_string(), j.id));
                    }
                    mine
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let mut ids: Vec<JobId> = ran.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ran.len(), "a job run twice");
    assert_eq!(ran.len(), 120, "every job ran");
    assert!(*most.lock().unwrap() <= limit, "a link passed its limit");
    assert_eq!(stores[1].counts().unwrap(), [(State::Done, 120)]);
    let agents: std::collections::BTreeSet<&str> = ran.iter().map(|(a, _)| a.as_str()).collect();
    assert!(agents.len() >= 2, "the work was shared: {agents:?}");
}

/// An agent that stops heartbeating loses its running job to the others within its
/// lease and a scan, not before; its late progress and end are refused (fencing).
#[test]
fn a_silent_agents_job_returns_to_the_pool_and_its_late_end_is_refused() {
    let Some(pg) = PgServer::shared() else { return };
    let a = open(pg, "leases", "dtn-a");
    let b = open(pg, "leases", "dtn-b");
    let j = a
        .submit("alice", JobKind::Copy, &spec("x", "y", "f"))
        .unwrap();
    assert_eq!(a.claim(now_ms()).unwrap().map(|j| j.id), Some(j.id));
    // Heartbeating, A keeps it: a second of B's scans takes nothing.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        a.heartbeat().unwrap();
        assert_eq!(b.reclaim().unwrap(), Vec::<JobId>::new());
        std::thread::sleep(Duration::from_millis(100));
    }
    // A goes silent; B scans every heartbeat.
    a.heartbeat().unwrap();
    let silent = Instant::now();
    let lease = quick().length();
    let reclaimed = loop {
        let got = b.reclaim().unwrap();
        if !got.is_empty() {
            break silent.elapsed();
        }
        assert!(
            silent.elapsed() < lease + Duration::from_secs(5),
            "never reclaimed"
        );
        std::thread::sleep(quick().heartbeat);
    };
    assert!(
        reclaimed + Duration::from_millis(50) >= lease,
        "reclaimed {reclaimed:?} after the last heartbeat, before the lease ({lease:?})"
    );
    let q = b.get(j.id).unwrap();
    assert_eq!(q.state, State::Queued, "{q:#?}");
    assert!(q.error.unwrap().contains("lease ran out"));
    // B runs it; A, back, is told its run is over and cannot record its end.
    assert_eq!(b.claim(now_ms()).unwrap().map(|j| j.id), Some(j.id));
    assert_eq!(a.progress(j.id, &counters(10)).unwrap(), RunState::Lost);
    match a.finish(j.id, &Outcome::Done(counters(100))) {
        Err(StoreError::Lost(m)) => assert!(m.contains("dtn-b runs it now"), "{m}"),
        other => panic!("{other:?}"),
    }
    let d = b.finish(j.id, &Outcome::Done(counters(100))).unwrap();
    assert_eq!((d.state, d.attempts), (State::Done, 2));
}

/// A second service under a live agent's name is refused; once the first is gone,
/// the next start (a new epoch) takes back its running jobs at once.
#[test]
fn one_agent_name_is_one_service_and_a_restart_takes_back_its_jobs() {
    let Some(pg) = PgServer::shared() else { return };
    let first = open(pg, "names", "dtn1");
    match PgStore::open(options(pg, "names", "dtn1")) {
        Err(e @ StoreError::AgentInUse(_)) => assert!(e.to_string().contains("agent dtn1"), "{e}"),
        other => panic!("{other:?}"),
    }
    let j = first
        .submit("alice", JobKind::Copy, &spec("x", "y", "f"))
        .unwrap();
    first.claim(now_ms()).unwrap().unwrap();
    let epoch = first.epoch();
    drop(first);
    let second = reopen(pg, "names", "dtn1");
    assert_eq!(second.epoch(), epoch + 1);
    // Well within the old lease: the epoch, not the time, says the run is over.
    assert_eq!(second.recover().unwrap(), [j.id]);
    assert_eq!(second.get(j.id).unwrap().state, State::Queued);
}

/// The database stopped and started again while an agent runs a job: calls fail
/// meanwhile, the agent reconnects, and the restart reclaims nothing even when it
/// took longer than a lease (the lease counts from the database's start).
#[test]
fn a_database_restart_mid_run_loses_nothing() {
    let Some(pg) = PgServer::start() else { return };
    let a = open(&pg, "restart", "dtn-a");
    let b = open(&pg, "restart", "dtn-b");
    let j = a
        .submit("alice", JobKind::Copy, &spec("x", "y", "f"))
        .unwrap();
    a.claim(now_ms()).unwrap().unwrap();
    pg.stop();
    assert!(matches!(a.heartbeat(), Err(StoreError::Db(_))));
    assert!(a.progress(j.id, &counters(5)).is_err());
    std::thread::sleep(quick().length() + Duration::from_millis(200));
    pg.restart();
    assert_eq!(
        b.reclaim().unwrap(),
        Vec::<JobId>::new(),
        "reclaimed at restart"
    );
    a.heartbeat().unwrap();
    assert_eq!(a.progress(j.id, &counters(50)).unwrap(), RunState::Running);
    let d = a.finish(j.id, &Outcome::Done(counters(100))).unwrap();
    assert_eq!((d.state, d.bytes, d.attempts), (State::Done, 100, 1));
}

/// Two clusters on one database, each in its schema: neither sees the other's jobs,
/// and one agent name may serve in both.
#[test]
fn two_clusters_share_one_database_in_their_own_schemas() {
    let Some(pg) = PgServer::shared() else { return };
    let one = open(pg, "cluster_one", "dtn1");
    let two = open(pg, "cluster_two", "dtn1");
    let j = one
        .submit("alice", JobKind::Copy, &spec("x", "y", "f"))
        .unwrap();
    assert_eq!(two.claim(now_ms()).unwrap(), None);
    assert!(
        two.list(Page {
            owner: None,
            before: None,
            limit: 10
        })
        .unwrap()
        .is_empty()
    );
    assert_eq!(one.claim(now_ms()).unwrap().map(|j| j.id), Some(j.id));
    let bad = PgStore::open(options(pg, "Cluster; DROP", "dtn1")).unwrap_err();
    assert!(bad.to_string().contains("lower-case"), "{bad}");
}

#[test]
fn an_unreachable_database_is_a_clear_error_at_start() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = PgOptions {
        url: format!("host=127.0.0.1 port={port} user=dmover dbname=x connect_timeout=2"),
        password: None,
        schema: None,
        agent: "dtn1".into(),
        lease: quick(),
        policy: Policy::default(),
        ca: None,
    };
    let e = PgStore::open(o).unwrap_err().to_string();
    assert!(
        e.contains("PostgreSQL") && e.contains("onnection refused"),
        "{e}"
    );
}

/// Two job services (agents) on one database and real servers: the first runs a
/// slow job and crashes; the second takes it over once the first's lease ran out,
/// resumes it, and the copy ends whole, with no partial file left.
#[test]
fn a_crashed_agents_job_is_finished_by_another() {
    let Some(pg) = PgServer::shared() else { return };
    let lab = Lab::new(Some(Duration::from_millis(50)));
    let big = 6 << 20;
    std::fs::write(lab.a_root.join("data/big"), bytes(9, big)).unwrap();
    let agent = |name: &str| -> Arc<dyn JobStore> { Arc::new(open(pg, "failover", name)) };
    let first = Running::with_store(agent("dtn-a"), lab.runner_config());
    let job = first
        .rt
        .block_on(
            first
                .service
                .submit("alice", lab.spec(&["data/big"], "in/")),
        )
        .unwrap();
    let seen: Job = first.wait(job.id, "data moving", |j| j.bytes > 0);
    let second = Running::with_store(agent("dtn-b"), lab.runner_config());
    first.crash();
    let t = Instant::now();
    let j = second.wait_end(job.id);
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!(j.attempts, 2, "{j:#?}");
    assert!(j.bytes_resumed > 0 && seen.bytes > 0, "resumed: {j:#?}");
    assert_eq!(
        std::fs::read(lab.b_root.join("in/big")).unwrap(),
        bytes(9, big)
    );
    assert_eq!(staging(&lab.b_root), Vec::<std::path::PathBuf>::new());
    eprintln!("taken over and finished {:?} after the crash", t.elapsed());
    second.stop();
}

/// A connection asking for TLS (which this store does not make yet) is refused, not
/// made in clear.
#[test]
fn tls_asked_of_the_database_is_refused_not_downgraded() {
    let Some(pg) = PgServer::shared() else { return };
    let mut o = options(pg, "tls", "dtn1");
    o.url.push_str(" sslmode=require");
    let e = PgStore::open(o).unwrap_err().to_string();
    assert!(e.contains("TLS"), "{e}");
}

/// A run that ends while the database is away records its end once it is back: one
/// attempt, done, nothing reclaimed.
#[test]
fn an_end_while_the_database_is_away_is_recorded_when_it_is_back() {
    let Some(pg) = PgServer::start() else { return };
    let lab = Lab::new(Some(Duration::from_millis(50)));
    let len = 6 << 20;
    std::fs::write(lab.a_root.join("data/f"), bytes(3, len)).unwrap();
    let svc = Running::with_store(Arc::new(open(&pg, "away", "dtn-a")), lab.runner_config());
    let job = svc
        .rt
        .block_on(svc.service.submit("alice", lab.spec(&["data/f"], "in/")))
        .unwrap();
    svc.wait(job.id, "data moving", |j| j.bytes > 0);
    pg.stop();
    let t = Instant::now();
    while !lab.b_root.join("in/f").exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the copy never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its end could not be recorded (6 MiB at 50 ms a chunk: the database stopped
    // seconds before); the service keeps trying.
    std::thread::sleep(Duration::from_secs(2));
    pg.restart();
    let t = Instant::now();
    let j = loop {
        match svc.service.store().get(job.id) {
            Ok(j) if j.state.is_end() => break j,
            _ => {}
        }
        assert!(t.elapsed() < Duration::from_secs(60), "never recorded");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((j.state, j.attempts), (State::Done, 1), "{j:#?}");
    assert_eq!(
        std::fs::read(lab.b_root.join("in/f")).unwrap(),
        bytes(3, len)
    );
    svc.stop();
}

/// `openssl` making a CA and a certificate for 127.0.0.1 signed by it, in `dir`
/// (readable by PostgreSQL's user): (CA file, certificate, key).
fn certificates(dir: &std::path::Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let f = |s: &str| dir.join(format!("{name}-{s}"));
    let run = |args: &[&str]| {
        let o = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
        "-keyout",
        &s(&f("ca.key")),
        "-out",
        &s(&f("ca.pem")),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &s(&f("key.pem")),
        "-out",
        &s(&f("csr.pem")),
    ]);
    let ext = f("ext");
    std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        &s(&f("csr.pem")),
        "-CA",
        &s(&f("ca.pem")),
        "-CAkey",
        &s(&f("ca.key")),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &s(&ext),
        "-out",
        &s(&f("cert.pem")),
    ]);
    std::fs::set_permissions(f("key.pem"), std::fs::Permissions::from_mode(0o600)).unwrap();
    (f("ca.pem"), f("cert.pem"), f("key.pem"))
}

/// With `database_ca` the connection is TLS, checked against the CA: a server whose
/// certificate another CA signed is refused, and a server without TLS is refused
/// rather than used in clear.
#[test]
fn tls_to_the_database_is_checked_against_its_ca() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if PgServer::shared().is_none() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ca, cert, key) = certificates(t.path(), "db");
    let (other_ca, _, _) = certificates(t.path(), "other");
    // PostgreSQL reads its key only if its own user owns it (mode 600).
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    if root {
        let out = std::process::Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .unwrap();
        let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        std::os::unix::fs::chown(&key, Some(uid), None).unwrap();
    }
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let pg = PgServer::start_with(&[
        ("ssl", "on"),
        ("ssl_cert_file", cert),
        ("ssl_key_file", key),
    ])
    .unwrap();
    let with = |ca: &std::path::Path| {
        let mut o = options(&pg, "tls", "dtn1");
        o.ca = Some(ca.to_path_buf());
        PgStore::open(o)
    };
    let s = with(&ca).unwrap();
    s.submit("alice", JobKind::Copy, &spec("x", "y", "f"))
        .unwrap();
    let _: Vec<Job> = s
        .list(Page {
            owner: None,
            before: None,
            limit: 1,
        })
        .unwrap();
    drop(s);
    let e = with(&other_ca).unwrap_err().to_string();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // The shared server has no TLS: refused, not used in clear.
    let mut o = options(PgServer::shared().unwrap(), "tls", "dtn2");
    o.ca = Some(ca.clone());
    let e = PgStore::open(o).unwrap_err().to_string();
    assert!(e.contains("TLS") || e.contains("SSL"), "{e}");
}
