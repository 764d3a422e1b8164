//! `dmover doctor` against fake `/proc` and `/sys` trees (the hidden `--sysroot`): each
//! test starts from a well-tuned host, changes what it is about, and checks the finding
//! and its exact fix in the JSON output (and once in the text).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{bin, json};
use serde_json::Value;

/// Every check id, in output order (without HOST).
const HOST_CHECKS: [&str; 15] = [
    "rmem_max",
    "wmem_max",
    "tcp_rmem",
    "tcp_wmem",
    "congestion_control",
    "default_qdisc",
    "tcp_mtu_probing",
    "tcp_fastopen",
    "cpu_governor",
    "nic_irqs",
    "mtu",
    "thp",
    "mount",
    "nofile",
    "file_max",
];

/// A fake root.
struct Tree(tempfile::TempDir);

impl Tree {
    fn empty() -> Tree {
        Tree(
            tempfile::Builder::new()
                .prefix("dmover-doctor-")
                .tempdir()
                .unwrap(),
        )
    }

    /// A host tuned as recommended for 100ms x 10gbit (and more).
    fn tuned() -> Tree {
        let t = Tree::empty();
        let max = "2147483647";
        t.put("proc/sys/net/core/rmem_max", max);
        t.put("proc/sys/net/core/wmem_max", max);
        t.put("proc/sys/net/ipv4/tcp_rmem", "4096\t87380\t2147483647");
        t.put("proc/sys/net/ipv4/tcp_wmem", "4096\t65536\t2147483647");
        t.put("proc/sys/net/ipv4/tcp_congestion_control", "bbr");
        t.put(
            "proc/sys/net/ipv4/tcp_available_congestion_control",
            "reno cubic bbr",
        );
        t.put("proc/sys/net/core/default_qdisc", "fq");
        t.put("proc/sys/net/ipv4/tcp_mtu_probing", "1");
        t.put("proc/sys/net/ipv4/tcp_fastopen", "3");
        t.put("proc/sys/kernel/osrelease", "6.1.0-test");
        t.put("proc/sys/fs/file-max", "9223372036854775807");
        for cpu in 0..4 {
            t.put(
                &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"),
                "performance",
            );
        }
        t.put("sys/devices/system/cpu/online", "0-3");
        t.put("sys/devices/system/node/node0/cpulist", "0-3");
        // Loopback and a virtual bridge: never checked.
        t.put("sys/class/net/lo/mtu", "65536");
        t.put("sys/class/net/docker0/mtu", "1500");
        t.put("sys/class/net/docker0/operstate", "up");
        // The DTN interface: 2 queues, 2 IRQs on CPUs 0 and 1.
        t.put("sys/class/net/eth0/mtu", "9000");
        t.put("sys/class/net/eth0/operstate", "up");
        t.put("sys/class/net/eth0/device/numa_node", "0");
        t.put("sys/class/net/eth0/device/msi_irqs/40", "msix");
        t.put("sys/class/net/eth0/device/msi_irqs/41", "msix");
        for q in ["rx-0", "rx-1", "tx-0", "tx-1"] {
            t.dir(&format!("sys/class/net/eth0/queues/{q}"));
        }
        t.put(
            "proc/interrupts",
            "           CPU0       CPU1       CPU2       CPU3\n \
             40:        100          0          0          0  IR-PCI-MSI 1-edge  eth0-TxRx-0\n \
             41:          0        100          0          0  IR-PCI-MSI 2-edge  eth0-TxRx-1\n",
        );
        t.put("proc/irq/40/smp_affinity_list", "0");
        t.put("proc/irq/41/smp_affinity_list", "1");
        t.put("proc/812/comm", "irqbalance");
        t.put("proc/1/comm", "systemd");
        t.put(
            "sys/kernel/mm/transparent_hugepage/enabled",
            "always [madvise] never",
        );
        t.put(
            "proc/mounts",
            "/dev/sda1 / ext4 rw,relatime 0 0\n\
             /dev/sdb1 /data xfs rw,noatime,attr2 0 0\n\
             /dev/sdc1 /data\\040two ext4 rw 0 0\n",
        );
        t.put(
            "proc/self/limits",
            "Limit                     Soft Limit           Hard Limit           Units\n\
             Max open files            1024                 1048576              files\n",
        );
        t
    }

    fn put(&self, rel: &str, content: &str) {
        let p = self.0.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{content}\n")).unwrap();
    }

