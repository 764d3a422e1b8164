//! Two `dmover serve` processes sharing one PostgreSQL job database (`[jobs] database
//! = "postgres://…"`), each an agent of one job service: a job submitted to one is
//! seen through the other, and when the one running it is killed (SIGKILL) the other
//! takes it over once its lease has run out and finishes it whole.

#[path = "../../dmover-jobs/tests/common/pg.rs"]
mod pg;

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::jobs::{dm, json_of, service_on, wait};
use common::{Server, bin, bytes};
use pg::PgServer;

/// A config for agent `agent` serving `root` to the token "sekrit", its job service on
/// `url`'s database in schema `schema`, with a lease of 5 × 200 ms.
fn config(dir: &Path, root: &Path, url: &str, schema: &str, agent: &str) -> PathBuf {
    let verifier = dmover_proto::auth::token_keys(b"sekrit").verifier.to_text();
    let state = dir.join(format!("state-{agent}"));
    let text = format!(
        "state_dir = \"{}\"\n\
         [exports.data]\npath = \"{}\"\n\
         [users.\"*\"]\ntoken = \"{verifier}\"\nexports = {{ data = \"rw\" }}\n\
         [jobs]\nenabled = true\nlisten = \"127.0.0.1:0\"\ndatabase = \"{url}\"\n\
         database_schema = \"{schema}\"\nagent = \"{agent}\"\n\
         heartbeat = \"200ms\"\nlease_heartbeats = 5\n",
        state.display(),
        root.display(),
    );
    let path = dir.join(format!("{agent}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn serve(cfg: &Path) -> Command {
    let mut c = Command::new(bin());
    c.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(cfg);
    c
}

#[test]
fn two_services_on_one_database_share_the_queue_and_fail_over() {
    let Some(pg) = PgServer::shared() else { return };
    let t = tempfile::tempdir().unwrap();
    let p = |s: &str| t.path().join(s);
    for d in ["a/run", "b/in", "c1", "c2"] {
        std::fs::create_dir_all(p(d)).unwrap();
    }
    // 40 files of 256 KiB read one chunk at a time at 100 ms a chunk: about 4 s.
    for i in 0..40u64 {
        std::fs::write(p(&format!("a/run/{i}")), bytes(i, 256 << 10)).unwrap();
    }
    std::fs::write(p("token"), "sekrit\n").unwrap();
    let slow = [
        "--third-party",
        "--io-threads",
        "1",
        "--debug-chunk-delay-ms",
        "100",
    ];
    let a = Server::start(&p("a"), &slow);
    let b = Server::start(&p("b"), &["--third-party"]);
    let url = pg.postgres_url();
    let cfg1 = config(t.path(), &p("c1"), &url, "cli_failover", "c1");
    let cfg2 = config(t.path(), &p("c2"), &url, "cli_failover", "c2");
    let (mut c1, url1, _) = service_on(&mut serve(&cfg1));
    let (mut c2, url2, _) = service_on(&mut serve(&cfg2));
    let (tok, kh) = (p("token"), p("known_hosts"));

    // A second service under a live agent's name does not start.
    let o = serve(&cfg1).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("agent c1") && e.contains("in use"), "{e}");

    let o = dm(
        &url1,
        Some(&tok),
        &kh,
        &["submit", &a.url("run"), &b.url("in/"), "--json"],
    );
    let id = json_of(&o)["id"].as_i64().unwrap().to_string();
    // Seen running through the other service: one queue.
    let seen = wait(&url2, &tok, &kh, &id, |j| j["bytes"].as_u64() > Some(0));
    assert_eq!(seen["state"], "running", "{seen}");
    c1.kill();
    let killed = Instant::now();
    let j = wait(&url2, &tok, &kh, &id, |j| j["state"] == "done");
    eprintln!(
        "taken over and finished {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(j["attempts"], 2, "{j}");
    assert_eq!(j["files_done"].as_u64(), Some(40), "{j}");
    assert!(j["bytes_resumed"].as_u64() > Some(0), "resumed: {j}");
    for i in 0..40u64 {
        assert_eq!(
            std::fs::read(p(&format!("b/in/run/{i}"))).unwrap(),
            bytes(i, 256 << 10)
        );
    }
    assert_eq!(common::staging_files(&p("b")), Vec::<PathBuf>::new());
    let list = json_of(&dm(&url2, Some(&tok), &kh, &["jobs", "--json"]));
    assert_eq!(list["jobs"][0]["id"].to_string(), id, "{list}");
    c2.kill();
    drop((a, b));
}

#[test]
fn an_unreachable_database_stops_the_start_with_its_cause() {
    let t = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::create_dir_all(t.path().join("c")).unwrap();
    std::fs::write(t.path().join("token"), "sekrit\n").unwrap();
    let url = format!("postgres://dmover@127.0.0.1:{port}/x?connect_timeout=2");
    let cfg = config(t.path(), &t.path().join("c"), &url, "x", "c1");
    let o = serve(&cfg).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("jobs database") && e.contains("onnection refused"),
        "{e}"
    );
    // --agent without PostgreSQL is a usage error.
    let o = Command::new(bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--jobs",
            "--agent",
            "x",
            "--root",
        ])
        .arg(t.path().join("c"))
        .arg("--token-file")
        .arg(t.path().join("token"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("PostgreSQL"));
}
