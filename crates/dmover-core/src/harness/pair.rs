//! Whole sessions on the production drivers, one process, no sockets: the harness
//! the driver tests and the pair properties share.
//!
//! The dialer's control channel and the acceptor's meet in an in-memory relay that a
//! script may break or silence; data streams go over the in-memory transport
//! (`memnet`: the dialer's production `Dialing` joins them through a real
//! `JoinTable` with the real proofs, the acceptor's `Accepted` takes them as a
//! server's does, each wrapped in the script's [`FaultPlan`]); the dialer's handshake
//! is answered by [`accept`]. Either role dials: a push (the source dials) or a pull
//! (the sink dials). Everything but sockets and files is the code a real session runs.
//!
//! On a current-thread runtime with tokio's clock paused ([`paused`]) and a disk pool
//! that runs its jobs where they are queued ([`DiskPool::inline`]), a session runs
//! the same way every time, and its time limits (stalls, silences, the heartbeat)
//! cost no wall-clock time: tokio moves the clock on whenever every task waits.

use std::sync::Arc;
use std::time::Duration;

use dmover_net::control::ControlChannel;
use dmover_proto::control::{Auth, AuthOk, ErrorCode, Hello, Open, SessionInfo, SessionOptions};
use dmover_proto::manifest::{Entry, Totals};
use dmover_proto::session::{Acceptance, ChunkSet, SinkSession, SourceSession, Timing};
use tokio::sync::mpsc;

use crate::dialer::now;
use crate::diskpool::DiskPool;
use crate::drive::*;
use crate::engine::Run;
use crate::error::{Error, Result};

use dmover_net::fault::{FaultPlan, Faulty};
use dmover_net::memnet::WireFaults;
use dmover_proto::control::{Credential, DataProtection, DirectIo, Op, SessionLimits, Welcome};
use dmover_proto::session::{Dial, Limits};
use tokio::io::DuplexStream;

/// The chunk size of the harness's sessions.
pub const CHUNK: u32 = 64 << 10;
/// The control connection's secret both sides derive the session key from.
const MASTER: [u8; 32] = [7; 32];

/// What happens to the control connection, some time after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlFault {
    /// It breaks: both ends see it close.
    Break(Duration),
    /// It goes silent both ways, and stays open.
    Silence(Duration),
}

/// Which data stream goes wrong how: given the order in which the acceptor took a
/// stream (0 for the first), its fault plan.
pub type LinkFaults = Arc<dyn Fn(usize) -> Option<Arc<FaultPlan>> + Send + Sync>;

/// How a session is wired, and what goes wrong in it.
#[derive(Clone)]
pub struct Wire {
    /// The source dials (a push); otherwise the sink does (a pull).
    pub push: bool,
    pub streams: u16,
    pub checksum: bool,
    /// Features the dialer offers.
    pub features: u64,
    pub timing: Timing,
    /// The data streams' faults.
    pub links: LinkFaults,
    pub control: Option<ControlFault>,
    /// The acceptor refuses the dialer's credential.
    pub refuse: bool,
    /// The disk pool both ends use.
    pub disk: Arc<DiskPool>,
    /// Chunk buffers of the source and of the sink.
    pub buffers: (usize, usize),
    /// How long every byte takes one way, on the control connection and the data
    /// streams.
    pub latency: Duration,
    /// Early data (protocol version 8): the dialer takes the session the acceptor will
    /// open as known from the start (its id from the connection's secret) and its
    /// streams join, and a push's first chunks go, with the first flight.
    pub early: bool,
    /// The sink's manifest limits.
    pub limits: Limits,
    /// (feature TUNING) The streams the source's tuner starts with.
    pub tuned_start: u16,
    /// The dialer's options say `resume` (the sink tells what it holds) and
    /// `continue_on_error`.
    pub resume: bool,
    pub continue_on_error: bool,
    /// Bytes per second each data stream carries each way (`None`: no limit).
    pub rate: Option<u64>,
    /// What goes wrong with data streams below their records.
    pub wire: Option<WireFaults>,
    /// Added to `latency` on the control connection: what a side sends there arrives
    /// after what it sent on the data streams at the same time.
    pub control_delay: Duration,
    /// (feature LIMITS) The dialer's limits; the acceptor answers with half its rate
    /// and the congestion control asked for ([`answer_limits`]).
    pub asks: SessionLimits,
}

