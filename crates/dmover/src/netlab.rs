//! `dmover netlab`: emulated long-haul links for tests and benchmarks.
//!
//! `up` starts a background process (`dmover netlab forward`, hidden) that owns the
//! lab: it creates the two namespaces and the link, marks the lab ready under
//! `/run/dmover-netlab/NAME/`, and removes everything on SIGTERM, which `down` sends.

use std::ffi::OsString;
use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use dmover_netlab::state::{self, LabRecord};
use dmover_netlab::{Emulator, ForwarderStats, Host, LinkSpec};
use dmover_proto::units::{format_rate, parse_duration, parse_rate, parse_size};

/// `dmover netlab ...`
#[derive(Debug, Args)]
pub struct NetlabArgs {
    #[command(subcommand)]
    pub command: NetlabCommand,
}

#[derive(Debug, Subcommand)]
pub enum NetlabCommand {
    /// Create two network namespaces, a and b, joined by an emulated link; returns once
    /// the link passes traffic.
    Up(UpArgs),
    /// Run a command inside host a or b of a lab.
    Exec(ExecArgs),
    /// Remove a lab (or all of them), with anything still running in it.
    Down(DownArgs),
    /// Show a lab's forwarder statistics: traffic, drops, CPU, release lateness.
    Stats(StatsArgs),
    /// List the labs on this machine.
    List(ListArgs),
    /// Run a lab's forwarder in the foreground (what `up` starts in the background).
    #[command(hide = true)]
    Forward(LinkArgs),
}

/// The lab's name and link.
#[derive(Debug, Clone, Args)]
pub struct LinkArgs {
    /// Name of the lab (namespaces are dmnl-NAME-a and dmnl-NAME-b).
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Round-trip time the link adds, up to 10s, half each way (a duration with a
    /// unit: 100ms, 250us, 1.5s; a bare number other than 0 is refused).
    #[arg(long, default_value = "0", value_parser = parse_link_rtt)]
    pub rtt: Duration,
    /// Bottleneck rate each way, 1kbit to 10tbit (bits: 5gbit, 100mbit, 10gbps; bytes
    /// per second: 125MB/s) [default: unlimited].
    #[arg(long, value_parser = parse_link_rate)]
    pub rate: Option<u64>,
    /// Random loss per segment each way, as a percentage (0.01%) or a fraction.
    #[arg(long, default_value = "0", value_parser = parse_loss)]
    pub loss: f64,
    /// Bottleneck queue (tail-drop), a size (e.g. 4M; a bare number is bytes)
    /// [default: one bandwidth-delay product, >= 1M].
    #[arg(long, value_parser = parse_size)]
    pub queue: Option<u64>,
    /// Default TCP congestion control inside the lab (e.g. bbr, cubic).
    #[arg(long)]
    pub congestion: Option<String>,
    /// Maximum of tcp_rmem/tcp_wmem inside the lab, a size (e.g. 256M)
    /// [default: 4 x BDP, 32M..1G].
    #[arg(long, value_parser = parse_size)]
    pub tcp_buffer_max: Option<u64>,
    /// Do not pin the forwarder's two threads to the last two CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Run the forwarder at normal priority instead of SCHED_FIFO.
    #[arg(long)]
    pub no_realtime: bool,
    /// Seed of the random loss.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// What makes the link: the kernel's netem when it has it (auto), netem (fail
    /// without it), or the userspace forwarder.
    #[arg(long, value_enum, default_value = "auto")]
    pub emulator: EmulatorArg,
    /// MTU of the link's devices (both ends), 576 to 65535, for path-MTU tests
    /// [default: 1500].
    #[arg(long, value_parser = clap::value_parser!(u32).range(576..=65535))]
    pub mtu: Option<u32>,
    /// Forwarder without UDP segmentation offload: every datagram of a UDP_SEGMENT
    /// burst crosses on its own (only to measure what the offload saves).
    #[arg(long)]
    pub no_uso: bool,
}

/// `--emulator`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum EmulatorArg {
    /// netem if the kernel has it, else the forwarder.
    Auto,
    /// A veth pair shaped by netem and tbf.
    Netem,
    /// TUN devices and the userspace forwarder.
    Forwarder,
}

/// Parses `--rtt` of a link: a duration ([`parse_duration`]) of at most 10 s.
pub(crate) fn parse_link_rtt(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > Duration::from_secs(10) {
        return Err(format!("RTT {s:?} is above 10s"));
    }
    Ok(d)
}

/// Parses `--rate` of a link: a rate ([`parse_rate`]) from 1kbit to 10tbit.
pub(crate) fn parse_link_rate(s: &str) -> Result<u64, String> {
    let r = parse_rate(s)?;
    if !(1_000..=10_000_000_000_000).contains(&r) {
        return Err(format!("rate {s:?} is out of range (1kbit to 10tbit)"));
    }
    Ok(r)
}

