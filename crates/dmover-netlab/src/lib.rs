//! dmover netlab: emulated long-haul links between network namespaces.
//!
//! A [`Lab`] is two network namespaces, host `a` and host `b`, joined by an emulated
//! link with a round-trip time (0 to a few hundred ms), an optional bottleneck rate
//! with a tail-drop queue, and random loss. Tests and benchmarks run a server in one
//! host and a client in the other ([`Host::command`], [`Host::in_netns`]) and see the
//! link as a real long-haul path.
//!
//! A [`Topology`] is more hosts (e.g. `c`, `a`, `b`) joined pairwise by plain veth,
//! tbf-shaped veth or emulated links, with per-interface counters; see [`topology`].
//!
//! # How the link is made
//!
//! When the kernel has netem, the link is a veth pair with `netem` (delay, loss) and
//! `tbf` (rate, tail-drop queue) on each end ([`netem`]). netem is not on every
//! machine (nothing kernel-side on ours can delay a packet), so otherwise the link is
//! a userspace forwarder ([`Emulator`] picks; both model the same link):
//!
//! - Each namespace has a TUN device (`dmnl0`, 10.200.0.1/24 in `a`, .2 in `b`) opened
//!   with `IFF_VNET_HDR` and TCP segmentation offload, so the kernel hands over TCP
//!   super-packets of up to 64 KiB: the forwarder moves ~45× fewer packets than at MTU
//!   size and stays out of the way below ~5 Gbit/s on two cores.
//! - One thread per direction reads packets, runs them through a FIFO bottleneck
//!   (token-bucket rate, tail-drop queue of about one bandwidth-delay product by
//!   default) followed by half the RTT of delay, and holds them in a pre-allocated
//!   byte ring until their release time (release times are monotone, so the ring is
//!   the whole time-ordered queue).
//! - UDP segmentation offload too (`TUN_F_USO4 | TUN_F_USO6`, Linux 6.2+; the lab
//!   goes without on older kernels and says so in [`ForwarderStats::uso`]): a burst of
//!   datagrams a sender hands over in one `sendmsg` with `UDP_SEGMENT` (as QUIC stacks
//!   do) crosses as one super-packet (`VIRTIO_NET_HDR_GSO_UDP_L4`) instead of one read
//!   per ~1.3 KB datagram, so a QUIC transport is measured on the same footing as TCP.
//! - Loss is drawn per MSS segment (per datagram for UDP): a super-packet with a lost
//!   segment is cut, and only that segment goes (dropping whole super-packets would be
//!   ~45× the asked loss per event and cripple TCP); the rate counts the wire bytes of
//!   every segment, headers included.
//! - [`LinkSpec::mtu`] sets both devices' MTU, for path-MTU tests.
//! - Each namespace's `tcp_rmem`/`tcp_wmem` maxima are raised to fit the link
//!   (4 × bandwidth-delay product) and its default congestion control set if asked.
//!   Its `tcp_fastopen` is 3 ([`FAST_OPEN`]): connections that ask for TCP Fast Open
//!   (dmover's) may send data in their SYN to a listener that offers it (dmover's);
//!   other tools' connections are as on any host.
//!   `net.core.rmem_max`/`wmem_max` are global and only cap explicit `SO_RCVBUF`/
//!   `SO_SNDBUF`; the lab leaves them alone.
//! - The forwarder reports its CPU time and how late it released packets
//!   ([`Lab::stats`]): when those grow, the emulator, not the tool, is the limit
//!   ([`ForwarderStats::limited`] says when a measurement should not be trusted).
//!
//! # Cleanup
//!
//! Dropping a [`Lab`] (also while a panic unwinds) ends the processes left in its
//! namespaces, stops the forwarder (its TUN devices vanish with it) and deletes the
//! namespaces. A lab records itself under `/run/dmover-netlab/NAME/`, so one left by
//! a killed process is found and removed by [`remove`]/[`remove_all`] (`dmover netlab
//! down --all`) or when a lab of the same name comes up.
//!
//! ```no_run
//! use std::time::Duration;
//! use dmover_netlab::{Lab, LinkSpec};
//!
//! let spec = LinkSpec { rtt: Duration::from_millis(50), rate_bps: Some(1_000_000_000),
//!                       ..LinkSpec::default() };
//! let lab = Lab::up("example", &spec)?;
//! let status = lab.b().command("ping").args(["-c1", &lab.a().addr.to_string()]).status();
//! println!("{:?} {:?}", status, lab.stats());
//! lab.down()?;
//! # Ok::<(), dmover_netlab::NetlabError>(())
//! ```

