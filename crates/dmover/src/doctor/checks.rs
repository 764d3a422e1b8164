//! The checks of this host: each reads files below a root and returns one [`Finding`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{Finding, Persist, Sizing, Status, fmt_bytes, human};

/// Where `dmover doctor` tells to put sysctl settings.
pub const SYSCTL_CONF: &str = "/etc/sysctl.d/90-dmover.conf";
/// Where it tells to load kernel modules at boot.
pub const MODULES_CONF: &str = "/etc/modules-load.d/dmover.conf";
/// Where it tells to raise the open-file limit.
pub const LIMITS_CONF: &str = "/etc/security/limits.d/90-dmover.conf";

const LINUX_TUNING: &str = "https://fasterdata.es.net/host-tuning/linux/";
const TUNING_100G: &str = "https://fasterdata.es.net/host-tuning/linux/100g-tuning/";
const THP_DOC: &str = "https://docs.kernel.org/admin-guide/mm/transhuge.html";
const MOUNT_DOC: &str = "https://man7.org/linux/man-pages/man8/mount.8.html";
const LIMITS_DOC: &str = "https://man7.org/linux/man-pages/man2/getrlimit.2.html";
const FS_SYSCTL_DOC: &str = "https://docs.kernel.org/admin-guide/sysctl/fs.html";
const IP_SYSCTL_DOC: &str = "https://docs.kernel.org/networking/ip-sysctl.html";

/// The largest value the kernel takes for the buffer limits (`INT_MAX`).
const INT_MAX: u64 = i32::MAX as u64;
/// MTU of jumbo frames.
const JUMBO: u32 = 9000;
/// Open files a data mover should be allowed (hard limit) and the system at least.
const NOFILE_WANT: u64 = 65536;
const FILE_MAX_WANT: u64 = 1 << 20;

/// This host, as seen through the files below `root`.
pub struct Host<'a> {
    root: &'a Path,
    sizing: &'a Sizing,
}

/// A network interface the MTU and IRQ checks look at.
struct Iface {
    name: String,
    /// Backed by a device (PCI, virtio, ...), not a bridge, veth or tunnel.
    physical: bool,
    /// A bond of physical interfaces.
    bond: bool,
    /// Up (or its state unknown).
    up: bool,
}

