//! The sink role's driver: prepares the storage when the manifest is in, keeps the
//! first copy of each chunk that arrives and writes it on a disk thread, acknowledges
//! as the machine says; also the request-driven sink of a mount ([`sink_on_demand`]).

use super::*;

/// What a sink session achieved.
pub struct SinkRun<K> {
    /// The session.
    pub info: SessionInfo,
    /// What the sink did.
    pub summary: Summary,
    /// The source's account of its sending.
    pub report: SendReport,
    /// What the streams went through.
    pub stats: StreamStats,
    /// The storage.
    pub store: Arc<K>,
}

/// Makes the sink for a manifest (on a disk thread): the entries, the session's chunk
/// size and options.
pub type Prepare<K> = Box<dyn FnOnce(Vec<Entry>, u32, &SessionOptions) -> Result<K> + Send>;

enum SinkIn<K> {
    Arrived {
        stream: u16,
        chunk: u64,
        buf: PoolBuf,
        digests: Vec<DigestEntry>,
        crc: Option<u32>,
    },
    /// A part frame (feature `PARTS`).
    Part {
        stream: u16,
        chunk: u64,
        offset: u32,
        data: Vec<u8>,
        digests: Vec<DigestEntry>,
        crc: Option<u32>,
    },
    PartWritten(Result<()>),
    End {
        stream: u16,
        sent: u64,
    },
    Failed {
        stream: u16,
        error: Error,
    },
    Written {
        chunk: u64,
        result: Result<()>,
    },
    Prepared(Result<(K, Held)>),
    Finished(Result<Summary>),
}

/// Drives the sink role `m` until the session ends. `options`: the session's options
/// when this side dialed (an acceptor takes the dialer's).
pub async fn sink<C, J, K>(
    m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    env: Env,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    sink_with(m, ch, joins, prepare, options, env, None).await
}

/// What the owner of a request-driven sink ([`sink_on_demand`]) asks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DemandAsk {
    /// Send these chunks of the layout (each again if it came before: its next copy
    /// is written again; one already on its way is not asked for twice).
    Want(Vec<std::ops::Range<u64>>),
    /// (feature `PARTS`, when [`DemandEvent::Ready`] said the session uses it) Send
    /// these byte ranges of chunks, each as a part frame (the storage's `write_part`).
    WantParts(Vec<dmover_proto::control::Part>),
    /// Close the session: the storage's `finish`, then `Done` (dropping the sender
    /// does the same).
    Close,
}

/// What a request-driven sink tells its owner.
#[derive(Debug)]
pub enum DemandEvent<K> {
    /// The storage is prepared and `OnDemand` went out: requests may follow. With the
    /// session's features.
    Ready(Arc<K>, u64),
    /// Chunk `k` arrived whole and is written into the storage.
    Written(u64),
}

/// The owner's side of a request-driven sink: its requests in, the sink's news out.
#[derive(Debug)]
pub struct Demand<K> {
    /// Requests, taken once the storage is prepared ([`DemandEvent::Ready`]).
    pub asks: mpsc::UnboundedReceiver<DemandAsk>,
    /// News for the owner.
    pub events: mpsc::UnboundedSender<DemandEvent<K>>,
}

/// [`sink`] of a request-driven session (feature
/// [`dmover_proto::session::features::RANGES`], which the session must use): the
/// manifest is answered with `OnDemand`, the source sends only the chunks `demand`
/// asks for, and the session lasts until the owner closes it ([`DemandAsk::Close`]).
pub async fn sink_on_demand<C, J, K>(
    m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    env: Env,
    demand: Demand<K>,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    sink_with(m, ch, joins, prepare, options, env, Some(demand)).await
}