pub mod daemon;
mod error;
mod forwarder;
pub mod netem;
pub mod ns;
pub mod packet;
pub mod ring;
pub mod shaper;
pub mod state;
pub mod topology;
pub mod tun;

use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use crate::error::NetlabError;
use crate::forwarder::{DirectionConfig, Forwarder};
pub use crate::forwarder::{DirectionStats, ForwarderStats};
use crate::state::{LabKind, LabRecord};
pub use crate::topology::{IfCounters, TopoHost, TopoLink, TopoLinkKind, Topology, TopologySpec};

/// Name of the TUN device inside each namespace.
pub const DEVICE: &str = "dmnl0";
/// Prefix of the namespaces a lab creates (`dmnl-NAME-a`, `dmnl-NAME-b`).
pub const NETNS_PREFIX: &str = "dmnl-";
/// Address of host `a`.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
/// Address of host `b`.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// Rate assumed for sizing buffers and the ring when the link has no rate limit.
const UNLIMITED_SIZING_BPS: u64 = 10_000_000_000;

/// What makes the link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Emulator {
    /// The kernel's netem when it has it, else the userspace forwarder.
    #[default]
    Auto,
    /// A veth pair with netem + tbf (see [`netem`]); fails when the link needs netem
    /// (a delay or loss) and the kernel lacks it.
    Netem,
    /// Two TUN devices and the userspace forwarder.
    Forwarder,
}

impl std::fmt::Display for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Emulator::Auto => "auto",
            Emulator::Netem => "kernel netem/tbf",
            Emulator::Forwarder => "userspace forwarder",
        })
    }
}

/// `net.ipv4.tcp_fastopen` in the lab's namespaces: bit 1, connections may use TCP
/// Fast Open; bit 2, listeners may offer it (off by default on Linux).
pub const FAST_OPEN: &str = "3";

/// What the emulated link looks like.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// Round-trip time added by the link (half in each direction).
    pub rtt: Duration,
    /// Bottleneck rate in bits per second, each direction (`None`: as fast as the
    /// forwarder goes, 10+ Gbit/s).
    pub rate_bps: Option<u64>,
    /// Probability that a segment is lost, 0 ≤ loss < 1, each direction.
    pub loss: f64,
    /// Bottleneck queue in bytes (tail-drop) [default: one bandwidth-delay product,
    /// at least 1 MiB]. Only meaningful with a rate.
    pub queue_bytes: Option<u64>,
    /// Default TCP congestion control inside both namespaces (e.g. `bbr`, `cubic`)
    /// [default: the machine's].
    pub congestion: Option<String>,
    /// Maximum of `tcp_rmem`/`tcp_wmem` inside both namespaces [default: 4 × the
    /// bandwidth-delay product, 32 MiB to 1 GiB].
    pub tcp_buffer_max: Option<u64>,
    /// Pin the two forwarder threads to the last CPUs of the machine (a → b on the
    /// last, b → a on the one before) [default: true].
    pub pin: bool,
    /// Run the forwarder threads under `SCHED_FIFO` (priority 10), so busy
    /// applications and builds on the machine cannot delay packets past their release
    /// time; they block in `poll` when idle, so this costs nothing then [default: true].
    pub realtime: bool,
    /// Seed of the loss draws (same seed, same loss pattern for the same packets;
    /// forwarder only).
    pub seed: u64,
    /// What makes the link [default: auto].
    #[serde(default)]
    pub emulator: Emulator,
    /// MTU of the link's devices (both ends), 576 to 65 535 bytes, for path-MTU
    /// tests [default: the device default, 1500].
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Ask the TUN devices for UDP segmentation offload, so bursts of datagrams sent
    /// with `UDP_SEGMENT` (QUIC stacks do) cross the forwarder as one super-packet
    /// instead of one read per datagram; off only to measure what it saves
    /// [default: true; forwarder only; kernels before 6.2 go without].
    #[serde(default = "yes")]
    pub uso: bool,
}

fn yes() -> bool {
    true
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec {
            rtt: Duration::ZERO,
            rate_bps: None,
            loss: 0.0,
            queue_bytes: None,
            congestion: None,
            tcp_buffer_max: None,
            pin: true,
            realtime: true,
            seed: 1,
            emulator: Emulator::Auto,
            mtu: None,
            uso: true,
        }
    }
}

