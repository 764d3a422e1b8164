//! Third-party copies (docs/third-party.md): a client steers server A → server B, the
//! data going from A to B directly, or relayed through the client (`--via-client`).
//! Real servers on loopback, real files.

mod common;

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-tpc-")
        .tempdir()
        .unwrap()
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_tree_goes_from_one_server_to_another_both_ways_of_dialing() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    make_small_files(&a_root.join("small"), 300, 7);
    let a = Server::start(&a_root, &["--third-party"]);
    // B's log (info) shows the source's tuning decisions: under push A's, under pull
    // A's as the acceptor of B's pull.
    let b_log = t.path().join("b.log");
    let b_args = [
        "--root".as_ref(),
        b_root.as_os_str(),
        "--third-party".as_ref(),
        "-v".as_ref(),
    ];
    let b = Server::start_with(&b_args, &b_root, Some(&b_log), None);
    // A client that tunes (no `-P`) has the session between the servers tune.
    let tuned = || {
        std::fs::read_to_string(&b_log)
            .unwrap()
            .matches("tuned the transfer: starting with")
            .count()
    };

    // Push (the default): A dials B.
    let o = cp(&["--json", &a.url("tree"), &a.url("small"), &b.url("")]);
    ok(&o);
    same(&a_root.join("tree"), &b_root.join("tree"));
    same(&a_root.join("small"), &b_root.join("small"));
    let j = json(&o);
    assert_eq!(j["direction"], "third-party-push", "{j}");
    assert_eq!(j["dialer"], a.addr.as_str(), "{j}");
    assert_eq!(j["verified"], true, "{j}");
    assert!(j["files"].as_u64().unwrap() > 300, "{j}");
    assert_eq!(tuned(), 1);

    // Pull: B dials A.
    let o = cp(&["--json", "--tpc", "pull", &a.url("tree"), &b.url("pulled")]);
    ok(&o);
    // As `cp -r tree pulled` with no `pulled` yet: `pulled` is the copy.
    same(&a_root.join("tree"), &b_root.join("pulled"));
    let j = json(&o);
    assert_eq!(j["direction"], "third-party-pull", "{j}");
    assert_eq!(j["dialer"], b.addr.as_str(), "{j}");
    assert!(no_partial_files(&a_root.join("tree"), &b_root.join("pulled")) > 0);
    assert_eq!(tuned(), 2);
    // With `-P` the streams are fixed.
    ok(&cp(&["-P", "2", &a.url("small"), &b.url("fixed")]));
    same(&a_root.join("small"), &b_root.join("fixed"));
    assert_eq!(tuned(), 2);
}