/// The next request of a request-driven sink's owner (never, without one); `None`: the
/// owner is gone.
async fn next_ask(d: &mut Option<mpsc::UnboundedReceiver<DemandAsk>>) -> Option<DemandAsk> {
    match d {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sink_with<C, J, K>(
    m: SinkSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    prepare: Prepare<K>,
    options: Option<SessionOptions>,
    env: Env,
    demand: Option<Demand<K>>,
) -> Result<SinkRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    SinkDriver::new(m, ch, joins, prepare, options, env, demand)
        .run()
        .await
}

/// A sink session's driver (see [`SourceDriver`]: the same loop).
struct SinkDriver<'a, C, J: Joins, K> {
    m: SinkSession<Fault>,
    ctl: ControlLink<'a, C>,
    joins: J,
    env: Env,
    peer: String,
    /// What the stream tasks and disk threads report.
    tx: mpsc::UnboundedSender<SinkIn<K>>,
    rx: mpsc::UnboundedReceiver<SinkIn<K>>,
    /// Makes the storage once the manifest is in.
    prepare: Option<Prepare<K>>,
    /// The session's options (a dialer's own, or as the dialer sent them).
    options: Option<SessionOptions>,
    /// The storage and what an earlier attempt left, while the resume is agreed.
    prep: Option<(K, Held)>,
    /// Files the source listed as sparse, and the metadata it sent, before its
    /// manifest: for the storage.
    sparse: Vec<u32>,
    meta: Vec<EntryMeta>,
    /// The storage, what writes it and the chunk buffers, once prepared.
    live: Option<(Arc<K>, Arc<dyn Sink>, Pool)>,
    /// Streams that joined before the storage was ready.
    waiting: Vec<(u16, DataStream<J::Link>)>,
    tasks: HashMap<u16, Task<u64>>,
    summary: Option<Summary>,
    /// Later parts of a growing manifest that came before the storage was ready.
    grown: Vec<GrownPart>,
    /// Newer directory times that came while the storage was on a disk thread.
    times: Vec<(u32, dmover_proto::manifest::Mtime)>,
    cancelled: bool,
    /// Writes still queued are skipped once the session failed.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    windows: Budget,
    disk_tune: Option<DiskTune>,
    /// A request-driven sink's owner: its requests, and where its news go.
    asks: Option<mpsc::UnboundedReceiver<DemandAsk>>,
    news: Option<mpsc::UnboundedSender<DemandEvent<K>>>,
    closing: bool,
}

/// What a sink driver woke up for.
enum SinkWake<K, L> {
    Cancelled,
    Input(SinkIn<K>),
    Ask(Option<DemandAsk>),
    Joined(u16, Result<DataStream<L>>),
    Control(std::result::Result<Control, NetError>),
    Timeout,
}

impl<'a, C, J, K> SinkDriver<'a, C, J, K>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SinkStore,
{
    fn new(
        m: SinkSession<Fault>,
        ch: &'a mut ControlChannel<C>,
        joins: J,
        prepare: Prepare<K>,
        options: Option<SessionOptions>,
        env: Env,
        demand: Option<Demand<K>>,
    ) -> Self {
        let (asks, news) = match demand {
            Some(d) => (Some(d.asks), Some(d.events)),
            None => (None, None),
        };
        let ctl = ControlLink::new(ch);
        let peer = ctl.ch.peer().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let windows = Budget::new(Direction::Receive, env.receive_budget, &peer);
        SinkDriver {
            m,
            ctl,
            joins,
            env,
            peer,
            tx,
            rx,
            prepare: Some(prepare),
            options,
            prep: None,
            sparse: Vec::new(),
            meta: Vec::new(),
            live: None,
            waiting: Vec::new(),
            tasks: HashMap::new(),
            summary: None,
            grown: Vec::new(),
            times: Vec::new(),
            cancelled: false,
            stopped: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            windows,
            disk_tune: None,
            asks,
            news,
            closing: false,
        }
    }

    async fn run(mut self) -> Result<SinkRun<K>> {
        loop {
            self.look_after();
            if let Some(end) = self.drain().await {
                return end;
            }
            let wake = self.wait().await;
            self.wake(wake);
        }
    }