impl LinkSpec {
    /// Bandwidth-delay product in bytes (at 10 Gbit/s when the rate is unlimited).
    pub fn bdp_bytes(&self) -> u64 {
        let rate = self.rate_bps.unwrap_or(UNLIMITED_SIZING_BPS) as u128;
        (rate * self.rtt.as_nanos() / 8 / 1_000_000_000) as u64
    }

    /// The bottleneck queue in bytes: as given, or one BDP (at least 1 MiB).
    pub fn effective_queue_bytes(&self) -> u64 {
        self.queue_bytes
            .unwrap_or_else(|| self.bdp_bytes().max(1 << 20))
    }

    /// The `tcp_rmem`/`tcp_wmem` maximum set in the namespaces.
    pub fn effective_tcp_buffer_max(&self) -> u64 {
        self.tcp_buffer_max
            .unwrap_or_else(|| (4 * self.bdp_bytes()).clamp(32 << 20, 1 << 30))
    }

    /// Checks the values, without touching the machine.
    pub fn validate(&self) -> Result<(), NetlabError> {
        if self.rtt > Duration::from_secs(10) {
            return Err(NetlabError::Invalid(format!(
                "RTT {:?} is above 10 s",
                self.rtt
            )));
        }
        if !(0.0..1.0).contains(&self.loss) || !self.loss.is_finite() {
            return Err(NetlabError::Invalid(format!(
                "loss {} is not a fraction in [0, 1)",
                self.loss
            )));
        }
        if let Some(r) = self.rate_bps {
            if !(1000..=10_000_000_000_000).contains(&r) {
                return Err(NetlabError::Invalid(format!(
                    "rate {r} bit/s is out of range (1 kbit/s to 10 Tbit/s)"
                )));
            }
        }
        if let Some(q) = self.queue_bytes {
            if !(4096..=(16u64 << 30)).contains(&q) {
                return Err(NetlabError::Invalid(format!(
                    "queue of {q} bytes is out of range (4 KiB to 16 GiB)"
                )));
            }
        }
        if let Some(b) = self.tcp_buffer_max {
            if !(65536..=(i32::MAX as u64)).contains(&b) {
                return Err(NetlabError::Invalid(format!(
                    "TCP buffer maximum of {b} bytes is out of range (64 KiB to 2 GiB)"
                )));
            }
        }
        if let Some(m) = self.mtu {
            if !(576..=65_535).contains(&m) {
                return Err(NetlabError::Invalid(format!(
                    "MTU {m} is out of range (576 to 65535 bytes)"
                )));
            }
        }
        if let Some(cc) = &self.congestion {
            if cc.is_empty() || !cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(NetlabError::Invalid(format!(
                    "congestion control {cc:?} is not a valid name"
                )));
            }
        }
        Ok(())
    }

    /// Ring capacity for one direction: the bottleneck queue plus a one-way delay at
    /// the link rate (10 Gbit/s when unlimited), with room for per-packet overhead, at
    /// least 8 MiB. The forwarder holds this much memory per direction.
    pub fn ring_bytes(&self) -> usize {
        let rate = self.rate_bps.unwrap_or(UNLIMITED_SIZING_BPS) as u128;
        let in_flight = (rate * (self.rtt.as_nanos() / 2) / 8 / 1_000_000_000) as u64;
        let queue = if self.rate_bps.is_some() {
            self.effective_queue_bytes()
        } else {
            0
        };
        let b = (in_flight + queue) + (in_flight + queue) / 4 + (8 << 20);
        b.min(4 << 30) as usize
    }
}

/// One end of a lab: a network namespace and its address on the link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Name of the network namespace (as `ip netns` knows it).
    pub netns: String,
    /// The host's address on the emulated link.
    pub addr: Ipv4Addr,
}

impl Host {
    /// A command that runs `program` inside this host's namespace (through `ip netns
    /// exec`); add arguments and spawn it as usual.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        ns::command(&self.netns, program)
    }

    /// Runs `f` on a thread inside this host's namespace: sockets it creates belong
    /// to the host and keep working from any thread afterwards.
    pub fn in_netns<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetlabError> {
        ns::in_netns(&self.netns, f)
    }

    /// Processes running inside this host's namespace.
    pub fn pids(&self) -> Vec<u32> {
        ns::pids_in(&self.netns)
    }
}

