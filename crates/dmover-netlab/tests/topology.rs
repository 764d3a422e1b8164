//! Topologies of three hosts on the real kernel: reachability over every link, a tbf
//! link's rate ceiling, per-interface counters, cleanup.
//!
//! Like `netlab.rs`: they need root and `ip`; without them they skip with a loud
//! message, unless `DMOVER_REQUIRE_NETLAB=1`, when they fail. They run one at a time
//! (a lock). Rates are checked as ceilings only (the machine is shared).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dmover_netlab::topology::{interface_name, netns_name};
use dmover_netlab::{TopoLinkKind, Topology, TopologySpec, ns, state};

static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the lock, or returns `None` (skipping) when labs are unavailable here.
fn guard(test: &str) -> Option<MutexGuard<'static, ()>> {
    if let Err(why) = dmover_netlab::available() {
        if std::env::var("DMOVER_REQUIRE_NETLAB").is_ok_and(|v| v == "1") {
            panic!("{test}: netlab unavailable but DMOVER_REQUIRE_NETLAB=1: {why}");
        }
        eprintln!("\n!!! SKIPPING {test}: netlab is unavailable here: {why} !!!\n");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
}

/// A lab name unique to this process and test.
fn name(test: &str) -> String {
    format!("y{}-{test}", std::process::id() % 100_000)
}

const RATE: u64 = 20_000_000;

/// c–a and c–b plain, a–b as given.
fn triangle(ab: TopoLinkKind) -> TopologySpec {
    TopologySpec::new(&["c", "a", "b"])
        .link("c", "a", TopoLinkKind::Veth)
        .link("c", "b", TopoLinkKind::Veth)
        .link("a", "b", ab)
}

/// A listener in `to`, on its address as `from` sees it, and a connection to it from
/// `from`: (sender in `from`, receiver in `to`).
fn connect(t: &Topology, from: &str, to: &str) -> (TcpStream, TcpStream) {
    let addr = t.addr(to, from).unwrap();
    let listener = t
        .host(to)
        .unwrap()
        .in_netns(|| TcpListener::bind((addr, 0)))
        .unwrap()
        .unwrap();
    let at: SocketAddr = listener.local_addr().unwrap();
    let tx = t
        .host(from)
        .unwrap()
        .in_netns(|| TcpStream::connect_timeout(&at, Duration::from_secs(10)))
        .unwrap()
        .unwrap();
    let (rx, _) = listener.accept().unwrap();
    (tx, rx)
}

/// Sends `bytes` from `from` to `to` over TCP; returns the receiver's time from its
/// first byte to the end and the count it got.
fn bulk(t: &Topology, from: &str, to: &str, bytes: u64) -> (Duration, u64) {
    let (mut tx, mut rx) = connect(t, from, to);
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        let mut first = None;
        loop {
            let n = rx.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            got += n as u64;
        }
        (first.map_or(Duration::ZERO, |f| f.elapsed()), got)
    });
    let buf = vec![0x5au8; 1 << 20];
    let mut sent = 0u64;
    while sent < bytes {
        let n = buf.len().min((bytes - sent) as usize);
        tx.write_all(&buf[..n]).unwrap();
        sent += n as u64;
    }
    tx.shutdown(std::net::Shutdown::Write).unwrap();
    receiver.join().unwrap()
}

