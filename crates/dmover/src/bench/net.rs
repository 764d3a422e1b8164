//! `dmover bench net HOST`: memory-to-memory throughput through dmover's own transport
//! against a `dmover serve`, with iperf3's number beside it when iperf3 is installed.
//! `dmover bench net --rtt …` measures over emulated links instead: per RTT, a `dmover
//! netlab` lab with `dmover serve` and `iperf3 -s` in namespace b and the client (this
//! process, on a thread inside namespace a) in a.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use dmover_bench::plot::{Figure, Lines, Panel, Series, XAxis};
use dmover_bench::report::{Report, find_program, round_sig, size_label, tool_version};
use dmover_bench::stats::Summary;
use dmover_core::client::Client;
use dmover_core::engine::Run;
use dmover_core::memtest::{MemTestOptions, ZeroCopyOutcome};
use dmover_core::session::TransferOptions;
use dmover_net::tcp::SocketOptions;
use dmover_proto::control::{DataProtection, MemDirection};
use serde_json::{Map, Value, json};

use super::common::{self, OutputArgs, Progress, num, row, text};
use super::interrupt;
use super::transfer::{self, DmoverServer, LinkRate, Place, Rtt};
use crate::env::Env;

/// Arguments of `dmover bench net`.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// The server: HOST or HOST:PORT of a `dmover serve` (port 7700 by default); not
    /// with --rtt, which starts its own.
    #[arg(required_unless_present = "rtt", conflicts_with = "rtt")]
    pub host: Option<String>,
    /// Emulated round-trip times instead of HOST (e.g. 0,50,200; bare numbers are ms
    /// here, or give a unit: 500us, 1.5ms, 0.2s):
    /// per value a `dmover netlab` link (root, /dev/net/tun) with `dmover serve` and
    /// `iperf3 -s` on one side and this client on the other; `loopback` measures a
    /// server started on 127.0.0.1.
    #[arg(long, value_delimiter = ',', value_parser = transfer::rtt_item)]
    pub rtt: Vec<Rtt>,
    /// Bottleneck rate of the emulated links, each way (e.g. 1gbit, 5gbit, 125MB/s,
    /// unlimited).
    #[arg(long, default_value = "1gbit", value_parser = transfer::link_rate)]
    pub rate: LinkRate,
    /// Random loss per segment on the emulated links (0.01% or a fraction).
    #[arg(long, default_value = "0", value_parser = crate::netlab::parse_loss)]
    pub loss: f64,
    /// Stream counts to measure.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',', value_parser = common::count_item)]
    pub streams: Vec<usize>,
    /// Seconds each measurement sends.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Times each point is measured; rows give the median and the spread.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Zero-copy sends (MSG_ZEROCOPY) on the sending side: off, on, or both.
    #[arg(long, default_value = "off,on", value_delimiter = ',', value_parser = on_off)]
    pub zerocopy: Vec<bool>,
    /// Directions: push (client to server), pull (server to client), or both.
    #[arg(long, default_value = "push", value_delimiter = ',', value_parser = direction)]
    pub direction: Vec<Dir>,
    /// Payload bytes per frame (a size: 4M, 1M).
    #[arg(long, default_value = "4M", value_parser = dmover_proto::units::parse_size)]
    pub chunk: u64,
    /// CRC32C every frame on both ends (shows what checksums cost).
    #[arg(long)]
    pub checksum: bool,
    /// TCP congestion control algorithms to measure (e.g. cubic,bbr) [default: the
    /// system's].
    #[arg(long, value_delimiter = ',')]
    pub congestion: Vec<String>,
    /// Socket buffer size for the data streams, e.g. 64M [default: kernel autotuning].
    #[arg(long, value_parser = dmover_proto::units::parse_size)]
    pub tcp_buffer: Option<u64>,
    /// File holding the server's token (or set DMOVER_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Pin the server's key in this known-hosts file [default: ~/.config/dmover/known_hosts].
    #[arg(long, env = "DMOVER_KNOWN_HOSTS")]
    pub known_hosts: Option<PathBuf>,
    /// Data stream protection to measure: plain, authenticated (dmover's default),
    /// encrypted; zero-copy needs plain.
    #[arg(long, default_value = "plain", value_delimiter = ',', value_parser = protection)]
    pub protection: Vec<DataProtection>,
    /// Also measure iperf3 (auto: when iperf3 is installed and HOST is an address of this
    /// machine, start `iperf3 -s` on it; off: never; HOST:PORT: an iperf3 server there).
    #[arg(long, default_value = "auto")]
    pub iperf3: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A direction on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server.
    Push,
    /// Server to client.
    Pull,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Push => "push",
            Dir::Pull => "pull",
        }
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s.trim() {
        "on" | "yes" | "true" => Ok(true),
        "off" | "no" | "false" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
}