/// Checks that this machine can host a lab: root, `/dev/net/tun`, and `ip`.
pub fn available() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("needs root (to create network namespaces and TUN devices)".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        return Err(format!("cannot open /dev/net/tun: {e}"));
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`ip -V` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("`ip` (iproute2) is not installed: {e}")),
    }
}

/// Checks a lab name: 1 to 24 of `A-Z a-z 0-9 _ -`.
pub fn validate_name(name: &str) -> Result<(), NetlabError> {
    if name.is_empty()
        || name.len() > 24
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(NetlabError::Invalid(format!(
            "lab name {name:?} must be 1 to 24 characters of A-Z a-z 0-9 _ -"
        )));
    }
    Ok(())
}

/// The namespaces of lab `name`: `(dmnl-NAME-a, dmnl-NAME-b)`.
pub fn netns_names(name: &str) -> (String, String) {
    (
        format!("{NETNS_PREFIX}{name}-a"),
        format!("{NETNS_PREFIX}{name}-b"),
    )
}

/// A running lab: two namespaces and the link between them. Dropping it tears
/// everything down (also during a panic); [`Lab::down`] does the same and reports
/// what could not be removed.
pub struct Lab {
    name: String,
    spec: LinkSpec,
    a: Host,
    b: Host,
    emulator: Emulator,
    forwarder: Option<Forwarder>,
    started: Instant,
    state_dir: PathBuf,
    torn_down: bool,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .field("a", &self.a)
            .field("b", &self.b)
            .finish_non_exhaustive()
    }
}

impl Lab {
    /// Creates lab `name` with the link `spec`; returns once a TCP connection crosses
    /// the link. A stale lab of the same name (its owner died) is removed first.
    pub fn up(name: &str, spec: &LinkSpec) -> Result<Lab, NetlabError> {
        Self::up_as(name, spec, LabKind::Library)
    }

    /// [`Lab::up`], recording who owns the lab (a library user or the `dmover netlab`
    /// background process).
    pub fn up_as(name: &str, spec: &LinkSpec, kind: LabKind) -> Result<Lab, NetlabError> {
        validate_name(name)?;
        spec.validate()?;
        available().map_err(NetlabError::Unavailable)?;
        if let Some(cc) = &spec.congestion {
            allow_congestion(cc)?;
        }
        let (ns_a, ns_b) = netns_names(name);
        let a = Host {
            netns: ns_a,
            addr: ADDR_A,
        };
        let b = Host {
            netns: ns_b,
            addr: ADDR_B,
        };
        let state_dir = state::claim(&LabRecord::new(name, kind, &a, &b, spec))?;
        // From here on, dropping `lab` removes whatever was made.
        let mut lab = Lab {
            name: name.to_string(),
            spec: spec.clone(),
            a,
            b,
            emulator: spec.emulator,
            forwarder: None,
            started: Instant::now(),
            state_dir,
            torn_down: false,
        };
        lab.build()?;
        Ok(lab)
    }