    /// Times that waited for the storage, the buffers' and the disk tuner's turn.
    fn look_after(&mut self) {
        if let Some((k, ..)) = &self.live
            && !self.times.is_empty()
        {
            k.set_times(std::mem::take(&mut self.times));
        }
        self.windows.check(now());
        let p = &self.env.run.progress;
        if let Some(share) = self.windows.take_set() {
            p.receive_buffer.store(share, Relaxed);
        }
        // A request-driven sink (a mount) moves what its reader asks for, in bursts:
        // its disk threads are not tuned.
        if let Some((.., pool)) = &self.live
            && self.asks.is_none()
        {
            if self.disk_tune.is_none() {
                self.disk_tune = DiskTune::new(&mut self.env);
            }
            if let Some(t) = self.disk_tune.as_mut() {
                let p = &self.env.run.progress;
                let left = remaining(p, self.m.manifest_complete());
                t.step(p, pool, self.m.outstanding() > 0, left, &self.peer);
            }
        }
    }

    /// What the machine asks, until it asks nothing more; the session's end when it
    /// came.
    async fn drain(&mut self) -> Option<Result<SinkRun<K>>> {
        loop {
            self.ctl.flush(&mut self.m).await;
            let mut busy = false;
            while let Some(c) = self.m.poll_command() {
                busy = true;
                self.command(c);
            }
            while let Some(ev) = self.m.poll_event() {
                busy = true;
                if let Some(end) = self.event(ev).await {
                    return Some(end);
                }
            }
            if !busy {
                return None;
            }
        }
    }

    fn command(&mut self, c: SinkCommand) {
        match c {
            SinkCommand::Open { stream } => self.joins.open(stream),
            SinkCommand::Ack { stream, frames } => {
                if let Some(t) = self.tasks.get(&stream) {
                    let _ = t.tx.send(frames);
                }
            }
            SinkCommand::Close { stream } => {
                self.tasks.remove(&stream);
                self.windows.retire(stream);
                self.waiting.retain(|(i, _)| *i != stream);
            }
        }
    }

    /// One of the machine's events; the session's end when it ended.
    async fn event(&mut self, ev: SinkEvent<Fault>) -> Option<Result<SinkRun<K>>> {
        match ev {
            SinkEvent::Opened(info) => self.joins.opened(&info),
            SinkEvent::Options(o) => self.options = Some(o),
            SinkEvent::Sparse(list) => self.sparse = list,
            SinkEvent::Meta(m) => self.meta = m,
            SinkEvent::Manifest(entries) => self.prepare(entries),
            SinkEvent::Plan(plan) => self.planned(&plan),
            SinkEvent::Grown {
                entries,
                chunks,
                meta,
                sparse,
                chunk,
            } => {
                self.env.run.progress.grow_manifest(&entries);
                let part = GrownPart {
                    entries,
                    chunks,
                    meta,
                    sparse,
                    chunk,
                };
                match &self.live {
                    Some((k, ..)) => grow_sink(&mut self.m, &**k, part),
                    // Before the sink is prepared: when it is.
                    None => self.grown.push(part),
                }
            }
            SinkEvent::Times(t) => match (&self.live, &self.prep) {
                (Some((k, ..)), _) => k.set_times(t),
                (None, Some((k, _))) => k.set_times(t),
                // Between the preparation and the start (the storage on a disk
                // thread): with the next.
                (None, None) => self.times.extend(t),
            },
            SinkEvent::Complete => self.finish(),
            SinkEvent::Limits(l) => {
                if let Some(a) = peer_limits(self.m.side(), &mut self.env, &self.peer, l) {
                    self.m.limits(a);
                }
            }
            SinkEvent::Tuned(t) => self.tuned(t),
            SinkEvent::StreamLost { stream, error } => {
                tracing::warn!(
                    "data stream {stream} from {} broke ({error}); waiting for its chunks on \
                     the others",
                    self.peer
                );
                let p = &self.env.run.progress;
                p.streams_lost.fetch_add(1, Relaxed);
                p.event(ProgressEvent::StreamLost {
                    stream,
                    error: error.to_string(),
                    resent: None,
                });
            }
            SinkEvent::Done(report) => return Some(self.done(report).await),
            SinkEvent::Failed(e) => {
                self.ctl.flush(&mut self.m).await;
                self.tasks.clear();
                self.windows.retire_all();
                // Writes still queued are skipped; the sink gives up (nothing
                // incomplete under a final name) when the last of those that run lets
                // it go: aborting under a running write could journal a piece whose
                // staging file is gone.
                self.stopped.store(true, Relaxed);
                let e = self
                    .env
                    .run
                    .take_error()
                    .unwrap_or_else(|| session_error(e));
                return Some(Err(e));
            }
        }
        None
    }