fn protection(s: &str) -> Result<DataProtection, String> {
    match s.trim() {
        "plain" => Ok(DataProtection::Plain),
        "authenticated" | "auth" => Ok(DataProtection::Authenticated),
        "encrypted" | "encrypt" => Ok(DataProtection::Encrypted),
        _ => Err(format!("{s:?}: expected plain, authenticated or encrypted")),
    }
}

fn protection_name(p: DataProtection) -> &'static str {
    match p {
        DataProtection::Plain => "plain",
        DataProtection::Authenticated => "authenticated",
        DataProtection::Encrypted => "encrypted",
    }
}

fn direction(s: &str) -> Result<Dir, String> {
    match s.trim() {
        "push" | "send" => Ok(Dir::Push),
        "pull" | "recv" => Ok(Dir::Pull),
        _ => Err(format!("{s:?}: expected push or pull")),
    }
}

/// `HOST` or `HOST:PORT` with the default port filled in.
pub fn server_addr(host: &str) -> String {
    let bare_v6 = host.matches(':').count() > 1 && !host.starts_with('[');
    if bare_v6 {
        format!("[{host}]:{}", dmover_proto::DEFAULT_PORT)
    } else if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_string()
    } else {
        format!("{host}:{}", dmover_proto::DEFAULT_PORT)
    }
}

/// Adds rate columns from per-repeat Gbit/s samples.
fn add_rate(r: &mut Map<String, Value>, gbit: &[f64]) {
    let Some(s) = Summary::of(gbit) else {
        r.insert("repeats".into(), json!(0));
        return;
    };
    r.insert("repeats".into(), json!(s.n));
    r.insert("gbit_per_s".into(), json!(round_sig(s.median, 4)));
    r.insert("gbit_per_s_min".into(), json!(round_sig(s.min, 4)));
    r.insert("gbit_per_s_max".into(), json!(round_sig(s.max, 4)));
    r.insert("spread".into(), json!(round_sig(s.spread, 3)));
    let samples: Vec<f64> = gbit.iter().map(|&g| round_sig(g, 4)).collect();
    r.insert("gbit_samples".into(), json!(samples));
}

/// An `iperf3 -s` this run started; stopped when dropped.
struct IperfServer {
    child: Child,
}

impl Drop for IperfServer {
    fn drop(&mut self) {
        dmover_bench::peers::kill_group(&mut self.child);
    }
}

/// A free TCP port on `ip` (bound and released; a small race is harmless here).
fn free_port(ip: std::net::IpAddr) -> anyhow::Result<u16> {
    Ok(TcpListener::bind((ip, 0))
        .with_context(|| format!("finding a free port on {ip}"))?
        .local_addr()?
        .port())
}