    fn build(&mut self) -> Result<(), NetlabError> {
        let spec = self.spec.clone();
        let buf_max = spec.effective_tcp_buffer_max();
        for host in [&self.a, &self.b] {
            let ns = host.netns.as_str();
            ns::create(ns)?;
            // No IPv6 on the link: no router solicitations or DAD chatter.
            let _ = ns::sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1");
            let _ = ns::sysctl(ns, "net/ipv6/conf/default/disable_ipv6", "1");
            ns::ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ns::sysctl(ns, "net/ipv4/tcp_rmem", &format!("4096 131072 {buf_max}"))?;
            ns::sysctl(ns, "net/ipv4/tcp_wmem", &format!("4096 16384 {buf_max}"))?;
            // Each measurement starts from scratch, not from cached ssthresh/RTT.
            ns::sysctl(ns, "net/ipv4/tcp_no_metrics_save", "1")?;
            // Hosts that open and accept TCP Fast Open connections, as a DTN set up
            // per docs/tuning.md; tools that do not ask for it are unaffected.
            let _ = ns::sysctl(ns, "net/ipv4/tcp_fastopen", FAST_OPEN);
            if let Some(cc) = &spec.congestion {
                ns::sysctl(ns, "net/ipv4/tcp_congestion_control", cc)?;
            }
        }
        self.emulator = self.choose_emulator()?;
        tracing::debug!("netlab {}: link by {}", self.name, self.emulator);
        let tuns = match self.emulator {
            Emulator::Netem => {
                self.veth_link()?;
                None
            }
            _ => {
                let a = ns::in_netns(&self.a.netns, || tun::open(DEVICE, spec.uso))??;
                let b = ns::in_netns(&self.b.netns, || tun::open(DEVICE, spec.uso))??;
                Some((a, b))
            }
        };
        for host in [&self.a, &self.b] {
            let ns = host.netns.as_str();
            let cidr = format!("{}/24", host.addr);
            ns::ip(&["-n", ns, "addr", "add", &cidr, "dev", DEVICE])?;
            if let Some(mtu) = spec.mtu {
                ns::ip(&["-n", ns, "link", "set", DEVICE, "mtu", &mtu.to_string()])?;
            }
            ns::ip(&["-n", ns, "link", "set", DEVICE, "txqueuelen", "10000", "up"])?;
        }
        if let Some((tun_a, tun_b)) = tuns {
            let uso = tun_a.uso && tun_b.uso;
            let cpus = pin_cpus(spec.pin);
            let dir = |name: &str, cpu: Option<usize>, seed: u64| DirectionConfig {
                name: name.to_string(),
                rate_bps: spec.rate_bps,
                queue_bytes: spec.effective_queue_bytes(),
                delay: spec.rtt / 2,
                loss: spec.loss,
                ring_bytes: spec.ring_bytes(),
                cpu,
                realtime: spec.realtime,
                seed,
            };
            self.forwarder = Some(Forwarder::start(
                tun_a.file,
                tun_b.file,
                uso,
                dir("a->b", cpus.0, spec.seed),
                dir("b->a", cpus.1, spec.seed ^ 0x9e37_79b9_7f4a_7c15),
            )?);
        }
        self.probe()?;
        Ok(())
    }

    /// Resolves [`Emulator::Auto`] (netem if the kernel has it) and checks that a
    /// link asked of netem can be made: it needs netem only for a delay or loss (a
    /// rate alone is tbf's).
    fn choose_emulator(&self) -> Result<Emulator, NetlabError> {
        let needs_netem = !self.spec.rtt.is_zero() || self.spec.loss > 0.0;
        match self.spec.emulator {
            Emulator::Forwarder => Ok(Emulator::Forwarder),
            Emulator::Auto => Ok(match netem::probe(&self.a.netns) {
                Ok(()) => Emulator::Netem,
                Err(why) => {
                    tracing::debug!("netlab: no kernel netem ({why}); using the forwarder");
                    Emulator::Forwarder
                }
            }),
            Emulator::Netem if !needs_netem => Ok(Emulator::Netem),
            Emulator::Netem => match netem::probe(&self.a.netns) {
                Ok(()) => Ok(Emulator::Netem),
                Err(why) => Err(NetlabError::Unavailable(format!(
                    "this kernel has no netem ({why}); use the userspace forwarder \
                     (--emulator forwarder or auto)"
                ))),
            },
        }
    }

    /// The kernel link: a veth pair, its ends named [`DEVICE`] in each namespace, each
    /// end's egress shaped by [`netem::qdisc_args`].
    fn veth_link(&self) -> Result<(), NetlabError> {
        let (a, b) = (self.a.netns.as_str(), self.b.netns.as_str());
        ns::ip(&[
            "link", "add", DEVICE, "netns", a, "type", "veth", "peer", "name", DEVICE, "netns", b,
        ])?;
        for ns in [a, b] {
            if self.spec.loss > 0.0 {
                // netem drops whole packets: keep TCP's packets MSS-sized.
                ns::ip(&["-n", ns, "link", "set", DEVICE, "gso_max_segs", "1"])?;
            }
            for call in netem::qdisc_args(&self.spec, DEVICE) {
                netem::tc(ns, &call)?;
            }
        }
        Ok(())
    }

