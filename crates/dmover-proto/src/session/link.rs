//! What both role machines share: the control messages to send, the handshake step
//! being awaited, heartbeats and silence, and how a failure ends the session.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Cause, SessionError, Side, State, Timing, features, unexpected};
use crate::control::{
    Auth, AuthMethod, Control, Credential, Hello, MAX_LIMITS_TEXT, Open, SessionInfo,
    SessionLimits, SessionOptions,
};

/// What a dialer sends in its first flight, and what it checks in the answers.
#[derive(Debug, Clone)]
pub struct Dial {
    /// Its greeting.
    pub hello: Hello,
    /// Its credential's proof (see [`crate::auth`]).
    pub auth: Auth,
    /// What it asks for.
    pub open: Open,
    /// The session's options.
    pub options: SessionOptions,
    /// The token proof the acceptor must answer with in `AuthOk`
    /// ([`crate::auth::server_token_proof`]), when `auth` proved a token.
    pub server_proof: Option<[u8; 32]>,
    /// Its limits ([`features::LIMITS`]), sent in the first flight when `open`
    /// offers the feature.
    pub limits: SessionLimits,
}

impl Dial {
    /// The session a version 8 acceptor opens for this dialer's fresh push, which
    /// early data takes as open before `Session` comes
    /// ([`super::SourceSession::dial_early`]): `id` and `salt` derived from the control
    /// connection ([`crate::auth::session_id`]), the streams and chunk size asked for,
    /// and the features of [`features::BASE`] offered (every acceptor grants those).
    pub fn assumed(&self, id: u64, salt: [u8; 32]) -> SessionInfo {
        SessionInfo {
            id,
            salt,
            streams: self.open.streams,
            chunk_size: self.open.chunk_size,
            features: features::negotiate(self.open.features, 0),
        }
    }
}

/// Where a dialer's handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Welcome,
    AuthOk,
    Session,
    Open,
}

/// The dialer's side of the handshake: `Welcome`, `AuthOk` and `Session` in order.
#[derive(Debug)]
pub(crate) struct Opening {
    step: Step,
    anonymous: bool,
    server_proof: Option<[u8; 32]>,
    requested: Open,
}

impl Opening {
    pub(crate) fn new(d: &Dial) -> Self {
        Opening {
            step: Step::Welcome,
            anonymous: matches!(d.auth.credential, Credential::None),
            server_proof: d.server_proof,
            requested: d.open.clone(),
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.step == Step::Open
    }

    /// The features the session will use for certain: those of [`features::BASE`]
    /// offered.
    fn base(&self) -> u64 {
        self.requested.features & features::BASE
    }

    /// What the next answer is, for timeouts.
    pub(crate) fn awaited(&self) -> &'static str {
        match self.step {
            Step::Welcome => "welcome",
            Step::AuthOk => "authentication",
            Step::Session | Step::Open => "session",
        }
    }

