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

/// A token for user alice and the server line that names it.
fn alice_token(t: &Path) -> (PathBuf, String) {
    let token = t.join("token");
    let o = std::process::Command::new(bin())
        .args(["credential", "token", s(&token)])
        .output()
        .unwrap();
    ok(&o);
    (token, String::from_utf8(o.stdout).unwrap())
}

/// A server logging JSON to `log`, with one export `data` and user alice (`user_extra`
/// added to her section).
fn logging_server(t: &Path, token_line: &str, user_extra: &str) -> (Server, PathBuf, PathBuf) {
    let data = t.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let config = t.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[exports.data]\npath = \"{}\"\n\n\
             [users.alice]\n{token_line}{user_extra}exports = {{ data = \"rw\" }}\n",
            data.display()
        ),
    )
    .unwrap();
    let log = t.join("server.log");
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
    (srv, data, log)
}

/// The server's JSON log lines once `sessions` sessions have ended (within 10 s).
fn log_after(log: &Path, sessions: usize) -> Vec<serde_json::Value> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let ended = lines
            .iter()
            .filter(|l| l["message"] == "session finished" || l["message"] == "session failed")
            .count();
        if ended >= sessions || Instant::now() > end {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server whose user has a limit tells it (feature LIMITS): the client's JSON reports
/// its own limit, the server's, and which one holds (the lower); its text says so.
#[test]
fn the_server_reports_its_limit_and_the_client_names_the_one_that_holds() {
    let t = tempfile::tempdir().unwrap();
    let (token, token_line) = alice_token(t.path());
    let (srv, data, _log) = logging_server(t.path(), &token_line, "bwlimit = \"40mbit\"\n");
    // Small: pacing at 40 Mbit/s costs a few tens of milliseconds.
    let src = t.path().join("small");
    write_file(&src, 10, 128 << 10, 0o644, 1_600_000_000);
    let env = [("DMOVER_USER", "alice")];
    let cases: [(&[&str], bool, Option<u64>, &str); 4] = [
        // No limit of the client's: the server's holds.
        (&[], false, None, "server"),
        // A lower one of its own holds, pushing as pulling.
        (&["--bwlimit", "10mbit"], true, Some(1_250_000), "client"),
        (&["--bwlimit", "10mbit"], false, Some(1_250_000), "client"),
        // A higher one: the server's.
        (&["--bwlimit", "100mbit"], false, Some(12_500_000), "server"),
    ];
    for (i, (limit, push, bwlimit, from)) in cases.into_iter().enumerate() {
        let remote = srv.url(&format!("data/f{i}"));
        let local = t.path().join(format!("back{i}"));
        let mut args = vec!["--json", "--token-file", s(&token)];
        args.extend_from_slice(limit);
        if push {
            args.extend([s(&src), remote.as_str()]);
        } else {
            std::fs::copy(&src, data.join(format!("f{i}"))).unwrap();
            args.extend([remote.as_str(), s(&local)]);
        }
        let o = cp_env(&args, &env);
        ok(&o);
        let j = json(&o);
        assert_eq!(j["bwlimit"].as_u64(), bwlimit, "{args:?}: {j}");
        assert_eq!(j["server_bwlimit"], 5_000_000, "{args:?}: {j}");
        assert_eq!(j["bwlimit_from"], from, "{args:?}: {j}");
    }
    // The text summary says which limit held.
    let o = cp_env(
        &[
            "--token-file",
            s(&token),
            &srv.url("data/f0"),
            s(&t.path().join("text")),
        ],
        &env,
    );
    ok(&o);
    let err = stderr(&o);
    assert!(err.contains("; limited to 40mbit by the server"), "{err}");
    same(&data.join("f0"), &t.path().join("text"));
}

/// Without a limit on either side the fields are null.
#[test]
fn without_limits_the_server_limit_and_its_origin_are_null() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let src = t.path().join("small");
    write_file(&src, 11, 4096, 0o644, 1_600_000_000);
    let srv = Server::start(&root, &[]);
    let o = cp(&["--json", s(&src), &srv.url("small")]);
    ok(&o);
    let j = json(&o);
    assert!(j["bwlimit"].is_null(), "{j}");
    assert!(j["server_bwlimit"].is_null(), "{j}");
    assert!(j["bwlimit_from"].is_null(), "{j}");
    let o = cp(&[s(&src), &srv.url("again")]);
    ok(&o);
    assert!(!stderr(&o).contains("limited to"), "{}", stderr(&o));
}

/// A pull's `--congestion` reaches the server (feature LIMITS), which sets it on its
/// ends of the data streams: the session's log line reads it back from their sockets.
/// An algorithm the server lacks is logged there and told to the client, whose copy
/// completes on the server's default.
#[test]
fn a_pull_sends_with_the_clients_congestion_control() {
    let t = tempfile::tempdir().unwrap();
    let (token, token_line) = alice_token(t.path());
    let (srv, data, log) = logging_server(t.path(), &token_line, "");
    write_file(&data.join("f"), 12, 3 << 20, 0o644, 1_600_000_000);
    let env = [("DMOVER_USER", "alice")];
    let pull = |cc: &str, to: &str| {
        let dest = t.path().join(to);
        let o = cp_env(
            &[
                "-P",
                "3",
                "--chunk",
                "1M",
                "--congestion",
                cc,
                "--token-file",
                s(&token),
                &srv.url("data/f"),
                s(&dest),
            ],
            &env,
        );
        ok(&o);
        same(&data.join("f"), &dest);
        stderr(&o)
    };
    pull("reno", "reno");
    let lines = log_after(&log, 1);
    let done: Vec<_> = lines
        .iter()
        .filter(|l| l["message"] == "session finished")
        .collect();
    assert_eq!(done.len(), 1, "{lines:?}");
    assert_eq!(done[0]["congestion"], "reno", "{}", done[0]);
    assert!(
        lines.iter().any(|l| l["message"].as_str().is_some_and(|m| m
            .ends_with("data streams send with congestion control \"reno\", as the client asked"))),
        "{lines:?}"
    );

    let err = pull("nosuchcc", "default");
    assert!(
        err.contains("cannot send with the congestion control asked for: congestion control \\\"nosuchcc\\\" is not available"),
        "{err}"
    );
    let lines = log_after(&log, 2);
    let done: Vec<_> = lines
        .iter()
        .filter(|l| l["message"] == "session finished")
        .collect();
    assert_eq!(done.len(), 2, "{lines:?}");
    assert!(done[1]["congestion"].is_null(), "{}", done[1]);
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["message"].as_str().is_some_and(|m| m.contains(
                "the client asked for congestion control nosuchcc: congestion control \"nosuchcc\" is not available"
            ))),
        "{lines:?}"
    );
}
