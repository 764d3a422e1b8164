//! A dialer's data streams: each opened when its machine asks, on a connection dialed
//! ahead when it is still good ([`Dialing`]), over any transport's [`Dial`] (TCP's
//! [`join::Dialer`]; the in-memory [`dmover_net::memnet::MemDial`] in tests).

use std::sync::Arc;

use dmover_net::join::{self, Ahead, Dial, JoinError, JoinWait, LinkMode};
use dmover_net::pace::{Paced, Pacer};
use dmover_proto::auth;
use dmover_proto::control::SessionInfo;

use crate::drive;
use crate::engine::DataStream;
use crate::error::{Error, Result};

/// The dialer's data streams: each opened when its machine asks, on the connection
/// dialed during set-up when it is still good (see [`Dialer::join`]).
pub(crate) struct Dialing<D: Dial = join::Dialer> {
    pub(super) dialer: D,
    pub(super) mode: LinkMode,
    pub(super) wait: JoinWait,
    pub(super) master: [u8; 32],
    /// The session and its key, once open.
    pub(super) key: Option<(u64, [u8; 32])>,
    /// Streams asked for before the session's key was known.
    pub(super) asked: Vec<u16>,
    pub(super) early: Ahead<D::Early>,
    /// The transfer's bandwidth limit, shared by its streams.
    pub(super) pacer: Option<Arc<Pacer>>,
    pub(super) set: tokio::task::JoinSet<Joined<D>>,
}

/// A stream's join, done: its index and the stream, or why it failed.
type Joined<D> = (u16, Result<DataStream<Paced<<D as Dial>::Link>>>);

impl<D: Dial> Dialing<D> {
    /// A session's data streams, to be joined with `dialer` as its machine asks (on
    /// the connections opened ahead, `early`), carried as `mode` says, each waiting for
    /// its join's answer or not (`wait`); `master`: the control connection's secret the
    /// session's key derives from; `pacer`: the transfer's bandwidth limit.
    pub(crate) fn new(
        dialer: D,
        mode: LinkMode,
        wait: JoinWait,
        master: [u8; 32],
        early: Ahead<D::Early>,
        pacer: Option<Arc<Pacer>>,
    ) -> Self {
        Dialing {
            dialer,
            mode,
            wait,
            master,
            key: None,
            asked: Vec::new(),
            early,
            pacer,
            set: tokio::task::JoinSet::new(),
        }
    }

    /// The session's id and salt, known before `Session` (early data): its streams
    /// may join now.
    pub(crate) fn set_session(&mut self, id: u64, salt: &[u8; 32]) {
        self.key = Some((id, auth::session_key(&self.master, id, salt)));
    }
}

impl<D: Dial> drive::Joins for Dialing<D> {
    type Link = Paced<D::Link>;

    fn opened(&mut self, info: &SessionInfo) {
        self.set_session(info.id, &info.salt);
        // Connections the session does not use (it granted fewer streams) close.
        self.early.keep(info.streams);
        for stream in std::mem::take(&mut self.asked) {
            self.open(stream);
        }
    }

    fn open(&mut self, stream: u16) {
        let Some((session, key)) = self.key else {
            self.asked.push(stream);
            return;
        };
        let early = self.early.take(stream);
        let (dialer, mode, wait) = (self.dialer.clone(), self.mode, self.wait);
        let pacer = self.pacer.clone();
        self.set.spawn(async move {
            let r = dialer.join(early, session, stream, &key, mode, wait).await;
            let peer = dialer.server().to_string();
            (
                stream,
                r.map(|io| DataStream {
                    io: Paced::new(io, pacer),
                    peer,
                })
                .map_err(join_error),
            )
        });
    }

    async fn next(&mut self) -> (u16, Result<DataStream<Paced<D::Link>>>) {
        loop {
            match self.set.join_next().await {
                Some(Ok(r)) => return r,
                Some(Err(e)) => tracing::debug!("a data stream join task failed: {e}"),
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// The engine's error for a failed data stream join.
fn join_error(e: JoinError) -> Error {
    match e {
        JoinError::Net(e) => Error::Net(e),
        JoinError::Answer { peer, source } => Error::data("reading from", &peer, source),
    }
}