/// Parses a loss probability: `X%` is a percentage, a bare number a fraction below 1.
/// Example: `0.01%` and `0.0001` are the same.
pub(crate) fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, pct) = match t.strip_suffix('%') {
        Some(n) => (n, true),
        None => (t, false),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid loss {s:?} (write 0.01% or 0.0001)"))?;
    let f = if pct { v / 100.0 } else { v };
    if !(0.0..1.0).contains(&f) || !f.is_finite() {
        return Err(format!(
            "loss {s:?} is out of range (0 to below 100 %; write percentages with a % sign)"
        ));
    }
    Ok(f)
}

impl From<EmulatorArg> for Emulator {
    fn from(e: EmulatorArg) -> Emulator {
        match e {
            EmulatorArg::Auto => Emulator::Auto,
            EmulatorArg::Netem => Emulator::Netem,
            EmulatorArg::Forwarder => Emulator::Forwarder,
        }
    }
}

impl LinkArgs {
    fn spec(&self) -> LinkSpec {
        LinkSpec {
            rtt: self.rtt,
            rate_bps: self.rate,
            loss: self.loss,
            queue_bytes: self.queue,
            congestion: self.congestion.clone(),
            tcp_buffer_max: self.tcp_buffer_max,
            pin: !self.no_pin,
            realtime: !self.no_realtime,
            seed: self.seed,
            emulator: self.emulator.into(),
            mtu: self.mtu,
            uso: !self.no_uso,
        }
    }

    /// The arguments that recreate these options for `dmover netlab forward`.
    fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--name".into(),
            self.name.clone(),
            "--rtt".into(),
            format!("{}ns", self.rtt.as_nanos()),
            "--loss".into(),
            format!("{}", self.loss),
            "--seed".into(),
            self.seed.to_string(),
            "--emulator".into(),
            format!("{:?}", self.emulator).to_lowercase(),
        ];
        if let Some(r) = self.rate {
            v.extend(["--rate".into(), format!("{r}bit")]);
        }
        if let Some(q) = self.queue {
            v.extend(["--queue".into(), q.to_string()]);
        }
        if let Some(c) = &self.congestion {
            v.extend(["--congestion".into(), c.clone()]);
        }
        if let Some(b) = self.tcp_buffer_max {
            v.extend(["--tcp-buffer-max".into(), b.to_string()]);
        }
        if self.no_pin {
            v.push("--no-pin".into());
        }
        if self.no_realtime {
            v.push("--no-realtime".into());
        }
        if let Some(m) = self.mtu {
            v.extend(["--mtu".into(), m.to_string()]);
        }
        if self.no_uso {
            v.push("--no-uso".into());
        }
        v
    }
}

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub link: LinkArgs,
    /// Print the hosts as JSON: {"a":{"netns":..,"addr":..},"b":{..}}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Side {
    /// Host a (10.200.0.1).
    A,
    /// Host b (10.200.0.2).
    B,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Name of the lab.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Which host.
    pub host: Side,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// Name of the lab.
    #[arg(long, default_value = "lab", conflicts_with = "all")]
    pub name: String,
    /// Remove every lab not owned by a running test, and stale namespaces.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Name of the lab.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Print the statistics as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print the records as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: NetlabArgs) -> anyhow::Result<ExitCode> {
    match a.command {
        NetlabCommand::Up(u) => up(u),
        NetlabCommand::Exec(e) => exec(e),
        NetlabCommand::Down(d) => down(d),
        NetlabCommand::Stats(s) => stats(s),
        NetlabCommand::List(l) => list(l),
        NetlabCommand::Forward(f) => forward(f),
    }
}

fn describe(spec: &LinkSpec) -> String {
    let mut s = format!("rtt {:?}", spec.rtt);
    match spec.rate_bps {
        Some(r) => {
            s += &format!(
                ", rate {}, queue {:.1} MB",
                format_rate(r),
                spec.effective_queue_bytes() as f64 / 1e6
            )
        }
        None => s += ", rate unlimited",
    }
    if spec.loss > 0.0 {
        s += &format!(", loss {}%", spec.loss * 100.0);
    }
    if let Some(c) = &spec.congestion {
        s += &format!(", congestion {c}");
    }
    if let Some(m) = spec.mtu {
        s += &format!(", mtu {m}");
    }
    s
}

