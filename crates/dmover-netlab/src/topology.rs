//! Labs of more than two hosts: named hosts, each in its own network namespace, and
//! links between pairs of them.
//!
//! # Addressing: a full mesh of direct links, no routing
//!
//! Each link is a point-to-point subnet of its own: link `i` (0-based, in the order of
//! [`TopologySpec::links`]) is `10.201.(i+1).0/24`, its first-named end `.1`, its
//! second `.2`. A host reaches a peer only over the link between them
//! ([`Topology::addr`]`(peer, from)` is the peer's address on that link); nothing is
//! routed and no host forwards packets, so a test that wants C to reach A and B and A
//! to reach B directly names the three links c–a, c–b and a–b. Traffic between A and B
//! then never touches C's interfaces, which a test can check with the per-interface
//! counters ([`Topology::counters`]).
//!
//! Inside host `h`, the interface of the link to peer `p` is named `dm-p`
//! ([`interface_name`]).
//!
//! # Links
//!
//! - [`TopoLinkKind::Veth`]: a plain veth pair; the kernel moves the packets, no
//!   thread of ours does.
//! - [`TopoLinkKind::Tbf`]: a veth pair whose two ends' egress is shaped by the
//!   kernel's `tbf` qdisc (token bucket at the given rate, tail-drop queue), so each
//!   direction has that bottleneck. Still no thread of ours. Where the kernel has no
//!   tbf, bringing the topology up fails with [`NetlabError::Unavailable`] saying so.
//! - [`TopoLinkKind::Emulated`]: the two-host lab's emulated link ([`LinkSpec`]: RTT,
//!   rate, loss) made by the userspace forwarder over a TUN device at each end: two
//!   threads per link (blocked in `poll` while idle), so use it only where a delay or
//!   loss is the point.
//!
//! # Cleanup
//!
//! As for a two-host [`crate::Lab`]: the topology records itself under
//! `/run/dmover-netlab/NAME/` (the record's `a` and `b` are the ends of its first
//! link, its `topology` the whole spec), its namespaces are `dmnl-NAME-HOST`, and they
//! are removed on drop, by [`Topology::down`], and by [`crate::remove`] /
//! [`crate::remove_all`] when the owner died.

use std::ffi::OsStr;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::forwarder::{DirectionConfig, Forwarder};
use crate::state::{LabKind, LabRecord};
use crate::{
    Host, LinkSpec, NETNS_PREFIX, NetlabError, available, netem, ns, pin_cpus, state, tun,
    validate_name,
};

/// Most links a topology may have (one `/24` each under `10.201.0.0/16`).
pub const MAX_LINKS: usize = 250;

/// How a link between two hosts is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopoLinkKind {
    /// A plain veth pair.
    Veth,
    /// A veth pair with the kernel's `tbf` on both ends: `rate_bps` each direction,
    /// a tail-drop queue of `queue_bytes` [default: 1 MiB].
    Tbf {
        /// Rate in bits per second, each direction.
        rate_bps: u64,
        /// The queue in bytes.
        queue_bytes: Option<u64>,
    },
    /// The userspace forwarder's emulated link (TUN devices; delay, rate, loss).
    Emulated(LinkSpec),
}

/// A link between hosts `a` and `b` (names from [`TopologySpec::hosts`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopoLink {
    /// One end (address `.1` of the link's subnet).
    pub a: String,
    /// The other end (address `.2`).
    pub b: String,
    /// How the link is made.
    pub kind: TopoLinkKind,
}

/// Hosts and the links between them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopologySpec {
    /// Host names: 1 to 8 of `a-z 0-9`, distinct.
    pub hosts: Vec<String>,
    /// Links between distinct hosts, at most one per pair.
    pub links: Vec<TopoLink>,
}

impl TopologySpec {
    /// Hosts `names` and no links yet.
    pub fn new(names: &[&str]) -> Self {
        TopologySpec {
            hosts: names.iter().map(|n| n.to_string()).collect(),
            links: Vec::new(),
        }
    }