    /// The manifest is in: the storage is made on a disk thread, with what an
    /// earlier attempt left when resuming.
    fn prepare(&mut self, entries: Vec<Entry>) {
        let (Some(f), Some(info)) = (self.prepare.take(), self.m.info()) else {
            return;
        };
        let p = &self.env.run.progress;
        let totals = dmover_proto::manifest::Totals::of(&entries);
        p.total.store(totals.bytes, Relaxed);
        let files = crate::engine::files_with_data(&entries);
        p.total_files.store(files, Relaxed);
        p.set_manifest(&entries);
        let o = self.options.unwrap_or(SessionOptions {
            resume: false,
            journal: true,
            fsync: false,
            verify: false,
            continue_on_error: false,
            heartbeat_ms: 0,
        });
        let (chunk, tx) = (info.chunk_size, self.tx.clone());
        let sparse = std::mem::take(&mut self.sparse);
        let meta = std::mem::take(&mut self.meta);
        self.env.disk.spawn(move || {
            let r = f(entries, chunk, &o).map(|mut k| {
                if !sparse.is_empty() {
                    k.set_sparse(sparse);
                }
                if !meta.is_empty() {
                    k.set_meta(meta);
                }
                let held = if o.resume {
                    k.held()
                } else {
                    Held::none(&k.entries())
                };
                (k, held)
            });
            let _ = tx.send(SinkIn::Prepared(r));
        });
    }

    /// The storage is made: a resume tells the source what is held, otherwise data
    /// may flow.
    fn prepared(&mut self, mut k: K, held: Held) {
        if self.options.as_ref().is_some_and(|o| o.resume) {
            let parts = held.to_have(&k.entries());
            self.prep = Some((k, held));
            self.m.resume(now(), parts);
            return;
        }
        match k.resume(&held) {
            Ok(()) => self.start(k),
            Err(e) => self.m.fail(now(), Fault::new(e)),
        }
    }

    /// The source's plan for a resume: what stays held, then data may flow.
    fn planned(&mut self, plan: &Plan) {
        let Some((mut k, mut held)) = self.prep.take() else {
            return;
        };
        let r = held
            .apply(plan)
            .map_err(|e| Error::protocol(&self.peer, format!("resume: {e}")))
            .and_then(|()| {
                if !held.is_empty() {
                    tracing::info!(
                        "resuming: {} files and {} bytes already here",
                        held.done_files(),
                        held.bytes(&k.entries(), k.layout().chunk_size() as u32)
                    );
                }
                k.resume(&held)
            });
        if r.is_ok() {
            let done = held.done.iter().enumerate().filter(|(_, d)| **d);
            (self.env.run.progress).files_held(done.map(|(i, _)| i as u32));
        }
        match r {
            Ok(()) => self.start(k),
            Err(e) => self.m.fail(now(), Fault::new(e)),
        }
    }