    /// Waits until a TCP connection from `a` to `b` succeeds (a few tries: the first
    /// SYN can be lost on a lossy link).
    fn probe(&self) -> Result<(), NetlabError> {
        let listener = self
            .b
            .in_netns(|| TcpListener::bind((self.b.addr, 0)))?
            .map_err(|e| NetlabError::io(format!("probe: listening in {}", self.b.netns), e))?;
        let to: SocketAddr = listener
            .local_addr()
            .map_err(|e| NetlabError::io("probe: local address", e))?;
        let per_try = Duration::from_secs(2) + self.spec.rtt * 4;
        let deadline = Instant::now() + Duration::from_secs(10) + self.spec.rtt * 20;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self
                .a
                .in_netns(|| TcpStream::connect_timeout(&to, per_try))?
            {
                Ok(_) => return Ok(()),
                Err(e) => {
                    last = e.to_string();
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Err(NetlabError::NoTraffic {
            name: self.name.clone(),
            detail: format!("no TCP connection from {} to {to}: {last}", self.a.addr),
        })
    }

    /// The lab's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The link's description.
    pub fn spec(&self) -> &LinkSpec {
        &self.spec
    }

    /// What makes the link ([`Emulator::Netem`] or [`Emulator::Forwarder`], never
    /// `Auto` once the lab is up).
    pub fn emulator(&self) -> Emulator {
        self.emulator
    }

    /// Host `a`.
    pub fn a(&self) -> &Host {
        &self.a
    }

    /// Host `b`.
    pub fn b(&self) -> &Host {
        &self.b
    }

    /// What the forwarder has done so far: packets, bytes, drops (loss and queue),
    /// its CPU time and how late it released packets (all zero for a netem link; its
    /// counters are in `tc -s qdisc` inside the namespaces).
    pub fn stats(&self) -> ForwarderStats {
        let mut s = self
            .forwarder
            .as_ref()
            .map(Forwarder::stats)
            .unwrap_or_default();
        s.emulator = self.emulator;
        if self.forwarder.is_none() {
            s.elapsed_seconds = self.started.elapsed().as_secs_f64();
        }
        s
    }

    /// Tears the lab down, reporting anything that could not be removed.
    pub fn down(mut self) -> Result<(), NetlabError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), NetlabError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        if let Some(f) = self.forwarder.take() {
            f.stop();
        }
        let mut problems = Vec::new();
        for host in [&self.a, &self.b] {
            if let Err(e) = ns::delete(&host.netns) {
                problems.push(e.to_string());
            }
        }
        if problems.is_empty() {
            state::release(&self.state_dir);
            Ok(())
        } else {
            Err(NetlabError::Teardown {
                name: self.name.clone(),
                detail: problems.join("; "),
            })
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("dmover netlab: {e}");
        }
    }
}

/// CPUs for the a→b and b→a threads: the last two the process may run on.
fn pin_cpus(pin: bool) -> (Option<usize>, Option<usize>) {
    if !pin {
        return (None, None);
    }
    let Ok(set) = rustix::thread::sched_getaffinity(None) else {
        return (None, None);
    };
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect();
    match cpus.as_slice() {
        [] | [_] => (None, None),
        [.., x, y] => (Some(*y), Some(*x)),
    }
}

/// Makes congestion control `cc` usable as a namespace's default: it must be
/// available, and namespaces may only use the ones the root namespace allows, so it
/// is added to `net.ipv4.tcp_allowed_congestion_control` when missing.
fn allow_congestion(cc: &str) -> Result<(), NetlabError> {
    let read = |k: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{k}"))
            .map(|s| s.trim().to_string())
            .map_err(|e| NetlabError::io(format!("reading net.ipv4.{k}"), e))
    };
    let available = read("tcp_available_congestion_control")?;
    let allowed = read("tcp_allowed_congestion_control")?;
    let err = || NetlabError::Congestion {
        wanted: cc.to_string(),
        available: available.clone(),
        allowed: allowed.clone(),
    };
    if !available.split_whitespace().any(|a| a == cc) {
        return Err(err());
    }
    if allowed.split_whitespace().any(|a| a == cc) {
        return Ok(());
    }
    let new = format!("{allowed} {cc}");
    std::fs::write(
        "/proc/sys/net/ipv4/tcp_allowed_congestion_control",
        new.as_bytes(),
    )
    .map_err(|_| err())?;
    tracing::info!("netlab: added {cc} to net.ipv4.tcp_allowed_congestion_control");
    Ok(())
}

/// Removes lab `name`, whoever made it: asks a `dmover netlab` background process to
/// stop, or, when the owner is gone, removes the namespaces and state itself. A lab
/// owned by a live library user (a running test) is left alone.
pub fn remove(name: &str) -> Result<(), NetlabError> {
    state::remove(name)
}

/// Removes every lab that is not owned by a live library user, and namespaces named
/// `dmnl-*` that no lab claims. Returns the names removed.
pub fn remove_all() -> Result<Vec<String>, NetlabError> {
    state::remove_all()
}

/// The labs recorded on this machine.
pub fn list() -> Vec<LabRecord> {
    state::list()
}
