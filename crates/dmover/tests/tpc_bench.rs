//! The third-party benchmark of issue 12 (not a test: `#[ignore]`d, run by hand; see
//! docs/benchmarks.md for the command and the results). Three hosts in network
//! namespaces: client C on plain veths to servers A and B, A–B an emulated link
//! (netlab's forwarder: RTT, 1 Gbit/s). Per RTT and dataset, interleaved rounds of
//! - `tpc`: C steers A → B (`dmover cp dmover://A/ds dmover://B/dst`),
//! - `two-party`: a client on A pushes the same files to B over the same link,
//! - `gridftp-tpc` (when `globus-url-copy` and `globus-gridftp-server` are installed):
//!   `globus-url-copy -cd -p 4 -cc 4 -pp -fast -f LIST` steered from C,
//! - `iperf3` (when installed; the `large` dataset only): raw TCP A → B over the same
//!   link, memory to memory, the dataset's bytes on 4 streams (`iperf3 -c B -n BYTES
//!   -P 4`; its clock stops when the sender has written its bytes),
//! - `raw-tcp-cubic`, `raw-tcp-bbr` (when `python3` is installed): raw TCP A → B, the
//!   dataset's bytes on 4 streams, timed until B holds the last byte
//!   (`docs/bench/raw-tcp.py`, as issue 13's bound), the "raw TCP" of issue 12's
//!   large-file goal and what no tool moving those bytes can beat from a cold start,
//! - `raw-and-copy` (when `python3` is installed): `raw-tcp-bbr` and a 16-way `cp -a`
//!   of the dataset into B's tree, started together, until both are done: what the
//!   copy's network and disk halves cost this machine done at once by other tools
//!   (a comparison, not a bound: they spend more CPU than dmover),
//!
//! cold cache (caches dropped before each run), wall time from start to exit (each
//! tool's destination writes included; dmover renames a file only once it is on
//! disk with `--fsync`, not used here by any tool). Rows go to `$DMOVER_BENCH_OUT`
//! (CSV). Knobs: `DMOVER_BENCH_RTTS` (ms, default `0,50,200`), `DMOVER_BENCH_ROUNDS`
//! (default 3), `DMOVER_BENCH_DATASETS` (default `tiny,losf,large`),
//! `DMOVER_BENCH_TOOLS` (default: every one above that is installed),
//! `DMOVER_BENCH_VARIANTS` (`NAME=BINARY[:CP OPTIONS],...`: dmover builds or options
//! to compare, each with servers of its own; their rows are `tpc:NAME` and
//! `two-party:NAME`; default: this build, as `tpc` and `two-party`),
//! `DMOVER_BENCH_KEEP` (`0`: each copy is deleted right after its run; by default they
//! are kept until the end: on ext4 without a journal, files created within seconds of
//! many deletions are slow to create, which slowed the next run of any tool that
//! creates files, by 0.1 s in 2000; docs/benchmarks.md), `DMOVER_BENCH_TIMELINE` (set:
//! each dmover run also prints when B's received bytes passed 100 kB, half, 99 % and
//! all, and when B's server had written 99 % and all of its bytes).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use dmover_netlab::{LinkSpec, TopoLinkKind, Topology, TopologySpec};

/// A GridFTP server process, with the namespace's `/etc/netns` directory it made,
/// removed with it.
struct Srv(std::process::Child, PathBuf);

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if !self.1.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(str::to_string)
        .collect()
}