    fn dir(&self, rel: &str) {
        std::fs::create_dir_all(self.0.path().join(rel)).unwrap();
    }

    fn remove(&self, rel: &str) {
        let p = self.0.path().join(rel);
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }

    /// `dmover doctor --sysroot TREE ARGS...`.
    fn doctor(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .arg("doctor")
            .arg("--sysroot")
            .arg(self.0.path())
            .args(args)
            .output()
            .expect("running dmover doctor")
    }

    /// The JSON report, for 100ms x 10gbit and the export /data/export unless `extra`
    /// says otherwise, and the exit code.
    fn report(&self, extra: &[&str]) -> (Value, i32) {
        let mut args = vec!["--json"];
        for (opt, value) in [
            ("--rtt", "100ms"),
            ("--rate", "10gbit"),
            ("--path", "/data/export"),
        ] {
            if !extra.contains(&opt) {
                args.extend([opt, value]);
            }
        }
        args.extend_from_slice(extra);
        let o = self.doctor(&args);
        let code = o.status.code().expect("exit code");
        assert!(
            code == 0 || code == 1,
            "exit {code}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        (json(&o), code)
    }
}

/// The finding `id` of a report.
fn finding<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no finding {id} in {report:#}"))
}

fn status<'a>(report: &'a Value, id: &str) -> &'a str {
    finding(report, id)["status"].as_str().unwrap()
}