#[test]
fn three_hosts_reach_each_other_directly_and_leave_nothing_behind() {
    let Some(_g) = guard("three_hosts_reach_each_other_directly_and_leave_nothing_behind") else {
        return;
    };
    let t0 = Instant::now();
    let lab = name("tri");
    let t = Topology::up(&lab, &triangle(TopoLinkKind::Veth)).unwrap();
    eprintln!("three plain links up in {:?}", t0.elapsed());
    for h in ["c", "a", "b"] {
        assert!(ns::exists(&netns_name(&lab, h)));
    }
    // Each address is the peer's end of their own link.
    assert_ne!(t.addr("a", "c").unwrap(), t.addr("a", "b").unwrap());
    assert!(t.addr("z", "c").is_err());

    // TCP both ways over every link.
    for (x, y) in [
        ("c", "a"),
        ("c", "b"),
        ("a", "b"),
        ("a", "c"),
        ("b", "c"),
        ("b", "a"),
    ] {
        let (mut tx, mut rx) = connect(&t, x, y);
        tx.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        rx.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello", "{x} -> {y}");
    }
    // ping too, where it is installed.
    if std::process::Command::new("ping")
        .arg("-V")
        .output()
        .is_ok()
    {
        for (x, y) in [("c", "a"), ("c", "b"), ("a", "b")] {
            let to = t.addr(y, x).unwrap().to_string();
            let st = t
                .host(x)
                .unwrap()
                .command("ping")
                .args(["-c1", "-W5", "-q", &to])
                .output()
                .unwrap();
            assert!(st.status.success(), "ping {x} -> {y}: {st:?}");
        }
    }

    // A bulk transfer from a to b is counted on a's and b's interfaces of their link,
    // and nowhere on c's.
    let c0 = t.host_counters("c").unwrap();
    let a0 = t.counters("a", "b").unwrap();
    let b0 = t.counters("b", "a").unwrap();
    let n = 32u64 << 20;
    let (took, got) = bulk(&t, "a", "b", n);
    assert_eq!(got, n);
    let a1 = t.counters("a", "b").unwrap().since(&a0);
    let b1 = t.counters("b", "a").unwrap().since(&b0);
    let c1 = t.host_counters("c").unwrap().since(&c0);
    eprintln!(
        "a -> b over veth: {n} bytes in {took:?} ({:.0} Mbit/s); a tx {} b rx {}; c both ways {}",
        n as f64 * 8.0 / took.as_secs_f64() / 1e6,
        a1.tx_bytes,
        b1.rx_bytes,
        c1.bytes()
    );
    assert!(a1.tx_bytes >= n, "{a1:?}");
    assert!(b1.rx_bytes >= n, "{b1:?}");
    assert!(
        (c1.bytes() as f64) < 0.01 * n as f64,
        "c's interfaces carried {} bytes",
        c1.bytes()
    );
    // The per-host sum is over the link interfaces, by name.
    let names: Vec<String> = t
        .all_counters("c")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&interface_name("a")) && names.contains(&interface_name("b")));

    // A process left running in a host is ended by the teardown.
    let mut child = t
        .host("c")
        .unwrap()
        .command("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let pid = child.id();
    let w = Instant::now();
    while !t.host("c").unwrap().pids().contains(&pid) && w.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let d = Instant::now();
    t.down().unwrap();
    eprintln!("down in {:?}", d.elapsed());
    assert!(child.try_wait().unwrap().is_some(), "the process was ended");
    for h in ["c", "a", "b"] {
        assert!(!ns::exists(&netns_name(&lab, h)), "{h}'s namespace removed");
    }
    assert!(!state::lab_dir(&lab).exists(), "state removed");
}

#[test]
fn a_tbf_link_holds_its_rate_both_ways() {
    let Some(_g) = guard("a_tbf_link_holds_its_rate_both_ways") else {
        return;
    };
    let lab = name("tbf");
    let t = Topology::up(
        &lab,
        &triangle(TopoLinkKind::Tbf {
            rate_bps: RATE,
            queue_bytes: None,
        }),
    )
    .unwrap();
    let ceiling = RATE as f64 * 1.2;
    for (x, y) in [("a", "b"), ("b", "a")] {
        let c0 = t.host_counters("c").unwrap();
        let tx0 = t.counters(x, y).unwrap();
        // 5 MB: about 2 s at 20 Mbit/s.
        let n = 5_000_000u64;
        let (took, got) = bulk(&t, x, y, n);
        assert_eq!(got, n);
        let rate = n as f64 * 8.0 / took.as_secs_f64();
        let tx = t.counters(x, y).unwrap().since(&tx0);
        let c = t.host_counters("c").unwrap().since(&c0);
        eprintln!(
            "{x} -> {y} over tbf {} Mbit/s: {n} bytes in {took:?} = {:.2} Mbit/s; \
             {x}'s interface sent {} bytes; c's carried {}",
            RATE / 1_000_000,
            rate / 1e6,
            tx.tx_bytes,
            c.bytes()
        );
        assert!(
            rate <= ceiling,
            "{x} -> {y}: {rate:.0} bit/s above {ceiling:.0}"
        );
        assert!(tx.tx_bytes >= n, "{tx:?}");
        assert!((c.bytes() as f64) < 0.01 * n as f64, "{c:?}");
    }
    t.down().unwrap();
    for h in ["c", "a", "b"] {
        assert!(!ns::exists(&netns_name(&lab, h)));
    }
}