/// The datasets, made once under `root`: (name, files, bytes).
fn datasets(root: &Path, names: &[String]) -> Vec<(String, usize, u64)> {
    let mut out = Vec::new();
    for n in names {
        let dir = root.join(n);
        let (files, size) = match n.as_str() {
            "tiny" => (2000, 8 << 10),
            "losf" => (256, 1 << 20),
            "large" => (1, 512 << 20),
            other => panic!("unknown dataset {other}"),
        };
        if !dir.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..files {
                write_file(
                    &dir.join(format!("f{i:05}")),
                    i as u64 + 1,
                    size,
                    0o644,
                    1_000_000,
                );
            }
        }
        out.push((n.clone(), files, files as u64 * size as u64));
    }
    out
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Bytes B received on its interfaces other than loopback, read from
/// `/proc/PID/net/dev` of a process in B's namespace.
fn b_rx(pid: u32) -> u64 {
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
    dev.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.trim() != "lo")
        .filter_map(|(_, v)| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Bytes process `pid` wrote (`wchar` of `/proc/PID/io`).
fn wchar(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// [`timed`], and with `DMOVER_BENCH_TIMELINE` set, when B's received bytes passed
/// 100 kB, half, 99 % and all of what the run brought, and when `b_pid` (B's first
/// server) had written 99 % and all of what it wrote (sampled every 2 ms),
/// printed beside the exit.
fn timed_at_b(c: Command, b_pid: Option<u32>, what: &str) -> f64 {
    let Some(pid) = b_pid.filter(|_| std::env::var_os("DMOVER_BENCH_TIMELINE").is_some()) else {
        return timed(c);
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r0 = b_rx(pid);
    let w0 = wchar(pid);
    let t = Instant::now();
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                v.push((
                    t.elapsed().as_secs_f64(),
                    b_rx(pid) - r0,
                    wchar(pid).saturating_sub(w0),
                ));
                std::thread::sleep(Duration::from_millis(2));
            }
            v
        })
    };
    let secs = timed(c);
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let v = sampler.join().unwrap();
    let all = v.last().map_or(0, |s| s.1);
    let wall = v.last().map_or(0, |s| s.2);
    let wrote = |n: u64| v.iter().find(|s| s.2 >= n).map_or(f64::NAN, |s| s.0);
    if let Ok(path) = std::env::var("DMOVER_BENCH_TIMELINE_CSV") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        let mut last = u64::MAX;
        for (t, n, _) in &v {
            if *n != last {
                writeln!(f, "{what},{t:.4},{n}").unwrap();
                last = *n;
            }
        }
    }
    let at = |n: u64| v.iter().find(|s| s.1 >= n).map_or(f64::NAN, |s| s.0);
    eprintln!(
        "{what}: at B 100 kB {:.3} s, half {:.3}, 99 % {:.3}, all {:.3} ({all} B); \
         B's first server wrote 99 % by {:.3}, all by {:.3} ({wall} B); exit {secs:.3}",
        at(100_000),
        at(all / 2),
        at(all * 99 / 100),
        at(all),
        wrote(wall * 99 / 100),
        wrote(wall),
    );
    secs
}

fn timed(mut c: Command) -> f64 {
    let t = Instant::now();
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{:?}: {}",
        c,
        String::from_utf8_lossy(&o.stderr)
    );
    t.elapsed().as_secs_f64()
}