fn fixes(report: &Value, id: &str) -> Vec<String> {
    finding(report, id)["fix"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

fn ids(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn tuned_host_is_all_ok_and_json_lists_every_check() {
    let t = Tree::tuned();
    let (r, code) = t.report(&[]);
    assert_eq!(ids(&r), HOST_CHECKS, "{r:#}");
    for f in r["findings"].as_array().unwrap() {
        assert_eq!(f["status"], "ok", "{f:#}");
        for key in ["seen", "recommended", "source"] {
            assert!(f[key].is_string(), "{key} in {f:#}");
        }
        assert!(f["fix"].as_array().unwrap().is_empty(), "{f:#}");
    }
    assert_eq!(code, 0);
    assert_eq!(r["schema"], 1, "{r:#}");
    assert_eq!(r["version"], env!("CARGO_PKG_VERSION"), "{r:#}");
    assert_eq!(r["warnings"], 0);
    assert_eq!(r["sizing"]["bdp_bytes"], 125_000_000);
    assert_eq!(r["sizing"]["rtt_from"], "option");
    assert!(
        finding(&r, "mount")["seen"]
            .as_str()
            .unwrap()
            .contains("/data (xfs from /dev/sdb1"),
        "{r:#}"
    );
    assert!(
        finding(&r, "nic_irqs")["seen"]
            .as_str()
            .unwrap()
            .contains("eth0: 2 rx/2 tx queues, NUMA node 0, 2 IRQs on CPUs 0-1"),
        "{r:#}"
    );
}

#[test]
fn small_buffers_warn_with_the_fix_computed_from_the_bdp() {
    let t = Tree::tuned();
    t.put("proc/sys/net/core/rmem_max", "212992");
    t.put("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456");
    // 100ms x 10gbit: BDP 125 MB, 2 x BDP = 250 MB, set to the next power of two.
    let (r, code) = t.report(&[]);
    assert_eq!(code, 1);
    assert_eq!(r["warnings"], 2);
    assert_eq!(status(&r, "rmem_max"), "warn");
    assert_eq!(
        fixes(&r, "rmem_max"),
        ["sysctl -w net.core.rmem_max=268435456"]
    );
    assert_eq!(
        finding(&r, "rmem_max")["persist"],
        serde_json::json!([{"file": "/etc/sysctl.d/90-dmover.conf",
                            "line": "net.core.rmem_max = 268435456"}])
    );
    assert_eq!(status(&r, "tcp_rmem"), "warn");
    assert_eq!(
        fixes(&r, "tcp_rmem"),
        ["sysctl -w net.ipv4.tcp_rmem=\"4096 131072 268435456\""]
    );
    assert_eq!(status(&r, "wmem_max"), "ok");

    // 20ms x 1gbit: BDP 2.5 MB, 2 x BDP = 5 MB: 6 MiB of tcp_rmem is enough, 208 KiB
    // of rmem_max is not (set 8 MiB).
    let (r, _) = t.report(&["--rtt", "20ms", "--rate", "1gbit"]);
    assert_eq!(r["sizing"]["bdp_bytes"], 2_500_000);
    assert_eq!(status(&r, "tcp_rmem"), "ok");
    assert_eq!(
        fixes(&r, "rmem_max"),
        ["sysctl -w net.core.rmem_max=8388608"]
    );

    // The text report: the fix, and the line for /etc/sysctl.d.
    let o = t.doctor(&["--rtt", "100ms", "--path", "/data"]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains("fix:  sysctl -w net.core.rmem_max=268435456"),
        "{text}"
    );
    assert!(
        text.contains("put in /etc/sysctl.d/90-dmover.conf:\n    net.core.rmem_max = 268435456\n    net.ipv4.tcp_rmem = 4096 131072 268435456\n"),
        "{text}"
    );
    assert!(text.contains("WARN    rmem_max"), "{text}");
}

#[test]
fn congestion_control_bbr_available_loadable_or_not() {
    let t = Tree::tuned();
    t.put("proc/sys/net/ipv4/tcp_congestion_control", "cubic");
    // Available: switch to it.
    let (r, code) = t.report(&[]);
    assert_eq!(code, 1);
    assert_eq!(status(&r, "congestion_control"), "warn");
    assert_eq!(
        fixes(&r, "congestion_control"),
        ["sysctl -w net.ipv4.tcp_congestion_control=bbr"]
    );

    // Not loaded, and no module: nothing to switch to.
    t.put(
        "proc/sys/net/ipv4/tcp_available_congestion_control",
        "reno cubic",
    );
    let (r, code) = t.report(&[]);
    assert_eq!(code, 0);
    assert_eq!(status(&r, "congestion_control"), "info");
    assert!(fixes(&r, "congestion_control").is_empty());
    assert!(
        finding(&r, "congestion_control")["seen"]
            .as_str()
            .unwrap()
            .contains("bbr and htcp are not available"),
        "{r:#}"
    );

    // Not loaded, but the module is installed: load it first.
    t.put("lib/modules/6.1.0-test/kernel/net/ipv4/tcp_bbr.ko.zst", "");
    let (r, _) = t.report(&[]);
    assert_eq!(status(&r, "congestion_control"), "warn");
    assert_eq!(
        fixes(&r, "congestion_control"),
        [
            "modprobe tcp_bbr",
            "sysctl -w net.ipv4.tcp_congestion_control=bbr"
        ]
    );
    let persist = &finding(&r, "congestion_control")["persist"];
    assert_eq!(persist[0]["file"], "/etc/modules-load.d/dmover.conf");
    assert_eq!(persist[0]["line"], "tcp_bbr");

    // htcp in use is fine too.
    t.put("proc/sys/net/ipv4/tcp_congestion_control", "htcp");
    assert_eq!(status(&t.report(&[]).0, "congestion_control"), "ok");
}

#[test]
fn qdisc_other_than_fq_warns() {
    let t = Tree::tuned();
    t.put("proc/sys/net/core/default_qdisc", "fq_codel");
    let (r, _) = t.report(&[]);
    assert_eq!(status(&r, "default_qdisc"), "warn");
    assert_eq!(
        fixes(&r, "default_qdisc"),
        ["sysctl -w net.core.default_qdisc=fq"]
    );
}

#[test]
fn fast_open_off_for_listeners_is_info_with_the_bits_kept() {
    let t = Tree::tuned();
    // Linux's default: connections only.
    t.put("proc/sys/net/ipv4/tcp_fastopen", "1");
    let (r, code) = t.report(&[]);
    assert_eq!(code, 0, "info does not fail the gate");
    assert_eq!(status(&r, "tcp_fastopen"), "info");
    assert_eq!(
        fixes(&r, "tcp_fastopen"),
        ["sysctl -w net.ipv4.tcp_fastopen=3"]
    );
    // Other bits (0x400: a listener needs no cookie) stay as they are.
    t.put("proc/sys/net/ipv4/tcp_fastopen", "1026");
    let (r, _) = t.report(&[]);
    assert_eq!(
        fixes(&r, "tcp_fastopen"),
        ["sysctl -w net.ipv4.tcp_fastopen=1027"]
    );
    t.put("proc/sys/net/ipv4/tcp_fastopen", "1027");
    assert_eq!(status(&t.report(&[]).0, "tcp_fastopen"), "ok");
}

#[test]
fn powersave_governor_warns() {
    let t = Tree::tuned();
    t.put(
        "sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
        "powersave",
    );
    let (r, code) = t.report(&[]);
    assert_eq!(code, 1);
    assert_eq!(status(&r, "cpu_governor"), "warn");
    assert!(
        finding(&r, "cpu_governor")["seen"]
            .as_str()
            .unwrap()
            .contains("performance on 3, powersave on 1 of 4 CPUs"),
        "{r:#}"
    );
    assert_eq!(
        fixes(&r, "cpu_governor")[0],
        "cpupower frequency-set -g performance"
    );
}

#[test]
fn thp_always_is_info_with_the_fix() {
    let t = Tree::tuned();
    t.put(
        "sys/kernel/mm/transparent_hugepage/enabled",
        "[always] madvise never",
    );
    let (r, code) = t.report(&[]);
    assert_eq!(code, 0, "info does not fail");
    assert_eq!(status(&r, "thp"), "info");
    assert_eq!(
        fixes(&r, "thp"),
        ["echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"]
    );
}

#[test]
fn small_mtu_warns_for_physical_interfaces_only() {
    let t = Tree::tuned();
    t.put("sys/class/net/eth0/mtu", "1500");
    // A second NIC that is down is left out.
    t.put("sys/class/net/eth1/mtu", "1500");
    t.put("sys/class/net/eth1/operstate", "down");
    t.dir("sys/class/net/eth1/device");
    let (r, _) = t.report(&[]);
    assert_eq!(status(&r, "mtu"), "warn");
    assert_eq!(fixes(&r, "mtu"), ["ip link set dev eth0 mtu 9000"]);
    assert_eq!(finding(&r, "mtu")["seen"], "MTU eth0 1500");
}

#[test]
fn irqs_on_one_cpu_warn() {
    let t = Tree::tuned();
    t.put("proc/irq/41/smp_affinity_list", "0");
    // irqbalance runs and left them there: the exact spread over node 0's CPUs.
    let (r, _) = t.report(&[]);
    assert_eq!(status(&r, "nic_irqs"), "warn");
    assert_eq!(
        fixes(&r, "nic_irqs"),
        [
            "echo 0 > /proc/irq/40/smp_affinity_list",
            "echo 1 > /proc/irq/41/smp_affinity_list"
        ]
    );
    // Without irqbalance: start it.
    t.remove("proc/812");
    let (r, _) = t.report(&[]);
    assert_eq!(fixes(&r, "nic_irqs"), ["systemctl enable --now irqbalance"]);
    // The effective affinity wins over the configured one.
    t.put("proc/irq/41/smp_affinity_list", "0-3");
    t.put("proc/irq/41/effective_affinity_list", "0");
    assert_eq!(status(&t.report(&[]).0, "nic_irqs"), "warn");
}

#[test]
fn virtio_irqs_are_found_by_device_name() {
    let t = Tree::tuned();
    t.remove("sys/class/net/eth0/device");
    std::os::unix::fs::symlink(
        "../../../virtio2",
        t.0.path().join("sys/class/net/eth0/device"),
    )
    .unwrap();
    t.put(
        "proc/interrupts",
        "           CPU0       CPU1\n \
         38:       6390          0 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n \
         39:          0       4247 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\n \
         41:       3968          0 PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx\n",
    );
    t.put("proc/irq/38/smp_affinity_list", "0");
    t.put("proc/irq/39/smp_affinity_list", "1");
    let (r, _) = t.report(&[]);
    assert_eq!(status(&r, "nic_irqs"), "ok", "{r:#}");
    assert!(
        finding(&r, "nic_irqs")["seen"]
            .as_str()
            .unwrap()
            .contains("eth0: 2 rx/2 tx queues, 2 IRQs on CPUs 0-1"),
        "{r:#}"
    );
    // One receive queue: worth knowing, not a warning.
    t.remove("sys/class/net/eth0/queues/rx-1");
    assert_eq!(status(&t.report(&[]).0, "nic_irqs"), "info");
}

#[test]
fn mount_options_of_the_export() {
    let t = Tree::tuned();
    // /data/export is on /data (noatime): ok, checked above. / has relatime: info.
    let (r, _) = t.report(&["--path", "/home/x"]);
    assert_eq!(status(&r, "mount"), "info");
    assert_eq!(fixes(&r, "mount"), ["mount -o remount,noatime /"]);
    // Neither noatime nor relatime: every read writes. An escaped space in the mount point.
    let (r, code) = t.report(&["--path", "/data two/x"]);
    assert_eq!(code, 1);
    assert_eq!(status(&r, "mount"), "warn");
    assert_eq!(fixes(&r, "mount"), ["mount -o remount,noatime /data two"]);
    // No --path: not checked.
    let o = t.doctor(&["--json", "--rtt", "100ms"]);
    assert_eq!(status(&json(&o), "mount"), "info");
}

#[test]
fn low_open_file_limits_warn() {
    let t = Tree::tuned();
    t.put(
        "proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units\n\
         Max open files            1024                 4096                 files\n",
    );
    t.put("proc/sys/fs/file-max", "65536");
    let (r, _) = t.report(&[]);
    assert_eq!(status(&r, "nofile"), "warn");
    assert_eq!(
        finding(&r, "nofile")["persist"][0]["line"],
        "*  -  nofile  1048576"
    );
    assert_eq!(status(&r, "file_max"), "warn");
    assert_eq!(fixes(&r, "file_max"), ["sysctl -w fs.file-max=1048576"]);
}

#[test]
fn missing_files_are_unknown_never_a_panic() {
    let t = Tree::empty();
    let (r, code) = t.report(&[]);
    assert_eq!(ids(&r), HOST_CHECKS);
    for f in r["findings"].as_array().unwrap() {
        assert_eq!(f["status"], "unknown", "{f:#}");
        assert!(f["seen"].as_str().unwrap().contains("cannot read"), "{f:#}");
    }
    assert_eq!(code, 0);

    // Half-written files: garbage, not panics.
    t.put("proc/sys/net/ipv4/tcp_rmem", "4096 lots");
    t.put("proc/sys/net/core/rmem_max", "");
    t.put("proc/self/limits", "Max open files            x");
    t.put("proc/interrupts", "garbage\n 40 no colon\n");
    t.put("sys/kernel/mm/transparent_hugepage/enabled", "");
    t.dir("sys/class/net/eth0/device");
    t.put("proc/mounts", "short line\n");
    let (r, _) = t.report(&[]);
    for id in ["tcp_rmem", "rmem_max", "nofile", "thp", "mount", "mtu"] {
        assert_eq!(status(&r, id), "unknown", "{id}: {r:#}");
    }
}

#[test]
fn units_are_required() {
    let t = Tree::tuned();
    for bad in [["--rtt", "100"], ["--rate", "10g"]] {
        let o = t.doctor(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn host_rtt_is_measured_and_used() {
    let t = Tree::tuned();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let o = t.doctor(&["--json", "--connects", "3", &addr]);
    let r = json(&o);
    let mut want: Vec<String> = HOST_CHECKS.iter().map(|s| s.to_string()).collect();
    want.extend(["path_rtt".into(), "path_mtu".into()]);
    assert_eq!(ids(&r), want);
    assert_eq!(r["sizing"]["rtt_from"], "measured");
    assert!(r["sizing"]["rtt_ms"].as_f64().unwrap() < 1000.0, "{r:#}");
    assert_eq!(r["host"]["connect_ms"].as_array().unwrap().len(), 3);
    assert_eq!(status(&r, "path_rtt"), "info");
    // Loopback's MTU is 65536 here.
    assert_eq!(status(&r, "path_mtu"), "ok", "{r:#}");
    // --rtt wins over the measurement.
    let r = json(&t.doctor(&["--json", "--rtt", "50ms", "--connects", "1", &addr]));
    assert_eq!(r["sizing"]["rtt_from"], "option");
    assert_eq!(r["sizing"]["rtt_ms"], 50.0);
    drop(listener);

    // Nobody listening: the path check warns, the RTT falls back to the default.
    let o = t.doctor(&["--json", "--connects", "2", &addr]);
    assert_eq!(o.status.code(), Some(1));
    let r = json(&o);
    assert_eq!(status(&r, "path_rtt"), "warn");
    assert_eq!(status(&r, "path_mtu"), "unknown");
    assert_eq!(r["sizing"]["rtt_from"], "default");
}

#[test]
fn real_host_does_not_panic() {
    // This machine's own /proc and /sys: whatever they say, a report comes out.
    let o = Command::new(bin())
        .args(["doctor", "--json", "--path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{o:?}");
    assert_eq!(ids(&json(&o)), HOST_CHECKS);
}
