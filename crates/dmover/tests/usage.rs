//! Every usage error exits with 2 and says what is wrong, whether clap finds it (a bad
//! value) or dmover does after parsing (a malformed HOST:PATH, options that contradict
//! each other). Nothing here reaches a network or a server.

use std::process::Command;

/// Runs dmover with `args`; asserts exit code 2 and that stderr says `says`.
fn usage_error(args: &[&str], says: &str) {
    let kh = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_dmover"))
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_KEY")
        .env("DMOVER_KNOWN_HOSTS", kh.path().join("known_hosts"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(says),
        "{args:?} should say {says:?}: {stderr}"
    );
    assert!(o.stdout.is_empty(), "{args:?}");
}

#[test]
fn bad_values_are_usage_errors() {
    for (args, says) in [
        (&["cp", "-P", "0", "a", "h:"][..], "0 is not in 1..=128"),
        (
            &["cp", "--streams", "129", "a", "h:"],
            "129 is not in 1..=128",
        ),
        (&["cp", "--chunk", "65M", "a", "h:"], "multiple of 4K"),
        (
            &["cp", "--chunk", "big", "a", "h:"],
            "not a number with a unit",
        ),
        (
            &["cp", "--io-threads", "0", "a", "h:"],
            "0 is not in 1..=256",
        ),
        (
            &["cp", "--buffers", "1", "a", "h:"],
            "1 is not in 2..=65536",
        ),
        (&["cp", "--retries", "-1", "a", "h:"], "-1"),
        (
            &["cp", "--bwlimit", "fast", "a", "h:"],
            "invalid value 'fast' for '--bwlimit <RATE>': rate \"fast\" is not a number",
        ),
        (
            &["cp", "--bwlimit", "100", "a", "h:"],
            "needs a unit, e.g. 100gbit or 100MB/s",
        ),
        (&["cp", "--bwlimit", "1gb", "a", "h:"], "write 1gbit"),
        (
            &["cp", "--bwlimit", "0mbit", "a", "h:"],
            "below one byte per second",
        ),
        (
            &["serve", "--root", ".", "--listen", "dtn1"],
            "invalid socket address",
        ),
        (
            &["serve", "--root", ".", "--max-sessions", "0"],
            "at least 1",
        ),
        (&["serve", "--root", ".", "--memory", "1M"], "at least 2M"),
        (
            &["serve", "--root", ".", "--net-threads", "0"],
            "0 is not in 1..=256",
        ),
        (&["demo", "--scale", "0"], "above 0"),
        (&["demo", "--scale", "-1"], "above 0"),
        (
            &[
                "bench",
                "mkdata",
                "d",
                "--profile",
                "tiny",
                "--scale",
                "nan",
            ],
            "above 0",
        ),
        (&["completions", "tcsh"], "possible values"),
    ] {
        // `dmover bench` is the lab's (the `lab` feature).
        if args[0] == "bench" && !cfg!(feature = "lab") {
            continue;
        }
        usage_error(args, says);
    }
}

#[test]
fn malformed_endpoints_are_usage_errors() {
    for (args, says) in [
        (
            &["cp", "a", "dmover://dtn1:port/x"][..],
            "invalid host \"dtn1:port\"",
        ),
        (&["cp", "a", "dmover:///x"], "empty host name"),
        (&["cp", "dmover://[::1/x", "b"], "unclosed '['"),
        (&["cp", "a", "dmover://[::1]:99999/x"], "invalid port"),
        (
            &["cp", "a", "dmover://::1/x"],
            "IPv6 addresses go in brackets",
        ),
        (
            &["cp", "h:a", "b", "c"],
            "b is local and the other sources are on a server",
        ),
        (
            &["cp", "h1:a", "h2:b", "c"],
            "all sources must be on the same server",
        ),
        (
            &["cp", "h1:a", "h2:b", "h3:c"],
            "all sources must be on the same server",
        ),
        (
            &["cp", "h1:a", "./b", "h2:c"],
            "a copy between two servers takes sources on one server only",
        ),
        (
            &["cp", "--tpc", "push", "a", "h:b"],
            "--tpc and --via-client are for copies between two servers",
        ),
        (
            &["sync", "--via-client", "h:a", "g:b"],
            "sync between two servers with --via-client is not supported yet",
        ),
        (
            &[
                "submit",
                "--service",
                "http://127.0.0.1:1",
                "--sync",
                "h:a",
                "h:b",
                "g:c",
            ],
            "submit --sync takes one source",
        ),
        (
            &[
                "submit",
                "--service",
                "http://127.0.0.1:1",
                "--delete",
                "h:a",
                "g:b",
            ],
            "--sync",
        ),
        (
            &[
                "submit",
                "--service",
                "http://127.0.0.1:1",
                "--files-from",
                "f",
                "h:a",
                "g:b",
            ],
            "--files-from is not supported for jobs yet",
        ),
    ] {
        usage_error(args, says);
    }
}

#[test]
fn contradicting_options_are_usage_errors() {
    for (args, says) in [
        (
            &["cp", "--direct-io", "--buffered-io", "a", "h:"][..],
            "cannot be used with",
        ),
        (
            &["cp", "--encrypt", "--plain-data", "a", "h:"],
            "cannot be used with",
        ),
        (
            &["cp", "--resume", "--no-journal", "a", "h:"],
            "cannot be used with",
        ),
        (
            &["cp", "--bwlimit", "1gbit", "h:a", "g:b"],
            "--bwlimit does not apply to a copy between two servers",
        ),
        (&["serve"], "--root"),
        (
            &["serve", "--root", ".", "--config", "c.toml"],
            "cannot be used with",
        ),
        (
            &["serve", "--root", ".", "--tls-cert", "c.pem"],
            "--tls-key",
        ),
        // No credentials: only loopback.
        (
            &["serve", "--root", ".", "--listen", "0.0.0.0:0"],
            "refusing to listen on 0.0.0.0:0 without authentication",
        ),
    ] {
        usage_error(args, says);
    }
}