impl<'a> Host<'a> {
    pub fn new(root: &'a Path, sizing: &'a Sizing) -> Host<'a> {
        Host { root, sizing }
    }

    /// Every check of the host, in a fixed order; `path` is the export to look at.
    pub fn check_all(&self, path: Option<&Path>) -> Vec<Finding> {
        vec![
            self.core_max(
                "rmem_max",
                "net.core.rmem_max",
                "the most a program without CAP_NET_ADMIN may ask with SO_RCVBUF: dmover \
                 --tcp-buffer, and dmover raising a stream's buffer past tcp_rmem's maximum",
            ),
            self.core_max(
                "wmem_max",
                "net.core.wmem_max",
                "the most a program without CAP_NET_ADMIN may ask with SO_SNDBUF: dmover \
                 --tcp-buffer, and dmover raising a stream's buffer past tcp_wmem's maximum",
            ),
            self.tcp_mem(
                "tcp_rmem",
                "net.ipv4.tcp_rmem",
                "receive autotuning grows to its third value (past it, dmover raises a \
                 stream's buffer where it may: docs/tuning.md, \"Socket buffers\")",
            ),
            self.tcp_mem(
                "tcp_wmem",
                "net.ipv4.tcp_wmem",
                "send autotuning grows to its third value (past it, dmover raises a \
                 stream's buffer where it may: docs/tuning.md, \"Socket buffers\")",
            ),
            self.congestion(),
            self.qdisc(),
            self.mtu_probing(),
            self.fast_open(),
            self.governor(),
            self.nic_irqs(),
            self.mtu(),
            self.thp(),
            self.mount(path),
            self.nofile(),
            self.file_max(),
        ]
    }

    /// `abs` (an absolute path on the host) below the root.
    fn file(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    /// The trimmed contents of `abs`, or why not.
    fn read(&self, abs: &str) -> Result<String, String> {
        std::fs::read_to_string(self.file(abs))
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("cannot read {abs}: {}", io_reason(&e)))
    }

    /// A sysctl's value, from `/proc/sys`.
    fn sysctl(&self, name: &str) -> Result<String, String> {
        self.read(&format!("/proc/sys/{}", name.replace('.', "/")))
    }

    /// A numeric sysctl.
    fn sysctl_u64(&self, name: &str) -> Result<u64, String> {
        let v = self.sysctl(name)?;
        v.parse()
            .map_err(|_| format!("{name} = {v:?} is not a number"))
    }

    /// Names of the entries of directory `abs`, sorted.
    fn list(&self, abs: &str) -> Result<Vec<String>, String> {
        let rd = std::fs::read_dir(self.file(abs))
            .map_err(|e| format!("cannot read {abs}: {}", io_reason(&e)))?;
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    }

    /// Whether `abs` exists (a dangling symlink counts: fake trees have them).
    fn exists(&self, abs: &str) -> bool {
        std::fs::symlink_metadata(self.file(abs)).is_ok()
    }

    /// The least a buffer limit should be (2 x BDP: Linux keeps about half of a socket
    /// buffer for its own bookkeeping), and the value to set (the next power of two),
    /// both capped at `INT_MAX`.
    fn buffer_need(&self) -> (u64, u64) {
        let need = self.sizing.bdp_bytes.saturating_mul(2).min(INT_MAX);
        let set = need
            .checked_next_power_of_two()
            .unwrap_or(INT_MAX)
            .min(INT_MAX);
        (need, set)
    }

    fn sizing_text(&self) -> String {
        format!(
            "2 x the bandwidth-delay product of {} x {}",
            super::fmt_ms(self.sizing.rtt_ms),
            dmover_proto::units::format_rate(self.sizing.rate_bit_per_s)
        )
    }

    /// `net.core.rmem_max` / `wmem_max` against 2 x BDP.
    fn core_max(&self, id: &'static str, name: &str, role: &str) -> Finding {
        let mut f = Finding::new(id, LINUX_TUNING);
        let (need, set) = self.buffer_need();
        f.recommended = format!(
            "{name} >= {need}, {} ({}): {role}",
            self.sizing_text(),
            human(need)
        );
        match self.sysctl_u64(name) {
            Err(e) => f.seen = e,
            Ok(v) => {
                f.seen = format!("{name} = {}", fmt_bytes(v));
                if v >= need {
                    f.status = Status::Ok;
                } else {
                    f.status = Status::Warn;
                    f.fix.push(format!("sysctl -w {name}={set}"));
                    f.persist.push(sysctl_line(name, &set.to_string()));
                }
            }
        }
        f
    }

    /// `net.ipv4.tcp_rmem` / `tcp_wmem` (min, default, max): the max against 2 x BDP.
    fn tcp_mem(&self, id: &'static str, name: &str, role: &str) -> Finding {
        let mut f = Finding::new(id, LINUX_TUNING);
        let (need, set) = self.buffer_need();
        f.recommended = format!(
            "third value of {name} >= {need}, {} ({}): {role}",
            self.sizing_text(),
            human(need)
        );
        let v = match self.sysctl(name) {
            Err(e) => {
                f.seen = e;
                return f;
            }
            Ok(v) => v,
        };
        let nums: Vec<u64> = v.split_whitespace().map_while(|n| n.parse().ok()).collect();
        let [min, default, max] = nums[..] else {
            f.seen = format!("{name} = {v:?}: not three numbers");
            return f;
        };
        f.seen = format!("{name} = {min} {default} {max} (max {})", human(max));
        if max >= need {
            f.status = Status::Ok;
        } else {
            f.status = Status::Warn;
            let value = format!("{min} {default} {set}");
            f.fix.push(format!("sysctl -w {name}=\"{value}\""));
            f.persist.push(sysctl_line(name, &value));
        }
        f
    }

    /// Whether the kernel module of congestion control `alg` is installed.
    fn cc_module(&self, alg: &str) -> bool {
        let Ok(release) = self.read("/proc/sys/kernel/osrelease") else {
            return false;
        };
        ["", ".xz", ".zst", ".gz"].iter().any(|ext| {
            self.exists(&format!(
                "/lib/modules/{release}/kernel/net/ipv4/tcp_{alg}.ko{ext}"
            ))
        })
    }

    /// The default congestion control: BBR or H-TCP rather than CUBIC on long paths.
    fn congestion(&self) -> Finding {
        let mut f = Finding::new("congestion_control", LINUX_TUNING);
        f.recommended = "bbr (or htcp) as net.ipv4.tcp_congestion_control: they keep long, \
                         fast paths full where cubic backs off at each loss"
            .into();
        let current = match self.sysctl("net.ipv4.tcp_congestion_control") {
            Ok(c) => c,
            Err(e) => {
                f.seen = e;
                return f;
            }
        };
        let available = self
            .sysctl("net.ipv4.tcp_available_congestion_control")
            .unwrap_or_default();
        let available: Vec<&str> = available.split_whitespace().collect();
        f.seen = format!(
            "net.ipv4.tcp_congestion_control = {current}; available: {}",
            if available.is_empty() {
                "(unreadable)".to_string()
            } else {
                available.join(" ")
            }
        );
        if current == "bbr" || current == "htcp" {
            f.status = Status::Ok;
            return f;
        }
        let usable = |alg: &str| {
            if available.contains(&alg) {
                Some(true)
            } else if self.cc_module(alg) {
                Some(false)
            } else {
                None
            }
        };
        let Some((alg, loaded)) = ["bbr", "htcp"]
            .into_iter()
            .find_map(|a| usable(a).map(|l| (a, l)))
        else {
            f.status = Status::Info;
            f.seen
                .push_str("; bbr and htcp are not available (no module found)");
            f.recommended = "a kernel with bbr (CONFIG_TCP_CONG_BBR) or htcp; until then \
                             more streams (-P) make up for cubic on long paths"
                .into();
            return f;
        };
        f.status = Status::Warn;
        if !loaded {
            f.seen
                .push_str(&format!("; tcp_{alg} module installed, not loaded"));
            f.fix.push(format!("modprobe tcp_{alg}"));
            f.persist.push(Persist {
                file: MODULES_CONF.into(),
                line: format!("tcp_{alg}"),
            });
        }
        f.fix
            .push(format!("sysctl -w net.ipv4.tcp_congestion_control={alg}"));
        f.persist
            .push(sysctl_line("net.ipv4.tcp_congestion_control", alg));
        f
    }

    /// The default queueing discipline: fq, which paces (BBR relies on it).
    fn qdisc(&self) -> Finding {
        let mut f = Finding::new("default_qdisc", LINUX_TUNING);
        f.recommended = "net.core.default_qdisc = fq: fair queueing and pacing between \
                         streams (interfaces get it when their qdisc is next created: \
                         reboot, or `tc qdisc del dev IFACE root` to re-create it)"
            .into();
        match self.sysctl("net.core.default_qdisc") {
            Err(e) => f.seen = e,
            Ok(q) => {
                f.seen = format!("net.core.default_qdisc = {q}");
                if q == "fq" {
                    f.status = Status::Ok;
                } else {
                    f.status = Status::Warn;
                    f.fix.push("sysctl -w net.core.default_qdisc=fq".into());
                    f.persist.push(sysctl_line("net.core.default_qdisc", "fq"));
                }
            }
        }
        f
    }

    /// TCP MTU probing, recommended with jumbo frames (finds the path MTU when ICMP
    /// is filtered).
    fn mtu_probing(&self) -> Finding {
        let mut f = Finding::new("tcp_mtu_probing", LINUX_TUNING);
        f.recommended = "net.ipv4.tcp_mtu_probing = 1 with jumbo frames: TCP finds a \
                         smaller path MTU itself when ICMP is filtered"
            .into();
        match self.sysctl_u64("net.ipv4.tcp_mtu_probing") {
            Err(e) => f.seen = e,
            Ok(v) => {
                f.seen = format!("net.ipv4.tcp_mtu_probing = {v}");
                if v >= 1 {
                    f.status = Status::Ok;
                } else {
                    f.status = Status::Info;
                    f.fix.push("sysctl -w net.ipv4.tcp_mtu_probing=1".into());
                    f.persist.push(sysctl_line("net.ipv4.tcp_mtu_probing", "1"));
                }
            }
        }
        f
    }

    /// TCP Fast Open for dmover's connections (bit 1) and listeners (bit 2): a copy to
    /// a server that offers it starts a round trip sooner.
    fn fast_open(&self) -> Finding {
        let mut f = Finding::new("tcp_fastopen", IP_SYSCTL_DOC);
        f.recommended = "net.ipv4.tcp_fastopen with bits 1 and 2 (3): dmover's \
                         connections send their first bytes in the SYN to a server that \
                         offers Fast Open, and its listeners offer it, so a copy to a \
                         server it connected to before starts a round trip sooner; \
                         Linux's default 1 offers it to no one"
            .into();
        match self.sysctl_u64("net.ipv4.tcp_fastopen") {
            Err(e) => f.seen = e,
            Ok(v) => {
                f.seen = format!("net.ipv4.tcp_fastopen = {v}");
                if v & 3 == 3 {
                    f.status = Status::Ok;
                } else {
                    let want = (v | 3).to_string();
                    f.status = Status::Info;
                    f.fix
                        .push(format!("sysctl -w net.ipv4.tcp_fastopen={want}"));
                    f.persist.push(sysctl_line("net.ipv4.tcp_fastopen", &want));
                }
            }
        }
        f
    }

    /// The CPU frequency governor of every CPU: performance.
    fn governor(&self) -> Finding {
        let mut f = Finding::new("cpu_governor", TUNING_100G);
        f.recommended = "the performance governor on every CPU: a core that clocks down \
                         between interrupts costs throughput at 10G and more (without \
                         cpupower: write performance to each CPU's scaling_governor; to \
                         keep it: the cpupower service, or `tuned-adm profile \
                         network-throughput`)"
            .into();
        let cpus = match self.list("/sys/devices/system/cpu") {
            Ok(c) => c,
            Err(e) => {
                f.seen = e;
                return f;
            }
        };
        let mut by_gov: BTreeMap<String, usize> = BTreeMap::new();
        let mut n = 0;
        for cpu in cpus.iter().filter(|c| is_cpu_dir(c)) {
            n += 1;
            if let Ok(g) = self.read(&format!(
                "/sys/devices/system/cpu/{cpu}/cpufreq/scaling_governor"
            )) {
                *by_gov.entry(g).or_default() += 1;
            }
        }
        if by_gov.is_empty() {
            f.seen = format!(
                "no cpufreq scaling_governor for any of {n} CPUs (frequency scaling not \
                 exposed: a VM, or no cpufreq driver)"
            );
            return f;
        }
        let list: Vec<String> = by_gov.iter().map(|(g, c)| format!("{g} on {c}")).collect();
        f.seen = format!("governor {} of {n} CPUs", list.join(", "));
        if by_gov.len() == 1 && by_gov.contains_key("performance") {
            f.status = Status::Ok;
        } else {
            f.status = Status::Warn;
            f.fix.push("cpupower frequency-set -g performance".into());
        }
        f
    }

    /// The interfaces under `/sys/class/net`, loopback left out.
    fn ifaces(&self) -> Result<Vec<Iface>, String> {
        let names = self.list("/sys/class/net")?;
        Ok(names
            .into_iter()
            .filter(|n| n != "lo")
            .map(|name| {
                let dir = format!("/sys/class/net/{name}");
                let state = self.read(&format!("{dir}/operstate")).unwrap_or_default();
                Iface {
                    physical: self.exists(&format!("{dir}/device")),
                    bond: self.exists(&format!("{dir}/bonding")),
                    up: !matches!(
                        state.as_str(),
                        "down" | "lowerlayerdown" | "notpresent" | "dormant"
                    ),
                    name,
                }
            })
            .collect())
    }

    /// Jumbo frames (MTU 9000) on the interfaces data would cross: physical ones and
    /// bonds that are up. Bridges, veths, tunnels and loopback are left out.
    fn mtu(&self) -> Finding {
        let mut f = Finding::new("mtu", LINUX_TUNING);
        f.recommended = format!(
            "MTU {JUMBO} (jumbo frames) on DTN interfaces, and on every switch and router \
             of the path (check with `dmover doctor HOST` or `ping -M do -s 8972 HOST`); \
             keep it in the interface's configuration (netplan `mtu: 9000`, \
             NetworkManager `802-3-ethernet.mtu 9000`, ifcfg `MTU=9000`)"
        );
        let ifaces = match self.ifaces() {
            Ok(i) => i,
            Err(e) => {
                f.seen = e;
                return f;
            }
        };
        let mut seen = Vec::new();
        let mut small = Vec::new();
        let mut unreadable = 0;
        for i in ifaces.iter().filter(|i| (i.physical || i.bond) && i.up) {
            match self
                .read(&format!("/sys/class/net/{}/mtu", i.name))
                .ok()
                .and_then(|m| m.parse::<u32>().ok())
            {
                Some(m) => {
                    seen.push(format!("{} {m}", i.name));
                    if m < JUMBO {
                        small.push(i.name.clone());
                    }
                }
                None => {
                    seen.push(format!("{} ?", i.name));
                    unreadable += 1;
                }
            }
        }
        if seen.is_empty() {
            f.status = Status::Info;
            f.seen = format!(
                "no physical interface up (of {}; virtual ones are not checked)",
                ifaces.len()
            );
            f.recommended.clear();
            return f;
        }
        f.seen = format!("MTU {}", seen.join(", "));
        if !small.is_empty() {
            f.status = Status::Warn;
            for n in &small {
                f.fix.push(format!("ip link set dev {n} mtu {JUMBO}"));
            }
        } else if unreadable == 0 {
            f.status = Status::Ok;
        }
        f
    }

    /// Whether a process named irqbalance runs (from `/proc/PID/comm`).
    fn irqbalance_running(&self) -> Option<bool> {
        let pids = self.list("/proc").ok()?;
        Some(
            pids.iter()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
                .any(|p| {
                    self.read(&format!("/proc/{p}/comm"))
                        .is_ok_and(|c| c == "irqbalance")
                }),
        )
    }

    /// The IRQs of interface `name`: its device's MSI vectors, and the lines of
    /// `/proc/interrupts` named after it (`eth0`, `eth0-TxRx-3`) or after its device
    /// (`virtio2-input.0`: virtio's vectors belong to the PCI device above it).
    fn irqs_of(&self, name: &str, interrupts: &str) -> BTreeSet<u32> {
        let device = std::fs::read_link(self.file(&format!("/sys/class/net/{name}/device")))
            .ok()
            .and_then(|t| t.file_name().map(|n| format!("{}-", n.to_string_lossy())));
        let mut irqs: BTreeSet<u32> = self
            .list(&format!("/sys/class/net/{name}/device/msi_irqs"))
            .unwrap_or_default()
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        for line in interrupts.lines() {
            let Some((irq, rest)) = line.trim_start().split_once(':') else {
                continue;
            };
            let Ok(irq) = irq.parse::<u32>() else {
                continue;
            };
            let named = rest.split_whitespace().any(|w| {
                w == name
                    || w.strip_prefix(name)
                        .is_some_and(|r| r.starts_with('-') || r.starts_with('@'))
                    || device.as_deref().is_some_and(|d| w.starts_with(d))
            });
            if named {
                irqs.insert(irq);
            }
        }
        irqs
    }

    /// The CPUs IRQ `irq` is delivered to (the effective affinity where the kernel
    /// shows it).
    fn irq_cpus(&self, irq: u32) -> Option<BTreeSet<u32>> {
        self.read(&format!("/proc/irq/{irq}/effective_affinity_list"))
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| {
                self.read(&format!("/proc/irq/{irq}/smp_affinity_list"))
                    .ok()
            })
            .and_then(|s| parse_cpu_list(&s))
    }

    /// NIC receive queues and where their interrupts go.
    fn nic_irqs(&self) -> Finding {
        let mut f = Finding::new("nic_irqs", TUNING_100G);
        f.recommended = "several receive queues (`ethtool -L IFACE combined N`, up to what \
                         `ethtool -l IFACE` shows) whose interrupts spread over cores of the \
                         NIC's own NUMA node (irqbalance, or the NIC vendor's set_irq_affinity \
                         script with irqbalance stopped), and dmover run on that node \
                         (numactl --cpunodebind=N)"
            .into();
        let ifaces = match self.ifaces() {
            Ok(i) => i,
            Err(e) => {
                f.seen = e;
                return f;
            }
        };
        let interrupts = self.read("/proc/interrupts");
        let balance = self.irqbalance_running();
        let mut parts = Vec::new();
        let mut crowded = Vec::new();
        let mut spread = 0;
        let mut one_queue = 0;
        let nics: Vec<&Iface> = ifaces.iter().filter(|i| i.physical && i.up).collect();
        for i in &nics {
            let dir = format!("/sys/class/net/{}", i.name);
            let queues = self.list(&format!("{dir}/queues")).unwrap_or_default();
            let rx = queues.iter().filter(|q| q.starts_with("rx-")).count();
            let tx = queues.iter().filter(|q| q.starts_with("tx-")).count();
            let node = self
                .read(&format!("{dir}/device/numa_node"))
                .ok()
                .and_then(|n| n.parse::<i32>().ok())
                .filter(|&n| n >= 0);
            let irqs = self.irqs_of(&i.name, interrupts.as_deref().unwrap_or(""));
            let mut cpus = BTreeSet::new();
            for &irq in &irqs {
                cpus.extend(self.irq_cpus(irq).unwrap_or_default());
            }
            if rx == 1 {
                one_queue += 1;
            }
            let mut p = format!("{}: {rx} rx/{tx} tx queues", i.name);
            if let Some(n) = node {
                p.push_str(&format!(", NUMA node {n}"));
            }
            if irqs.is_empty() {
                p.push_str(", IRQs not found");
            } else {
                p.push_str(&format!(
                    ", {} IRQs on CPUs {}",
                    irqs.len(),
                    format_cpu_list(&cpus)
                ));
                if irqs.len() > 1 && cpus.len() == 1 {
                    crowded.push((i.name.clone(), irqs, node));
                } else if cpus.len() > 1 {
                    spread += 1;
                }
            }
            parts.push(p);
        }
        let balance_text = match balance {
            Some(true) => "irqbalance running",
            Some(false) => "irqbalance not running",
            None => "irqbalance unknown",
        };
        if nics.is_empty() {
            f.status = Status::Info;
            f.seen = format!("no physical interface up; {balance_text}");
            f.recommended.clear();
            return f;
        }
        if let Err(e) = &interrupts {
            parts.push(e.clone());
        }
        f.seen = format!("{}; {balance_text}", parts.join("; "));
        if !crowded.is_empty() {
            f.status = Status::Warn;
            if balance == Some(false) {
                f.fix.push("systemctl enable --now irqbalance".into());
            } else {
                // irqbalance runs (or cannot be told) and left them on one core: the
                // exact assignment, round robin over the node's CPUs.
                for (_, irqs, node) in &crowded {
                    let cpus = self.node_cpus(*node);
                    if cpus.len() < 2 {
                        continue;
                    }
                    for (k, irq) in irqs.iter().enumerate() {
                        f.fix.push(format!(
                            "echo {} > /proc/irq/{irq}/smp_affinity_list",
                            cpus[k % cpus.len()]
                        ));
                    }
                }
            }
        } else if spread == nics.len() && one_queue == 0 {
            f.status = Status::Ok;
        } else {
            f.status = Status::Info;
        }
        f
    }

    /// The CPUs of NUMA node `node`, or all online CPUs.
    fn node_cpus(&self, node: Option<i32>) -> Vec<u32> {
        node.and_then(|n| {
            self.read(&format!("/sys/devices/system/node/node{n}/cpulist"))
                .ok()
        })
        .or_else(|| self.read("/sys/devices/system/cpu/online").ok())
        .and_then(|s| parse_cpu_list(&s))
        .map(|s| s.into_iter().collect())
        .unwrap_or_default()
    }

    /// Transparent huge pages: madvise (or never) rather than always.
    fn thp(&self) -> Finding {
        let mut f = Finding::new("thp", THP_DOC);
        f.recommended = "madvise: with always, khugepaged and compaction can stall a \
                         busy mover (keep it with transparent_hugepage=madvise on the \
                         kernel command line)"
            .into();
        match self.read("/sys/kernel/mm/transparent_hugepage/enabled") {
            Err(e) => f.seen = e,
            Ok(s) => {
                let mode = s
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
                    .unwrap_or(&s)
                    .to_string();
                f.seen = format!("transparent_hugepage/enabled = {mode}");
                match mode.as_str() {
                    "madvise" | "never" => f.status = Status::Ok,
                    "always" => {
                        f.status = Status::Info;
                        f.fix.push(
                            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled".into(),
                        );
                    }
                    _ => {}
                }
            }
        }
        f
    }

    /// The file system and mount options of the export `path`.
    fn mount(&self, path: Option<&Path>) -> Finding {
        let mut f = Finding::new("mount", MOUNT_DOC);
        f.recommended = "noatime on the exports' file systems: reading a file then \
                         writes nothing (keep it: add noatime to the options in \
                         /etc/fstab)"
            .into();
        let Some(path) = path else {
            f.status = Status::Info;
            f.seen = "not checked: give --path DIR (a directory dmover serves or writes)".into();
            f.recommended.clear();
            return f;
        };
        // On the real root the path is resolved; in a fake tree it is taken as given.
        let path = if self.root == Path::new("/") {
            match std::fs::canonicalize(path) {
                Ok(p) => p,
                Err(e) => {
                    f.seen = format!("cannot resolve {}: {}", path.display(), io_reason(&e));
                    return f;
                }
            }
        } else {
            path.to_path_buf()
        };
        let mounts = match self.read("/proc/mounts") {
            Ok(m) => m,
            Err(e) => {
                f.seen = e;
                return f;
            }
        };
        // The last of the longest mount points holding the path: the one on top.
        let mut best: Option<(PathBuf, String, String, String)> = None;
        for line in mounts.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let [dev, mnt, fstype, opts, ..] = w[..] else {
                continue;
            };
            let mnt = PathBuf::from(unescape_mount(mnt));
            if path.starts_with(&mnt)
                && best
                    .as_ref()
                    .is_none_or(|b| mnt.components().count() >= b.0.components().count())
            {
                best = Some((mnt, unescape_mount(dev), fstype.into(), opts.into()));
            }
        }
        let Some((mnt, dev, fstype, opts)) = best else {
            f.seen = format!("{}: no mount in /proc/mounts holds it", path.display());
            return f;
        };
        f.seen = format!(
            "{} is on {} ({fstype} from {dev}, options {opts})",
            path.display(),
            mnt.display()
        );
        let has = |o: &str| opts.split(',').any(|x| x == o);
        let note = match fstype.as_str() {
            "nfs" | "nfs4" | "cifs" | "smb3" | "lustre" | "gpfs" | "beegfs" | "cephfs" => {
                "; a network file system: it, not the WAN, may bound the rate (test it with \
                 dmover bench storage)"
            }
            t if t.starts_with("fuse") => "; a FUSE file system: expect it to bound the rate",
            "tmpfs" | "overlay" | "squashfs" => "; not a disk file system",
            _ => "",
        };
        f.seen.push_str(note);
        if has("noatime") {
            f.status = Status::Ok;
        } else {
            f.status = if has("relatime") {
                Status::Info
            } else {
                Status::Warn
            };
            f.fix
                .push(format!("mount -o remount,noatime {}", mnt.display()));
        }
        f
    }

    /// RLIMIT_NOFILE of this process: `/proc/self/limits`, or getrlimit on the real
    /// root.
    fn nofile_limits(&self) -> Result<(u64, u64), String> {
        let text = match self.read("/proc/self/limits") {
            Ok(t) => t,
            Err(_) if self.root == Path::new("/") => {
                let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
                return Ok((l.current.unwrap_or(u64::MAX), l.maximum.unwrap_or(u64::MAX)));
            }
            Err(e) => return Err(e),
        };
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .ok_or("no \"Max open files\" in /proc/self/limits")?;
        let num = |w: &str| {
            if w == "unlimited" {
                Some(u64::MAX)
            } else {
                w.parse().ok()
            }
        };
        let w: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
        match w[..] {
            [soft, hard, ..] => num(soft)
                .zip(num(hard))
                .ok_or_else(|| format!("cannot parse {line:?}")),
            _ => Err(format!("cannot parse {line:?}")),
        }
    }

    /// The open-file limit (RLIMIT_NOFILE).
    fn nofile(&self) -> Finding {
        let mut f = Finding::new("nofile", LIMITS_DOC);
        f.recommended = format!(
            "a hard open-file limit of at least {NOFILE_WANT} for the users running \
             movers (dmover raises its own soft limit to the hard one; other tools may \
             need `ulimit -n` too; systemd services: LimitNOFILE=)"
        );
        match self.nofile_limits() {
            Err(e) => f.seen = e,
            Ok((soft, hard)) => {
                let n = |v: u64| {
                    if v == u64::MAX {
                        "unlimited".to_string()
                    } else {
                        v.to_string()
                    }
                };
                f.seen = format!(
                    "open files (RLIMIT_NOFILE) soft {}, hard {}",
                    n(soft),
                    n(hard)
                );
                if hard < NOFILE_WANT {
                    f.status = Status::Warn;
                    f.fix.push(format!(
                        "ulimit -Hn {want} && ulimit -n {want}   # this shell (as root), until logout",
                        want = 1 << 20
                    ));
                    f.persist.push(Persist {
                        file: LIMITS_CONF.into(),
                        line: format!("*  -  nofile  {}", 1 << 20),
                    });
                } else {
                    f.status = Status::Ok;
                }
            }
        }
        f
    }

    /// The system-wide file limit, fs.file-max.
    fn file_max(&self) -> Finding {
        let mut f = Finding::new("file_max", FS_SYSCTL_DOC);
        f.recommended = format!("fs.file-max >= {FILE_MAX_WANT}");
        match self.sysctl_u64("fs.file-max") {
            Err(e) => f.seen = e,
            Ok(v) => {
                f.seen = format!("fs.file-max = {v}");
                if v >= FILE_MAX_WANT {
                    f.status = Status::Ok;
                } else {
                    f.status = Status::Warn;
                    f.fix.push(format!("sysctl -w fs.file-max={FILE_MAX_WANT}"));
                    f.persist
                        .push(sysctl_line("fs.file-max", &FILE_MAX_WANT.to_string()));
                }
            }
        }
        f
    }
}

