//! `dmover netlab` end to end: bring a lab up with the CLI, run `dmover serve` in one
//! host and `dmover cp` in the other across the emulated link, read the forwarder's
//! statistics, take the lab down and check nothing is left.
//!
//! Needs root, `/dev/net/tun` and `ip`; skips loudly without them unless
//! `DMOVER_REQUIRE_NETLAB=1`, when it fails.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn netlab(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("netlab")
        .args(args)
        .output()
        .expect("running dmover netlab")
}

/// A counter of `/proc/net/netstat` (e.g. `TCPFastOpenPassive`) in host `host` of lab
/// `name`.
fn netstat(name: &str, host: &str, counter: &str) -> u64 {
    let o = netlab(&[
        "exec",
        "--name",
        name,
        host,
        "--",
        "cat",
        "/proc/net/netstat",
    ]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let (names, values) = (pair[0].split_whitespace(), pair[1].split_whitespace());
        for (n, v) in names.zip(values) {
            if n == counter {
                return v.parse().unwrap();
            }
        }
    }
    panic!("no {counter} in {text}");
}

/// Removes the lab even when the test fails.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = netlab(&["down", "--name", &self.0]);
    }
}

#[test]
fn netlab_up_serve_cp_stats_down() {
    if !netlab_available("netlab_up_serve_cp_stats_down") {
        return;
    }
    let name = format!("e2e{}", std::process::id() % 100_000);
    let up = netlab(&[
        "up",
        "--name",
        &name,
        "--rtt",
        "20ms",
        "--rate",
        "500mbit",
        "--json",
        // The forwarder's statistics are checked below.
        "--emulator",
        "forwarder",
        // Reaches the background forwarder's lab: checked on the device below.
        "--mtu",
        "1400",
    ]);
    ok(&up);
    let _down = Down(name.clone());
    let hosts = json(&up);
    assert_eq!(hosts["emulator"], "forwarder");
    let (ns_a, ns_b) = (
        hosts["a"]["netns"].as_str().unwrap().to_string(),
        hosts["b"]["netns"].as_str().unwrap().to_string(),
    );
    let addr_b = hosts["b"]["addr"].as_str().unwrap().to_string();
    assert_eq!(hosts["a"]["addr"], "10.200.0.1");
    assert!(Path::new("/run/netns").join(&ns_a).exists());

    // A second `up` of the same name is refused while the first lives.
    let again = netlab(&["up", "--name", &name]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );

    // `exec` runs inside the namespace and passes the exit status through.
    let e = netlab(&["exec", "--name", &name, "b", "--", "sh", "-c", "exit 7"]);
    assert_eq!(e.status.code(), Some(7));
    let e = netlab(&["exec", "--name", &name, "a", "--", "cat", "/proc/net/dev"]);
    ok(&e);
    assert!(String::from_utf8_lossy(&e.stdout).contains("dmnl0"));
    let e = netlab(&[
        "exec",
        "--name",
        &name,
        "b",
        "--",
        "cat",
        "/sys/class/net/dmnl0/mtu",
    ]);
    ok(&e);
    assert_eq!(String::from_utf8_lossy(&e.stdout).trim(), "1400");

    // dmover serve in b, dmover cp in a, across the 20 ms link.
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let token = t.path().join("token");
    std::fs::write(&token, "netlab-e2e-token").unwrap();
    let mut server = Command::new(bin())
        .args(["netlab", "exec", "--name", &name, "b", "--"])
        .arg(bin())
        .args(["serve", "--listen", &format!("{addr_b}:0"), "--root"])
        .arg(&root)
        .arg("--token-file")
        .arg(&token)
        .arg("--state-dir")
        .arg(t.path().join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listen = line
        .trim()
        .strip_prefix("dmover: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let src = t.path().join("src");
    make_tree(&src);
    let t0 = Instant::now();
    let cp = Command::new(bin())
        .args(["netlab", "exec", "--name", &name, "a", "--"])
        .arg(bin())
        .env("DMOVER_KNOWN_HOSTS", t.path().join("known_hosts"))
        .args(["cp", "--json", "--token-file"])
        .arg(&token)
        .arg(&src)
        .arg(format!("dmover://{listen}/pushed"))
        .output()
        .unwrap();
    ok(&cp);
    assert!(
        t0.elapsed() > Duration::from_millis(40),
        "a push takes round trips of 20 ms"
    );
    same(&src, &root.join("pushed"));

    // The lab's hosts offer TCP Fast Open: the first copy got the server's cookie, so
    // a second one's control connection and data streams send their first bytes in
    // their SYNs, and the copy is as good.
    let passive = netstat(&name, "b", "TCPFastOpenPassive");
    let cp = Command::new(bin())
        .args(["netlab", "exec", "--name", &name, "a", "--"])
        .arg(bin())
        .env("DMOVER_KNOWN_HOSTS", t.path().join("known_hosts"))
        .args(["cp", "--json", "-P", "3", "--token-file"])
        .arg(&token)
        .arg(&src)
        .arg(format!("dmover://{listen}/again"))
        .output()
        .unwrap();
    ok(&cp);
    same(&src, &root.join("again"));
    let opened = netstat(&name, "b", "TCPFastOpenPassive") - passive;
    assert!(
        opened >= 4,
        "the control connection and 3 data streams open with Fast Open: {opened}"
    );

    // The forwarder's statistics saw the transfer.
    std::thread::sleep(Duration::from_millis(1200)); // rewritten every second
    let st = netlab(&["stats", "--name", &name, "--json"]);
    ok(&st);
    let st = json(&st);
    assert!(st["a_to_b"]["bytes_out"].as_u64().unwrap() > 10 << 20);
    assert!(st["uso"].is_boolean(), "{st}");
    assert_eq!(st["schema"], 1, "{st}");
    assert!(st["a_to_b"]["late_p50_us"].is_number(), "{st}");
    assert!(
        st["a_to_b"]["segments_in"].as_u64().unwrap()
            > st["a_to_b"]["packets_in"].as_u64().unwrap()
    );
    ok(&netlab(&["stats", "--name", &name]));
    let list = netlab(&["list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains(&name));

    // Down removes the namespaces, the forwarder and the server still running in b.
    let server_pid = server.id();
    let d = netlab(&["down", "--name", &name]);
    ok(&d);
    assert!(!Path::new("/run/netns").join(&ns_a).exists());
    assert!(!Path::new("/run/netns").join(&ns_b).exists());
    assert!(!Path::new("/run/dmover-netlab").join(&name).exists());
    assert!(
        server.try_wait().unwrap().is_some() || {
            std::thread::sleep(Duration::from_millis(500));
            server.try_wait().unwrap().is_some()
        },
        "the server (pid {server_pid}) in the lab was ended"
    );
    let d = netlab(&["down", "--name", &name]);
    assert!(!d.status.success(), "the lab is gone");
}

/// `--emulator netem`: where the kernel lacks netem (this machine), a link with a delay
/// is refused with the reason and nothing is left behind; a rate-only link is tbf on a
/// veth pair, and `stats` shows the kernel's counters.
#[test]
fn netlab_kernel_emulator() {
    if !netlab_available("netlab_kernel_emulator") {
        return;
    }
    let name = format!("kem{}", std::process::id() % 100_000);
    let up = netlab(&[
        "up",
        "--name",
        &name,
        "--rtt",
        "10ms",
        "--emulator",
        "netem",
        "--json",
    ]);
    let gone = |name: &str| {
        !Path::new("/run/netns")
            .join(format!("dmnl-{name}-a"))
            .exists()
            && !Path::new("/run/netns")
                .join(format!("dmnl-{name}-b"))
                .exists()
            && !Path::new("/run/dmover-netlab").join(name).exists()
            && !Path::new("/run/dmover-netlab")
                .join(format!("{name}.log"))
                .exists()
    };
    if up.status.success() {
        let _down = Down(name.clone());
        assert_eq!(json(&up)["emulator"], "netem");
        ok(&netlab(&["down", "--name", &name]));
    } else {
        let err = stderr(&up);
        assert!(
            err.contains("no netem") && err.contains("forwarder"),
            "the reason is given: {err}"
        );
        assert!(gone(&name), "a refused lab leaves nothing behind");
    }
    assert!(gone(&name));

    let up = netlab(&[
        "up",
        "--name",
        &name,
        "--rate",
        "100mbit",
        "--emulator",
        "netem",
        "--json",
    ]);
    ok(&up);
    let _down = Down(name.clone());
    assert_eq!(json(&up)["emulator"], "netem");
    let st = netlab(&["stats", "--name", &name]);
    ok(&st);
    let out = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(
        out.contains("tbf 2: root") && out.contains("100Mbit"),
        "{out}"
    );
    ok(&netlab(&["down", "--name", &name]));
    assert!(gone(&name));
}

#[test]
fn netlab_usage_errors() {
    for args in [
        &["up", "--rtt", "100"][..],
        &["up", "--rate", "5gbyte"],
        &["up", "--rate", "1gb"],
        &["up", "--rate", "100"],
        &["up", "--rtt", "11s"],
        &["up", "--queue", "4X"],
        &["up", "--loss", "2"],
        &["up", "--name", "bad/name"],
        &["exec", "c", "--", "true"],
        &["down", "--all", "--name", "x"],
    ] {
        let o = netlab(args);
        assert!(!o.status.success(), "{args:?} must fail");
        assert!(!stderr(&o).is_empty());
    }
    let o = netlab(&["up", "--rate", "1gb"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("write 1gbit for bits per second or 1GB/s"),
        "{}",
        stderr(&o)
    );
}