#[test]
fn servers_that_do_not_allow_third_party_copies_refuse_and_nothing_is_written() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    let a = Server::start(&a_root, &["--third-party"]);
    // B serves, but not for third-party copies: it issues no capability.
    let b = Server::start(&b_root, &[]);
    let o = cp(&[&a.url("tree"), &b.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not allow third-party copies"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);

    // A read-only destination refuses to issue a capability to write.
    let ro = Server::start(&b_root, &["--third-party", "--read-only"]);
    let o = cp(&[&a.url("tree"), &ro.url("")]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);

    // The source must allow them too: A without the switch refuses to dial.
    let a2 = Server::start(&a_root, &[]);
    let b2 = Server::start(&b_root, &["--third-party"]);
    let o = cp(&[&a2.url("tree"), &b2.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not allow third-party copies"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);
    let _ = s(t.path());
}

/// Three hosts: client C on slow links (kernel tbf, 20 Mbit/s) to servers A and B, A
/// and B on a plain veth. A 512 MiB tree of small and large files (issue 12's size)
/// copies A → B byte-identical with either server dialing (each advertises its
/// address on the A–B link), and C's interfaces carry under 1 % of the bytes.
#[test]
fn three_hosts_the_data_bypass_the_client() {
    use dmover_netlab::{TopoLinkKind, Topology, TopologySpec};
    if !netlab_available("three_hosts_the_data_bypass_the_client") {
        return;
    }
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir_all(a_root.join("data")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_small_files(&a_root.join("data/small"), 2000, 20);
    for i in 0..3u64 {
        write_file(
            &a_root.join(format!("data/big{i}")),
            i,
            170 << 20,
            0o644,
            1_000_000,
        );
    }
    let total: u64 = walk_bytes(&a_root.join("data"));
    assert!(total >= 512 << 20, "{total}");
    let token = t.path().join("token");
    std::fs::write(&token, "a shared token for the three hosts\n").unwrap();
    let kh = known_hosts_in(t.path());
    let slow = TopoLinkKind::Tbf {
        rate_bps: 20_000_000,
        queue_bytes: None,
    };
    let spec = TopologySpec::new(&["c", "a", "b"])
        .link("c", "a", slow.clone())
        .link("c", "b", slow)
        .link("a", "b", TopoLinkKind::Veth);
    let lab = format!("tpc{}", std::process::id() % 100_000);
    let topo = Topology::up(&lab, &spec).unwrap();
    let a_srv = ns_serve(
        &topo,
        "a",
        &a_root,
        &token,
        &format!("{}:7700", topo.addr("a", "b").unwrap()),
    );
    let b_srv = ns_serve(
        &topo,
        "b",
        &b_root,
        &token,
        &format!("{}:7700", topo.addr("b", "a").unwrap()),
    );
    let a_url = |p: &str| format!("dmover://{}:7700/{p}", topo.addr("a", "c").unwrap());
    let b_url = |p: &str| format!("dmover://{}:7700/{p}", topo.addr("b", "c").unwrap());
    for (mode, dest) in [("push", "pushed"), ("pull", "pulled")] {
        let before = topo.host_counters("c").unwrap();
        let o = topo
            .host("c")
            .unwrap()
            .command(bin())
            .args(["cp", "--json", "--tpc", mode, "--token-file"])
            .arg(&token)
            .args([&a_url("data"), &b_url(dest)])
            .env("DMOVER_KNOWN_HOSTS", &kh)
            .output()
            .unwrap();
        ok(&o);
        let c_bytes = topo.host_counters("c").unwrap().since(&before).bytes();
        same(&a_root.join("data"), &b_root.join(dest));
        let j = json(&o);
        eprintln!(
            "{mode}: {total} bytes A -> B, {c_bytes} bytes on the client's links, {} s",
            j["seconds"]
        );
        assert_eq!(j["direction"], format!("third-party-{mode}"), "{j}");
        assert!(
            (c_bytes as f64) < total as f64 * 0.01,
            "{mode}: the client's links carried {c_bytes} bytes of a {total}-byte copy"
        );
    }
    drop((a_srv, b_srv));
    topo.down().unwrap();
}

/// The steering client killed mid-copy: the dialer stops the copy at once (its control
/// connection closed), both servers keep what they have, and the same command with
/// `--resume` finishes it, nothing lost or corrupted.
#[test]
fn a_killed_client_stops_the_copy_and_resume_finishes_it() {
    let (t, a_root, b_root) = a_and_b(48);
    // Every chunk takes 40 ms to read at A: the copy lasts seconds.
    let slow = ["--third-party", "--debug-chunk-delay-ms", "40"];
    let a = Server::start(&a_root, &slow);
    let b = Server::start(&b_root, &["--third-party"]);
    let kh = known_hosts_in(t.path());
    let args = [
        "cp",
        "--chunk",
        "256K",
        "-P",
        "2",
        &a.url("src"),
        &b.url("dst"),
    ];
    let mut child = std::process::Command::new(bin())
        .args(args)
        .env("DMOVER_KNOWN_HOSTS", &kh)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dst = b_root.join("dst");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while regular_file_sizes(&dst).len() < 8 {
        assert!(std::time::Instant::now() < until, "no progress at B");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // A sees its control connection close and stops: B's tree stops growing.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let settled = regular_file_sizes(&dst).len();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        regular_file_sizes(&dst).len(),
        settled,
        "the copy went on without its client"
    );
    assert!(settled < 48, "the copy was interrupted ({settled} files)");
    let o = std::process::Command::new(bin())
        .args(["cp", "--json", "--resume", "--chunk", "256K", "-P", "2"])
        .args([&a.url("src"), &b.url("dst")])
        .env("DMOVER_KNOWN_HOSTS", &kh)
        .output()
        .unwrap();
    ok(&o);
    same(&a_root.join("src"), &dst);
    let j = json(&o);
    assert!(j["bytes_resumed"].as_u64().unwrap() > 0, "{j}");
}

/// A copy within one server (A = B) works, through that server alone; a destination
/// that advertises an address the source cannot reach gives an error that says so.
#[test]
fn a_copy_within_one_server_and_an_unreachable_peer() {
    let t = tmp();
    let a_root = t.path().join("a");
    std::fs::create_dir(&a_root).unwrap();
    make_tree(&a_root.join("tree"));
    let a = Server::start(&a_root, &["--third-party"]);
    let o = cp(&["--json", &a.url("tree"), &a.url("copy")]);
    ok(&o);
    same(&a_root.join("tree"), &a_root.join("copy"));

    let b_root = t.path().join("b");
    std::fs::create_dir(&b_root).unwrap();
    // B tells servers to dial it at a port nobody listens on.
    let b = Server::start(&b_root, &["--third-party", "--tpc-address", "127.0.0.1:1"]);
    let o = cp(&[&a.url("tree"), &b.url("")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("could not reach 127.0.0.1:1"),
        "{}",
        stderr(&o)
    );
    // The error names the way out: a relay through the client.
    assert!(stderr(&o).contains("--via-client"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);
    // And it works: the client reaches both.
    let o = cp(&["--via-client", &a.url("tree"), &b.url("")]);
    ok(&o);
    same(&a_root.join("tree"), &b_root.join("tree"));
}

/// The source server killed mid-copy and started again (same key, same files): the
/// copy fails, and the same command with `--resume` finishes it from what the
/// destination kept.
#[test]
fn a_server_killed_mid_copy_then_resume() {
    let (t, a_root, b_root) = a_and_b(48);
    let a_state = tempfile::Builder::new()
        .prefix("dmover-state-")
        .tempdir()
        .unwrap();
    let root = a_root.to_str().unwrap();
    let slow_args = [
        "--root",
        root,
        "--third-party",
        "--debug-chunk-delay-ms",
        "40",
    ];
    let slow: Vec<&std::ffi::OsStr> = slow_args.iter().map(std::ffi::OsStr::new).collect();
    let mut a = Server::start_with(&slow, &a_root, None, Some(a_state.path()));
    let b = Server::start(&b_root, &["--third-party"]);
    let kh = known_hosts_in(t.path());
    let copy = |a: &Server, resume: bool| {
        let mut c = std::process::Command::new(bin());
        c.args(["cp", "--json", "--chunk", "256K", "-P", "2"]);
        if resume {
            c.arg("--resume");
        }
        c.args([&a.url("src"), &b.url("dst")])
            .env("DMOVER_KNOWN_HOSTS", &kh)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let child = copy(&a, false).spawn().unwrap();
    let dst = b_root.join("dst");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while regular_file_sizes(&dst).len() < 8 {
        assert!(std::time::Instant::now() < until, "no progress at B");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    a.kill();
    let o = child.wait_with_output().unwrap();
    assert_ne!(
        o.status.code(),
        Some(0),
        "the copy cannot succeed without its source"
    );
    // Started again with its key: the client's pin still holds.
    let plain_args = ["--root", root, "--third-party"];
    let plain: Vec<&std::ffi::OsStr> = plain_args.iter().map(std::ffi::OsStr::new).collect();
    let a = Server::start_with(&plain, &a_root, None, Some(a_state.path()));
    let o = copy(&a, true).output().unwrap();
    ok(&o);
    same(&a_root.join("src"), &dst);
    let j = json(&o);
    assert!(j["bytes_resumed"].as_u64().unwrap() > 0, "{j}");
}

/// A third-party copy whose destination server dies mid-copy and comes back (same
/// address, same key): `--retries` steers the copy again by itself, with a new
/// capability (each is single use) and resumed, so what B kept is not sent again.
/// Both ways of dialing: under push B is the server A dialed, under pull B is the
/// dialer.
#[test]
fn a_third_party_copy_retried_after_its_destination_restarts_resumes() {
    for mode in ["push", "pull"] {
        let (t, a_root, b_root) = a_and_b(32);
        let a_args = [
            "--root",
            a_root.to_str().unwrap(),
            "--third-party",
            "--io-threads",
            "1",
            "--debug-chunk-delay-ms",
            "40",
        ];
        let a_args: Vec<&std::ffi::OsStr> = a_args.iter().map(std::ffi::OsStr::new).collect();
        let a = Server::start_with(&a_args, &a_root, None, None);
        let b_state = tempfile::Builder::new()
            .prefix("dmover-state-")
            .tempdir()
            .unwrap();
        // Both servers slow each chunk of the sessions they accept (a dialer's own
        // session runs as the client's would): under push B's, under pull A's.
        let b_args: Vec<&std::ffi::OsStr> = vec![
            "--root".as_ref(),
            b_root.as_os_str(),
            "--third-party".as_ref(),
            "--debug-chunk-delay-ms".as_ref(),
            "40".as_ref(),
        ];
        let mut b = Server::start_with(&b_args, &b_root, None, Some(b_state.path()));
        let kh = known_hosts_in(t.path());
        let (src, dst) = (a_root.join("src"), b_root.join("dst"));
        let child = std::process::Command::new(bin())
            .args(["cp", "--json", "--chunk", "256K", "-P", "2", "--tpc", mode])
            .args(["--retries", "5", "--retry-wait", "1s"])
            .args([&a.url("src"), &b.url("dst")])
            .env("DMOVER_KNOWN_HOSTS", &kh)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (j, done) = restart_b_mid_copy(child, &src, &dst, &mut b, &b_args, b_state.path());
        assert_eq!(j["direction"], format!("third-party-{mode}"), "{j}");
        // What B kept was not sent again: all attempts together moved less than the
        // tree and what B kept.
        assert!(
            j["bytes_sent"].as_u64().unwrap() < walk_bytes(&src) + done,
            "{mode}: {done}: {j}"
        );
    }
}

/// `--via-client`: the data goes A → client → B (servers that cannot reach each other
/// need no third-party switch: the client pulls and pushes at once). A tree of small
/// files, multi-MiB files, an empty file and symlinks arrives byte-identical, through
/// a ring of a few chunks (so puts wait for room and the push waits for chunks).
#[test]
fn a_relay_through_the_client_copies_a_tree() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    make_small_files(&a_root.join("tree/small"), 200, 5);
    write_file(
        &a_root.join("tree/large"),
        99,
        12 << 20,
        0o644,
        1_700_000_000,
    );
    let a = Server::start(&a_root, &[]);
    let b = Server::start(&b_root, &[]);
    let o = cp(&[
        "--json",
        "--via-client",
        "--chunk",
        "256K",
        "-P",
        "3",
        "--debug-relay-bytes",
        "786432",
        &a.url("tree"),
        &b.url("copy"),
    ]);
    ok(&o);
    same(&a_root.join("tree"), &b_root.join("copy"));
    assert!(staging_files(&b_root).is_empty());
    let j = json(&o);
    assert_eq!(j["direction"], "third-party-relay", "{j}");
    assert_eq!(j["verified"], true, "{j}");
    let total = walk_bytes(&a_root.join("tree"));
    assert_eq!(j["bytes"].as_u64(), Some(total), "{j}");
    assert_eq!(j["bytes_received"].as_u64(), Some(total), "{j}");
    assert_eq!(j["bytes_sent"].as_u64(), Some(total), "{j}");
    // Never the whole dataset at once: the ring holds 3 chunks, more only while the
    // push waits for a chunk that A's streams deliver behind later ones.
    let peak = j["relay_peak_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak < total, "{j}");
}

/// A relay's push to a destination whose key the client knew before sends early data
/// (protocol 8: its streams join and send with the first flight), as a two-party push
/// does; the first relay, which pins the keys, does not.
#[test]
fn a_relay_to_a_known_destination_sends_early_data() {
    let (t, a_root, b_root) = a_and_b(4);
    let a = Server::start(&a_root, &[]);
    let b = Server::start(&b_root, &[]);
    let kh = t.path().join("known_hosts");
    let env = [("DMOVER_KNOWN_HOSTS", kh.to_str().unwrap())];
    let early = "early data: session";
    for (dest, known) in [("first", false), ("second", true)] {
        let o = cp_env(&["-v", "--via-client", &a.url("src"), &b.url(dest)], &env);
        ok(&o);
        same(&a_root.join("src"), &b_root.join(dest));
        assert_eq!(stderr(&o).contains(early), known, "{dest}: {}", stderr(&o));
    }
    assert!(staging_files(&b_root).is_empty());
}

/// A relay to a destination that refuses (a read-only export) fails with B's reason,
/// writes nothing at B, and leaves A serving.
#[test]
fn a_relay_to_a_read_only_destination_fails_and_writes_nothing() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    let a = Server::start(&a_root, &[]);
    let b = Server::start(&b_root, &["--read-only"]);
    let o = cp(&["--json", "--via-client", &a.url("tree"), &b.url("copy")]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["ok"], false, "{j}");
    assert_eq!(j["direction"], "third-party-relay", "{j}");
    assert_eq!(std::fs::read_dir(&b_root).unwrap().count(), 0);
    // A is fine: the same relay to a writable B works.
    let b2 = Server::start(&b_root, &[]);
    let o = cp(&["--via-client", &a.url("tree"), &b2.url("copy")]);
    ok(&o);
    same(&a_root.join("tree"), &b_root.join("copy"));
}

/// The source server killed mid-relay: the relay fails (B's session ends with it),
/// nothing incomplete is visible under a final name at B, and the same relay run again
/// against the restarted server completes.
#[test]
fn a_relay_whose_source_dies_fails_cleanly_and_runs_again() {
    let (t, a_root, b_root) = a_and_b(32);
    let mut a = Server::start(&a_root, &["--debug-chunk-delay-ms", "40"]);
    let b = Server::start(&b_root, &[]);
    let kh = known_hosts_in(t.path());
    let child = std::process::Command::new(bin())
        .args(["cp", "--via-client", "--chunk", "256K", "-P", "2"])
        .args([&a.url("src"), &b.url("dst")])
        .env("DMOVER_KNOWN_HOSTS", &kh)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let dst = b_root.join("dst");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while regular_file_sizes(&dst).len() < 4 {
        assert!(std::time::Instant::now() < until, "no progress at B");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    a.kill();
    let started = std::time::Instant::now();
    let o = child.wait_with_output().unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the relay stops soon after its source"
    );
    assert!(
        stderr(&o).contains(&a.addr),
        "names the source: {}",
        stderr(&o)
    );
    no_partial_files(&a_root.join("src"), &dst);
    let a = Server::start(&a_root, &[]);
    let o = cp(&[
        "--via-client",
        "--chunk",
        "256K",
        &a.url("src"),
        &b.url("dst"),
    ]);
    ok(&o);
    same(&a_root.join("src"), &dst);
    assert!(staging_files(&dst).is_empty());
}

/// The destination server killed mid-relay: the relay fails soon, naming it (the pull
/// from A stops with it instead of waiting for room), and A serves the next relay.
#[test]
fn a_relay_whose_destination_dies_fails_soon() {
    let (t, a_root, b_root) = a_and_b(32);
    let a = Server::start(&a_root, &[]);
    let mut b = Server::start(&b_root, &["--debug-chunk-delay-ms", "40"]);
    let kh = known_hosts_in(t.path());
    let child = std::process::Command::new(bin())
        .args(["cp", "--via-client", "--chunk", "256K", "-P", "2"])
        .args(["--debug-relay-bytes", "1048576"])
        .args([&a.url("src"), &b.url("dst")])
        .env("DMOVER_KNOWN_HOSTS", &kh)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let dst = b_root.join("dst");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while regular_file_sizes(&dst).len() < 4 {
        assert!(std::time::Instant::now() < until, "no progress at B");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    b.kill();
    let started = std::time::Instant::now();
    let o = child.wait_with_output().unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the relay stops soon after its destination"
    );
    assert!(stderr(&o).contains(&b.addr), "names B: {}", stderr(&o));
    no_partial_files(&a_root.join("src"), &dst);
    let b2 = Server::start(&b_root, &[]);
    let o = cp(&["--via-client", &a.url("src"), &b2.url("again")]);
    ok(&o);
    same(&a_root.join("src"), &b_root.join("again"));
}

/// Bytes of the files under their final names below `dir` (staging files left out).
/// A temporary directory with two server roots, `a` (its `src` holding `files` files
/// of 512 KiB, `f00`, `f01`, ...) and an empty `b`.
fn a_and_b(files: u64) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    for i in 0..files {
        write_file(
            &a_root.join(format!("src/f{i:02}")),
            i,
            512 << 10,
            0o644,
            1_000_000,
        );
    }
    (t, a_root, b_root)
}

fn final_bytes(dir: &std::path::Path) -> u64 {
    let mut n = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_dir() {
            n += final_bytes(&e.path());
        } else if m.is_file() && !e.file_name().to_string_lossy().starts_with(".dmv.") {
            n += m.len();
        }
    }
    n
}

/// `dmover cp --via-client --chunk 256K -P 2 [--json] EXTRA SRC DST` with the
/// known-hosts file `kh`, its output piped.
fn relay_command(
    kh: &std::path::Path,
    extra: &[&str],
    src: &str,
    dst: &str,
) -> std::process::Command {
    let mut c = std::process::Command::new(bin());
    c.args(["cp", "--json", "--via-client", "--chunk", "256K", "-P", "2"])
        .args(extra)
        .args([src, dst])
        .env("DMOVER_KNOWN_HOSTS", kh)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// B killed once 8 files are complete at `dst` and started again (same address, key and
/// `state`, args `b_args`) while the copy `child` runs under `--retries`: the copy
/// completes byte-identical with nothing staged, in two attempts or more, and reports
/// as resumed at least what B held when it died. Returns the JSON summary and that.
fn restart_b_mid_copy(
    child: std::process::Child,
    src: &std::path::Path,
    dst: &std::path::Path,
    b: &mut Server,
    b_args: &[&std::ffi::OsStr],
    state: &std::path::Path,
) -> (serde_json::Value, u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while no_partial_files(src, dst) < 8 {
        assert!(std::time::Instant::now() < until, "no progress at B");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    b.kill();
    let done = final_bytes(dst);
    let root = b.root.clone();
    let _b = Server::start_on(&b.addr, b_args, &root, None, Some(state));
    let o = child.wait_with_output().unwrap();
    ok(&o);
    same(src, dst);
    assert!(staging_files(dst).is_empty());
    let j = json(&o);
    assert!(j["attempts"].as_u64().unwrap() >= 2, "{j}");
    assert!(j["bytes_resumed"].as_u64().unwrap() >= done, "{done}: {j}");
    (j, done)
}

/// Starts a relay, waits (60 s at most) until `cut_here` holds, kills the client, and
/// leaves B a moment to end its session (it keeps its journal).
fn cut_relay(mut c: std::process::Command, cut_here: impl Fn() -> bool) {
    let mut child = c.spawn().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cut_here() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the relay ended before it was cut"
        );
        assert!(std::time::Instant::now() < until, "no progress at B");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
}

/// A relay cut mid-copy (the client killed): the same relay with `--resume` completes
/// byte-identical, and pulls from A and pushes to B only what B lacks (B's answer to
/// the push is the pull's resume answer to A).
#[test]
fn a_relay_cut_mid_copy_resumes_with_only_what_b_lacks() {
    let (t, a_root, b_root) = a_and_b(32);
    write_file(&a_root.join("src/big"), 77, 6 << 20, 0o600, 1_500_000);
    // One disk thread at A, 40 ms a chunk: about 25 chunks (6 MiB) a second.
    let a = Server::start(
        &a_root,
        &["--io-threads", "1", "--debug-chunk-delay-ms", "40"],
    );
    let b = Server::start(&b_root, &[]);
    let kh = known_hosts_in(t.path());
    let (src, dst) = (a_root.join("src"), b_root.join("dst"));
    cut_relay(
        relay_command(&kh, &[], &a.url("src"), &b.url("dst")),
        || no_partial_files(&src, &dst) >= 12,
    );
    let done = final_bytes(&dst);
    let total = walk_bytes(&src);
    assert!(done < total, "the relay was cut ({done} of {total} bytes)");
    let o = relay_command(&kh, &["--resume"], &a.url("src"), &b.url("dst"))
        .output()
        .unwrap();
    ok(&o);
    same(&src, &dst);
    assert!(staging_files(&dst).is_empty());
    let j = json(&o);
    assert_eq!(j["verified"], true, "{j}");
    assert!(j["bytes_resumed"].as_u64().unwrap() >= done, "{j}");
    let (received, sent) = (
        j["bytes_received"].as_u64().unwrap(),
        j["bytes_sent"].as_u64().unwrap(),
    );
    assert!(received + done <= total, "{done} of {total} held: {j}");
    assert!(sent + done <= total, "{done} of {total} held: {j}");
    assert!(
        received < total - (4 << 20) && sent < total - (4 << 20),
        "{j}"
    );
}

/// A relay `--resume` to a B that holds everything moves nothing; a file changed at A
/// since (another mtime) is sent again whole, and only it.
#[test]
fn a_relay_resume_sends_nothing_when_b_holds_everything() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    make_tree(&a_root.join("tree"));
    make_small_files(&a_root.join("tree/small"), 100, 4);
    write_file(&a_root.join("tree/data"), 1, 3 << 20, 0o644, 1_700_000_000);
    let a = Server::start(&a_root, &[]);
    let b = Server::start(&b_root, &[]);
    let kh = known_hosts_in(t.path());
    let (src, dst) = (a_root.join("tree"), b_root.join("copy"));
    let o = relay_command(&kh, &[], &a.url("tree"), &b.url("copy"))
        .output()
        .unwrap();
    ok(&o);
    same(&src, &dst);
    let o = relay_command(&kh, &["--resume"], &a.url("tree"), &b.url("copy"))
        .output()
        .unwrap();
    ok(&o);
    same(&src, &dst);
    let j = json(&o);
    assert_eq!(j["bytes_received"].as_u64(), Some(0), "{j}");
    assert_eq!(j["bytes_sent"].as_u64(), Some(0), "{j}");
    assert_eq!(j["bytes_resumed"].as_u64(), Some(walk_bytes(&src)), "{j}");
    // Changed at A: sent whole, the rest stays.
    write_file(&a_root.join("tree/data"), 2, 3 << 20, 0o644, 1_700_000_100);
    let o = relay_command(&kh, &["--resume"], &a.url("tree"), &b.url("copy"))
        .output()
        .unwrap();
    ok(&o);
    same(&src, &dst);
    assert!(staging_files(&dst).is_empty());
    let j = json(&o);
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["bytes_received"].as_u64(), Some(3 << 20), "{j}");
    assert_eq!(j["bytes_sent"].as_u64(), Some(3 << 20), "{j}");
}

/// A large file partly at B when a relay was cut: `--resume` sends only its missing
/// pieces, and B verifies the whole file against A's digest (computed over the held
/// pieces A checked and the rest). The same file changed at A since (same size and
/// mtime, other bytes: A finds B's pieces differ) is sent again whole, never spliced.
#[test]
fn a_relay_resumes_a_partly_held_file_and_resends_one_changed_since() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    const SIZE: usize = 16 << 20;
    write_file(&a_root.join("one/big"), 1, SIZE, 0o644, 1_600_000_000);
    write_file(&a_root.join("two/big"), 2, SIZE, 0o644, 1_600_000_000);
    // One disk thread at A, 40 ms a chunk: 16 MiB take about 2.6 s.
    let a = Server::start(
        &a_root,
        &["--io-threads", "1", "--debug-chunk-delay-ms", "40"],
    );
    let b = Server::start(&b_root, &[]);
    let kh = known_hosts_in(t.path());
    for name in ["one", "two"] {
        let dst = b_root.join(name);
        let started = std::cell::Cell::new(None);
        cut_relay(relay_command(&kh, &[], &a.url(name), &b.url(name)), || {
            // A second after B started the file: about a third of it is there.
            match started.get() {
                None if !staging_files(&dst).is_empty() => {
                    started.set(Some(std::time::Instant::now()));
                    false
                }
                Some(at) => at.elapsed() > std::time::Duration::from_secs(1),
                None => false,
            }
        });
        assert!(
            !dst.join("big").exists(),
            "cut before the file was complete"
        );
        assert!(!staging_files(&dst).is_empty(), "B keeps its pieces");
    }
    // Same size and mtime, other bytes.
    write_file(&a_root.join("two/big"), 3, SIZE, 0o644, 1_600_000_000);
    let o = relay_command(&kh, &["--resume"], &a.url("one"), &b.url("one"))
        .output()
        .unwrap();
    ok(&o);
    same(&a_root.join("one"), &b_root.join("one"));
    let j = json(&o);
    assert_eq!(j["verified"], true, "{j}");
    let held = j["bytes_resumed"].as_u64().unwrap();
    assert!(held > 0, "{j}");
    assert_eq!(
        j["bytes_received"].as_u64(),
        Some(SIZE as u64 - held),
        "{j}"
    );
    assert_eq!(j["bytes_sent"].as_u64(), Some(SIZE as u64 - held), "{j}");

    let o = relay_command(&kh, &["--resume"], &a.url("two"), &b.url("two"))
        .output()
        .unwrap();
    ok(&o);
    same(&a_root.join("two"), &b_root.join("two"));
    assert!(staging_files(&b_root).is_empty());
    let j = json(&o);
    assert_eq!(j["bytes_resumed"].as_u64(), Some(0), "{j}");
    assert_eq!(j["bytes_received"].as_u64(), Some(SIZE as u64), "{j}");
    assert_eq!(j["bytes_sent"].as_u64(), Some(SIZE as u64), "{j}");
}

/// B killed mid-relay and started again (same address, same key): `--retries` runs the
/// relay again by itself, resumed, so what B kept is neither pulled from A nor pushed
/// again.
#[test]
fn a_relay_retried_after_its_destination_restarts_resumes() {
    let (t, a_root, b_root) = a_and_b(32);
    let a = Server::start(
        &a_root,
        &["--io-threads", "1", "--debug-chunk-delay-ms", "40"],
    );
    let b_state = tempfile::Builder::new()
        .prefix("dmover-state-")
        .tempdir()
        .unwrap();
    let b_args: Vec<&std::ffi::OsStr> = vec!["--root".as_ref(), b_root.as_os_str()];
    let mut b = Server::start_with(&b_args, &b_root, None, Some(b_state.path()));
    let kh = known_hosts_in(t.path());
    let (src, dst) = (a_root.join("src"), b_root.join("dst"));
    let child = relay_command(
        &kh,
        &["--retries", "5", "--retry-wait", "1s"],
        &a.url("src"),
        &b.url("dst"),
    )
    .spawn()
    .unwrap();
    let (j, done) = restart_b_mid_copy(child, &src, &dst, &mut b, &b_args, b_state.path());
    let total = walk_bytes(&src);
    // Both attempts together: what B kept crossed the client once, not twice.
    assert!(
        j["bytes_received"].as_u64().unwrap() < total + done,
        "{done}: {j}"
    );
    assert!(
        j["bytes_sent"].as_u64().unwrap() < total + done,
        "{done}: {j}"
    );
}

/// `--continue-on-error` with `--via-client`: a file A cannot read (removed while the
/// relay runs) is reported with A's reason and dropped at B (A's failure markers pass
/// through the client), everything else arrives; exit 23 (a partial copy). Once the file is back,
/// `--resume` sends only it.
#[test]
fn a_relay_continues_past_a_file_the_source_cannot_read() {
    let t = tmp();
    let a_root = t.path().join("a");
    let b_root = t.path().join("b");
    std::fs::create_dir(&b_root).unwrap();
    let src = a_root.join("src");
    make_small_files(&src, 40, 2);
    write_file(&src.join("zz-grow"), 9, 8 << 20, 0o644, 1_700_000_000);
    let a = Server::start(&a_root, &["--debug-chunk-delay-ms", "40"]);
    let b = Server::start(&b_root, &[]);
    let kh = known_hosts_in(t.path());
    let dst = b_root.join("dst");
    let child = std::process::Command::new(bin())
        .args(["cp", "--json", "--via-client", "--continue-on-error"])
        .args(["--chunk", "64K", &a.url("src"), &b.url("dst")])
        .env("DMOVER_KNOWN_HOSTS", &kh)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while staging_files(&dst).is_empty() {
        assert!(std::time::Instant::now() < until, "no data arrived");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::remove_file(src.join("zz-grow")).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(23), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["direction"], "third-party-relay", "{j}");
    let failed = j["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{j}");
    assert!(failed[0].as_str().unwrap().contains("zz-grow"), "{j}");
    assert!(!dst.join("zz-grow").exists());
    assert_eq!(no_partial_files(&src, &dst), 40);
    assert_eq!(staging_files(&dst), Vec::<std::path::PathBuf>::new());
    // Back at A: `--resume` (as the error says) sends just that file.
    write_file(&src.join("zz-grow"), 9, 8 << 20, 0o644, 1_700_000_000);
    let o = relay_command(&kh, &["--resume"], &a.url("src"), &b.url("dst"))
        .output()
        .unwrap();
    ok(&o);
    same(&src, &dst);
    let j = json(&o);
    assert_eq!(j["bytes_received"].as_u64(), Some(8 << 20), "{j}");
    assert_eq!(j["bytes_sent"].as_u64(), Some(8 << 20), "{j}");
}