/// The acceptor's answer to the dialer's limits `l` (feature LIMITS).
pub fn answer_limits(l: &SessionLimits) -> SessionLimits {
    SessionLimits {
        bwlimit: l.bwlimit / 2,
        congestion: l.congestion.clone(),
        refused: String::new(),
    }
}

impl Wire {
    /// A push over `streams` streams with nothing going wrong, on a disk pool that
    /// runs its jobs where they are queued (for a [`paused`] runtime).
    pub fn push(streams: u16, checksum: bool) -> Self {
        Wire {
            push: true,
            streams,
            checksum,
            features: 0,
            timing: timing(Duration::from_secs(5), Duration::from_secs(30)),
            links: Arc::new(|_| None),
            control: None,
            refuse: false,
            disk: Arc::new(DiskPool::inline()),
            buffers: (6, 4),
            latency: Duration::ZERO,
            early: false,
            limits: Limits::default(),
            tuned_start: crate::session::TUNED_START,
            resume: false,
            continue_on_error: false,
            rate: None,
            wire: None,
            control_delay: Duration::ZERO,
            asks: SessionLimits::default(),
        }
    }

    /// The options the dialer sends.
    fn options(&self) -> SessionOptions {
        SessionOptions {
            resume: self.resume,
            continue_on_error: self.continue_on_error,
            ..options(self.timing.heartbeat)
        }
    }

    /// The same, every stream with `plan` (a plan cuts at most one stream).
    pub fn with_plan(mut self, plan: Option<Arc<FaultPlan>>) -> Self {
        self.links = Arc::new(move |_| plan.clone());
        self
    }

    fn env(&self, buffers: usize) -> Env {
        Env {
            disk: self.disk.clone(),
            run: Run::new(),
            buffers: Box::new(move |_| buffers),
            chunk_delay: None,
            zerocopy: None,
            limits: None,
            receive_budget: None,
            send_budget: None,
            tuned_start: self.tuned_start,
            disk_room: None,
            manifest_charge: None,
        }
    }

    fn dial(&self) -> Dial {
        let op = if self.push {
            Op::Push {
                dest: b"d".to_vec(),
            }
        } else {
            Op::Pull {
                sources: vec![b"d".to_vec()],
            }
        };
        Dial {
            hello: Hello {
                software: "test".into(),
                nonce: [1; 32],
            },
            auth: Auth {
                user: String::new(),
                credential: Credential::None,
            },
            open: Open {
                op,
                streams: self.streams,
                chunk_size: CHUNK,
                checksum: self.checksum,
                direct_io: DirectIo::Auto,
                protection: DataProtection::Authenticated,
                features: if self.early {
                    self.features | dmover_proto::session::features::EARLY
                } else {
                    self.features
                },
            },
            options: self.options(),
            server_proof: None,
            limits: self.asks.clone(),
        }
    }
}

/// The options a harness session runs with: a heartbeat every `heartbeat`.
pub fn options(heartbeat: Duration) -> SessionOptions {
    SessionOptions {
        resume: false,
        journal: false,
        fsync: false,
        verify: false,
        continue_on_error: false,
        heartbeat_ms: heartbeat.as_millis() as u32,
    }
}

/// How a session ended at each end, and when (from its start).
pub struct Ends<K, S> {
    pub source: Result<SourceRun<K>>,
    pub sink: Result<SinkRun<S>>,
    pub source_at: Duration,
    pub sink_at: Duration,
    /// (feature LIMITS) The dialer's limits as the acceptor heard them, and the
    /// acceptor's answer as the dialer heard it.
    pub limits: (Option<SessionLimits>, Option<SessionLimits>),
}

/// Where an acceptor's limits answer ([`answer_limits`]) notes what it heard.
type Heard = Arc<parking_lot::Mutex<Option<SessionLimits>>>;

/// The acceptor's environment: `env`, answering the dialer's limits.
fn answering(mut env: Env, heard: &Heard) -> Env {
    let heard = heard.clone();
    env.limits = Some(Box::new(move |l: &SessionLimits| {
        *heard.lock() = Some(l.clone());
        answer_limits(l)
    }));
    env
}