    /// Adds a link between `a` and `b`.
    pub fn link(mut self, a: &str, b: &str, kind: TopoLinkKind) -> Self {
        self.links.push(TopoLink {
            a: a.to_string(),
            b: b.to_string(),
            kind,
        });
        self
    }

    /// Checks names, links and their parameters, without touching the machine.
    pub fn validate(&self) -> Result<(), NetlabError> {
        let bad = |m: String| Err(NetlabError::Invalid(m));
        if self.hosts.len() < 2 {
            return bad("a topology needs at least two hosts".into());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if !valid_host_name(h) {
                return bad(format!(
                    "host name {h:?} must be 1 to 8 characters of a-z 0-9"
                ));
            }
            if self.hosts[..i].contains(h) {
                return bad(format!("host {h:?} is named twice"));
            }
        }
        if self.links.is_empty() {
            return bad("a topology needs at least one link".into());
        }
        if self.links.len() > MAX_LINKS {
            return bad(format!("{} links: at most {MAX_LINKS}", self.links.len()));
        }
        for (i, l) in self.links.iter().enumerate() {
            for end in [&l.a, &l.b] {
                if !self.hosts.contains(end) {
                    return bad(format!("link {}–{} names unknown host {end:?}", l.a, l.b));
                }
            }
            if l.a == l.b {
                return bad(format!("link {}–{} joins a host to itself", l.a, l.b));
            }
            if self.links[..i].iter().any(|o| same_pair(o, &l.a, &l.b)) {
                return bad(format!("hosts {} and {} are linked twice", l.a, l.b));
            }
            match &l.kind {
                TopoLinkKind::Veth => {}
                TopoLinkKind::Tbf {
                    rate_bps,
                    queue_bytes,
                } => tbf_spec(*rate_bps, *queue_bytes).validate()?,
                TopoLinkKind::Emulated(spec) => spec.validate()?,
            }
        }
        Ok(())
    }

    /// Index of the link between `x` and `y`.
    fn link_index(&self, x: &str, y: &str) -> Option<usize> {
        self.links.iter().position(|l| same_pair(l, x, y))
    }
}

fn same_pair(l: &TopoLink, x: &str, y: &str) -> bool {
    (l.a == x && l.b == y) || (l.a == y && l.b == x)
}

/// Whether `h` is a valid host name: 1 to 8 of `a-z 0-9` (no `-`, so a namespace
/// `dmnl-LAB-HOST` names its lab unambiguously).
pub fn valid_host_name(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 8
        && h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The namespace of host `host` of lab `lab`: `dmnl-LAB-HOST`.
pub fn netns_name(lab: &str, host: &str) -> String {
    format!("{NETNS_PREFIX}{lab}-{host}")
}

/// The interface inside a host for its link to `peer`: `dm-PEER`.
pub fn interface_name(peer: &str) -> String {
    format!("dm-{peer}")
}

/// The address of end `end` (0: `a`, 1: `b`) of link `index`.
pub fn link_addr(index: usize, end: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, (index + 1) as u8, end as u8 + 1)
}

/// The two-host link spec a tbf link stands for (used for its `tc` arguments and
/// checks).
fn tbf_spec(rate_bps: u64, queue_bytes: Option<u64>) -> LinkSpec {
    LinkSpec {
        rate_bps: Some(rate_bps),
        queue_bytes,
        ..LinkSpec::default()
    }
}

/// One host of a topology: a network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopoHost {
    /// The host's name in the topology.
    pub name: String,
    /// Name of its network namespace (as `ip netns` knows it).
    pub netns: String,
}

impl TopoHost {
    /// A command that runs `program` inside this host's namespace (through `ip netns
    /// exec`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        ns::command(&self.netns, program)
    }

    /// Runs `f` on a thread inside this host's namespace (see [`Host::in_netns`]).
    pub fn in_netns<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetlabError> {
        ns::in_netns(&self.netns, f)
    }

    /// Processes running inside this host's namespace.
    pub fn pids(&self) -> Vec<u32> {
        ns::pids_in(&self.netns)
    }
}

