//! A sending session's congestion control (feature `LIMITS`, docs/protocol.md): the
//! client names the algorithm in its `Limits` right after `Session`; the server sets it
//! (`TCP_CONGESTION`) on its ends of the session's data streams, those joined already
//! and those that join later, before its first chunk (the client's `Go` comes after
//! its `Limits` on the control connection). An algorithm this server cannot use is
//! logged and told to the client; the streams get the server's own.
//!
//! Connections are accepted on [`UNPACED_START`] (the listening socket's algorithm),
//! and a session that names none gets the server's own (its `--congestion`, else the
//! system's default) at the same point. Why not accept on the system's default: a
//! socket that ever ran BBR stays paced by the kernel whatever it switches to (BBR
//! asks for pacing when it starts, and nothing takes that back), and a request-driven
//! session (a mount's reads: a request, then one chunk, then quiet) never shows BBR
//! its bandwidth, so each answer is paced at a few Mbit/s. Measured over a 50 ms,
//! 1 Gbit/s netlab link, one 64 KiB answer per request: 74.9 ms on BBR, 51.0 ms on
//! cubic (docs/remote.md, "Random reads over long links").

use std::collections::BTreeSet;

use dmover_net::link::{self, Probe};
use parking_lot::Mutex;

/// The congestion control connections are accepted on.
pub(crate) const UNPACED_START: &str = link::UNPACED;

/// The congestion control of a sending session's data streams.
#[derive(Debug)]
pub(crate) struct SendCongestion {
    peer: String,
    /// The server's own algorithm, for sessions that name none (`None`: leave the
    /// streams as accepted).
    default: Option<String>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The client's limits came (or none will).
    decided: bool,
    /// The algorithm to set, once decided (`None`: leave the streams as they are).
    name: Option<String>,
    /// Whether the client asked for `name` (what the streams use is then reported).
    asked: bool,
    /// Streams that joined before the decision (their connections' probes, dropped
    /// once it is made).
    waiting: Vec<Probe>,
    /// What the streams' sockets use, read back after setting the algorithm asked for.
    used: BTreeSet<String>,
}

impl SendCongestion {
    /// `default`: the algorithm of streams whose client names none.
    pub(crate) fn new(peer: &str, default: Option<String>) -> Self {
        SendCongestion {
            peer: peer.to_string(),
            default,
            state: Mutex::new(State::default()),
        }
    }

    /// A data stream joined, `probe` its connection: it gets the algorithm now or
    /// when it is decided.
    pub(crate) fn joined(&self, probe: Probe) {
        let mut st = self.state.lock();
        if !st.decided {
            st.waiting.push(probe);
            return;
        }
        if let Some(name) = st.name.clone() {
            self.apply(&probe, &name, &mut st);
        }
    }

    /// The client asked for `name` (empty: the server's default): it is checked and
    /// set on the streams joined so far and those to come. Returns the answer: the
    /// algorithm the sending ends use (empty when none was asked) and why the one
    /// asked for is not (empty when it is).
    pub(crate) fn decide(&self, name: &str) -> (String, String) {
        let mut st = self.state.lock();
        if st.decided {
            return (String::new(), String::new());
        }
        st.decided = true;
        let waiting = std::mem::take(&mut st.waiting);
        let answer = if name.is_empty() {
            st.name = self.default.clone();
            (String::new(), String::new())
        } else {
            match link::check_congestion(name) {
                Ok(()) => {
                    st.name = Some(name.to_string());
                    st.asked = true;
                    tracing::info!(
                        "{}: data streams send with congestion control {name:?}, as the \
                         client asked",
                        self.peer
                    );
                    (name.to_string(), String::new())
                }
                Err(why) => {
                    st.name = self.default.clone();
                    let default = self
                        .default
                        .clone()
                        .or_else(link::default_congestion)
                        .unwrap_or_default();
                    tracing::warn!(
                        "{}: the client asked for congestion control {}: {why}; its data \
                         streams keep the server's ({default})",
                        self.peer,
                        name.escape_debug()
                    );
                    (default, why)
                }
            }
        };
        if let Some(n) = st.name.clone() {
            for p in &waiting {
                self.apply(p, &n, &mut st);
            }
        }
        answer
    }