    /// The sink is prepared: says `Go` (`OnDemand` for a request-driven sink, whose
    /// owner hears of it), and starts reading the streams that joined; then the parts
    /// of a growing manifest that came meanwhile.
    fn start(&mut self, k: K) {
        let info = self.m.info().expect("open before the manifest").clone();
        self.env.run.progress.held.store(k.held_bytes(), Relaxed);
        let k = Arc::new(k);
        let mut sink: Arc<dyn Sink> = k.clone();
        if let Some(d) = self.env.chunk_delay {
            sink = Arc::new(Slow::new(sink, d));
        }
        let tuned = info.features & features::TUNING != 0;
        let pool = Pool::new(
            (self.env.buffers)(crate::session::buffer_streams(info.streams, tuned)),
            info.chunk_size as usize,
        );
        let expected = chunk_set(sink.chunks());
        let n = k.layout_chunks();
        for (i, s) in std::mem::take(&mut self.waiting) {
            let p = &self.env.run.progress;
            let t = spawn_sink_stream(i, s, sink.clone(), pool.clone(), &self.tx, p);
            self.tasks.insert(i, t);
        }
        match &self.news {
            Some(d) => {
                self.m.ready_on_demand(now(), n);
                let features = self.m.info().map_or(0, |i| i.features);
                let _ = d.send(DemandEvent::Ready(k.clone(), features));
            }
            None => self.m.ready(now(), expected, n),
        }
        for part in std::mem::take(&mut self.grown) {
            grow_sink(&mut self.m, &*k, part);
        }
        self.live = Some((k, sink, pool));
    }

    /// Every chunk is written (or the owner closes a request-driven sink): the
    /// storage finishes on a disk thread.
    fn finish(&mut self) {
        let Some((_, sink, _)) = &self.live else {
            return;
        };
        let (sink, tx) = (sink.clone(), self.tx.clone());
        self.env.disk.spawn(move || {
            let _ = tx.send(SinkIn::Finished(sink.finish().map_err(Error::from)));
        });
    }

    /// The source's tuner changed its streams (feature TUNING).
    fn tuned(&mut self, t: Tuned) {
        tracing::info!("{} tuned the transfer: {}", self.peer, t.reason);
        self.windows.sending(t.streams);
        let p = &self.env.run.progress;
        let of = self.m.info().map_or(t.streams, |i| i.streams);
        // The first decision is where the tuner starts; changes follow.
        let mut tuning = p.tuning.lock();
        match tuning.as_mut() {
            None => {
                *tuning = Some(Tuning {
                    streams: t.streams,
                    of,
                    active: t.streams,
                    changes: 0,
                    settled_ms: None,
                })
            }
            Some(s) => {
                s.streams = t.streams;
                s.active = t.streams;
                s.changes += 1;
                s.settled_ms = Some(t.at_ms);
            }
        }
        drop(tuning);
        p.event(ProgressEvent::Tuned {
            streams: t.streams,
            rate: t.rate,
            reason: t.reason,
        });
    }

    async fn done(&mut self, report: SendReport) -> Result<SinkRun<K>> {
        self.ctl.flush(&mut self.m).await;
        let (Some(summary), Some((store, ..))) = (self.summary.take(), self.live.take()) else {
            return Err(Error::protocol(&self.peer, "session ended before its data"));
        };
        Ok(SinkRun {
            info: self.m.info().expect("open before the end").clone(),
            summary,
            report,
            stats: self.m.stats(),
            store,
        })
    }