/// Byte and packet counters of one interface (`/proc/net/dev` inside its namespace,
/// the same numbers as `/sys/class/net/IF/statistics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
}

impl IfCounters {
    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.rx_bytes + self.tx_bytes
    }

    /// What grew since `earlier`.
    pub fn since(&self, earlier: &IfCounters) -> IfCounters {
        IfCounters {
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            rx_packets: self.rx_packets.saturating_sub(earlier.rx_packets),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            tx_packets: self.tx_packets.saturating_sub(earlier.tx_packets),
        }
    }

    fn add(&mut self, o: &IfCounters) {
        self.rx_bytes += o.rx_bytes;
        self.rx_packets += o.rx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_packets += o.tx_packets;
    }
}

/// Parses `/proc/net/dev`: interface name and its counters.
pub fn parse_proc_net_dev(text: &str) -> Vec<(String, IfCounters)> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|f| f.parse().ok())
                .collect::<Option<_>>()?;
            if v.len() < 10 {
                return None;
            }
            Some((
                name.trim().to_string(),
                IfCounters {
                    rx_bytes: v[0],
                    rx_packets: v[1],
                    tx_bytes: v[8],
                    tx_packets: v[9],
                },
            ))
        })
        .collect()
}

/// A running topology. Dropping it tears everything down (also during a panic);
/// [`Topology::down`] does the same and reports what could not be removed.
pub struct Topology {
    name: String,
    spec: TopologySpec,
    hosts: Vec<TopoHost>,
    forwarders: Vec<Forwarder>,
    state_dir: PathBuf,
    torn_down: bool,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Topology {
    /// Creates topology `name` (a lab name: the same namespace of names as
    /// [`crate::Lab`]s); returns once a TCP connection crosses every link. A stale lab
    /// of the same name is removed first.
    pub fn up(name: &str, spec: &TopologySpec) -> Result<Topology, NetlabError> {
        validate_name(name)?;
        spec.validate()?;
        available().map_err(NetlabError::Unavailable)?;
        for l in &spec.links {
            if let TopoLinkKind::Emulated(LinkSpec {
                congestion: Some(cc),
                ..
            }) = &l.kind
            {
                crate::allow_congestion(cc)?;
            }
        }
        let hosts: Vec<TopoHost> = spec
            .hosts
            .iter()
            .map(|h| TopoHost {
                name: h.clone(),
                netns: netns_name(name, h),
            })
            .collect();
        let first = &spec.links[0];
        let end = |h: &str, e: usize| Host {
            netns: netns_name(name, h),
            addr: link_addr(0, e),
        };
        let mut rec = LabRecord::new(
            name,
            LabKind::Library,
            &end(&first.a, 0),
            &end(&first.b, 1),
            &LinkSpec::default(),
        );
        rec.topology = Some(spec.clone());
        let state_dir = state::claim(&rec)?;
        // From here on, dropping `topo` removes whatever was made.
        let mut topo = Topology {
            name: name.to_string(),
            spec: spec.clone(),
            hosts,
            forwarders: Vec::new(),
            state_dir,
            torn_down: false,
        };
        topo.build()?;
        Ok(topo)
    }

    fn build(&mut self) -> Result<(), NetlabError> {
        for host in &self.hosts {
            let ns = host.netns.as_str();
            ns::create(ns)?;
            let _ = ns::sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1");
            let _ = ns::sysctl(ns, "net/ipv6/conf/default/disable_ipv6", "1");
            ns::ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ns::sysctl(ns, "net/ipv4/tcp_no_metrics_save", "1")?;
            let _ = ns::sysctl(ns, "net/ipv4/tcp_fastopen", crate::FAST_OPEN);
            // The largest buffers any of the host's emulated links wants.
            let buf_max = self
                .spec
                .links
                .iter()
                .filter(|l| l.a == host.name || l.b == host.name)
                .filter_map(|l| match &l.kind {
                    TopoLinkKind::Emulated(s) => Some(s.effective_tcp_buffer_max()),
                    _ => None,
                })
                .max();
            if let Some(m) = buf_max {
                ns::sysctl(ns, "net/ipv4/tcp_rmem", &format!("4096 131072 {m}"))?;
                ns::sysctl(ns, "net/ipv4/tcp_wmem", &format!("4096 16384 {m}"))?;
            }
        }
        for i in 0..self.spec.links.len() {
            self.build_link(i)?;
        }
        for i in 0..self.spec.links.len() {
            self.probe(i)?;
        }
        Ok(())
    }

    fn build_link(&mut self, i: usize) -> Result<(), NetlabError> {
        let link = self.spec.links[i].clone();
        let (ns_a, ns_b) = (
            netns_name(&self.name, &link.a),
            netns_name(&self.name, &link.b),
        );
        // Inside a, the device toward b is named after b, and the other way round.
        let (dev_a, dev_b) = (interface_name(&link.b), interface_name(&link.a));
        match &link.kind {
            TopoLinkKind::Veth | TopoLinkKind::Tbf { .. } => {
                ns::ip(&[
                    "link", "add", &dev_a, "netns", &ns_a, "type", "veth", "peer", "name", &dev_b,
                    "netns", &ns_b,
                ])?;
                if let TopoLinkKind::Tbf {
                    rate_bps,
                    queue_bytes,
                } = &link.kind
                {
                    let spec = tbf_spec(*rate_bps, *queue_bytes);
                    for (ns, dev) in [(&ns_a, &dev_a), (&ns_b, &dev_b)] {
                        for call in netem::qdisc_args(&spec, dev) {
                            netem::tc(ns, &call).map_err(|e| no_tbf(e, &link))?;
                        }
                    }
                }
            }
            TopoLinkKind::Emulated(spec) => {
                let a = ns::in_netns(&ns_a, || tun::open(&dev_a, spec.uso))??;
                let b = ns::in_netns(&ns_b, || tun::open(&dev_b, spec.uso))??;
                let uso = a.uso && b.uso;
                let (a, b): (File, File) = (a.file, b.file);
                let cpus = pin_cpus(spec.pin);
                let dir = |name: String, cpu: Option<usize>, seed: u64| DirectionConfig {
                    name,
                    rate_bps: spec.rate_bps,
                    queue_bytes: spec.effective_queue_bytes(),
                    delay: spec.rtt / 2,
                    loss: spec.loss,
                    ring_bytes: spec.ring_bytes(),
                    cpu,
                    realtime: spec.realtime,
                    seed,
                };
                self.forwarders.push(Forwarder::start(
                    a,
                    b,
                    uso,
                    dir(format!("{}->{}", link.a, link.b), cpus.0, spec.seed),
                    dir(
                        format!("{}->{}", link.b, link.a),
                        cpus.1,
                        spec.seed ^ 0x9e37_79b9_7f4a_7c15,
                    ),
                )?);
            }
        }
        for (ns, dev, end) in [(&ns_a, &dev_a, 0), (&ns_b, &dev_b, 1)] {
            let cidr = format!("{}/24", link_addr(i, end));
            ns::ip(&["-n", ns, "addr", "add", &cidr, "dev", dev])?;
            if let TopoLinkKind::Emulated(LinkSpec { mtu: Some(mtu), .. }) = &link.kind {
                ns::ip(&["-n", ns, "link", "set", dev, "mtu", &mtu.to_string()])?;
            }
            ns::ip(&["-n", ns, "link", "set", dev, "txqueuelen", "10000", "up"])?;
        }
        Ok(())
    }

    /// Waits until a TCP connection crosses link `i` from its `a` end to its `b` end.
    fn probe(&self, i: usize) -> Result<(), NetlabError> {
        let link = &self.spec.links[i];
        let (from, to_host) = (self.host(&link.a)?, self.host(&link.b)?);
        let listener = to_host
            .in_netns(|| TcpListener::bind((link_addr(i, 1), 0)))?
            .map_err(|e| NetlabError::io(format!("probe: listening in {}", to_host.netns), e))?;
        let to: SocketAddr = listener
            .local_addr()
            .map_err(|e| NetlabError::io("probe: local address", e))?;
        let rtt = match &link.kind {
            TopoLinkKind::Emulated(s) => s.rtt,
            _ => Duration::ZERO,
        };
        let deadline = Instant::now() + Duration::from_secs(10) + rtt * 20;
        let mut last = String::new();
        while Instant::now() < deadline {
            match from
                .in_netns(|| TcpStream::connect_timeout(&to, Duration::from_secs(2) + rtt * 4))?
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
            detail: format!(
                "no TCP connection over link {}–{} from {} to {to}: {last}",
                link.a,
                link.b,
                link_addr(i, 0)
            ),
        })
    }