fn up(u: UpArgs) -> anyhow::Result<ExitCode> {
    let name = &u.link.name;
    let spec = u.link.spec();
    dmover_netlab::validate_name(name)?;
    spec.validate()?;
    dmover_netlab::available().map_err(dmover_netlab::NetlabError::Unavailable)?;
    if let Some(rec) = state::read_record(name) {
        if rec.owner_alive() {
            return Err(dmover_netlab::NetlabError::Exists {
                name: name.clone(),
                pid: rec.pid,
            }
            .into());
        }
    }
    std::fs::create_dir_all(state::STATE_ROOT)
        .with_context(|| format!("creating {}", state::STATE_ROOT))?;
    let log_path = state::log_path(name);
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("locating the dmover binary")?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(exe)
            .args(["netlab", "forward"])
            .args(u.link.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal does not reach it.
            .process_group(0)
            .spawn()
            .context("starting the forwarder process")?
    };
    let deadline = Instant::now() + Duration::from_secs(60) + spec.rtt * 20;
    loop {
        if state::is_ready(name) && state::read_record(name).is_some_and(|r| r.pid == child.id()) {
            break;
        }
        if let Some(status) = child.try_wait().context("waiting for the forwarder")? {
            let mut msg = String::new();
            if let Ok(mut f) = std::fs::File::open(&log_path) {
                let _ = f.read_to_string(&mut msg);
            }
            let _ = std::fs::remove_file(&log_path);
            bail!(
                "the lab did not come up ({status}): {}",
                msg.trim().trim_start_matches("dmover: error: ")
            );
        }
        if Instant::now() > deadline {
            let _ = dmover_netlab::remove(name);
            bail!("the lab did not come up within {:?}", deadline.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let rec = state::read_record(name).context("reading the lab's record")?;
    // The daemon writes its first statistics before it marks the lab ready.
    let emulator = state::read_stats(name).map_or(spec.emulator, |s| s.emulator);
    if u.json {
        println!(
            "{}",
            serde_json::json!({ "name": name, "a": rec.a, "b": rec.b, "pid": rec.pid,
                                "emulator": emulator })
        );
    } else {
        println!("lab {name}: {} ({emulator})", describe(&spec));
        for (side, h) in [("a", &rec.a), ("b", &rec.b)] {
            println!("  {side}  {:<20} {}", h.netns, h.addr);
        }
        println!(
            "run commands with `dmover netlab exec{} a -- CMD`; remove with `dmover netlab down{}`",
            if name == "lab" {
                String::new()
            } else {
                format!(" --name {name}")
            },
            if name == "lab" {
                String::new()
            } else {
                format!(" --name {name}")
            },
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn record(name: &str) -> anyhow::Result<LabRecord> {
    dmover_netlab::validate_name(name)?;
    state::read_record(name)
        .ok_or_else(|| dmover_netlab::NetlabError::NotFound(name.to_string()).into())
}

fn exec(e: ExecArgs) -> anyhow::Result<ExitCode> {
    let rec = record(&e.name)?;
    let host: &Host = match e.host {
        Side::A => &rec.a,
        Side::B => &rec.b,
    };
    let (prog, args) = e.command.split_first().expect("clap requires a command");
    // Become the command (through `ip netns exec`): same pid, signals reach it, its
    // exit status is ours.
    use std::os::unix::process::CommandExt;
    let err = host.command(prog).args(args).exec();
    Err(err).with_context(|| {
        format!(
            "running {prog:?} in {} (through `ip netns exec`)",
            host.netns
        )
    })
}

fn down(d: DownArgs) -> anyhow::Result<ExitCode> {
    if d.all {
        let removed = dmover_netlab::remove_all()?;
        if removed.is_empty() {
            eprintln!("dmover netlab: nothing to remove");
        } else {
            eprintln!("dmover netlab: removed {}", removed.join(", "));
        }
    } else {
        let last = state::read_stats(&d.name);
        dmover_netlab::remove(&d.name)?;
        match last {
            Some(s) => eprintln!("dmover netlab: removed lab {}; {}", d.name, summary(&s)),
            None => eprintln!("dmover netlab: removed lab {}", d.name),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One line about the forwarder's life.
fn summary(s: &ForwarderStats) -> String {
    if s.emulator == Emulator::Netem {
        return format!(
            "kernel netem/tbf for {:.1} s (its counters: `tc -s qdisc` in the namespaces)",
            s.elapsed_seconds
        );
    }
    format!(
        "forwarder {:.1} s, {:.0} % of a core (busiest thread {:.0} %), UDP offload {}{}",
        s.elapsed_seconds,
        s.cpu_cores() * 100.0,
        s.busiest_thread_cpu() * 100.0,
        if s.uso { "on" } else { "off" },
        s.limited()
            .map_or(String::new(), |w| format!("; FORWARDER-LIMITED ({w})"))
    )
}

fn stats(s: StatsArgs) -> anyhow::Result<ExitCode> {
    let rec = record(&s.name)?;
    let Some(st) = state::read_stats(&s.name) else {
        bail!(
            "lab {} has no statistics (only labs made by `dmover netlab up` write them; \
             owner pid {})",
            s.name,
            rec.pid
        );
    };
    if s.json {
        let mut doc = serde_json::to_value(&st)?;
        if let Some(o) = doc.as_object_mut() {
            o.insert("schema".into(), crate::output::SCHEMA.into());
            o.insert("dmover_version".into(), env!("CARGO_PKG_VERSION").into());
        }
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("lab {}: {}; {}", s.name, describe(&rec.spec), summary(&st));
    if st.emulator == Emulator::Netem {
        for (side, h) in [("a", &rec.a), ("b", &rec.b)] {
            let out = Command::new("tc")
                .args([
                    "-n",
                    &h.netns,
                    "-s",
                    "qdisc",
                    "show",
                    "dev",
                    dmover_netlab::DEVICE,
                ])
                .output()
                .context("running tc")?;
            println!("  {side} egress ({}):", h.netns);
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                println!("    {line}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    for (dir, d) in [("a->b", &st.a_to_b), ("b->a", &st.b_to_a)] {
        println!(
            "  {dir}: {} packets ({} segments), {:.3} GB out, mean {:.3} Gbit/s; drops: {} loss, \
             {} queue, {} overflow; CPU {:.1} s; release lateness mean {:.0} us, p50 <= {:.0} us, \
             p99 <= {:.0} us, max {:.0} us{}",
            d.packets_in,
            d.segments_in,
            d.bytes_out as f64 / 1e9,
            d.bytes_out as f64 * 8.0 / st.elapsed_seconds.max(1e-9) / 1e9,
            d.loss_drops,
            d.queue_drops,
            d.overflow_drops,
            d.cpu_seconds,
            d.late_mean_us,
            d.late_p50_us,
            d.late_p99_us,
            d.late_max_us,
            if d.failed { "; FAILED" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn list(l: ListArgs) -> anyhow::Result<ExitCode> {
    let labs = dmover_netlab::list();
    if l.json {
        println!("{}", serde_json::to_string_pretty(&labs)?);
        return Ok(ExitCode::SUCCESS);
    }
    if labs.is_empty() {
        eprintln!("dmover netlab: no labs");
    }
    for r in labs {
        println!(
            "{:<16} {:<8} pid {:<8} {} {}",
            r.name,
            format!("{:?}", r.kind).to_lowercase(),
            r.pid,
            if r.owner_alive() { "up   " } else { "stale" },
            describe(&r.spec)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn forward(f: LinkArgs) -> anyhow::Result<ExitCode> {
    let spec = f.spec();
    dmover_netlab::daemon::run(&f.name, &spec, |lab| {
        tracing::info!("netlab {}: up ({})", lab.name(), describe(lab.spec()));
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_values() {
        assert_eq!(parse_link_rtt("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_link_rtt("0"), Ok(Duration::ZERO));
        assert_eq!(parse_link_rtt("10s"), Ok(Duration::from_secs(10)));
        assert!(parse_link_rtt("100").unwrap_err().contains("needs a unit"));
        assert!(parse_link_rtt("10.001s").unwrap_err().contains("above 10s"));
        assert_eq!(parse_link_rate("5gbit"), Ok(5_000_000_000));
        assert_eq!(parse_link_rate("1kbit"), Ok(1_000));
        assert_eq!(parse_link_rate("10tbit"), Ok(10_000_000_000_000));
        assert!(
            parse_link_rate("999bit")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(
            parse_link_rate("11tbit")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(parse_link_rate("1gb").unwrap_err().contains("1gbit"));
    }

    #[test]
    fn losses() {
        assert_eq!(parse_loss("1%"), Ok(0.01));
        assert!((parse_loss("0.01%").unwrap() - 0.0001).abs() < 1e-12);
        assert_eq!(parse_loss("0.02"), Ok(0.02));
        assert_eq!(parse_loss("0"), Ok(0.0));
        assert!(parse_loss("1").is_err());
        assert!(parse_loss("100%").is_err());
        assert!(parse_loss("NaN").is_err());
        assert!(parse_loss("x").is_err());
    }

    #[test]
    fn forward_arguments_parse_back() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            link: LinkArgs,
        }
        let t = T::parse_from([
            "t", "--rtt", "12.5ms", "--rate", "1.25GB/s", "--queue", "4M",
        ]);
        let again = T::parse_from(std::iter::once("t".to_string()).chain(t.link.to_args()));
        assert_eq!(again.link.rtt, Duration::from_micros(12_500));
        assert_eq!(again.link.rate, Some(10_000_000_000));
        assert_eq!(again.link.queue, Some(4 << 20));
    }
}
