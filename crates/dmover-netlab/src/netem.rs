//! The kernel link: a veth pair with `netem` (delay, loss) and `tbf` (rate, tail-drop
//! queue) on each end's egress, for machines whose kernel has netem.
//!
//! Each direction gets the same model as the userspace forwarder
//! ([`crate::shaper`]): half the RTT of delay, a FIFO bottleneck at the link rate with
//! a tail-drop queue of [`LinkSpec::effective_queue_bytes`] bytes, and random loss:
//!
//! ```text
//! root 1: netem delay RTT/2 [loss P%] limit N     (the delay line; N covers a one-way
//!   └─ 2: tbf rate R burst B limit QUEUE           delay of packets at the rate)
//! ```
//!
//! `tbf` alone (at the root) when the link adds no delay and no loss; `netem` alone
//! without a rate. netem draws loss per packet, so with loss the veth ends are set to
//! `gso_max_segs 1`: TCP then sends MSS-sized packets and a loss event drops one
//! segment, as on a real link, not a 64 KiB super-packet (the forwarder splits
//! super-packets for the same reason).

use std::process::Command;

use crate::{LinkSpec, NetlabError};

/// Burst of the token bucket: at least two 64 KiB GSO packets (tbf would otherwise
/// split them), and 1 ms at the link rate above 1 Gbit/s.
fn burst_bytes(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 1000).max(128 << 10)
}

/// netem's `limit` (packets in its delay line): every packet of a one-way delay at the
/// link rate (10 Gbit/s unlimited), counted at 64 bytes each so that a line of
/// acknowledgements fits too, at least 10 000.
fn delay_line_packets(spec: &LinkSpec) -> u64 {
    let one_way = LinkSpec {
        rtt: spec.rtt / 2,
        ..spec.clone()
    };
    (one_way.bdp_bytes() / 64).clamp(10_000, 50_000_000)
}

/// The `tc` argument lists that give device `dev` (inside the namespace `tc -n` is
/// pointed at) this link's egress: one list per `tc` call, in order.
pub fn qdisc_args(spec: &LinkSpec, dev: &str) -> Vec<Vec<String>> {
    let delay_us = (spec.rtt / 2).as_micros();
    let netem = delay_us > 0 || spec.loss > 0.0;
    let mut calls = Vec::new();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    if netem {
        let mut a = s(&["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"]);
        if delay_us > 0 {
            a.extend(s(&["delay", &format!("{delay_us}us")]));
        }
        if spec.loss > 0.0 {
            a.extend(s(&["loss", "random", &format!("{}%", spec.loss * 100.0)]));
        }
        a.extend(s(&["limit", &delay_line_packets(spec).to_string()]));
        calls.push(a);
    }
    if let Some(rate) = spec.rate_bps {
        let mut a = s(&["qdisc", "add", "dev", dev]);
        if netem {
            a.extend(s(&["parent", "1:", "handle", "2:"]));
        } else {
            a.extend(s(&["root", "handle", "2:"]));
        }
        a.extend(s(&[
            "tbf",
            "rate",
            &format!("{rate}bit"),
            "burst",
            &burst_bytes(rate).to_string(),
            "limit",
            &spec.effective_queue_bytes().to_string(),
        ]));
        calls.push(a);
    }
    calls
}

/// Whether the kernel has netem, tried on the loopback device of namespace `ns` (a new
/// namespace: nothing else is disturbed). `Err` says why not.
pub fn probe(ns: &str) -> Result<(), String> {
    let add = Command::new("tc")
        .args([
            "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
        ])
        .output()
        .map_err(|e| format!("`tc` (iproute2) could not run: {e}"))?;
    if !add.status.success() {
        return Err(String::from_utf8_lossy(&add.stderr).trim().to_string());
    }
    let _ = Command::new("tc")
        .args(["-n", ns, "qdisc", "del", "dev", "lo", "root"])
        .output();
    Ok(())
}

/// Runs `tc -n NS ARGS…`.
pub(crate) fn tc(ns: &str, args: &[String]) -> Result<(), NetlabError> {
    let mut all = vec!["-n", ns];
    all.extend(args.iter().map(String::as_str));
    crate::ns::run("tc", &all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(rtt_ms: u64, rate: Option<u64>, loss: f64) -> LinkSpec {
        LinkSpec {
            rtt: Duration::from_millis(rtt_ms),
            rate_bps: rate,
            loss,
            ..LinkSpec::default()
        }
    }

    fn joined(calls: Vec<Vec<String>>) -> Vec<String> {
        calls.into_iter().map(|c| c.join(" ")).collect()
    }

    #[test]
    fn delay_rate_and_loss_make_netem_with_a_tbf_child() {
        let calls = joined(qdisc_args(&spec(100, Some(1_000_000_000), 0.0001), "d0"));
        // One-way 50 ms at 1 Gbit/s = 6.25 MB = 97 656 packets of 64 bytes.
        assert_eq!(
            calls,
            [
                "qdisc add dev d0 root handle 1: netem delay 50000us loss random 0.01% limit 97656",
                // Queue: one BDP (100 ms at 1 Gbit/s = 12.5 MB); burst 1 ms = 125 000 < 128 KiB.
                "qdisc add dev d0 parent 1: handle 2: tbf rate 1000000000bit burst 131072 limit 12500000",
            ]
        );
    }

    #[test]
    fn rate_only_is_a_root_tbf_and_delay_only_a_netem() {
        assert_eq!(
            joined(qdisc_args(&spec(0, Some(5_000_000_000), 0.0), "d0")),
            ["qdisc add dev d0 root handle 2: tbf rate 5000000000bit burst 625000 limit 1048576"]
        );
        assert_eq!(
            joined(qdisc_args(&spec(20, None, 0.0), "d0")),
            // One-way 10 ms at 10 Gbit/s (unlimited sizing) / 64 bytes.
            ["qdisc add dev d0 root handle 1: netem delay 10000us limit 195312"]
        );
        assert!(qdisc_args(&spec(0, None, 0.0), "d0").is_empty());
    }
}