    /// The topology's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its description.
    pub fn spec(&self) -> &TopologySpec {
        &self.spec
    }

    /// The hosts, in the spec's order.
    pub fn hosts(&self) -> &[TopoHost] {
        &self.hosts
    }

    /// Host `name`.
    pub fn host(&self, name: &str) -> Result<&TopoHost, NetlabError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| NetlabError::Invalid(format!("no host {name:?} in {}", self.name)))
    }

    fn link_index(&self, x: &str, y: &str) -> Result<usize, NetlabError> {
        self.host(x)?;
        self.host(y)?;
        self.spec.link_index(x, y).ok_or_else(|| {
            NetlabError::Invalid(format!(
                "hosts {x} and {y} of {} have no link between them",
                self.name
            ))
        })
    }

    /// The address of `host` as `from` reaches it: `host`'s end of the link between
    /// them.
    pub fn addr(&self, host: &str, from: &str) -> Result<Ipv4Addr, NetlabError> {
        let i = self.link_index(host, from)?;
        Ok(link_addr(i, usize::from(self.spec.links[i].a != host)))
    }

    /// The counters of `host`'s interface toward `peer`.
    pub fn counters(&self, host: &str, peer: &str) -> Result<IfCounters, NetlabError> {
        self.link_index(host, peer)?;
        let dev = interface_name(peer);
        self.all_counters(host)?
            .into_iter()
            .find(|(n, _)| *n == dev)
            .map(|(_, c)| c)
            .ok_or_else(|| NetlabError::Invalid(format!("no interface {dev} in host {host}")))
    }

    /// The counters of all of `host`'s link interfaces together (loopback excluded).
    pub fn host_counters(&self, host: &str) -> Result<IfCounters, NetlabError> {
        let mut sum = IfCounters::default();
        for (n, c) in self.all_counters(host)? {
            if n.starts_with("dm-") {
                sum.add(&c);
            }
        }
        Ok(sum)
    }

    /// Every interface of `host` and its counters. Read from `/proc/thread-self/net/dev`
    /// on a thread inside the namespace (`/sys/class/net` shows the namespace sysfs was
    /// mounted in, not the reading thread's).
    pub fn all_counters(&self, host: &str) -> Result<Vec<(String, IfCounters)>, NetlabError> {
        let h = self.host(host)?;
        let text = h
            .in_netns(|| std::fs::read_to_string("/proc/thread-self/net/dev"))?
            .map_err(|e| NetlabError::io(format!("reading /proc/net/dev in {}", h.netns), e))?;
        Ok(parse_proc_net_dev(&text))
    }

    /// Tears the topology down, reporting anything that could not be removed.
    pub fn down(mut self) -> Result<(), NetlabError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), NetlabError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        for f in self.forwarders.drain(..) {
            f.stop();
        }
        let mut problems = Vec::new();
        for host in &self.hosts {
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

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("dmover netlab: {e}");
        }
    }
}