/// A current-thread runtime whose clock is paused: it moves only when every task
/// waits, straight to the next timer.
pub fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// The queue a source's manifest comes from: given the source's machine, queues the
/// manifest on it, or returns the feed of a growing one.
pub type Manifest =
    Box<dyn FnOnce(&mut SourceSession<Fault>) -> Option<mpsc::UnboundedReceiver<GrowPart>> + Send>;

/// A manifest queued whole: `entries`, whose data are `chunks`.
pub fn whole(entries: Vec<Entry>, chunks: ChunkSet) -> Manifest {
    Box::new(move |m| {
        m.push_manifest(&entries);
        m.end_manifest(Totals::of(&entries), chunks);
        None
    })
}

/// One session between both drivers, wired as `wire` says: `source` sends the
/// manifest `manifest` queues, the sink's storage is what `prepare` makes. With
/// `demand` (a pull only) the session is request-driven, a mount's: the sink asks
/// for what `demand`'s owner asks.
pub async fn session<K: SourceStore, S: SinkStore>(
    wire: Wire,
    source: K,
    prepare: Prepare<S>,
    manifest: Manifest,
    demand: Option<Demand<S>>,
) -> Ends<K, S> {
    assert!(
        demand.is_none() || !wire.push,
        "only a pull is request-driven"
    );
    let start = tokio::time::Instant::now();
    let (dialer, acceptor) = control(wire.control, wire.latency + wire.control_delay);
    let max = dmover_proto::control::MAX_FRAME;
    // A stream's own idle limit is the stream timeout, as a server's and a client's.
    let idle = wire.timing.stall;
    let mut net =
        dmover_net::memnet::MemNet::new(idle, Duration::from_secs(5)).with_latency(wire.latency);
    if let Some(rate) = wire.rate {
        net = net.with_rate(rate);
    }
    if let Some(faults) = wire.wire.clone() {
        net = net.with_faults(faults);
    }
    let mut joins = crate::dialer::Dialing::new(
        net.dialer("acceptor", Duration::from_secs(5)),
        dmover_net::join::LinkMode {
            protection: DataProtection::Authenticated,
            idle,
        },
        dmover_net::join::JoinWait::Pipelined,
        MASTER,
        Default::default(),
        None,
    );
    // The session every acceptor opens: its id and salt from the connection's secret
    // (as a server's), which an early dialer knows from the start.
    let (id, salt) = dmover_proto::auth::session_id(&MASTER);
    if wire.early {
        joins.set_session(id, &salt);
    }
    let at = |r| (r, start.elapsed());
    let at2 = |r| (r, start.elapsed());
    let heard = Heard::default();
    if wire.push {
        let mut ch = ControlChannel::new(dialer, "sink", max);
        let mut m = if wire.early {
            SourceSession::dial_early(now(), "sink", wire.timing, wire.dial(), id, salt)
        } else {
            SourceSession::dial(now(), "sink", wire.timing, wire.dial())
        };
        let growth = manifest(&mut m);
        let env = wire.env(wire.buffers.0);
        let run = env.run.clone();
        let sending = async { at(source_growing(m, &mut ch, joins, source, env, growth).await) };
        let receiving = async {
            let mut ch = ControlChannel::new(acceptor, "source", max);
            let Some((info, joins)) = open(&wire, &net, &mut ch).await else {
                let e = Error::refused(ErrorCode::Auth, "refused");
                return at2(Err(e));
            };
            let deadline = now() + wire.timing.handshake;
            let limits = wire.limits;
            let mut m = SinkSession::accept(now(), "source", wire.timing, limits, deadline);
            m.grant(now(), info);
            let env = answering(wire.env(wire.buffers.1), &heard);
            at2(sink(m, &mut ch, joins, prepare, None, env).await)
        };
        let ((source, source_at), (sink, sink_at)) = tokio::join!(sending, receiving);
        let answer = run.progress.peer_limits.lock().clone();
        Ends {
            source,
            sink,
            source_at,
            sink_at,
            limits: (heard.lock().clone(), answer),
        }
    } else {
        let mut ch = ControlChannel::new(dialer, "source", max);
        let (timing, limits, dial) = (wire.timing, wire.limits, wire.dial());
        let m = if wire.early {
            SinkSession::dial_early(now(), "source", timing, limits, dial, id, salt)
        } else {
            SinkSession::dial(now(), "source", timing, limits, dial)
        };
        let env = wire.env(wire.buffers.1);
        let run = env.run.clone();
        let options = Some(wire.options());
        let receiving = async {
            at2(match demand {
                Some(d) => sink_on_demand(m, &mut ch, joins, prepare, options, env, d).await,
                None => sink(m, &mut ch, joins, prepare, options, env).await,
            })
        };
        let sending = async {
            let mut ch = ControlChannel::new(acceptor, "sink", max);
            let Some((info, joins)) = open(&wire, &net, &mut ch).await else {
                let e = Error::refused(ErrorCode::Auth, "refused");
                return at(Err(e));
            };
            let deadline = now() + wire.timing.handshake;
            let mut m = SourceSession::accept(now(), "sink", wire.timing, deadline);
            m.grant(now(), info);
            let growth = manifest(&mut m);
            let env = answering(wire.env(wire.buffers.0), &heard);
            at(source_growing(m, &mut ch, joins, source, env, growth).await)
        };
        let ((source, source_at), (sink, sink_at)) = tokio::join!(sending, receiving);
        let answer = run.progress.peer_limits.lock().clone();
        Ends {
            source,
            sink,
            source_at,
            sink_at,
            limits: (heard.lock().clone(), answer),
        }
    }
}