#[test]
fn an_emulated_link_in_a_topology_adds_its_delay() {
    let Some(_g) = guard("an_emulated_link_in_a_topology_adds_its_delay") else {
        return;
    };
    let lab = name("emu");
    let rtt = Duration::from_millis(40);
    let spec = TopologySpec::new(&["c", "a", "b"])
        .link("c", "a", TopoLinkKind::Veth)
        .link(
            "c",
            "b",
            TopoLinkKind::Emulated(dmover_netlab::LinkSpec {
                rtt,
                ..dmover_netlab::LinkSpec::default()
            }),
        );
    let t = Topology::up(&lab, &spec).unwrap();
    // A connect is one round trip: the emulated link's, not the plain one's.
    let connect_time = |to: &str| {
        let addr = t.addr(to, "c").unwrap();
        let l = t
            .host(to)
            .unwrap()
            .in_netns(|| TcpListener::bind((addr, 0)))
            .unwrap()
            .unwrap();
        let at = l.local_addr().unwrap();
        let mut v: Vec<Duration> = (0..5)
            .map(|_| {
                t.host("c")
                    .unwrap()
                    .in_netns(|| {
                        let s = Instant::now();
                        let c = TcpStream::connect_timeout(&at, Duration::from_secs(10)).unwrap();
                        drop(c);
                        s.elapsed()
                    })
                    .unwrap()
            })
            .collect();
        v.sort();
        v[2]
    };
    let slow = connect_time("b");
    let fast = connect_time("a");
    eprintln!("connect c -> b (emulated {rtt:?}): {slow:?}; c -> a (veth): {fast:?}");
    assert!(slow >= rtt.mul_f64(0.9), "{slow:?}");
    assert!(fast < rtt / 2, "{fast:?}");
    // a and b have no link: asking for one is an error, not a guess.
    assert!(t.addr("b", "a").is_err());
    drop(t);
    for h in ["c", "a", "b"] {
        assert!(!ns::exists(&netns_name(&lab, h)));
    }
    let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("dmnl "))
        .collect();
    assert!(threads.is_empty(), "forwarder threads left: {threads:?}");
}

/// `remove` (and `remove_all`, which calls it for every lab not owned by a live
/// library user; not called here, as it acts on the whole machine) leaves a live
/// topology alone and removes every host of a dead one, not only `a` and `b`.
#[test]
fn remove_spares_a_live_topology_and_removes_all_hosts_of_a_dead_one() {
    let Some(_g) = guard("remove_spares_a_live_topology_and_removes_all_hosts_of_a_dead_one")
    else {
        return;
    };
    let lab = name("stale");
    let t = Topology::up(&lab, &triangle(TopoLinkKind::Veth)).unwrap();
    assert!(
        dmover_netlab::remove(&lab).is_err(),
        "a live owner's lab stays"
    );
    let mut ours = state::namespaces_of(&lab);
    ours.sort();
    let mut want: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|h| netns_name(&lab, h))
        .collect();
    want.sort();
    assert_eq!(ours, want);
    for n in &ours {
        assert_eq!(state::lab_of_netns(n), Some(lab.as_str()));
    }
    let rec = state::read_record(&lab).unwrap();
    assert_eq!(rec.topology.as_ref(), Some(t.spec()));
    // Pretend the owner died: the record names a finished process.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    let mut rec = rec;
    rec.pid = dead.id();
    rec.pid_start = 1;
    std::fs::write(
        state::lab_dir(&lab).join("lab.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();
    std::mem::forget(t);
    dmover_netlab::remove(&lab).unwrap();
    for h in ["c", "a", "b"] {
        assert!(!ns::exists(&netns_name(&lab, h)), "{h} removed");
    }
    assert!(!state::lab_dir(&lab).exists());
}

#[test]
fn a_panic_inside_a_topology_leaves_nothing_behind() {
    let Some(_g) = guard("a_panic_inside_a_topology_leaves_nothing_behind") else {
        return;
    };
    let lab = name("panic");
    let result = std::panic::catch_unwind(|| {
        let t = Topology::up(
            &lab,
            &triangle(TopoLinkKind::Tbf {
                rate_bps: RATE,
                queue_bytes: None,
            }),
        )
        .unwrap();
        assert!(ns::exists(&t.host("c").unwrap().netns));
        panic!("a test failing inside a topology");
    });
    assert!(result.is_err());
    for h in ["c", "a", "b"] {
        assert!(!ns::exists(&netns_name(&lab, h)), "{h} removed");
    }
    assert!(!state::lab_dir(&lab).exists(), "state removed");
}