fn installed(programs: &[&str]) -> bool {
    programs.iter().all(|p| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn gridftp_installed() -> bool {
    installed(&["globus-url-copy", "globus-gridftp-server"])
}

/// An iperf3 server in `host`, on `addr`.
fn iperf3(topo: &Topology, host: &str, addr: &str) -> Srv {
    let child = topo
        .host(host)
        .unwrap()
        .command("iperf3")
        .args(["-s", "-B", addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    Srv(child, PathBuf::new())
}

/// Raw TCP from `a` to `b` (its address `b_addr`) on 4 streams with congestion control
/// `cc`, memory to memory: seconds from the sender's start until the receiver holds
/// every byte (`docs/bench/raw-tcp.py`).
fn raw_tcp(topo: &Topology, b_addr: &str, bytes: u64, cc: &str) -> f64 {
    let (start, end, ()) = raw_tcp_times(topo, b_addr, bytes, cc, || ());
    end - start
}

/// Raw TCP from A to B on 4 streams with bbr, memory to memory, and at the same time a
/// 16-way `cp -a` of the dataset `src` (its `files`) to `dst` (cold cache, no sync, as
/// the copies here): seconds from the first start to the last end. What the copy's
/// network half and its disk half cost this machine when other tools do them at once,
/// on the same cores; a comparison, not a bound, since those tools spend more CPU than
/// dmover (issue 13's `raw-and-copy`, docs/bench/tune-cells.sh).
fn raw_and_copy(
    topo: &Topology,
    b_addr: &str,
    bytes: u64,
    files: usize,
    src: &Path,
    dst: &Path,
) -> f64 {
    std::fs::create_dir_all(dst).unwrap();
    let per = files.div_ceil(16).max(1);
    let sh = format!(
        "cd '{}' && find . -type f -print0 | xargs -0 -P 16 -n {per} cp -a --parents -t '{}'",
        src.display(),
        dst.display()
    );
    // Started with the raw sender, once the receiver is ready; its clock starts once
    // Python is up, as the sender's does.
    let (start, end, cp) = raw_tcp_times(topo, b_addr, bytes, "bbr", || {
        Command::new("python3")
            .args([
                "-c",
                "import subprocess, sys, time\n\
                 s = time.monotonic()\n\
                 subprocess.run(sys.argv[1], shell=True, check=True)\n\
                 print(f'{s:.6f} {time.monotonic():.6f}')",
                &sh,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    });
    let o = cp.wait_with_output().unwrap();
    assert!(o.status.success(), "the local copy failed");
    let t: Vec<f64> = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    end.max(t[1]) - start.min(t[0])
}

/// The raw sender's start and the receiver's last byte, on the monotonic clock, and
/// what `beside` (called once the receiver is ready, just before the sender starts)
/// returned.
fn raw_tcp_times<T>(
    topo: &Topology,
    b_addr: &str,
    bytes: u64,
    cc: &str,
    beside: impl FnOnce() -> T,
) -> (f64, f64, T) {
    use std::io::BufRead;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench/raw-tcp.py");
    let mut r = topo
        .host("b")
        .unwrap()
        .command("python3")
        .arg(&script)
        .args(["r", b_addr, "17991", "4"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(r.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let other = beside();
    let o = topo
        .host("a")
        .unwrap()
        .command("python3")
        .arg(&script)
        .args(["s", b_addr, "17991", "4", &bytes.to_string(), cc])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let start: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let end: f64 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    r.wait().unwrap();
    (start, end, other)
}

/// A GridFTP server in `host`, anonymous, its data channels on `data` (its address on
/// the A–B link), as docs/peers.md says (a hosts file for the namespace, GLOBUS_HOSTNAME).
fn gridftp(topo: &Topology, host: &str, data: &str, dir: &Path) -> Srv {
    let ns = dmover_netlab::topology::netns_name(topo.name(), host);
    let etc = PathBuf::from("/etc/netns").join(&ns);
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("hosts"),
        format!("127.0.0.1 localhost\n{data} {host}\n"),
    )
    .unwrap();
    std::fs::write(etc.join("resolv.conf"), "").unwrap();
    let child = topo
        .host(host)
        .unwrap()
        .command("globus-gridftp-server")
        .env("GLOBUS_HOSTNAME", data)
        .args([
            "-p",
            "2811",
            "-data-interface",
            data,
            "-aa",
            "-anonymous-user",
            "root",
        ])
        .args(["-allow-root", "-threads", "2", "-l"])
        .arg(dir.join(format!("gridftp-{host}.log")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    Srv(child, etc)
}

#[test]
#[ignore = "a benchmark: run by hand (docs/benchmarks.md)"]
fn third_party_against_two_party_and_gridftp() {
    if !netlab_available("third_party_against_two_party_and_gridftp") {
        return;
    }
    let out = std::env::var("DMOVER_BENCH_OUT").unwrap_or_else(|_| "tpc-bench.csv".into());
    let rounds: usize = std::env::var("DMOVER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let base = tempfile::Builder::new()
        .prefix("dmover-tpcb-")
        .tempdir()
        .unwrap();
    let a_root = base.path().join("a");
    let b_root = base.path().join("b");
    std::fs::create_dir_all(&b_root).unwrap();
    let sets = datasets(
        &a_root,
        &env_list("DMOVER_BENCH_DATASETS", "tiny,losf,large"),
    );
    let token = base.path().join("token");
    std::fs::write(&token, "benchmark token\n").unwrap();
    let with_gridftp = gridftp_installed();
    let with_iperf3 = installed(&["iperf3"]);
    let with_python = installed(&["python3"]);
    if !with_gridftp {
        eprintln!("GridFTP not installed: measuring dmover only");
    }
    let mut csv = std::fs::File::create(&out).unwrap();
    writeln!(
        csv,
        "rtt_ms,dataset,files,bytes,tool,round,seconds,gbit_per_s"
    )
    .unwrap();
    for rtt in env_list("DMOVER_BENCH_RTTS", "0,50,200") {
        let ms: u64 = rtt.parse().unwrap();
        // The servers of each lab have keys of their own: a known-hosts file per lab.
        let kh = base.path().join(format!("known_hosts-{ms}"));
        let link = LinkSpec {
            rtt: Duration::from_millis(ms),
            rate_bps: Some(1_000_000_000),
            ..LinkSpec::default()
        };
        let spec = TopologySpec::new(&["c", "a", "b"])
            .link("c", "a", TopoLinkKind::Veth)
            .link("c", "b", TopoLinkKind::Veth)
            .link("a", "b", TopoLinkKind::Emulated(link));
        let topo = Topology::up(&format!("tb{}", std::process::id() % 10_000), &spec).unwrap();
        let a_ab = topo.addr("a", "b").unwrap().to_string();
        let b_ab = topo.addr("b", "a").unwrap().to_string();
        let a_c = topo.addr("a", "c").unwrap().to_string();
        let b_c = topo.addr("b", "c").unwrap().to_string();
        // Per variant: its binary, its port, its `cp` options, and its servers on A
        // and B.
        let variants: Vec<(String, String, u16, Vec<String>)> =
            match std::env::var("DMOVER_BENCH_VARIANTS") {
                Ok(v) => v
                    .split(',')
                    .enumerate()
                    .map(|(i, nb)| {
                        let (n, b) = nb.split_once('=').expect("NAME=BINARY[:OPTIONS]");
                        let (b, o) = b.split_once(':').unwrap_or((b, ""));
                        let o = o.split_whitespace().map(String::from).collect();
                        (format!(":{n}"), b.to_string(), 7700 + i as u16, o)
                    })
                    .collect(),
                Err(_) => vec![(String::new(), bin().to_string(), 7700, Vec::new())],
            };
        let _servers: Vec<_> = variants
            .iter()
            .flat_map(|(_, exe, port, _)| {
                [
                    ns_serve_with(
                        &topo,
                        "a",
                        &a_root,
                        &token,
                        &format!("{a_ab}:{port}"),
                        exe,
                        *port,
                    ),
                    ns_serve_with(
                        &topo,
                        "b",
                        &b_root,
                        &token,
                        &format!("{b_ab}:{port}"),
                        exe,
                        *port,
                    ),
                ]
            })
            .collect();
        let grid = with_gridftp.then(|| {
            (
                gridftp(&topo, "a", &a_ab, base.path()),
                gridftp(&topo, "b", &b_ab, base.path()),
            )
        });
        let raw = with_iperf3.then(|| iperf3(&topo, "b", &b_ab));
        for (name, files, bytes) in &sets {
            for round in 0..rounds {
                let mut tools: Vec<String> = variants
                    .iter()
                    .flat_map(|(n, ..)| [format!("tpc{n}"), format!("two-party{n}")])
                    .collect();
                let mut more = Vec::new();
                if grid.is_some() {
                    more.push("gridftp-tpc");
                }
                if raw.is_some() && name == "large" {
                    more.push("iperf3");
                }
                if with_python {
                    more.extend(["raw-tcp-cubic", "raw-tcp-bbr", "raw-and-copy"]);
                }
                tools.extend(more.into_iter().map(String::from));
                if let Ok(only) = std::env::var("DMOVER_BENCH_TOOLS") {
                    // `tpc` and `two-party` name every variant's.
                    tools.retain(|t| {
                        let kind = t.split(':').next().unwrap_or(t);
                        only.split(',').any(|o| o.trim() == kind || o.trim() == t)
                    });
                }
                for tool in &tools {
                    let dst = format!("{name}-{}-{round}", tool.replace(':', "-"));
                    drop_caches();
                    let (kind, variant) = tool.split_once(':').unwrap_or((tool, ""));
                    let (exe, port, opts) = variants
                        .iter()
                        .find(|(n, ..)| n.trim_start_matches(':') == variant)
                        .map(|(_, e, p, o)| (e.as_str(), *p, o.clone()))
                        .unwrap_or((bin(), 7700, Vec::new()));
                    let secs = match kind {
                        "tpc" => {
                            let mut c = topo.host("c").unwrap().command(exe);
                            c.args(["cp", "--quiet"])
                                .args(&opts)
                                .arg("--token-file")
                                .arg(&token)
                                .arg(format!("dmover://{a_c}:{port}/{name}"))
                                .arg(format!("dmover://{b_c}:{port}/{dst}"))
                                .env("DMOVER_KNOWN_HOSTS", &kh);
                            timed_at_b(c, topo.host("b").unwrap().pids().first().copied(), tool)
                        }
                        "two-party" => {
                            let mut c = topo.host("a").unwrap().command(exe);
                            c.args(["cp", "--quiet"])
                                .args(&opts)
                                .arg("--token-file")
                                .arg(&token)
                                .arg(a_root.join(name))
                                .arg(format!("dmover://{b_ab}:{port}/{dst}"))
                                .env("DMOVER_KNOWN_HOSTS", &kh);
                            timed_at_b(c, topo.host("b").unwrap().pids().first().copied(), tool)
                        }
                        "iperf3" => {
                            let mut c = topo.host("a").unwrap().command("iperf3");
                            c.args(["-c", &b_ab, "-P", "4", "-n", &bytes.to_string()]);
                            timed(c)
                        }
                        "raw-tcp-cubic" => raw_tcp(&topo, &b_ab, *bytes, "cubic"),
                        "raw-tcp-bbr" => raw_tcp(&topo, &b_ab, *bytes, "bbr"),
                        "raw-and-copy" => raw_and_copy(
                            &topo,
                            &b_ab,
                            *bytes,
                            *files,
                            &a_root.join(name),
                            &b_root.join(&dst),
                        ),
                        _ => {
                            // One pair per file; the destination directory first.
                            std::fs::create_dir_all(b_root.join(&dst)).unwrap();
                            let list = base.path().join("list");
                            let mut l = std::fs::File::create(&list).unwrap();
                            for i in 0..*files {
                                writeln!(
                                    l,
                                    "ftp://{a_c}:2811{}/f{i:05} ftp://{b_c}:2811{}/f{i:05}",
                                    a_root.join(name).display(),
                                    b_root.join(&dst).display()
                                )
                                .unwrap();
                            }
                            drop(l);
                            let mut c = topo.host("c").unwrap().command("globus-url-copy");
                            c.args(["-cd", "-p", "4", "-cc", "4", "-pp", "-fast", "-f"])
                                .arg(&list);
                            timed(c)
                        }
                    };
                    let gbit = *bytes as f64 * 8.0 / secs / 1e9;
                    eprintln!("{ms} ms {name} {tool} #{round}: {secs:.2} s, {gbit:.3} Gbit/s");
                    writeln!(
                        csv,
                        "{ms},{name},{files},{bytes},{tool},{round},{secs:.3},{gbit:.4}"
                    )
                    .unwrap();
                    if std::env::var("DMOVER_BENCH_KEEP").as_deref() == Ok("0") {
                        let _ = std::fs::remove_dir_all(b_root.join(&dst));
                    }
                }
            }
        }
        drop(grid);
        drop(raw);
        topo.down().unwrap();
    }
}