/// A `tc` failure adding tbf, said as "this kernel has no tbf" when that is why.
fn no_tbf(e: NetlabError, link: &TopoLink) -> NetlabError {
    match e {
        NetlabError::Command { command, stderr }
            if stderr.contains("Unknown qdisc")
                || stderr.contains("No such file")
                || stderr.contains("not found")
                || stderr.contains("Specified qdisc kind is unknown") =>
        {
            NetlabError::Unavailable(format!(
                "link {}–{} needs the kernel's tbf qdisc, which this kernel lacks \
                 (`{command}`: {stderr}); use a plain veth or an emulated link",
                link.a, link.b
            ))
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triangle() -> TopologySpec {
        TopologySpec::new(&["c", "a", "b"])
            .link("c", "a", TopoLinkKind::Veth)
            .link("c", "b", TopoLinkKind::Veth)
            .link(
                "a",
                "b",
                TopoLinkKind::Tbf {
                    rate_bps: 20_000_000,
                    queue_bytes: None,
                },
            )
    }

    #[test]
    fn a_triangle_is_valid_and_addressed_per_link() {
        let s = triangle();
        s.validate().unwrap();
        assert_eq!(s.link_index("a", "c"), Some(0));
        assert_eq!(s.link_index("b", "a"), Some(2));
        assert_eq!(link_addr(0, 0), Ipv4Addr::new(10, 201, 1, 1));
        assert_eq!(link_addr(2, 1), Ipv4Addr::new(10, 201, 3, 2));
        assert_eq!(netns_name("t1", "c"), "dmnl-t1-c");
        assert_eq!(interface_name("b"), "dm-b");
    }

    #[test]
    fn bad_topologies_are_refused() {
        let bad = [
            TopologySpec::new(&["a"]).link("a", "a", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "b"]),
            TopologySpec::new(&["a", "B"]).link("a", "B", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "x-y"]).link("a", "x-y", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "abcdefghi"]).link("a", "abcdefghi", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "a"]).link("a", "a", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "b"]).link("a", "z", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "b"]).link("a", "a", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "b"])
                .link("a", "b", TopoLinkKind::Veth)
                .link("b", "a", TopoLinkKind::Veth),
            TopologySpec::new(&["a", "b"]).link(
                "a",
                "b",
                TopoLinkKind::Tbf {
                    rate_bps: 10,
                    queue_bytes: None,
                },
            ),
            TopologySpec::new(&["a", "b"]).link(
                "a",
                "b",
                TopoLinkKind::Emulated(LinkSpec {
                    loss: 1.0,
                    ..LinkSpec::default()
                }),
            ),
        ];
        for s in bad {
            assert!(
                matches!(s.validate(), Err(NetlabError::Invalid(_))),
                "{s:?} passed"
            );
        }
    }

    #[test]
    fn a_kernel_without_tbf_is_said_so() {
        let link = &triangle().links[2];
        let e = no_tbf(
            NetlabError::Command {
                command: "tc -n x qdisc add dev dm-b root handle 2: tbf rate 20000000bit".into(),
                stderr: "Error: Specified qdisc kind is unknown.".into(),
            },
            link,
        );
        match e {
            NetlabError::Unavailable(m) => {
                assert!(m.contains("tbf qdisc") && m.contains("a–b"), "{m}")
            }
            e => panic!("{e}"),
        }
        // Other failures pass through as they are.
        let e = no_tbf(
            NetlabError::Command {
                command: "tc".into(),
                stderr: "RTNETLINK answers: Invalid argument".into(),
            },
            link,
        );
        assert!(matches!(e, NetlabError::Command { .. }), "{e}");
    }

    #[test]
    fn proc_net_dev_parses() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0\n  \
             dm-a: 5000 40 0 0 0 0 0 0 7000 50 0 0 0 0 0 0\n";
        let v = parse_proc_net_dev(text);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].0, "dm-a");
        assert_eq!(
            v[1].1,
            IfCounters {
                rx_bytes: 5000,
                rx_packets: 40,
                tx_bytes: 7000,
                tx_packets: 50
            }
        );
    }
}
