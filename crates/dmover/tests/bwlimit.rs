//! Bandwidth limits, end to end: `cp --bwlimit` paces a push (the client sends) and a
//! pull (the client reads), and a server's export limit paces a push whatever the
//! client asks. Only lower bounds on time are asserted (an upper bound on the rate),
//! which a loaded machine cannot break.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// 8 MiB at 40 Mbit/s (5 MB/s) take 1.68 s; the bucket's burst (50 ms) and the
/// timer's slack leave well over this.
const LEAST: Duration = Duration::from_millis(1400);
const SIZE: usize = 8 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn timed(args: &[&str], env: &[(&str, &str)]) -> (serde_json::Value, Duration) {
    let t = Instant::now();
    let o = cp_env(args, env);
    let took = t.elapsed();
    ok(&o);
    eprintln!("{args:?}: {took:?}");
    (json(&o), took)
}

#[test]
fn cp_bwlimit_paces_a_push_and_a_pull() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let src = t.path().join("big");
    write_file(&src, 7, SIZE, 0o644, 1_600_000_000);
    let srv = Server::start(&root, &[]);
    let url = srv.url("big");
    let (j, took) = timed(&["--json", "--bwlimit", "40Mbit", s(&src), &url], &[]);
    assert_eq!(j["bwlimit"], 5_000_000, "{j}");
    assert!(took >= LEAST, "a push of 8 MiB at 40 Mbit/s took {took:?}");
    same(&src, &root.join("big"));
    let back = t.path().join("back");
    let (j, took) = timed(
        &["--json", "--bwlimit", "5MB/s", "-P", "2", &url, s(&back)],
        &[],
    );
    assert_eq!(j["bwlimit"], 5_000_000, "{j}");
    assert!(took >= LEAST, "a pull of 8 MiB at 5 MB/s took {took:?}");
    same(&src, &back);
    // Without a limit the field is null.
    let (j, _) = timed(&["--json", s(&src), &srv.url("again")], &[]);
    assert!(j["bwlimit"].is_null(), "{j}");
}

#[test]
fn a_server_export_limit_paces_a_push() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let token = t.path().join("token");
    let o = std::process::Command::new(bin())
        .args(["credential", "token", s(&token)])
        .output()
        .unwrap();
    ok(&o);
    let token_line = String::from_utf8(o.stdout).unwrap();
    let config = t.path().join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[exports.data]\npath = \"{}\"\nbwlimit = \"40mbit\"\n\n\
             [users.alice]\n{token_line}bwlimit = \"1gbit\"\nexports = {{ data = \"rw\" }}\n",
            data.display()
        ),
    )
    .unwrap();
    let log = t.path().join("server.log");
    let srv = Server::start_with(
        &[
            "--config".as_ref(),
            config.as_os_str(),
            "--log-format".as_ref(),
            "json".as_ref(),
        ],
        &data,
        Some(&log),
        None,
    );
    let src = t.path().join("big");
    write_file(&src, 8, SIZE, 0o644, 1_600_000_000);
    let (j, took) = timed(
        &[
            "--json",
            "--token-file",
            s(&token),
            s(&src),
            &srv.url("data/big"),
        ],
        &[("DMOVER_USER", "alice")],
    );
    assert!(j["bwlimit"].is_null(), "the client has no limit of its own");
    assert!(
        took >= LEAST,
        "a push into a 40 Mbit/s export took {took:?}"
    );
    same(&src, &data.join("big"));
    // The server logs the limit that holds, the export's (the lower), when the session
    // starts and in its session line.
    let end = Instant::now() + Duration::from_secs(5);
    let mut lines: Vec<serde_json::Value> = Vec::new();
    while Instant::now() < end {
        lines = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.iter().any(|l| l["message"] == "session finished") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        lines.iter().any(|l| l["message"].as_str().is_some_and(
            |m| m.ends_with("session limited to 40mbit (5000000 bytes/s) by export \"data\"")
        )),
        "{lines:?}"
    );
    let done = lines
        .iter()
        .find(|l| l["message"] == "session finished")
        .unwrap_or_else(|| panic!("no session line: {lines:?}"));
    assert_eq!(done["bwlimit"], 5_000_000, "{done}");
}

/// A server with a token user alice and one export `data` (third-party copies allowed,
/// `extra` added to it).
fn config_server(t: &Path, name: &str, token_line: &str, extra: &str) -> (Server, PathBuf) {
    let data = t.join(name);
    std::fs::create_dir_all(&data).unwrap();
    let config = t.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "[exports.data]\npath = \"{}\"\nthird_party = true\n{extra}\n\
             [users.alice]\n{token_line}exports = {{ data = \"rw\" }}\n",
            data.display()
        ),
    )
    .unwrap();
    let srv = Server::start_with(
        &["--config".as_ref(), config.as_os_str()],
        &data,
        None,
        None,
    );
    (srv, data)
}

/// A third-party copy is paced by the limit of the server whose export has one, whether
/// that server dials (push) or accepts (pull).
#[test]
fn a_server_export_limit_paces_a_third_party_copy_both_ways() {
    let t = tempfile::tempdir().unwrap();
    let token = t.path().join("token");
    let o = std::process::Command::new(bin())
        .args(["credential", "token", s(&token)])
        .output()
        .unwrap();
    ok(&o);
    let token_line = String::from_utf8(o.stdout).unwrap();
    let (a, a_data) = config_server(t.path(), "a", &token_line, "bwlimit = \"40mbit\"");
    let (b, b_data) = config_server(t.path(), "b", &token_line, "");
    write_file(&a_data.join("big"), 9, SIZE, 0o644, 1_600_000_000);
    let env = [("DMOVER_USER", "alice")];
    for (mode, dest) in [("push", "pushed"), ("pull", "pulled")] {
        let dest_url = b.url(&format!("data/{dest}"));
        let (j, took) = timed(
            &[
                "--json",
                "--tpc",
                mode,
                "--token-file",
                s(&token),
                &a.url("data/big"),
                &dest_url,
            ],
            &env,
        );
        assert!(j["bwlimit"].is_null(), "{j}");
        assert!(
            took >= LEAST,
            "a third-party {mode} from a 40 Mbit/s export took {took:?}"
        );
        same(&a_data.join("big"), &b_data.join(dest));
    }
}