/// Waits until something accepts connections on `addr`.
pub fn wait_listening(addr: SocketAddr, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// One iperf3 client run, retried while the server is still busy with the previous
/// one; Gbit/s received.
fn iperf3_run(
    addr: SocketAddr,
    streams: usize,
    secs: f64,
    zerocopy: bool,
    pull: bool,
    congestion: Option<&str>,
) -> anyhow::Result<f64> {
    let mut tries = 0;
    loop {
        match iperf3_once(addr, streams, secs, zerocopy, pull, congestion) {
            Err(e) if tries < 4 && format!("{e:#}").contains("connect") => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

fn iperf3_once(
    addr: SocketAddr,
    streams: usize,
    secs: f64,
    zerocopy: bool,
    pull: bool,
    congestion: Option<&str>,
) -> anyhow::Result<f64> {
    let mut c = Command::new("iperf3");
    c.args(["-c", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-P", &streams.to_string(), "-J"])
        .args(["-t", &format!("{}", secs.max(1.0).round())]);
    if zerocopy {
        c.arg("-Z");
    }
    if pull {
        c.arg("-R");
    }
    if let Some(cc) = congestion {
        c.args(["-C", cc]);
    }
    let out = c.output().context("running iperf3 -c")?;
    let v: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "iperf3 printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .context("iperf3's JSON has no end.sum_received.bits_per_second")
}

pub fn run(a: NetArgs, env: &Env) -> anyhow::Result<()> {
    let started = Instant::now();
    if !a.rtt.is_empty() {
        return run_rtt(a, env, started);
    }
    dmover_bench::peers::close_inherited_fds();
    let out_dir = a.output.dir("net")?;
    let host = a.host.clone().context("HOST is required without --rtt")?;
    let report = measure(&a, env, &host, &out_dir)?;
    let figure = a.output.plot.as_ref().map(|_| figure(&report));
    // No RTT column without --rtt.
    common::finish(report, started, &out_dir, &a.output, figure, &TABLE[1..])
}

/// The columns of the table printed at the end.
const TABLE: &[(&str, &str)] = &[
    ("rtt_ms", "RTT ms"),
    ("tool", "tool"),
    ("direction", "dir"),
    ("protection", "data"),
    ("streams", "streams"),
    ("zerocopy", "zc"),
    ("congestion", "cc"),
    ("gbit_per_s", "Gbit/s"),
    ("gbit_per_s_min", "min"),
    ("gbit_per_s_max", "max"),
    ("vs_iperf3", "vs iperf3"),
    ("zerocopy_copied_percent", "zc copied %"),
];

/// `--rtt`: per value, a lab with a server and `iperf3 -s` in b, [`measure`] run on a
/// thread inside a, its rows prefixed with the link's columns.
fn run_rtt(a: NetArgs, env: &Env, started: Instant) -> anyhow::Result<()> {
    let settings = transfer::link_settings(&a.rtt, a.rate, a.loss, None)?;
    interrupt::install().context("watching for Ctrl-C")?;
    dmover_bench::peers::close_inherited_fds();
    let out_dir = a.output.dir("net")?;
    let work = out_dir.join("links");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let token = work.join("token");
    transfer::write_token(&token)?;
    let root = work.join("root");
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let mut report = Report::new("net", &env.argv, Path::new("."));
    let result = (|| -> anyhow::Result<()> {
        for (i, setting) in settings.iter().enumerate() {
            interrupt::check()?;
            let label = setting
                .as_ref()
                .map_or_else(|| "loopback".to_string(), |s| transfer::rtt_label(s.rtt));
            eprintln!("link {}/{}: {label}", i + 1, settings.len());
            let lab = match setting {
                None => None,
                Some(spec) => Some(
                    dmover_netlab::Lab::up(&format!("bnet{}", std::process::id()), spec)
                        .with_context(|| format!("bringing up an emulated link ({label})"))?,
                ),
            };
            interrupt::check()?;
            let (place, ip) = match &lab {
                Some(l) => (
                    Place {
                        netns: Some(l.b().netns.clone()),
                    },
                    l.b().addr.to_string(),
                ),
                None => (Place::default(), "127.0.0.1".to_string()),
            };
            let server = DmoverServer::start(
                &place,
                &ip,
                &root,
                false,
                &token,
                &work.join(format!("server-{i}.log")),
            )?;
            let iperf = match (a.iperf3.as_str(), find_program("iperf3", &env.path)) {
                ("off", _) | (_, None) => None,
                _ => Some(start_iperf3_at(&place, &ip, lab.as_ref())?),
            };
            let mut sub = a.clone();
            sub.rtt.clear();
            sub.token_file = Some(token.clone());
            // A new server key per link (its own state dir) at the same address, maybe
            // on the same port: each link pins it in its own file.
            sub.known_hosts = Some(work.join(format!("known_hosts-{i}")));
            sub.iperf3 = iperf
                .as_ref()
                .map_or_else(|| a.iperf3.clone(), |(_, at)| at.to_string());
            let addr = server.addr.clone();
            let dir = out_dir.clone();
            let measured = match &lab {
                Some(l) => l.a().in_netns(move || measure(&sub, env, &addr, &dir))?,
                None => measure(&sub, env, &addr, &dir),
            }?;
            drop(iperf);
            drop(server);
            if report.rows.is_empty() {
                report.parameters = measured.parameters.clone();
                report.param(
                    "server",
                    match a.rate.0 {
                        Some(r) => {
                            format!("emulated links, {}", dmover_proto::units::format_rate(r))
                        }
                        None => "emulated links, unlimited rate".into(),
                    },
                );
                report.param(
                    "rtt",
                    settings
                        .iter()
                        .map(|s| {
                            s.as_ref()
                                .map_or("loopback".into(), |s| transfer::rtt_label(s.rtt))
                        })
                        .collect::<Vec<_>>(),
                );
                report.param("link_rate", a.rate.0.map(dmover_proto::units::format_rate));
                report.param("link_loss", a.loss);
            }
            report.tools.extend(measured.tools);
            for n in measured.notes {
                report.note(n);
            }
            for r in measured.rows {
                report.push(transfer::with_link_columns(setting.as_ref(), r));
            }
            if let Some(l) = lab {
                l.down().context("removing the emulated link")?;
            }
        }
        Ok(())
    })();
    if let Err(e) = &result {
        report.note(format!(
            "incomplete run (rows of finished links only): {e:#}"
        ));
    }
    let figure = a.output.plot.as_ref().map(|_| figure(&report));
    common::finish(report, started, &out_dir, &a.output, figure, TABLE)?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// Starts `iperf3 -s` at `place` on `ip` (without a lab: an address of this machine)
/// and waits until it listens (seen from host a of `lab` when there is one).
fn start_iperf3_at(
    place: &Place,
    ip: &str,
    lab: Option<&dmover_netlab::Lab>,
) -> anyhow::Result<(IperfServer, SocketAddr)> {
    let ipaddr: std::net::IpAddr = ip.parse().context("the server address")?;
    let port = match lab {
        // The lab's namespace is ours: any port is free there.
        Some(_) => 5201,
        None => free_port(ipaddr)?,
    };
    let mut c = place.command("iperf3");
    c.args(["-s", "-B", ip, "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = std::os::unix::process::CommandExt::process_group(&mut c, 0)
        .spawn()
        .context("starting iperf3 -s")?;
    let server = IperfServer { child };
    let addr = SocketAddr::new(ipaddr, port);
    let up = match lab {
        Some(l) => l
            .a()
            .in_netns(move || wait_listening(addr, Duration::from_secs(10)))?,
        None => wait_listening(addr, Duration::from_secs(10)),
    };
    if !up {
        bail!("iperf3 -s did not listen on {addr} within 10 s");
    }
    Ok((server, addr))
}

/// Measures every point against `host` (iperf3 beside it as `a.iperf3` says) and
/// returns the report, not yet written.
fn measure(a: &NetArgs, env: &Env, host: &str, out_dir: &Path) -> anyhow::Result<Report> {
    if !(0.2..=120.0).contains(&a.seconds) {
        bail!("--seconds must be between 0.2 and 120");
    }
    let chunk = u32::try_from(a.chunk)
        .ok()
        .filter(|c| dmover_proto::layout::validate_chunk_size(*c).is_ok());
    let Some(chunk) = chunk else {
        bail!(
            "--chunk {} is not a valid chunk size (64K..64M, a multiple of 4K)",
            a.chunk
        );
    };
    let server = server_addr(host);
    let addr: SocketAddr = server
        .to_socket_addrs()
        .with_context(|| format!("resolving {server}"))?
        .next()
        .with_context(|| format!("{server} has no address"))?;
    let mut report = Report::new("net", &env.argv, std::path::Path::new("."));
    report.param("server", &server);
    report.param("streams", &a.streams);
    report.param("seconds", a.seconds);
    report.param("repeats", a.repeats);
    report.param("zerocopy", &a.zerocopy);
    report.param(
        "directions",
        a.direction.iter().map(|d| d.name()).collect::<Vec<_>>(),
    );
    report.param("chunk", chunk);
    report.param("checksum", a.checksum);
    report.param("congestion", &a.congestion);
    report.param("tcp_buffer", a.tcp_buffer);
    report.param(
        "protection",
        a.protection
            .iter()
            .map(|&p| protection_name(p))
            .collect::<Vec<_>>(),
    );

    let base = TransferOptions {
        chunk_size: chunk,
        checksum: a.checksum,
        socket: SocketOptions {
            send_buffer: a.tcp_buffer.map(|b| b as usize),
            recv_buffer: a.tcp_buffer.map(|b| b as usize),
            congestion: None,
        },
        token: crate::resolve::token(a.token_file.as_deref(), env)?,
        trust: a
            .known_hosts
            .clone()
            .or_else(|| env.known_hosts())
            .map(dmover_net::tls::Trust::KnownHosts),
        ..TransferOptions::default()
    };
    let congestions: Vec<Option<String>> = if a.congestion.is_empty() {
        vec![None]
    } else {
        a.congestion.iter().cloned().map(Some).collect()
    };

    // iperf3 beside it.
    let mut iperf: Option<(Option<IperfServer>, SocketAddr)> = None;
    match a.iperf3.as_str() {
        "off" => {}
        spec => match find_program("iperf3", &env.path) {
            None => {
                report.tools.insert("iperf3".into(), "missing".into());
                report.note("iperf3 is not installed: no iperf3 rows (apt-get install iperf3)");
            }
            Some(_) => {
                report.tools.insert(
                    "iperf3".into(),
                    tool_version("iperf3", &["--version"]).unwrap_or_default(),
                );
                if spec == "auto" {
                    let local = TcpListener::bind((addr.ip(), 0)).is_ok();
                    if local {
                        match start_iperf3_at(&Place::default(), &addr.ip().to_string(), None) {
                            Ok((s, at)) => iperf = Some((Some(s), at)),
                            Err(e) => report.note(format!("no iperf3 rows: {e:#}")),
                        }
                    } else {
                        report.note(format!(
                            "{} is not an address of this machine: start `iperf3 -s` there \
                             and pass --iperf3 HOST:PORT for iperf3 rows",
                            addr.ip()
                        ));
                    }
                } else {
                    let at: SocketAddr = spec
                        .to_socket_addrs()
                        .ok()
                        .and_then(|mut i| i.next())
                        .with_context(|| format!("--iperf3 {spec}: not auto, off or HOST:PORT"))?;
                    iperf = Some((None, at));
                }
                if a.zerocopy.contains(&true) {
                    report.note("iperf3's zero-copy (-Z) sends with sendfile(2), dmover's with MSG_ZEROCOPY");
                }
            }
        },
    }

    let max_streams = a.streams.iter().copied().max().unwrap_or(1);
    let rt = crate::resolve::runtime(max_streams.min(128) as u16)?;
    let iperf_points = usize::from(iperf.is_some())
        * a.direction.len()
        * a.zerocopy.len()
        * congestions.len()
        * a.streams.len();
    let points = a.direction.len()
        * a.protection.len()
        * a.zerocopy.len()
        * congestions.len()
        * a.streams.len();
    let mut progress = Progress::new((points + iperf_points) as u64 * u64::from(a.repeats));
    eprintln!(
        "network test against {server}: {points} points x {} repeat(s) x {:.1} s; results in {}",
        a.repeats,
        a.seconds,
        out_dir.display()
    );
    for (&dir, &prot) in a
        .direction
        .iter()
        .flat_map(|d| a.protection.iter().map(move |p| (d, p)))
    {
        for &zc in &a.zerocopy {
            for cc in &congestions {
                for &n in &a.streams {
                    interrupt::check()?;
                    let label = format!(
                        "{} {} {n} stream(s), zero-copy {}, {}",
                        dir.name(),
                        protection_name(prot),
                        if zc { "on" } else { "off" },
                        cc.as_deref().unwrap_or("default cc")
                    );
                    let mut opts = base.clone();
                    opts.streams = n as u16;
                    opts.socket.congestion = cc.clone();
                    opts.protection = prot;
                    let client = Client::new(opts, 1);
                    let t = MemTestOptions {
                        direction: match dir {
                            Dir::Push => MemDirection::ToServer,
                            Dir::Pull => MemDirection::FromServer,
                        },
                        duration: Duration::from_secs_f64(a.seconds),
                        zerocopy: zc,
                        congestion: cc.clone(),
                    };
                    let mut gbit = Vec::new();
                    let mut cpu = Vec::new();
                    let mut outcome = ZeroCopyOutcome::Off;
                    for rep in 0..a.repeats {
                        progress.start(&format!("dmover {label} (repeat {})", rep + 1));
                        let c0 = dmover_bench::report::cpu_seconds();
                        let r = rt
                            .block_on(client.memtest(&server, &t, Run::new()))
                            .with_context(|| format!("memory-to-memory test with {server}"))?;
                        cpu.push(
                            (dmover_bench::report::cpu_seconds() - c0) / r.seconds.max(1e-9)
                                * 100.0,
                        );
                        progress.done(&format!("dmover {label}: {:.2} Gbit/s", r.gbit_per_s()));
                        gbit.push(r.gbit_per_s());
                        outcome = r.zerocopy;
                    }
                    let (zc_text, copied) = zerocopy_columns(&outcome, &mut report);
                    let mut r = row(&[
                        ("tool", json!("dmover")),
                        ("direction", json!(dir.name())),
                        ("protection", json!(protection_name(prot))),
                        ("streams", json!(n)),
                        ("zerocopy", json!(zc)),
                        ("congestion", json!(cc.as_deref().unwrap_or("default"))),
                        ("chunk", json!(size_label(u64::from(chunk)))),
                        ("checksum", json!(a.checksum)),
                    ]);
                    add_rate(&mut r, &gbit);
                    r.insert(
                        "client_cpu_percent".into(),
                        json!(round_sig(Summary::of(&cpu).map_or(0.0, |s| s.median), 3)),
                    );
                    r.insert("zerocopy_result".into(), json!(zc_text));
                    r.insert("zerocopy_copied_percent".into(), copied);
                    report.push(r);

                    // iperf3 once per point, not once per protection.
                    let first_prot = a.protection.first() == Some(&prot);
                    if let Some((_, at)) = iperf.as_ref().filter(|_| first_prot) {
                        let mut gbit = Vec::new();
                        let mut err = None;
                        for rep in 0..a.repeats {
                            progress.start(&format!("iperf3 {label} (repeat {})", rep + 1));
                            match iperf3_run(*at, n, a.seconds, zc, dir == Dir::Pull, cc.as_deref())
                            {
                                Ok(g) => {
                                    progress.done(&format!("iperf3 {label}: {g:.2} Gbit/s"));
                                    gbit.push(g);
                                }
                                Err(e) => {
                                    progress.done(&format!("iperf3 {label}: failed: {e:#}"));
                                    err = Some(format!("{e:#}"));
                                }
                            }
                        }
                        if let Some(e) = err {
                            report.note(format!("iperf3 failed on some runs: {e}"));
                        }
                        let mut r = row(&[
                            ("tool", json!("iperf3")),
                            ("direction", json!(dir.name())),
                            ("protection", json!("none")),
                            ("streams", json!(n)),
                            ("zerocopy", json!(zc)),
                            ("congestion", json!(cc.as_deref().unwrap_or("default"))),
                            ("chunk", json!("128K")),
                            ("checksum", json!(false)),
                        ]);
                        add_rate(&mut r, &gbit);
                        report.push(r);
                    }
                }
            }
        }
    }
    progress.finish();
    drop(iperf);
    add_ratio_to_iperf(&mut report);
    Ok(report)
}

/// What zero-copy did in a point, as its row says it (and a note when it was not
/// available, or the kernel copied most sends).
fn zerocopy_columns(outcome: &ZeroCopyOutcome, report: &mut Report) -> (String, Value) {
    match outcome {
        ZeroCopyOutcome::Off => ("off".to_string(), Value::Null),
        ZeroCopyOutcome::Unsupported(e) => {
            report.note(format!(
                "zero-copy not available ({e}): ordinary sends used"
            ));
            (format!("unsupported: {e}"), Value::Null)
        }
        ZeroCopyOutcome::Remote => ("on (server side, not reported)".to_string(), Value::Null),
        ZeroCopyOutcome::Used(s) => {
            let pct = s.copied as f64 * 100.0 / s.completed.max(1) as f64;
            if pct > 50.0 {
                report.note(
                    "the kernel copied most zero-copy sends (it always does on \
                     loopback and for devices without scatter-gather): zero-copy \
                     rows measure MSG_ZEROCOPY's overhead, not its gain",
                );
            }
            (
                format!("on: {} sends, {:.0}% copied by the kernel", s.sends, pct),
                json!(round_sig(pct, 3)),
            )
        }
    }
}

/// Gives every dmover row the ratio to the iperf3 row of the same point.
fn add_ratio_to_iperf(report: &mut Report) {
    let key = |r: &Map<String, Value>| {
        (
            text(r, "direction"),
            text(r, "streams"),
            text(r, "zerocopy"),
            text(r, "congestion"),
        )
    };
    let iperf: Vec<_> = report
        .rows
        .iter()
        .filter(|r| text(r, "tool") == "iperf3")
        .filter_map(|r| Some((key(r), num(r, "gbit_per_s")?)))
        .collect();
    for r in report
        .rows
        .iter_mut()
        .filter(|r| text(r, "tool") == "dmover")
    {
        let k = key(r);
        let ratio = iperf
            .iter()
            .find(|(ik, _)| *ik == k)
            .and_then(|(_, g)| Some(num(r, "gbit_per_s")? / g.max(1e-12)));
        r.insert(
            "vs_iperf3".into(),
            ratio.map_or(Value::Null, |x| json!(round_sig(x, 3))),
        );
    }
    if !report.columns.iter().any(|c| c == "vs_iperf3") {
        report.columns.push("vs_iperf3".into());
    }
}

/// Throughput against streams, a panel per direction, a line per tool and setting.
fn figure(report: &Report) -> Figure {
    let mut panels = Vec::new();
    let mut dirs: Vec<String> = report.rows.iter().map(|r| text(r, "direction")).collect();
    dirs.dedup();
    for d in dirs {
        let mut series: Vec<Series> = Vec::new();
        for r in report.rows.iter().filter(|r| text(r, "direction") == d) {
            let name = format!(
                "{}{}{}{}{}",
                match text(r, "link").as_str() {
                    "" => String::new(),
                    "loopback" => "loopback: ".to_string(),
                    l => format!("RTT {l}: "),
                },
                text(r, "tool"),
                match text(r, "protection").as_str() {
                    "plain" | "none" | "" => String::new(),
                    p => format!(", {p}"),
                },
                if text(r, "zerocopy") == "true" {
                    ", zero-copy"
                } else {
                    ""
                },
                match text(r, "congestion").as_str() {
                    "default" => String::new(),
                    cc => format!(", {cc}"),
                }
            );
            if let Some(pt) = common::streams_point(r) {
                common::add_point(&mut series, name, pt);
            }
        }
        panels.push(Panel::Lines(Lines {
            title: format!("{d}, memory to memory"),
            x_label: "TCP streams".into(),
            y_label: "Gbit/s".into(),
            x_axis: XAxis::Log2Count,
            series,
        }));
    }
    Figure {
        title: format!(
            "dmover bench net: {}",
            report
                .parameters
                .get("server")
                .and_then(Value::as_str)
                .unwrap_or("")
        ),
        panels,
    }
}
