//! With `HOST`: a few TCP connects to a dmover server measure the round-trip time (a
//! connect takes one: SYN out, SYN-ACK back), and `IP_MTU` on a connected socket gives
//! the MTU of the route to it. The connections close without a word, which the server
//! logs as refused; no protocol message is involved.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Finding, Status};

const SOURCE: &str = "https://fasterdata.es.net/host-tuning/linux/";

/// What the connects to the server found.
#[derive(Debug, Serialize)]
pub struct Probe {
    /// `host:port` as given.
    pub server: String,
    /// The address connected to.
    pub addr: Option<String>,
    /// Each successful connect's time, in milliseconds.
    pub connect_ms: Vec<f64>,
    /// Connects that failed.
    pub failed: u32,
    /// The first failure (or why the name did not resolve).
    pub error: Option<String>,
    /// The route's MTU from `IP_MTU`/`IPV6_MTU` on a connected socket.
    pub mtu: Option<u32>,
    /// Why the MTU is missing, if it is.
    pub mtu_error: Option<String>,
}

/// Connects `n` times to `server` (`host:port`), each given up after `timeout`.
pub fn probe(server: &str, n: u32, timeout: Duration) -> Probe {
    let mut p = Probe {
        server: server.to_string(),
        addr: None,
        connect_ms: Vec::new(),
        failed: 0,
        error: None,
        mtu: None,
        mtu_error: None,
    };
    let addr: SocketAddr = match server.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => {
            p.error = Some(format!("{server}: no address"));
            return p;
        }
        Err(e) => {
            p.error = Some(format!("cannot resolve {server}: {e}"));
            return p;
        }
    };
    p.addr = Some(addr.to_string());
    for _ in 0..n {
        let t = Instant::now();
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                p.connect_ms.push(t.elapsed().as_secs_f64() * 1e3);
                if p.mtu.is_none() {
                    let mtu = if addr.is_ipv4() {
                        rustix::net::sockopt::ip_mtu(&s)
                    } else {
                        rustix::net::sockopt::ipv6_mtu(&s)
                    };
                    match mtu {
                        Ok(m) => p.mtu = Some(m),
                        Err(e) => p.mtu_error = Some(format!("IP_MTU: {e}")),
                    }
                }
            }
            Err(e) => {
                p.failed += 1;
                p.error
                    .get_or_insert_with(|| format!("connect to {addr}: {e}"));
            }
        }
    }
    p
}

impl Probe {
    /// The median connect time, if any connect succeeded.
    pub fn median(&self) -> Option<Duration> {
        let mut v = self.connect_ms.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let m = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        Some(Duration::from_secs_f64(m / 1e3))
    }

    /// `path_rtt` and `path_mtu`.
    pub fn findings(&self) -> Vec<Finding> {
        let mut rtt = Finding::new("path_rtt", "measured: TCP connect time (SYN to SYN-ACK)");
        let mut mtu = Finding::new("path_mtu", SOURCE);
        let target = self.addr.as_deref().unwrap_or(&self.server);
        match self.median() {
            None => {
                rtt.status = Status::Warn;
                rtt.seen = self
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("no connect to {target}"));
                rtt.recommended = format!(
                    "a dmover server listening at {}, reachable from here (firewalls \
                     open for its port)",
                    self.server
                );
                mtu.seen = "not measured: no connection".into();
                return vec![rtt, mtu];
            }
            Some(m) => {
                let min = self
                    .connect_ms
                    .iter()
                    .copied()
                    .fold(f64::INFINITY, f64::min);
                let max = self.connect_ms.iter().copied().fold(0.0, f64::max);
                rtt.status = if self.failed == 0 {
                    Status::Info
                } else {
                    Status::Warn
                };
                rtt.seen = format!(
                    "median connect time to {target} {:.3} ms over {} connects (min {min:.3}, \
                     max {max:.3}; the buffer checks use it unless --rtt is given){}",
                    m.as_secs_f64() * 1e3,
                    self.connect_ms.len(),
                    if self.failed > 0 {
                        format!(
                            "; {} failed: {}",
                            self.failed,
                            self.error.as_deref().unwrap_or("")
                        )
                    } else {
                        String::new()
                    }
                );
            }
        }
        match (self.mtu, &self.mtu_error) {
            (Some(m), _) => {
                mtu.seen = format!(
                    "route MTU to {target}: {m} (IP_MTU of a connected socket: the \
                     interface's, or a smaller path MTU the kernel has learned)"
                );
                mtu.recommended = "9000 end to end: the DTN interfaces and every hop of \
                                   the path carry jumbo frames (confirm with `ping -M do -s \
                                   8972 HOST`)"
                    .into();
                mtu.status = if m >= 9000 { Status::Ok } else { Status::Info };
            }
            (None, e) => mtu.seen = e.clone().unwrap_or_else(|| "not measured".into()),
        }
        vec![rtt, mtu]
    }
}
