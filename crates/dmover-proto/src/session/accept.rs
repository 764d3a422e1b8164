//! The acceptor's side of a handshake, before it knows its role: `Hello` → `Welcome`,
//! `Auth` → (the driver checks the credential) → `AuthOk`, then `Open`, which says
//! whether the acceptor is the source or the sink of the session
//! ([`super::SourceSession::accept`], [`super::SinkSession::accept`]).
//!
//! Nothing after `Auth` is read until the driver has verified the credential, so a
//! refused dialer's later messages are never looked at; the whole exchange must end
//! within the set-up deadline.

use std::collections::VecDeque;
use std::time::Instant;

use super::link::Link;
use super::{Cause, SessionError, Side, State, Timing, unexpected};
use crate::control::{Auth, AuthOk, Control, Hello, Open, Welcome};

/// What the acceptor's application learns.
#[derive(Debug, Clone, PartialEq)]
pub enum AcceptEvent<E> {
    /// The dialer's credential: check it (against [`crate::auth::transcript`] with the
    /// hello's nonce), then call [`Acceptance::verified`] or [`Acceptance::fail`].
    Verify {
        /// The dialer's greeting.
        hello: Hello,
        /// Its credential.
        auth: Auth,
    },
    /// What the dialer asks for: create the role machine for it.
    Opened(Open),
    /// The handshake failed.
    Failed(SessionError<E>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Hello,
    Auth,
    Verifying,
    Open,
    Opened,
}

/// The acceptor's handshake up to `Open`.
#[derive(Debug)]
pub struct Acceptance<E> {
    link: Link<E>,
    phase: Phase,
    welcome: Option<Welcome>,
    hello: Option<Hello>,
    events: VecDeque<AcceptEvent<E>>,
}

impl<E: Cause> Acceptance<E> {
    /// Waits for the dialer's `Hello`, to answer with `welcome`, all by `deadline`.
    pub fn new(
        peer: impl Into<String>,
        timing: Timing,
        deadline: Instant,
        welcome: Welcome,
    ) -> Self {
        let mut link = Link::new(peer.into(), Side::Acceptor, timing);
        link.set_up_by(deadline);
        Acceptance {
            link,
            phase: Phase::Hello,
            welcome: Some(welcome),
            hello: None,
            events: VecDeque::new(),
        }
    }

    /// A control message from the dialer.
    pub fn handle_control(&mut self, now: Instant, msg: Control) {
        let Some(msg) = self.link.screen(now, msg) else {
            return self.flush_failure();
        };
        let peer = self.link.peer.clone();
        match (self.phase, msg) {
            (Phase::Hello, Control::Hello(hello)) => {
                if let Some(w) = self.welcome.take() {
                    self.link.send(Control::Welcome(w));
                }
                self.phase = Phase::Auth;
                self.hello = Some(hello);
            }
            (Phase::Auth, Control::Auth(auth)) => {
                self.phase = Phase::Verifying;
                let hello = self.hello.take().expect("hello kept");
                self.events.push_back(AcceptEvent::Verify { hello, auth });
            }
            (Phase::Open, Control::Open(open)) => {
                self.phase = Phase::Opened;
                self.link.finish();
                self.events.push_back(AcceptEvent::Opened(open));
            }
            (phase, other) => {
                let wanted = match phase {
                    Phase::Hello => "Hello",
                    Phase::Auth => "Auth",
                    Phase::Open => "Open",
                    Phase::Verifying | Phase::Opened => "nothing",
                };
                let e = unexpected(&peer, &other, wanted);
                self.link.fail(now, e);
            }
        }
        self.flush_failure();
    }

    /// The credential is good: answers `AuthOk` (with the acceptor's token proof, when
    /// the dialer proved a token) and waits for `Open`.
    pub fn verified(&mut self, now: Instant, ok: AuthOk) {
        if self.phase != Phase::Verifying || !self.link.live() {
            return;
        }
        let _ = now;
        self.link.send(Control::AuthOk(ok));
        self.phase = Phase::Open;
    }

    /// The driver refused the dialer (a wrong credential) or failed.
    pub fn fail(&mut self, now: Instant, error: E) {
        self.link.fail(now, SessionError::Local(error));
        self.flush_failure();
    }

    /// The control connection closed or failed.
    pub fn control_closed(&mut self, now: Instant, error: E) {
        if self.link.state != State::Running {
            return;
        }
        self.link.control_closed(now, error);
        self.flush_failure();
    }

    /// When [`Acceptance::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.link.poll_timeout()
    }

    /// Handles the set-up deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.link.on_timeout(now);
        self.flush_failure();
    }

    /// The next control message to send.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        self.link.poll_transmit()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<AcceptEvent<E>> {
        self.events.pop_front()
    }

    /// Where the handshake stands: `Finished` once `Open` arrived.
    pub fn state(&self) -> State {
        self.link.state
    }

    fn flush_failure(&mut self) {
        if let Some(e) = self.link.failure.take() {
            self.events.push_back(AcceptEvent::Failed(e));
        }
    }
}
