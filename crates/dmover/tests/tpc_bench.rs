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
//!
//! cold cache (caches dropped before each run), wall time from start to exit (each
//! tool's destination writes included; dmover renames a file only once it is on
//! disk with `--fsync`, not used here by any tool). Rows go to `$DMOVER_BENCH_OUT`
//! (CSV). Knobs: `DMOVER_BENCH_RTTS` (ms, default `0,50,200`), `DMOVER_BENCH_ROUNDS`
//! (default 3), `DMOVER_BENCH_DATASETS` (default `tiny,losf,large`),
//! `DMOVER_BENCH_TOOLS` (default: every one above that is installed).

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
    end - start
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
        let _a = ns_serve(&topo, "a", &a_root, &token, &format!("{a_ab}:7700"));
        let _b = ns_serve(&topo, "b", &b_root, &token, &format!("{b_ab}:7700"));
        let grid = with_gridftp.then(|| {
            (
                gridftp(&topo, "a", &a_ab, base.path()),
                gridftp(&topo, "b", &b_ab, base.path()),
            )
        });
        let raw = with_iperf3.then(|| iperf3(&topo, "b", &b_ab));
        for (name, files, bytes) in &sets {
            for round in 0..rounds {
                let mut tools = vec!["tpc", "two-party"];
                if grid.is_some() {
                    tools.push("gridftp-tpc");
                }
                if raw.is_some() && name == "large" {
                    tools.push("iperf3");
                }
                if with_python {
                    tools.extend(["raw-tcp-cubic", "raw-tcp-bbr"]);
                }
                if let Ok(only) = std::env::var("DMOVER_BENCH_TOOLS") {
                    tools.retain(|t| only.split(',').any(|o| o.trim() == *t));
                }
                for tool in tools {
                    let dst = format!("{name}-{tool}-{round}");
                    drop_caches();
                    let secs = match tool {
                        "tpc" => {
                            let mut c = topo.host("c").unwrap().command(bin());
                            c.args(["cp", "--quiet", "--token-file"])
                                .arg(&token)
                                .arg(format!("dmover://{a_c}:7700/{name}"))
                                .arg(format!("dmover://{b_c}:7700/{dst}"))
                                .env("DMOVER_KNOWN_HOSTS", &kh);
                            timed(c)
                        }
                        "two-party" => {
                            let mut c = topo.host("a").unwrap().command(bin());
                            c.args(["cp", "--quiet", "--token-file"])
                                .arg(&token)
                                .arg(a_root.join(name))
                                .arg(format!("dmover://{b_ab}:7700/{dst}"))
                                .env("DMOVER_KNOWN_HOSTS", &kh);
                            timed(c)
                        }
                        "iperf3" => {
                            let mut c = topo.host("a").unwrap().command("iperf3");
                            c.args(["-c", &b_ab, "-P", "4", "-n", &bytes.to_string()]);
                            timed(c)
                        }
                        "raw-tcp-cubic" => raw_tcp(&topo, &b_ab, *bytes, "cubic"),
                        "raw-tcp-bbr" => raw_tcp(&topo, &b_ab, *bytes, "bbr"),
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
                    let _ = std::fs::remove_dir_all(b_root.join(&dst));
                }
            }
        }
        drop(grid);
        drop(raw);
        topo.down().unwrap();
    }
}
