//! `dmover tune`, end to end: the real binary against a real server on loopback. It
//! finishes within its budget (plus slack for set-up on a loaded machine), its JSON has
//! the fields with sane values, and its test files are gone afterwards, locally and on
//! the server, also after Ctrl-C; refusals and an unreachable host give clear errors
//! with their exit codes. A pull holds its data streams' receive buffers to shares of
//! a budget (in a network namespace with long-link buffer settings).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::*;

/// Slack on top of `--seconds`: set-up, the session's end, the storage phases' last
/// blocks, a loaded test machine.
const SLACK: Duration = Duration::from_secs(12);

fn tune_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.arg("tune")
        .args(args)
        .env_remove("DMOVER_TOKEN")
        .env_remove("DMOVER_KEY")
        .env_remove("DMOVER_USER")
        .env("DMOVER_KNOWN_HOSTS", known_hosts_in(dir));
    c
}

fn tune(dir: &Path, args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let o = tune_cmd(dir, args).output().expect("running dmover tune");
    (o, t.elapsed())
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Waits up to 5 s for `dir` to hold exactly `want` (a server may still be winding
/// a session down).
fn settles_to(dir: &Path, want: &[&str]) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let got = entries(dir);
        if got == want || Instant::now() > until {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn mtime(p: &Path) -> SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

fn check_network(j: &serde_json::Value) {
    assert_eq!(j["schema"], 1, "{j}");
    assert_eq!(j["type"], "tune", "{j}");
    let n = &j["network"];
    assert!(n["bit_per_s"].as_u64().unwrap() > 0, "{j}");
    assert!(n["bytes"].as_u64().unwrap() > 0, "{j}");
    let max = n["streams_max"].as_u64().unwrap();
    assert_eq!(max, 16, "a tuned test may use up to 16 streams: {j}");
    let streams = n["streams"].as_u64().unwrap();
    assert!((1..=max).contains(&streams), "{j}");
    assert_eq!(n["tuned"], true, "{j}");
    let decisions = n["decisions"].as_array().unwrap();
    assert_eq!(
        decisions[0]["reason"], "starting with 4 of 16 streams",
        "{j}"
    );
    assert!(n["rtt_ms"].as_f64().unwrap() > 0.0, "{j}");
    let cpu = n["cpu_percent"].as_f64().unwrap();
    assert!(cpu > 0.0 && cpu <= 100.0, "{j}");
    assert!(n["cores"].as_u64().unwrap() >= 1, "{j}");
    let chosen = j["settings"]["streams"].as_u64().unwrap();
    assert!((1..=max).contains(&chosen), "{j}");
    // Settled (or pinned), it is the tuner's count; else one the tuner measured.
    if j["settings"]["streams_settled"] == true {
        assert_eq!(chosen, streams, "{j}");
    } else {
        assert!(decisions.iter().any(|d| d["streams"] == chosen), "{j}");
    }
    assert!(
        j["settings"]["not_tuned"].as_array().unwrap().len() >= 3,
        "{j}"
    );
    assert!(
        j["settings"]["socket_buffers"]
            .as_str()
            .is_some_and(|s| s.contains("raised")),
        "{j}"
    );
    let limit = j["limit"].as_str().unwrap();
    assert!(
        ["network", "disk read", "disk write", "cpu"].contains(&limit),
        "{j}"
    );
    assert!(!j["limit_reason"].as_str().unwrap().is_empty(), "{j}");
}

#[test]
fn a_local_path_is_probed_within_the_budget_and_left_clean() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let local = t.path().join("local");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("mine"), b"keep me").unwrap();
    let srv = Server::start(&root, &[]);
    let (o, took) = tune(
        t.path(),
        &[
            &srv.addr,
            local.to_str().unwrap(),
            "--seconds",
            "4",
            "--size",
            "8M",
            "--json",
        ],
    );
    ok(&o);
    assert!(
        took < Duration::from_secs(4) + SLACK,
        "a 4 s budget took {took:?}"
    );
    let j = json(&o);
    check_network(&j);
    assert_eq!(j["budget_seconds"], 4.0, "{j}");
    assert_eq!(j["size_cap"], 8 << 20, "{j}");
    let s = &j["storage"];
    assert_eq!(s["where"], "local", "{j}");
    let written = s["write_bytes"].as_u64().unwrap();
    assert!(written > 0 && written <= 8 << 20, "{j}");
    assert!(s["write_bit_per_s"].as_u64().unwrap() > 0, "{j}");
    assert!(s["read_bytes"].as_u64().unwrap() > 0, "{j}");
    assert!(s["read_bytes"].as_u64().unwrap() <= written, "{j}");
    assert!(s["read_bit_per_s"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(s["removed"], true, "{j}");
    assert_eq!(entries(&local), ["mine"], "the test file is gone");
    assert!(entries(&root).is_empty(), "nothing on the server");
}

#[test]
fn a_server_path_gets_a_test_push_that_is_deleted_again() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let sub = root.join("sub");
    std::fs::create_dir_all(sub.join("inner")).unwrap();
    std::fs::write(sub.join("keep"), b"x").unwrap();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    std::fs::File::open(&sub)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let srv = Server::start(&root, &[]);
    let (o, took) = tune(
        t.path(),
        &[
            &srv.addr,
            &srv.url("sub"),
            "--seconds",
            "4",
            "--size",
            "4M",
            "--json",
        ],
    );
    ok(&o);
    assert!(took < Duration::from_secs(4) + SLACK, "took {took:?}");
    let j = json(&o);
    check_network(&j);
    let s = &j["storage"];
    assert_eq!(s["where"], "remote", "{j}");
    let pushed = s["write_bytes"].as_u64().unwrap();
    assert!((1 << 20..=4 << 20).contains(&pushed), "{j}");
    assert!(s["write_bit_per_s"].as_u64().unwrap() > 0, "{j}");
    assert!(s["read_bytes"].is_null(), "{j}");
    assert_eq!(s["removed"], true, "{j}");
    assert_eq!(entries(&sub), ["inner", "keep"], "only the test file went");
    assert_eq!(mtime(&sub), old, "the directory keeps its mtime");
}

#[test]
fn ctrl_c_during_the_storage_tests_leaves_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let local = t.path().join("local");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    let srv = Server::start(&root, &[]);
    // The push gets a longer budget and two streams: its set-up before the first
    // chunk (16 TLS handshakes of a debug build) can take seconds on a loaded machine,
    // and it is stopped when the budget is spent.
    for (target, marker, dir, extra) in [
        (
            local.to_str().unwrap().to_string(),
            "storage: writing",
            &local,
            &["--seconds", "4"][..],
        ),
        (
            srv.url("sub"),
            "storage: pushing",
            &root.join("sub"),
            &["--seconds", "12", "-P", "2"],
        ),
    ] {
        let mut args = vec![srv.addr.as_str(), target.as_str(), "--size", "4G"];
        args.extend_from_slice(extra);
        let mut child = tune_cmd(t.path(), &args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 {
                panic!("dmover tune ended before {marker:?}:\n{seen}");
            }
            seen.push_str(&line);
            if line.starts_with(marker) {
                break;
            }
        }
        // Interrupted while its test file is being written (locally: the file;
        // on the server: the push's staging file).
        let until = Instant::now() + Duration::from_secs(20);
        while entries(dir).is_empty() {
            if let Some(st) = child.try_wait().unwrap() {
                let mut rest = String::new();
                std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
                panic!("{target}: ended ({st}) before a test file appeared\n{seen}{rest}");
            }
            assert!(
                Instant::now() < until,
                "{target}: no test file appeared\n{seen}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let during = entries(dir);
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "interrupted, it fails:\n{seen}{rest}");
        assert_eq!(
            status.code(),
            Some(1),
            "an interrupt is a failure, not a signal death:\n{seen}{rest}"
        );
        assert!(
            rest.contains("interrupted"),
            "{target}: interrupted while {during:?} existed:\n{seen}{rest}"
        );
        let left = settles_to(dir, &[]);
        assert!(
            left.is_empty(),
            "{target}: left {left:?} (interrupted while {during:?} existed)\n{seen}{rest}"
        );
        eprintln!("{target}: interrupted while {during:?} existed; nothing left");
    }
}

#[test]
fn a_read_only_server_refuses_before_anything_is_written() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let srv = Server::start(&root, &["--read-only"]);
    let (o, took) = tune(
        t.path(),
        &[&srv.addr, &srv.url("sub"), "--seconds", "3", "--size", "4M"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("where you may write and delete"), "{e}");
    assert!(e.contains("read-only") || e.contains("read only"), "{e}");
    // Refused before the network test ran (no network line); the time is only a
    // guard against a hang (3.3 s was seen on a loaded machine, so no tighter bound).
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(!e.contains("network:"), "{e}");
    assert!(entries(&root.join("sub")).is_empty());
}

#[test]
fn an_unreachable_host_is_a_network_failure() {
    let t = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let local = t.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    let (o, took) = tune(
        t.path(),
        &[&addr, local.to_str().unwrap(), "--seconds", "3"],
    );
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(&addr) && e.contains("refused"), "{e}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(entries(&local).is_empty());
}

#[test]
fn usage_errors_exit_2() {
    let t = tempfile::tempdir().unwrap();
    for args in [
        &["127.0.0.1:1", "--seconds", "1"][..],
        &["127.0.0.1:1", "--seconds", "ten"],
        &["127.0.0.1:1", "--size", "1K"],
        &["127.0.0.1:1", "--size", "lots"],
        &["[::1"],
        &[],
    ] {
        let (o, _) = tune(t.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("error"), "{args:?}: {}", stderr(&o));
    }
    // A local PATH that is not a directory: refused before anything runs (no
    // server is listening on port 1).
    let f = t.path().join("file");
    std::fs::write(&f, b"x").unwrap();
    let (o, _) = tune(t.path(), &["127.0.0.1:1", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
}

/// Without PATH the network test has the budget: long enough for the tuner to measure
/// its start and decide, to probe or to hold (a memory-to-memory source that read every announced chunk
/// into its buffers had nothing waiting, and its tuner never finished a period).
#[test]
fn the_tuner_decides_within_a_network_only_budget() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // 7.5 s of sending: a decision needs 2 s of it without a pause, which a loaded
    // machine (the other tests run beside this one) does not always give at once.
    let (o, took) = tune(t.path(), &[&srv.addr, "--seconds", "10", "--json"]);
    ok(&o);
    assert!(took < Duration::from_secs(10) + SLACK, "took {took:?}");
    let j = json(&o);
    check_network(&j);
    assert!(j["storage"].is_null(), "{j}");
    // The tuner measured a period and decided: to probe (a second decision, made on a
    // measured rate), or to hold where the streams' congestion control already sends
    // what the path gives (BBR, not window-limited: no change, but settled).
    let decisions = j["network"]["decisions"].as_array().unwrap();
    assert!(
        j["network"]["settled_ms"].as_u64().is_some() || decisions.len() >= 2,
        "no decision after the start: {j}"
    );
    if let Some(d) = decisions.get(1) {
        assert!(d["gbit_per_s"].as_f64().unwrap() > 0.0, "{j}");
    }
    assert_eq!(j["network"]["changes"], decisions.len() as u64 - 1, "{j}");
}

/// A directory (named `prefix`…) with a server's root holding `data/f0`…`f3` of
/// `size` bytes each, a token file and a known-hosts file: the root, the token, the
/// known hosts.
fn four_files(
    prefix: &str,
    size: usize,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let t = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("data")).unwrap();
    for i in 0..4u64 {
        write_file(&root.join(format!("data/f{i}")), i, size, 0o644, 1_000_000);
    }
    let token = t.path().join("token");
    std::fs::write(&token, "a token for the socket buffer tests\n").unwrap();
    let kh = known_hosts_in(t.path());
    (t, root, token, kh)
}

/// A pull holds each data stream's receive buffer to its share of the session's
/// receive budget where autotuning would grow it past that (a host whose `tcp_rmem`
/// maximum is 1 GiB, as long fat links want): more streams, smaller shares, never
/// below the floor; `--tcp-buffer` leaves the buffers to the user. Two hosts on a
/// veth, so the sysctl touches nothing else.
#[test]
fn a_pull_shares_its_receive_budget_among_its_streams() {
    use dmover_netlab::{TopoLinkKind, Topology, TopologySpec};
    if !netlab_available("a_pull_shares_its_receive_budget_among_its_streams") {
        return;
    }
    let (t, root, token, kh) = four_files("dmover-rcvbuf-", 4 << 20);
    let lab = format!("rcv{}", std::process::id() % 100_000);
    let spec = TopologySpec::new(&["a", "b"]).link("a", "b", TopoLinkKind::Veth);
    let topo = Topology::up(&lab, &spec).unwrap();
    // The client, b, autotunes as on a long fat link.
    let h = topo.host("b").unwrap();
    let o = h
        .command("sh")
        .args([
            "-c",
            "echo '4096 131072 1073741824' > /proc/sys/net/ipv4/tcp_rmem",
        ])
        .output()
        .unwrap();
    ok(&o);
    let addr = format!("{}:7700", topo.addr("a", "b").unwrap());
    let srv = ns_serve(&topo, "a", &root, &token, &addr);
    let pull = |streams: &str, extra: &[&str], dest: &str| {
        let mut c = h.command(bin());
        c.args(["cp", "--json"]);
        if !streams.is_empty() {
            c.args(["-P", streams]);
        }
        let o = c
            .arg("--token-file")
            .arg(&token)
            .args(extra)
            .arg(format!("dmover://{addr}/data"))
            .arg(t.path().join(dest))
            .env("DMOVER_KNOWN_HOSTS", &kh)
            .output()
            .unwrap();
        ok(&o);
        same(&root.join("data"), &t.path().join(dest));
        json(&o)
    };
    let share = |j: &serde_json::Value| {
        j["receive_buffer"]
            .as_u64()
            .unwrap_or_else(|| panic!("no receive_buffer: {j}"))
    };
    let one = share(&pull("1", &[], "one"));
    let eight = share(&pull("8", &[], "eight"));
    assert!(
        eight < one,
        "8 streams hold {eight} bytes each, 1 holds {one}"
    );
    assert!(eight >= 1 << 20, "below the floor: {eight}");
    // Twice the share (the kernel's doubling) stays below autotuning's maximum.
    assert!(one * 2 < 1 << 30, "{one}");
    // Tuned (no -P): the shares follow the streams the server's tuner sends on.
    let tuned = share(&pull("", &[], "tuned"));
    assert!(tuned >= 1 << 20 && tuned * 2 < 1 << 30, "{tuned}");
    let j = pull("8", &["--tcp-buffer", "4M"], "pinned");
    assert!(j.get("receive_buffer").is_none(), "{j}");
    drop(srv);
    topo.down().unwrap();
}

/// Where the hosts' buffer limits are below a session's share (Linux's defaults are
/// 4 and 6 MiB, which hold one stream to 168 Mbit/s at 200 ms), a stream's buffer
/// that autotuning grew to the limit and that still wants more is raised to its
/// share: a pull's receive buffers at the client, a push's send buffers (waited on)
/// at the client. Two hosts on a 20 ms, 1 Gbit/s link whose limits are 64 KiB, where
/// every buffer starts (the sysctls' default and maximum are one value): 64 KiB a
/// round trip is 26 Mbit/s, so a push's streams wait on their send buffers until
/// raised. `--tcp-buffer` leaves the buffers to the user.
#[test]
fn buffers_at_the_hosts_limit_are_raised_to_the_sessions_share() {
    use dmover_netlab::{LinkSpec, TopoLinkKind, Topology, TopologySpec};
    if !netlab_available("buffers_at_the_hosts_limit_are_raised_to_the_sessions_share") {
        return;
    }
    let (t, root, token, kh) = four_files("dmover-raise-", 16 << 20);
    let lab = format!("rse{}", std::process::id() % 100_000);
    let link = LinkSpec {
        rtt: Duration::from_millis(20),
        rate_bps: Some(1_000_000_000),
        ..LinkSpec::default()
    };
    let spec = TopologySpec::new(&["a", "b"]).link("a", "b", TopoLinkKind::Emulated(link));
    let topo = Topology::up(&lab, &spec).unwrap();
    for host in ["a", "b"] {
        let o = topo
            .host(host)
            .unwrap()
            .command("sh")
            .args([
                "-c",
                "echo '4096 65536 65536' > /proc/sys/net/ipv4/tcp_rmem && \
                 echo '4096 65536 65536' > /proc/sys/net/ipv4/tcp_wmem",
            ])
            .output()
            .unwrap();
        ok(&o);
    }
    let addr = format!("{}:7700", topo.addr("a", "b").unwrap());
    let srv = ns_serve(&topo, "a", &root, &token, &addr);
    let h = topo.host("b").unwrap();
    let cp = |extra: &[&str], from: &str, to: &str| {
        let o = h
            .command(bin())
            .args(["cp", "--json", "-P", "2", "--token-file"])
            .arg(&token)
            .args(extra)
            .args([from, to])
            .env("DMOVER_KNOWN_HOSTS", &kh)
            .output()
            .unwrap();
        ok(&o);
        json(&o)
    };
    let raised = |j: &serde_json::Value, key: &str| {
        let n = j[key].as_u64().unwrap_or_else(|| panic!("no {key}: {j}"));
        // Its share of the budget, never below the floor: far above the limit.
        assert!(n >= 1 << 20, "{key} {n}: {j}");
    };
    let src = root.join("data");
    let pulled = t.path().join("pulled");
    let j = cp(
        &[],
        &format!("dmover://{addr}/data"),
        pulled.to_str().unwrap(),
    );
    same(&src, &pulled);
    raised(&j, "receive_buffer");
    let j = cp(
        &[],
        src.to_str().unwrap(),
        &format!("dmover://{addr}/pushed"),
    );
    same(&src, &root.join("pushed"));
    raised(&j, "send_buffer");
    let pinned = t.path().join("pinned");
    let j = cp(
        &["--tcp-buffer", "4M"],
        &format!("dmover://{addr}/data"),
        pinned.to_str().unwrap(),
    );
    same(&src, &pinned);
    assert!(j.get("receive_buffer").is_none(), "{j}");
    assert!(j.get("send_buffer").is_none(), "{j}");
    drop(srv);
    topo.down().unwrap();
}