/// The data streams an acceptor takes: joined through the in-memory table, wrapped
/// in their faults.
type Taken = Accepted<DuplexStream, Faulty<dmover_net::stream::DataIo<DuplexStream>>>;

/// The acceptor's handshake, as a server's: verifies the dialer (or refuses it, as
/// `wire` says), opens the session on the join table and gives the session and its
/// streams (`None`: the handshake failed, and the dialer was told).
async fn open(
    wire: &Wire,
    net: &dmover_net::memnet::MemNet,
    ch: &mut ControlChannel<DuplexStream>,
) -> Option<(SessionInfo, Taken)> {
    let welcome = Welcome {
        software: "test".into(),
        nonce: [2; 32],
        auth: dmover_proto::control::AuthMethod::None,
    };
    let deadline = now() + wire.timing.handshake;
    let a = Acceptance::new("dialer", wire.timing, deadline, welcome);
    let refuse = wire.refuse;
    let verify = |_: &Hello, _: &Auth| {
        if refuse {
            Err(Error::refused(
                ErrorCode::Auth,
                "this credential is refused here",
            ))
        } else {
            Ok(AuthOk { proof: None })
        }
    };
    let open = accept(a, ch, verify).await.ok()?;
    let (id, salt) = dmover_proto::auth::session_id(&MASTER);
    let info = SessionInfo {
        id,
        salt,
        streams: open.streams,
        chunk_size: open.chunk_size,
        features: dmover_proto::session::features::negotiate(
            open.features,
            dmover_proto::session::features::SUPPORTED,
        ),
    };
    let key = dmover_proto::auth::session_key(&MASTER, info.id, &info.salt);
    let rx = net
        .table()
        .open(info.id, key, open.protection, info.streams)
        .expect("a new session");
    let links = wire.links.clone();
    let taken = std::sync::atomic::AtomicUsize::new(0);
    let joins = Accepted::new(rx, move |io| {
        let n = taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Faulty::new(io, links(n))
    });
    Some((info, joins))
}

/// The two ends of a control connection `latency` long one way, through a relay
/// that `fault` may break or silence.
fn control(fault: Option<ControlFault>, latency: Duration) -> (DuplexStream, DuplexStream) {
    let (dialer, mut near) = dmover_net::memnet::pipe(latency);
    let (mut far, acceptor) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let relay = tokio::io::copy_bidirectional(&mut near, &mut far);
        let Some(fault) = fault else {
            let _ = relay.await;
            return;
        };
        let (ControlFault::Break(at) | ControlFault::Silence(at)) = fault;
        tokio::select! {
            _ = relay => return,
            () = tokio::time::sleep(at) => {}
        }
        if let ControlFault::Silence(_) = fault {
            // Open and silent until the runtime goes (the ends must give up first).
            std::future::pending::<()>().await;
        }
        drop((near, far));
    });
    (dialer, acceptor)
}