    /// The earliest of the machine's and the tuners' timers.
    fn deadline(&self) -> Option<std::time::Instant> {
        [
            self.m.poll_timeout(),
            self.disk_tune.as_ref().and_then(DiskTune::poll_timeout),
            self.windows.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Waits for the next thing to happen.
    async fn wait(&mut self) -> SinkWake<K, J::Link> {
        let deadline = self.deadline();
        // A request-driven sink's owner, once the sink is prepared.
        let wants_ask = self.asks.is_some() && self.live.is_some() && !self.closing;
        let SinkDriver {
            env,
            cancelled,
            rx,
            asks,
            joins,
            ctl,
            ..
        } = self;
        tokio::select! {
            biased;
            _ = env.run.cancelled(), if !*cancelled => SinkWake::Cancelled,
            Some(input) = rx.recv() => SinkWake::Input(input),
            ask = next_ask(asks), if wants_ask => SinkWake::Ask(ask),
            (i, r) = joins.next() => SinkWake::Joined(i, r),
            msg = ctl.recv() => SinkWake::Control(msg),
            _ = sleep_until(deadline) => SinkWake::Timeout,
        }
    }

    /// Feeds in what happened.
    fn wake(&mut self, wake: SinkWake<K, J::Link>) {
        match wake {
            SinkWake::Cancelled => {
                self.cancelled = true;
                self.m.fail(now(), cancellation(&self.env.run));
            }
            SinkWake::Input(input) => self.input(input),
            SinkWake::Ask(Some(DemandAsk::Want(chunks))) => self.m.want(now(), &chunks),
            SinkWake::Ask(Some(DemandAsk::WantParts(parts))) => self.m.want_parts(now(), &parts),
            SinkWake::Ask(Some(DemandAsk::Close) | None) => {
                self.closing = true;
                self.finish();
            }
            SinkWake::Joined(i, r) => self.joined(i, r),
            SinkWake::Control(Ok(msg)) => {
                self.m.handle_control(now(), msg);
                self.charge_manifest();
            }
            SinkWake::Control(Err(e)) => {
                self.ctl.open = false;
                self.m.control_closed(now(), Fault::new(Error::Net(e)));
            }
            SinkWake::Timeout => self.m.handle_timeout(now()),
        }
    }

    /// Charges the manifest's growth to the server's manifest budget; a manifest that
    /// does not fit fails the session (its charge given back at once).
    fn charge_manifest(&mut self) {
        let Some(charge) = self.env.manifest_charge.as_mut() else {
            return;
        };
        if let Err(e) = charge.grow_to(self.m.manifest_bytes()) {
            self.env.manifest_charge = None;
            self.m.fail(now(), Fault::new(e));
        }
    }

    /// What a stream task or a disk thread reported.
    fn input(&mut self, input: SinkIn<K>) {
        match input {
            SinkIn::Arrived {
                stream,
                chunk,
                buf,
                digests,
                crc,
            } => {
                if self.m.arrived(now(), stream, chunk) == Arrival::Write {
                    self.write(move |sink| {
                        let result = sink.write_chunk(chunk, &buf, &digests, crc);
                        drop(buf);
                        SinkIn::Written {
                            chunk,
                            result: result.map_err(Error::from),
                        }
                    });
                }
            }
            SinkIn::Part {
                stream,
                chunk,
                offset,
                data,
                digests,
                crc,
            } => {
                let range = PartRange {
                    offset,
                    len: data.len() as u32,
                };
                if self.m.arrived_part(now(), stream, chunk, range) == Arrival::Write {
                    self.write(move |sink| {
                        let r = sink.write_part(chunk, offset, &data, &digests, crc);
                        SinkIn::PartWritten(r.map_err(Error::from))
                    });
                }
            }
            SinkIn::PartWritten(Ok(())) => self.m.part_written(now()),
            SinkIn::End { stream, sent } => {
                self.tasks.remove(&stream);
                self.windows.retire(stream);
                self.m.stream_end(now(), stream, sent);
            }
            SinkIn::Failed { stream, error } => {
                self.tasks.remove(&stream);
                self.windows.retire(stream);
                self.m.stream_failed(now(), stream, Fault::new(error));
            }
            SinkIn::Written {
                chunk,
                result: Ok(()),
            } => {
                if let Some((_, sink, _)) = &self.live {
                    self.env.run.progress.count_files(&sink.layout(), chunk);
                }
                self.m.chunk_written(now(), chunk);
                if let Some(n) = &self.news {
                    let _ = n.send(DemandEvent::Written(chunk));
                }
            }
            SinkIn::Prepared(Ok((k, held))) => self.prepared(k, held),
            SinkIn::Finished(Ok(s)) => {
                self.summary = Some(s);
                self.m.finished(s);
            }
            SinkIn::PartWritten(Err(e))
            | SinkIn::Written { result: Err(e), .. }
            | SinkIn::Prepared(Err(e))
            | SinkIn::Finished(Err(e)) => self.m.fail(now(), Fault::new(e)),
        }
    }

    /// Runs `write` on the storage on a disk thread, unless the session failed first.
    fn write(&self, write: impl FnOnce(&dyn Sink) -> SinkIn<K> + Send + 'static) {
        let Some((_, sink, _)) = &self.live else {
            return;
        };
        let (sink, stopped, tx) = (sink.clone(), self.stopped.clone(), self.tx.clone());
        self.env.disk.spawn(move || {
            if stopped.load(Relaxed) {
                return;
            }
            let _ = tx.send(write(&*sink));
        });
    }

    /// A data stream joined (or failed to): its task starts once the storage is.
    fn joined(&mut self, i: u16, r: Result<DataStream<J::Link>>) {
        let s = match r {
            Ok(s) => s,
            Err(e) => return self.m.stream_failed(now(), i, Fault::new(e)),
        };
        self.m.stream_joined(now(), i);
        self.windows.join(now(), i, s.io.probe().as_ref());
        match &self.live {
            Some((_, sink, pool)) => {
                let p = &self.env.run.progress;
                let t = spawn_sink_stream(i, s, sink.clone(), pool.clone(), &self.tx, p);
                self.tasks.insert(i, t);
            }
            None => self.waiting.push((i, s)),
        }
    }
}

/// A later part of a growing manifest at the sink.
pub struct GrownPart {
    /// Its entries, numbered after every earlier part's.
    pub entries: Vec<Entry>,
    /// The layout's chunks it adds.
    pub chunks: std::ops::Range<u64>,
    /// (feature `METADATA`) Owners and extended attributes of its entries (or earlier
    /// ones).
    pub meta: Vec<dmover_proto::manifest::EntryMeta>,
    /// (feature `WALKING`) Its files that may have holes (entry indices, ascending).
    pub sparse: Vec<u32>,
    /// The size of its chunks: the session's, or (feature `PART_CHUNKS`) another no
    /// larger.
    pub chunk: u32,
}

/// A later part of a growing manifest: the storage makes room, the machine hears it.
fn grow_sink<K: SinkStore>(m: &mut SinkSession<Fault>, k: &K, part: GrownPart) {
    let end = part.chunks.end;
    match k.grow(part) {
        Ok(()) => m.grown(now(), end),
        Err(e) => m.fail(now(), Fault::new(e)),
    }
}

fn spawn_sink_stream<L: DataLink, K: Send + 'static>(
    i: u16,
    mut s: DataStream<L>,
    sink: Arc<dyn Sink>,
    pool: Pool,
    tx: &mpsc::UnboundedSender<SinkIn<K>>,
    progress: &Arc<Progress>,
) -> Task<u64> {
    // The machine times the streams' reads, not their own idle limit. A stream may
    // rightly bring nothing for long (a mount's while nothing is asked for, a tuned
    // source's idle streams, a growing manifest's quiet spells, every stream waiting
    // on a silent one's chunk at the end), which the machine's idle rule knows; and
    // it gives a stream 1.5 x the stream timeout, so that the source, which knows
    // which stream is at fault, acts first. A link's own limit (1 x) would drop every
    // quiet stream at once and fail the session.
    s.io.reads_timed_by_caller();
    let (atx, arx) = mpsc::unbounded_channel();
    let (tx, progress) = (tx.clone(), progress.clone());
    let h = tokio::spawn(async move {
        match sink_stream(i, s, sink, pool, arx, &tx, &progress).await {
            Ok(Some(sent)) => {
                let _ = tx.send(SinkIn::End { stream: i, sent });
            }
            Ok(None) => {}
            Err(error) => {
                let _ = tx.send(SinkIn::Failed { stream: i, error });
            }
        }
    });
    Task {
        tx: atx,
        abort: h.abort_handle(),
    }
}

/// A sink's data stream: reads chunk frames into pool buffers, hands them to the
/// driver, and writes the acknowledgements the machine asks for. Ends with `END`
/// (`Some(sent)`), when the driver lets it go (`None`), or with the error.
async fn sink_stream<L: DataLink, K>(
    i: u16,
    mut s: DataStream<L>,
    sink: Arc<dyn Sink>,
    pool: Pool,
    mut acks: mpsc::UnboundedReceiver<u64>,
    tx: &mpsc::UnboundedSender<SinkIn<K>>,
    progress: &Progress,
) -> Result<Option<u64>> {
    let mut layout = sink.layout();
    let limits = FrameLimits {
        max_payload: layout.chunk_size() as u32,
        max_digests: layout.chunk_size() as u32,
    };
    let peer = s.peer.clone();
    // A record that fails authentication (InvalidData) is altered data, not a broken
    // link: it fails the session at once and is reported as the root cause, like a
    // checksum mismatch.
    let lost = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            Error::refused(
                ErrorCode::Checksum,
                format!("receiving data from {peer}: {e}"),
            )
        } else {
            Error::data("receiving data from", &peer, e)
        }
    };
    let mut segments = Vec::new();
    loop {
        // Checked against the layout before anything the header sizes is read; a
        // growing manifest's later part is laid out by the time its chunks come (the
        // source waits for `Grown`), so a chunk past the layout looks again first.
        let mut len = 0;
        let check = |h: &dmover_proto::data::FrameHeader, part: Option<u32>| {
            if h.chunk >= layout.n_chunks() {
                layout = sink.layout();
            }
            len = layout.check_frame(h, part, |k| sink.sparse_chunk(k))?;
            Ok(())
        };
        let head = match s.io.recv_frame(limits, check).await {
            Ok(Received::Chunk(head)) => head,
            Ok(Received::End { sent }) => return Ok(Some(sent)),
            Err(RecvError::Io(e)) => return Err(lost(e)),
            Err(RecvError::Malformed(e)) => return Err(Error::Net(NetError::proto(&peer, e))),
            Err(RecvError::Refused(what)) => return Err(Error::protocol(&peer, what)),
        };
        let (h, k) = (head.header, head.header.chunk);
        let arrived = match head.part {
            Some(offset) => {
                let mut data = vec![0u8; h.payload_len as usize];
                s.io.recv_into(&mut data).await.map_err(lost)?;
                progress.bytes.fetch_add(len, Relaxed);
                progress.stream_bytes.add(i, len);
                SinkIn::Part {
                    stream: i,
                    chunk: k,
                    offset,
                    data,
                    digests: head.digests,
                    crc: h.crc,
                }
            }
            None => {
                let mut buf = pool.get().await;
                layout.segments(k, &mut segments);
                for &(off, n) in &segments {
                    if h.zeros {
                        buf[off..off + n].fill(0);
                        continue;
                    }
                    // Sealed records are opened straight into the pool buffer.
                    s.io.recv_into(&mut buf[off..off + n]).await.map_err(lost)?;
                }
                // Bytes that crossed the stream (none for a zeros frame).
                let wire = if h.zeros {
                    progress.holes.fetch_add(len, Relaxed);
                    0
                } else {
                    len
                };
                progress.bytes.fetch_add(wire, Relaxed);
                progress.stream_bytes.add(i, wire);
                progress.chunks.fetch_add(1, Relaxed);
                SinkIn::Arrived {
                    stream: i,
                    chunk: k,
                    buf,
                    digests: head.digests,
                    crc: h.crc,
                }
            }
        };
        progress.data_flowing();
        let _ = tx.send(arrived);
        let Some(frames) = acks.recv().await else {
            return Ok(None);
        };
        s.io.send_ack(frames).await.map_err(lost)?;
    }
}