fn sysctl_line(name: &str, value: &str) -> Persist {
    Persist {
        file: SYSCTL_CONF.into(),
        line: format!("{name} = {value}"),
    }
}

/// An I/O error without the "(os error 2)" tail.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "not found".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// `cpu0`, `cpu17` (not `cpufreq`, `cpuidle`).
fn is_cpu_dir(name: &str) -> bool {
    name.strip_prefix("cpu")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A kernel CPU list: `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<BTreeSet<u32>> {
    let mut set = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65536 {
                    return None;
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(part.trim().parse().ok()?);
            }
        }
    }
    Some(set)
}

/// The inverse of [`parse_cpu_list`].
fn format_cpu_list(cpus: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b = it.next().unwrap_or(b);
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    if out.is_empty() {
        "?".into()
    } else {
        out.join(",")
    }
}

/// `/proc/mounts` escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        let s = parse_cpu_list("0-3,8,10-11\n").unwrap();
        assert_eq!(
            s.iter().copied().collect::<Vec<_>>(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(format_cpu_list(&s), "0-3,8,10-11");
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(format_cpu_list(&BTreeSet::new()), "?");
    }

    #[test]
    fn mount_escapes() {
        assert_eq!(unescape_mount("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount("/x\\"), "/x\\");
        assert_eq!(unescape_mount("/x\\04"), "/x\\04");
    }

    #[test]
    fn cpu_dirs() {
        assert!(is_cpu_dir("cpu0"));
        assert!(is_cpu_dir("cpu127"));
        assert!(!is_cpu_dir("cpufreq"));
        assert!(!is_cpu_dir("cpu"));
    }
}