    /// Takes an answer; `Some` once the session is open. `exact_chunk`: the session
    /// must have the chunk size asked for (a source that cut its manifest with it).
    pub(crate) fn on_message<E>(
        &mut self,
        peer: &str,
        msg: Control,
        exact_chunk: bool,
    ) -> Result<Option<SessionInfo>, SessionError<E>> {
        match (self.step, msg) {
            (Step::Welcome, Control::Welcome(w)) => {
                if self.anonymous && w.auth == AuthMethod::Required {
                    return Err(SessionError::AuthRequired {
                        peer: peer.to_string(),
                    });
                }
                // A server without authentication ignores a credential and proves
                // nothing, as when the client had none to send.
                if w.auth != AuthMethod::Required {
                    self.server_proof = None;
                }
                self.step = Step::AuthOk;
                Ok(None)
            }
            (Step::AuthOk, Control::AuthOk(ok)) => {
                if let Some(want) = self.server_proof {
                    if !ok
                        .proof
                        .is_some_and(|p| crate::auth::proofs_equal(&p, &want))
                    {
                        return Err(SessionError::ServerProof {
                            peer: peer.to_string(),
                        });
                    }
                }
                self.step = Step::Session;
                Ok(None)
            }
            (Step::Session, Control::Session(s)) => {
                let bad = |what: String| SessionError::Protocol {
                    peer: peer.to_string(),
                    what,
                };
                if s.streams == 0 {
                    return Err(bad("session with zero streams".into()));
                }
                if s.streams > self.requested.streams {
                    return Err(bad(format!(
                        "session with {} streams, {} asked for",
                        s.streams, self.requested.streams
                    )));
                }
                crate::layout::validate_chunk_size(s.chunk_size).map_err(|e| {
                    SessionError::Malformed {
                        peer: peer.to_string(),
                        source: e,
                    }
                })?;
                if exact_chunk && s.chunk_size != self.requested.chunk_size {
                    return Err(bad(format!(
                        "session chunk size {} differs from the {} asked for",
                        s.chunk_size, self.requested.chunk_size
                    )));
                }
                if s.features & !features::negotiate(self.requested.features, u64::MAX) != 0 {
                    return Err(bad(format!(
                        "session features {:#x} were not offered ({:#x})",
                        s.features, self.requested.features
                    )));
                }
                let left_out = self.base() & !s.features;
                if left_out != 0 {
                    return Err(bad(format!(
                        "session without the {} feature, which every acceptor grants when \
                         offered",
                        features::name(1 << left_out.trailing_zeros())
                    )));
                }
                self.step = Step::Open;
                Ok(Some(s))
            }
            (_, msg) => {
                let wanted = match self.step {
                    Step::Welcome => "Welcome",
                    Step::AuthOk => "AuthOk",
                    _ => "Session",
                };
                Err(unexpected(peer, &msg, wanted))
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Beat {
    next_ping: Instant,
    last_heard: Instant,
}

/// What a control message is to a role once the set-up has seen it.
pub(crate) enum Setup {
    /// The set-up took it; nothing for the role.
    Taken,
    /// (dialer) The session is open.
    Opened(SessionInfo),
    /// (acceptor) The dialer's session options.
    Options(SessionOptions),
    /// A message of the session proper, for the role.
    Session(Control),
}

/// The control side of a session.
#[derive(Debug)]
pub(crate) struct Link<E> {
    pub(crate) peer: String,
    pub(crate) side: Side,
    pub(crate) timing: Timing,
    pub(crate) state: State,
    out: VecDeque<Control>,
    beat: Option<Beat>,
    step: Option<(Instant, &'static str)>,
    setup: Option<Instant>,
    /// Acceptor: when every data stream must have joined.
    joins_by: Option<Instant>,
    failing: Option<(SessionError<E>, Instant)>,
    control_open: bool,
    /// A dialer's handshake, until the session is open.
    opening: Option<Opening>,
    /// (feature LIMITS) This side sent its limits.
    limits_sent: bool,
    /// (feature LIMITS) The peer's limits came.
    limits_heard: bool,
    /// The failure, until the machine hands it out as an event.
    pub(crate) failure: Option<SessionError<E>>,
}

impl<E: Cause> Link<E> {
    pub(crate) fn new(peer: String, side: Side, timing: Timing) -> Self {
        Link {
            peer,
            side,
            timing,
            state: State::Running,
            out: VecDeque::new(),
            beat: None,
            step: None,
            setup: None,
            joins_by: None,
            failing: None,
            control_open: true,
            opening: None,
            limits_sent: false,
            limits_heard: false,
            failure: None,
        }
    }

    /// Whether the session still runs and has not begun to fail.
    pub(crate) fn live(&self) -> bool {
        self.state == State::Running && self.failing.is_none()
    }

    pub(crate) fn send(&mut self, msg: Control) {
        if self.live() {
            self.out.push_back(msg);
        }
    }

    /// Sends a dialer's first flight, all at once, and awaits the `Welcome`. Its
    /// limits go in it (feature LIMITS: the acceptor grants it), so the acceptor has
    /// them before the sink's `Go` and sets its sending ends before data flows.
    pub(crate) fn dial(&mut self, now: Instant, d: Dial) {
        let opening = Opening::new(&d);
        let limits = opening.base() & features::LIMITS != 0;
        self.opening = Some(opening);
        self.send(Control::Hello(d.hello));
        self.send(Control::Auth(d.auth));
        self.send(Control::Open(d.open));
        self.send(Control::Options(d.options));
        if limits {
            self.limits_sent = true;
            self.send(Control::Limits(d.limits));
        }
        self.expect(now, "welcome");
    }

    /// (dialer) The features the session uses, known before `Session` comes: those
    /// of [`features::BASE`] offered (`None` on an acceptor).
    pub(crate) fn offered(&self) -> Option<u64> {
        self.opening.as_ref().map(Opening::base)
    }

    /// (dialer) Whether `Session` came: the handshake is over.
    pub(crate) fn opened(&self) -> bool {
        self.opening.as_ref().is_some_and(Opening::is_open)
    }

    /// The set-up's part of a message from the peer, the same for both roles: the
    /// peer's `Error`, a dialer's handshake answers (`exact_chunk`: the session must
    /// have the chunk size asked for), an acceptor's wait for `Options` once it has
    /// `granted` the session. Starts the heartbeat when the session opens.
    pub(crate) fn setup(
        &mut self,
        now: Instant,
        msg: Control,
        exact_chunk: bool,
        granted: bool,
    ) -> Result<Setup, SessionError<E>> {
        let peer = self.peer.clone();
        if let Control::Error(_) = msg {
            return Err(unexpected(&peer, &msg, ""));
        }
        if let Some(o) = self.opening.as_mut().filter(|o| !o.is_open()) {
            let info = o.on_message(&peer, msg, exact_chunk)?;
            let awaited = o.awaited();
            return Ok(match info {
                None => {
                    self.expect(now, awaited);
                    Setup::Taken
                }
                Some(info) => {
                    self.start_heartbeat(now, self.timing.heartbeat);
                    Setup::Opened(info)
                }
            });
        }
        if self.side == Side::Acceptor && !self.heartbeat_running() {
            return match msg {
                Control::Options(o) if granted => {
                    self.start_heartbeat(now, options_heartbeat(&o));
                    Ok(Setup::Options(o))
                }
                other => Err(unexpected(&peer, &other, "Options")),
            };
        }
        Ok(Setup::Session(msg))
    }

    /// (feature LIMITS) The peer's limits came: refused when they came before, or
    /// with a text over [`MAX_LIMITS_TEXT`] bytes.
    pub(crate) fn on_limits(&mut self, l: &SessionLimits) -> Result<(), SessionError<E>> {
        let what = if self.limits_heard {
            "Limits came twice".to_string()
        } else if l.congestion.len() > MAX_LIMITS_TEXT || l.refused.len() > MAX_LIMITS_TEXT {
            format!(
                "Limits with a {}-byte congestion control and a {}-byte refusal",
                l.congestion.len(),
                l.refused.len()
            )
        } else {
            self.limits_heard = true;
            return Ok(());
        };
        Err(SessionError::Protocol {
            peer: self.peer.clone(),
            what,
        })
    }

    /// (feature LIMITS, acceptor) Answers the dialer's limits with this side's, once:
    /// only in a session that uses the feature, after the dialer's came.
    pub(crate) fn answer_limits(&mut self, info: Option<&SessionInfo>, l: SessionLimits) {
        let uses = info.is_some_and(|i| i.features & features::LIMITS != 0);
        if self.side == Side::Acceptor && uses && self.limits_heard && !self.limits_sent {
            self.limits_sent = true;
            self.send(Control::Limits(l));
        }
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Control> {
        self.out.pop_front()
    }

    /// A message came from the peer.
    pub(crate) fn heard(&mut self, now: Instant) {
        if let Some(b) = &mut self.beat {
            b.last_heard = now;
        }
    }

    /// The session is open: heartbeats start, handshake steps end.
    pub(crate) fn start_heartbeat(&mut self, now: Instant, interval: Duration) {
        self.timing.heartbeat = interval;
        self.step = None;
        self.setup = None;
        self.beat = Some(Beat {
            next_ping: now + interval,
            last_heard: now,
        });
    }

    pub(crate) fn heartbeat_running(&self) -> bool {
        self.beat.is_some()
    }

    /// Awaits a handshake step's answer (until the heartbeat runs).
    pub(crate) fn expect(&mut self, now: Instant, what: &'static str) {
        if self.beat.is_none() {
            self.step = Some((now + self.timing.handshake, what));
        }
    }

    /// The acceptor's whole set-up must end by `deadline`.
    pub(crate) fn set_up_by(&mut self, deadline: Instant) {
        self.setup = Some(deadline);
    }

    /// (acceptor) Every data stream must join within the join limit from `now`.
    pub(crate) fn await_joins(&mut self, now: Instant) {
        if self.side == Side::Acceptor {
            self.joins_by = Some(now + self.timing.join);
        }
    }

    /// No join is awaited any more (all joined, or no data is expected).
    pub(crate) fn joins_done(&mut self) {
        self.joins_by = None;
    }

    /// Fails the session if the join limit passed with `joined` of `streams` joined.
    pub(crate) fn check_joins(&mut self, now: Instant, joined: usize, streams: usize) {
        if self.joins_by.is_some_and(|d| now >= d) && self.live() {
            let e = SessionError::Joins {
                peer: self.peer.clone(),
                joined: joined as u16,
                streams: streams as u16,
            };
            self.fail(now, e);
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if let Some((_, until)) = &self.failing {
            return Some(*until);
        }
        if self.state != State::Running {
            return None;
        }
        let beat = self.beat.map(|b| {
            b.next_ping
                .min(b.last_heard + self.timing.silence() + Duration::from_nanos(1))
        });
        let joins = self.joins_by.filter(|_| self.failing.is_none());
        [beat, self.step.map(|s| s.0), self.setup, joins]
            .into_iter()
            .flatten()
            .min()
    }

    /// Handles the link's deadlines at `now`.
    pub(crate) fn on_timeout(&mut self, now: Instant) {
        if let Some((_, until)) = &self.failing {
            if now >= *until {
                let (e, _) = self.failing.take().expect("failing");
                self.finalize(e);
            }
            return;
        }
        if self.state != State::Running {
            return;
        }
        if let Some(deadline) = self.setup {
            if now >= deadline {
                let secs = self.timing.handshake.as_secs();
                return self.fail(now, SessionError::SetupTimeout { secs });
            }
        }
        if let Some((deadline, what)) = self.step {
            if now >= deadline {
                let e = SessionError::Timeout {
                    peer: self.peer.clone(),
                    what,
                    secs: self.timing.handshake.as_secs(),
                };
                return self.fail(now, e);
            }
        }
        if let Some(b) = &mut self.beat {
            if now > b.last_heard + self.timing.silence() {
                let e = SessionError::Silent {
                    peer: self.peer.clone(),
                    secs: self.timing.silence().as_secs().max(1),
                };
                return self.fail(now, e);
            }
            if now >= b.next_ping {
                b.next_ping = now + self.timing.heartbeat;
                self.out.push_back(Control::Ping);
            }
        }
    }

    /// Fails the session with `e`, at once or, for an error that is not a root cause,
    /// after waiting briefly for the peer's report. Of several errors the peer's report
    /// or else the most telling is kept.
    pub(crate) fn fail(&mut self, now: Instant, e: SessionError<E>) {
        if self.state != State::Running {
            return;
        }
        let remote = matches!(e, SessionError::Remote { .. });
        if let Some((cur, _)) = &mut self.failing {
            if remote || e.rank() > cur.rank() {
                *cur = e;
            }
            if remote {
                let (e, _) = self.failing.take().expect("failing");
                self.finalize(e);
            }
            return;
        }
        if remote || e.rank() >= 3 || !self.control_open {
            self.finalize(e);
        } else {
            self.failing = Some((e, now + self.timing.report_wait));
        }
    }

    /// While waiting for the peer's report, every message but its `Error` is ignored.
    /// Returns the message when the link is not failing.
    pub(crate) fn screen(&mut self, now: Instant, msg: Control) -> Option<Control> {
        self.heard(now);
        if self.failing.is_none() && self.state == State::Running {
            return Some(msg);
        }
        if let (Some(_), Control::Error(m)) = (&self.failing, &msg) {
            let e = SessionError::Remote {
                peer: self.peer.clone(),
                code: m.code,
                message: m.message.clone(),
            };
            self.fail(now, e);
        }
        None
    }

    fn finalize(&mut self, e: SessionError<E>) {
        if !matches!(e, SessionError::Remote { .. }) && self.control_open {
            self.out.push_back(Control::Error(e.to_msg()));
        }
        self.state = State::Failed;
        self.step = None;
        self.beat = None;
        self.setup = None;
        self.failure = Some(e);
    }

    /// The control connection failed or closed: nothing more can be read or sent.
    pub(crate) fn control_closed(&mut self, now: Instant, e: E) {
        self.control_open = false;
        self.out.clear();
        match self.failing.take() {
            Some((cur, _)) => self.finalize(cur),
            None => self.fail(now, SessionError::Local(e)),
        }
    }

    /// The session ended well.
    pub(crate) fn finish(&mut self) {
        if self.state == State::Running && self.failing.is_none() {
            self.state = State::Finished;
            self.step = None;
            self.beat = None;
            self.setup = None;
        }
    }
}

/// The heartbeat interval an acceptor takes from the dialer's options.
pub(crate) fn options_heartbeat(o: &SessionOptions) -> Duration {
    super::Timing::heartbeat_from_ms(o.heartbeat_ms)
}