    /// What the data streams' sockets use, read back from them, when the client asked
    /// for an algorithm: each one once, in order, joined by commas.
    pub(crate) fn used(&self) -> Option<String> {
        let st = self.state.lock();
        (!st.used.is_empty()).then(|| st.used.iter().cloned().collect::<Vec<_>>().join(","))
    }

    fn apply(&self, probe: &Probe, name: &str, st: &mut State) {
        if let Err(e) = probe.set_congestion(name) {
            tracing::warn!(
                "{}: cannot use congestion control {name:?} on a data stream: {e}; it keeps \
                 {UNPACED_START}",
                self.peer
            );
        }
        if !st.asked {
            return;
        }
        match probe.congestion() {
            Ok(n) => {
                st.used.insert(n);
            }
            Err(e) => tracing::debug!("{}: congestion control: {e}", self.peer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmover_net::tcp;

    fn probe(s: &std::net::TcpStream) -> Probe {
        Probe::tcp(s).unwrap()
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        (a, c)
    }

    /// Streams joined before the decision and after it both get the algorithm.
    #[test]
    fn streams_joined_before_and_after_the_decision_get_the_algorithm() {
        let cc = SendCongestion::new("peer", None);
        let (early, _c1) = pair();
        cc.joined(probe(&early));
        assert_eq!(cc.decide("reno"), ("reno".to_string(), String::new()));
        let (late, _c2) = pair();
        cc.joined(probe(&late));
        for s in [&early, &late] {
            assert_eq!(tcp::congestion_of(s).unwrap(), "reno");
        }
        assert_eq!(cc.used().as_deref(), Some("reno"));
        // Decided once.
        assert_eq!(cc.decide("cubic"), (String::new(), String::new()));
    }

    /// An algorithm the kernel lacks: the answer says why and names the default, and
    /// the streams keep it.
    #[test]
    fn an_unavailable_algorithm_is_refused_with_the_reason() {
        let cc = SendCongestion::new("peer", None);
        let (s, _c) = pair();
        let before = tcp::congestion_of(&s).unwrap();
        cc.joined(probe(&s));
        let (used, why) = cc.decide("nosuchcc");
        assert_eq!(used, before);
        assert!(why.contains("\"nosuchcc\" is not available"), "{why}");
        assert_eq!(tcp::congestion_of(&s).unwrap(), before);
        assert_eq!(cc.used(), None);
        // Nothing asked: nothing set, nothing refused.
        let cc = SendCongestion::new("peer", None);
        cc.joined(probe(&s));
        assert_eq!(cc.decide(""), (String::new(), String::new()));
        assert_eq!(cc.used(), None);
    }

    /// A session that names nothing gets the server's algorithm (the listener's is
    /// only where connections start), and nothing is reported as asked.
    #[test]
    fn nothing_asked_gets_the_servers_algorithm() {
        let cc = SendCongestion::new("peer", Some("reno".into()));
        let (early, _c1) = pair();
        tcp::set_congestion(&early, UNPACED_START).unwrap();
        cc.joined(probe(&early));
        assert_eq!(tcp::congestion_of(&early).unwrap(), UNPACED_START);
        assert_eq!(cc.decide(""), (String::new(), String::new()));
        let (late, _c2) = pair();
        cc.joined(probe(&late));
        for s in [&early, &late] {
            assert_eq!(tcp::congestion_of(s).unwrap(), "reno");
        }
        assert_eq!(cc.used(), None);
        // One the kernel lacks: the server's, and the answer names it.
        let cc = SendCongestion::new("peer", Some("reno".into()));
        let (s, _c) = pair();
        tcp::set_congestion(&s, UNPACED_START).unwrap();
        cc.joined(probe(&s));
        let (used, why) = cc.decide("nosuchcc");
        assert_eq!(used, "reno");
        assert!(!why.is_empty());
        assert_eq!(tcp::congestion_of(&s).unwrap(), "reno");
    }
}
