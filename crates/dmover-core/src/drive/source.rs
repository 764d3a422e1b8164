//! The source role's driver: reads chunks on the disk threads, hands each to the
//! stream the machine names, feeds the machine the acknowledgements, and runs the
//! source's tuner ([`SourceDriver`]).

use super::*;

/// What a source session achieved.
pub struct SourceRun<K> {
    /// The session.
    pub info: SessionInfo,
    /// The sink's summary.
    pub summary: Summary,
    /// What the streams went through.
    pub stats: StreamStats,
    /// The storage, for its report.
    pub store: Arc<K>,
}

enum SrcIn<K> {
    Read {
        chunk: u64,
        read: Result<(PoolBuf, ChunkMeta)>,
    },
    Written {
        stream: u16,
        chunk: u64,
    },
    Acked {
        stream: u16,
        frames: u64,
    },
    Failed {
        stream: u16,
        error: Error,
    },
    Checked(Box<(K, Result<(Plan, ChunkSet)>)>),
}

enum SrcOut {
    Chunk {
        chunk: u64,
        buf: PoolBuf,
        meta: ChunkMeta,
        segments: Vec<(usize, usize)>,
    },
    End(u64),
}

/// Drives the source role `m` until the session ends. The manifest must already be
/// queued on `m` (see [`SourceSession::push_manifest`]).
pub async fn source<C, J, K>(
    m: SourceSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    store: K,
    env: Env,
) -> Result<SourceRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    source_growing(m, ch, joins, store, env, None).await
}

/// [`source`] of a manifest that grows while the session runs: the parts come from
/// `growth` (the first of them stands for the whole manifest of [`source`]); the
/// session must use [`dmover_proto::session::features::GROWING_MANIFEST`]. The
/// storage must read a part's chunks by the time the part comes.
pub async fn source_growing<C, J, K>(
    m: SourceSession<Fault>,
    ch: &mut ControlChannel<C>,
    joins: J,
    store: K,
    env: Env,
    growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
) -> Result<SourceRun<K>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    SourceDriver::new(m, ch, joins, store, env, growth)
        .run()
        .await
}

/// A source session's driver: the machine, what it drives, and what it waits on. Its
/// loop ([`SourceDriver::run`]) looks after the tuners, lets the machine say all it
/// has to say ([`SourceDriver::drain`]), then waits for one thing to happen
/// ([`SourceDriver::wait`]) and feeds it in ([`SourceDriver::wake`]).
struct SourceDriver<'a, C, J: Joins, K> {
    m: SourceSession<Fault>,
    ctl: ControlLink<'a, C>,
    joins: J,
    env: Env,
    peer: String,
    /// What the stream tasks and disk threads report.
    tx: mpsc::UnboundedSender<SrcIn<K>>,
    rx: mpsc::UnboundedReceiver<SrcIn<K>>,
    /// The storage until `Go` (away on a disk thread while a resume is checked).
    prep: Option<K>,
    /// The storage, what reads it and the chunk buffers, from `Go` on.
    live: Option<(Arc<K>, Arc<dyn Source>, Pool)>,
    /// A free buffer the machine has no read for yet.
    spare: Option<PoolBuf>,
    /// Chunks read and not yet sent, by chunk and part (a request-driven session may
    /// read parts of one chunk for several reads at once).
    bufs: HashMap<(u64, Option<PartRange>), PoolBuf>,
    tasks: HashMap<u16, Task<SrcOut>>,
    cancelled: bool,
    /// The manifest's later parts (a growing manifest).
    growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
    growing: bool,
    tuner: Option<Tuner>,
    disk_tune: Option<DiskTune>,
    /// Reads on the disk threads, for the disk tuner: the data wait on them too when
    /// every chunk left is being read.
    reading: usize,
    meters: Meters,
    sendbufs: Budget,
    /// Parts so far, and the entries whose metadata went with them.
    parts: u64,
    meta_from: u32,
    /// Parts whose producer waits to hear they are durable: (the part's number, the
    /// layout's end with it, whom to tell).
    durable: VecDeque<(u64, u64, tokio::sync::oneshot::Sender<()>)>,
}

/// What a source driver woke up for.
enum SrcWake<K, L> {
    Cancelled,
    Part(Option<GrowPart>),
    Input(SrcIn<K>),
    Joined(u16, Result<DataStream<L>>),
    Control(std::result::Result<Control, NetError>),
    Buffer(PoolBuf),
    Timeout,
}

impl<'a, C, J, K> SourceDriver<'a, C, J, K>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    J: Joins,
    K: SourceStore,
{
    fn new(
        m: SourceSession<Fault>,
        ch: &'a mut ControlChannel<C>,
        joins: J,
        store: K,
        env: Env,
        growth: Option<mpsc::UnboundedReceiver<GrowPart>>,
    ) -> Self {
        let ctl = ControlLink::new(ch);
        let peer = ctl.ch.peer().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let sendbufs = Budget::new(Direction::Send, env.send_budget, &peer);
        SourceDriver {
            m,
            ctl,
            joins,
            env,
            peer,
            tx,
            rx,
            prep: Some(store),
            live: None,
            spare: None,
            bufs: HashMap::new(),
            tasks: HashMap::new(),
            cancelled: false,
            growing: growth.is_some(),
            growth,
            tuner: None,
            disk_tune: None,
            reading: 0,
            meters: Meters::default(),
            sendbufs,
            parts: 0,
            meta_from: 0,
            durable: VecDeque::new(),
        }
    }

    async fn run(mut self) -> Result<SourceRun<K>> {
        loop {
            self.look_after();
            if let Some(end) = self.drain().await {
                return end;
            }
            let wake = self.wait().await;
            self.wake(wake);
        }
    }

    /// The tuners' turn, the buffers' and the durable parts' news.
    fn look_after(&mut self) {
        let p = &self.env.run.progress;
        if let Some(t) = self.tuner.as_mut() {
            tune_step(t, &mut self.m, &self.meters, p, &self.peer);
            self.sendbufs.sending(t.streams());
        }
        self.sendbufs.check(now());
        if let Some(share) = self.sendbufs.take_set() {
            p.send_buffer.store(share, Relaxed);
        }
        if let (Some(t), Some((.., pool))) = (self.disk_tune.as_mut(), &self.live) {
            let left = remaining(p, self.m.manifest_complete());
            let working = self.m.has_work() || self.reading > 0;
            t.step(p, pool, working, left, &self.peer);
        }
        while let Some((i, end, _)) = self.durable.front() {
            if self.m.parts_confirmed() <= *i || self.m.stored_below() < *end {
                break;
            }
            if let Some((.., tell)) = self.durable.pop_front() {
                let _ = tell.send(());
            }
        }
    }

    /// What the machine asks, until it asks nothing more; the session's end when it
    /// came.
    async fn drain(&mut self) -> Option<Result<SourceRun<K>>> {
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
            busy |= self.read_more();
            if !busy {
                return None;
            }
        }
    }

    fn command(&mut self, c: SourceCommand) {
        match c {
            SourceCommand::Open { stream } => self.joins.open(stream),
            SourceCommand::Send {
                stream,
                chunk,
                meta,
            } => self.send(stream, chunk, meta),
            SourceCommand::End { stream, sent } => {
                if let Some(t) = self.tasks.get(&stream) {
                    let _ = t.tx.send(SrcOut::End(sent));
                }
            }
            SourceCommand::Close { stream } => self.retire(stream),
        }
    }

    /// Hands chunk `chunk`'s buffer to stream `stream`'s task.
    fn send(&mut self, stream: u16, chunk: u64, meta: ChunkMeta) {
        let (Some(buf), Some((_, src, _))) = (self.bufs.remove(&(chunk, meta.part)), &self.live)
        else {
            return;
        };
        let Some(t) = self.tasks.get(&stream) else {
            return;
        };
        let mut segments = Vec::new();
        src.layout().segments(chunk, &mut segments);
        if let Some(p) = meta.part {
            // Checked when read: within one segment.
            segments = part_segments(&segments, p).unwrap_or_default();
        }
        let _ = t.tx.send(SrcOut::Chunk {
            chunk,
            buf,
            meta,
            segments,
        });
    }

    /// Stream `stream` ended, was lost or closed: its task and its probes go.
    fn retire(&mut self, stream: u16) {
        self.tasks.remove(&stream);
        self.meters.retire(stream);
        self.sendbufs.retire(stream);
    }

    /// One of the machine's events; the session's end when it ended.
    async fn event(&mut self, ev: SourceEvent<Fault>) -> Option<Result<SourceRun<K>>> {
        match ev {
            SourceEvent::Opened(info) => self.joins.opened(&info),
            SourceEvent::Limits(l) => {
                if let Some(a) = peer_limits(self.m.side(), &mut self.env, &self.peer, l) {
                    self.m.limits(a);
                }
            }
            SourceEvent::Options(o) => {
                if let Some(k) = self.prep.as_mut() {
                    k.set_continue_on_error(o.continue_on_error);
                }
            }
            SourceEvent::Held(parts) => self.check_held(parts),
            SourceEvent::Go => self.go(),
            SourceEvent::StreamLost {
                stream,
                error,
                resent,
            } => self.stream_lost(stream, &error, resent),
            SourceEvent::Sent => {
                let failed = self.live.as_ref().map(|l| l.0.failed()).unwrap_or_default();
                self.m.report(failed);
            }
            SourceEvent::Drained => {
                // The streams end: their connections must close with them.
                self.meters.retire_all();
                self.sendbufs.retire_all();
                let failed = self.live.as_ref().map(|l| l.0.failed()).unwrap_or_default();
                self.m.drained(failed);
            }
            SourceEvent::Done(summary) => return Some(Ok(self.done(summary).await)),
            SourceEvent::Failed(e) => {
                self.ctl.flush(&mut self.m).await;
                return Some(Err(self
                    .env
                    .run
                    .take_error()
                    .unwrap_or_else(|| session_error(e))));
            }
        }
        None
    }

    /// The sink told what it holds: the storage checks it on a disk thread.
    fn check_held(&mut self, parts: Vec<Have>) {
        let Some(mut k) = self.prep.take() else {
            return;
        };
        let (tx, peer) = (self.tx.clone(), self.peer.clone());
        self.env.disk.spawn(move || {
            let r = k
                .resume_from(&peer, &parts)
                .map(|plan| (plan, chunk_set(k.chunks())));
            let _ = tx.send(SrcIn::Checked(Box::new((k, r))));
        });
    }

    /// `Go`: the storage is bound, the chunk buffers made, the tuners start.
    fn go(&mut self) {
        let Some(k) = self.prep.take() else {
            return;
        };
        let info = self.m.info().expect("open before Go").clone();
        self.env.run.progress.held.store(k.held_bytes(), Relaxed);
        self.env.run.progress.files_held(k.held_entries());
        let k = Arc::new(k);
        let mut src: Arc<dyn Source> = k.clone();
        if let Some(d) = self.env.chunk_delay {
            src = Arc::new(Slow::new(src, d));
        }
        let tuned = info.features & features::TUNING != 0;
        let n = (self.env.buffers)(crate::session::buffer_streams(info.streams, tuned));
        if tuned {
            self.start_tuner(info.streams);
        }
        // The sink's chunk requests (feature RANGES) are checked against the whole
        // layout; a growing manifest's against what it confirmed.
        if !self.growing {
            self.m.set_layout_chunks(src.layout().n_chunks());
        }
        self.live = Some((k, src, Pool::new(n, info.chunk_size as usize)));
        self.disk_tune = DiskTune::new(&mut self.env);
    }

    /// The stream tuner starts (feature TUNING) on its first streams of `of`.
    fn start_tuner(&mut self, of: u16) {
        let t = Tuner::new(TuneConfig::new(self.env.tuned_start, of));
        self.m.set_active(now(), t.streams());
        let reason = format!("starting with {} of {of} streams", t.streams());
        self.m.tuned(Tuned {
            at_ms: 0,
            streams: t.streams(),
            rate: 0,
            reason: reason.clone(),
        });
        let p = &self.env.run.progress;
        p.event(ProgressEvent::Tuned {
            streams: t.streams(),
            rate: 0,
            reason,
        });
        *p.tuning.lock() = Some(Tuning {
            streams: t.streams(),
            of,
            active: t.streams(),
            changes: 0,
            settled_ms: None,
        });
        self.tuner = Some(t);
    }

    fn stream_lost(&mut self, stream: u16, error: &SessionError<Fault>, resent: u64) {
        tracing::warn!(
            "data stream {stream} to {} broke ({error}); sending its {resent} \
             unacknowledged chunks on the others",
            self.peer
        );
        let p = &self.env.run.progress;
        p.streams_lost.fetch_add(1, Relaxed);
        p.chunks_resent.fetch_add(resent, Relaxed);
        p.event(ProgressEvent::StreamLost {
            stream,
            error: error.to_string(),
            resent: Some(resent),
        });
    }

    /// The session ended well: parts still waiting hear they are durable.
    async fn done(&mut self, summary: Summary) -> SourceRun<K> {
        self.ctl.flush(&mut self.m).await;
        for (.., tell) in self.durable.drain(..) {
            let _ = tell.send(());
        }
        let store = match self.live.take() {
            Some((k, ..)) => k,
            None => Arc::new(self.prep.take().expect("the store is here")),
        };
        SourceRun {
            info: self.m.info().expect("open before the end").clone(),
            summary,
            stats: self.m.stats(),
            store,
        }
    }

    /// Starts a read into the free buffer, if the machine has a chunk to read.
    fn read_more(&mut self) -> bool {
        let (Some((_, src, _)), Some(buf)) = (&self.live, self.spare.take()) else {
            return false;
        };
        match self.m.poll_read() {
            Some(job) => {
                spawn_read(&self.env.disk, src.clone(), job, buf, self.tx.clone());
                self.reading += 1;
                true
            }
            None => {
                self.spare = Some(buf);
                false
            }
        }
    }

    /// The earliest of the machine's and the tuners' timers.
    fn deadline(&self) -> Option<std::time::Instant> {
        [
            self.m.poll_timeout(),
            self.tuner.as_ref().and_then(Tuner::poll_timeout),
            self.disk_tune.as_ref().and_then(DiskTune::poll_timeout),
            self.sendbufs.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the next part of a growing manifest may be taken now (the machine's
    /// rule: [`SourceSession::ready_for_part`]).
    fn wants_part(&self) -> bool {
        self.growth.is_some() && self.m.ready_for_part(self.parts)
    }

    /// Waits for the next thing to happen.
    async fn wait(&mut self) -> SrcWake<K, J::Link> {
        let deadline = self.deadline();
        let wants_part = self.wants_part();
        let pool = self.live.as_ref().map(|l| l.2.clone());
        let wants_buffer = pool.is_some() && self.spare.is_none();
        let SourceDriver {
            env,
            cancelled,
            growth,
            rx,
            joins,
            ctl,
            ..
        } = self;
        tokio::select! {
            biased;
            _ = env.run.cancelled(), if !*cancelled => SrcWake::Cancelled,
            part = next_part(growth), if wants_part => SrcWake::Part(part),
            Some(input) = rx.recv() => SrcWake::Input(input),
            (i, r) = joins.next() => SrcWake::Joined(i, r),
            msg = ctl.recv() => SrcWake::Control(msg),
            b = async { pool.as_ref().expect("checked").get().await }, if wants_buffer => {
                SrcWake::Buffer(b)
            }
            _ = sleep_until(deadline) => SrcWake::Timeout,
        }
    }

    /// Feeds in what happened.
    fn wake(&mut self, wake: SrcWake<K, J::Link>) {
        match wake {
            SrcWake::Cancelled => {
                self.cancelled = true;
                self.m.fail(now(), cancellation(&self.env.run));
            }
            SrcWake::Part(part) => self.part(part),
            SrcWake::Input(input) => self.input(input),
            SrcWake::Joined(i, r) => self.joined(i, r),
            SrcWake::Control(Ok(msg)) => self.m.handle_control(now(), msg),
            SrcWake::Control(Err(e)) => {
                self.ctl.open = false;
                self.m.control_closed(now(), Fault::new(Error::Net(e)));
            }
            SrcWake::Buffer(b) => self.spare = Some(b),
            SrcWake::Timeout => self.m.handle_timeout(now()),
        }
    }

    /// What a stream task or a disk thread reported.
    fn input(&mut self, input: SrcIn<K>) {
        match input {
            SrcIn::Read {
                chunk,
                read: Ok((buf, meta)),
            } => {
                self.reading -= 1;
                self.bufs.insert((chunk, meta.part), buf);
                self.m.chunk_read(now(), chunk, meta);
            }
            SrcIn::Read { read: Err(e), .. } => {
                self.reading -= 1;
                self.m.fail(now(), Fault::new(e));
            }
            SrcIn::Written { stream, chunk } => {
                if let Some((_, src, _)) = &self.live {
                    self.env.run.progress.count_files(&src.layout(), chunk);
                }
                self.m.chunk_written(now(), stream, chunk)
            }
            SrcIn::Acked { stream, frames } => self.m.acked(now(), stream, frames),
            SrcIn::Failed { stream, error } => {
                self.retire(stream);
                self.m.stream_failed(now(), stream, Fault::new(error));
            }
            SrcIn::Checked(b) => {
                let (k, r) = *b;
                self.prep = Some(k);
                match r {
                    Ok((plan, chunks)) => self.m.planned(now(), plan, chunks),
                    Err(e) => self.m.fail(now(), Fault::new(e)),
                }
            }
        }
    }

    /// A data stream joined (or failed to): its task starts.
    fn joined(&mut self, i: u16, r: Result<DataStream<J::Link>>) {
        let s = match r {
            Ok(s) => s,
            Err(e) => return self.m.stream_failed(now(), i, Fault::new(e)),
        };
        let probe = s.io.probe();
        if self.m.uses(features::TUNING) {
            self.meters.add(i, probe.clone());
        }
        self.sendbufs.join(now(), i, probe.as_ref());
        let (ttx, trx) = mpsc::unbounded_channel();
        let h = tokio::spawn(source_stream(
            i,
            s,
            trx,
            self.tx.clone(),
            self.env.run.progress.clone(),
            self.env.zerocopy.clone(),
            // The sink knows the sparse files only under LINKS.
            self.m.uses(features::LINKS),
        ));
        self.tasks.insert(
            i,
            Task {
                tx: ttx,
                abort: h.abort_handle(),
            },
        );
        self.m.stream_joined(now(), i);
    }

    /// The next part of a growing manifest came from its producer (`None`: the
    /// producer stopped before the last).
    fn part(&mut self, part: Option<GrowPart>) {
        let Some(p) = part else {
            self.growth = None;
            let e = Error::refused(
                ErrorCode::Aborted,
                "the manifest's producer stopped before its last part",
            );
            return self.m.fail(now(), Fault::new(e));
        };
        let links_or_holes = !p.sparse.is_empty()
            || p.entries
                .iter()
                .any(|e| matches!(e.kind, EntryKind::HardLink { .. }));
        match self.m.plan_part(self.parts, p.sent, links_or_holes) {
            PartPlan::Grow => self.grow(p),
            PartPlan::RestWhole => self.rest_whole(p),
            PartPlan::Refuse => {
                self.growth = None;
                let e = Error::refused(
                    ErrorCode::Unsupported,
                    format!(
                        "{}: the server takes no hard links or sparse files in a manifest \
                         sent while the walk runs (it predates that); upgrade it, or copy \
                         with --resume, which walks the whole tree first",
                        self.peer
                    ),
                );
                self.m.fail(now(), Fault::new(e));
            }
        }
    }

    /// The sink does not take parts: the rest of the manifest goes whole behind the
    /// first part's entries, as a push's always did.
    fn rest_whole(&mut self, p: GrowPart) {
        let (mut rest, mut meta, mut totals) = (Vec::new(), p.meta, p.totals);
        if let Some(g) = self.growth.as_mut() {
            while let Ok(mut q) = g.try_recv() {
                rest.append(&mut q.entries);
                meta.append(&mut q.meta);
                totals = q.totals;
            }
        }
        self.growth = None;
        self.growing = false;
        let grown = match self.prep.as_ref() {
            Some(k) => {
                let chunk = k.layout().chunk_size() as u32;
                k.grow(&rest, &[], chunk).map(|_| chunk_set(k.chunks()))
            }
            None => Err(Error::refused(
                ErrorCode::Unsupported,
                "the manifest's rest came after the storage was bound",
            )),
        };
        let chunks = match grown {
            Ok(c) => c,
            Err(e) => return self.m.fail(now(), Fault::new(e)),
        };
        self.env.run.progress.total.store(totals.bytes, Relaxed);
        self.m.push_manifest(&rest);
        self.m.push_meta(meta);
        self.m.end_manifest(totals, chunks);
    }

    /// A part goes to the sink: a later one laid out by storage that grows first.
    fn grow(&mut self, mut p: GrowPart) {
        let mut meta = Vec::new();
        let mut part_chunk = None;
        if self.parts > 0 {
            match self.lay_out(&mut p) {
                Ok((chunk, m)) => (part_chunk, meta) = (Some(chunk), m),
                Err(e) => {
                    self.growth = None;
                    return self.m.fail(now(), Fault::new(e));
                }
            }
        }
        meta.append(&mut p.meta);
        self.parts += 1;
        let progress = &self.env.run.progress;
        if self.parts > 1 && self.m.uses(features::STREAMED) {
            progress.manifest_grown.fetch_add(1, Relaxed);
        }
        self.m.times(std::mem::take(&mut p.times));
        if let Some(tell) = p.durable.take() {
            self.durable.push_back((self.parts - 1, p.chunks, tell));
        }
        if !p.sent {
            self.m.push_manifest(&p.entries);
        }
        self.m.sparse_files(&p.sparse);
        self.m.grow_meta(meta);
        // A streamed manifest's source knows the whole total already.
        progress.total.fetch_max(p.totals.bytes, Relaxed);
        if let Some(c) = part_chunk {
            self.m.part_chunk(now(), c);
        }
        self.m.grow_manifest(now(), p.totals, p.chunks, p.last);
        if p.last {
            self.growth = None;
        }
    }

    /// A later part: storage that grows lays it out now (in chunks of the part's own
    /// size where both ends can, feature PART_CHUNKS; `p.chunks` becomes the layout's
    /// length with it), and reads its entries' metadata (the first part's root's too).
    /// Returns the part's chunk size and that metadata.
    fn lay_out(&mut self, p: &mut GrowPart) -> Result<(u32, Vec<EntryMeta>)> {
        let store = self.prep.as_ref().or(self.live.as_ref().map(|l| &*l.0));
        let Some(k) = store else {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "a later part of the manifest came while a resume was checked",
            ));
        };
        let session = k.layout().chunk_size() as u32;
        let chunk = if k.part_chunks() && self.m.uses(features::PART_CHUNKS) {
            crate::session::part_chunk(&p.entries, session)
        } else {
            session
        };
        if chunk != session {
            let t = Totals::of(&p.entries);
            tracing::info!(
                "chunks of the transfer to {}: a later part's {} files hold {} bytes: {} \
                 KiB chunks for them (the session's: {} KiB)",
                self.peer,
                t.files,
                t.bytes,
                chunk >> 10,
                session >> 10
            );
        }
        if let Some(n) = k.grow(&p.entries, &p.sparse, chunk)? {
            p.chunks = n;
        }
        let meta;
        (meta, self.meta_from) = k.grown_meta(self.meta_from);
        Ok((chunk, meta))
    }
}

/// What a tuned source's data streams delivered, as their connections count it
/// ([`Probe`]), which its tuner measures with. A probe holds its stream's connection
/// open: it goes when the stream ends or is lost.
#[derive(Default)]
struct Meters {
    /// Each stream's probe, and whether its congestion control is model-based (BBR).
    live: HashMap<u16, (Probe, bool)>,
    /// Bytes delivered on streams whose probes went.
    retired: u64,
    /// Their busy and window-limited times.
    retired_pressure: (Duration, Duration),
    /// A stream joined without one: measure with the chunks sent instead.
    unmetered: bool,
}

impl Meters {
    fn add(&mut self, stream: u16, probe: Option<Probe>) {
        match probe {
            Some(p) => {
                let model_based = p.model_based();
                self.live.insert(stream, (p, model_based));
            }
            None => self.unmetered = true,
        }
    }

    fn retire(&mut self, stream: u16) {
        if let Some((p, _)) = self.live.remove(&stream) {
            if let Ok(s) = p.sample() {
                self.retired += s.delivered;
                self.retired_pressure.0 += s.busy;
                self.retired_pressure.1 += s.window_limited;
            }
        }
    }

    fn retire_all(&mut self) {
        let streams: Vec<u16> = self.live.keys().copied().collect();
        for i in streams {
            self.retire(i);
        }
    }

    /// Bytes delivered on every stream so far (acknowledged, and on live streams held
    /// by the peer beyond a loss: see
    /// [`dmover_net::link::StreamSample::delivered_beyond_loss`]), the smallest round
    /// trip seen, and what the streams waited on.
    fn read(&self) -> Option<(u64, Option<Duration>, Pressure)> {
        if self.unmetered || self.live.is_empty() {
            return None;
        }
        let (mut bytes, mut rtt) = (self.retired, None::<Duration>);
        let mut p = Pressure {
            busy: self.retired_pressure.0,
            window_limited: self.retired_pressure.1,
            model_based: true,
        };
        for (probe, model_based) in self.live.values() {
            let s = probe.sample().ok()?;
            bytes += s.delivered + s.delivered_beyond_loss;
            if !s.min_rtt.is_zero() {
                rtt = Some(rtt.map_or(s.min_rtt, |r| r.min(s.min_rtt)));
            }
            p.busy += s.busy;
            p.window_limited += s.window_limited;
            p.model_based &= model_based;
        }
        Some((bytes, rtt, p))
    }
}

/// Feeds the source's tuner the clock and the bytes sent (as the streams' TCP
/// counters have them acknowledged, or else as written), and applies its decision:
/// the machine sends on that many streams and tells the sink; the progress says so.
fn tune_step(
    t: &mut Tuner,
    m: &mut SourceSession<Fault>,
    meters: &Meters,
    p: &Progress,
    peer: &str,
) {
    let at = now();
    let decision = if m.has_work() {
        let (bytes, rtt, pressure) = match meters.read() {
            Some((b, rtt, pressure)) => (b, rtt.or(m.ack_rtt()), Some(pressure)),
            None => (p.bytes.load(Relaxed), m.ack_rtt(), None),
        };
        t.set_pressure(pressure);
        if let Some(rtt) = rtt {
            t.set_rtt(rtt);
            p.note_rtt(rtt);
        }
        // What is left to send, once the manifest is complete (a growing one, as the
        // memory test's, has a total of what it announced so far, not of what it will
        // send).
        t.set_remaining(remaining(p, m.manifest_complete()));
        let d = t.tick(at, bytes);
        if let Some(note) = t.take_note() {
            tracing::info!("tuning the transfer to {peer}: {note}");
        }
        d
    } else {
        if t.poll_timeout().is_some() {
            tracing::debug!(
                "tuning the transfer to {peer}: nothing to send, the period is dropped"
            );
        }
        t.pause();
        None
    };
    let first = p.first_data();
    let since_first = |i: std::time::Instant| {
        first.map_or(0, |f| i.saturating_duration_since(f).as_millis() as u64)
    };
    let mut tuning = p.tuning.lock();
    if let Some(s) = tuning.as_mut() {
        s.streams = t.kept();
        s.active = t.streams();
        s.changes = t.changes();
        s.settled_ms = t.settled_after().map(|d| d.as_millis() as u64);
    }
    drop(tuning);
    let Some(d) = decision else { return };
    tracing::info!("tuning the transfer to {peer}: {}", d.reason);
    m.set_active(at, d.streams);
    m.tuned(Tuned {
        at_ms: since_first(at),
        streams: d.streams,
        rate: d.rate,
        reason: d.reason.clone(),
    });
    p.event(ProgressEvent::Tuned {
        streams: d.streams,
        rate: d.rate,
        reason: d.reason,
    });
}

/// The next part of a growing manifest (never, without one).
async fn next_part(g: &mut Option<mpsc::UnboundedReceiver<GrowPart>>) -> Option<GrowPart> {
    match g {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn spawn_read<K>(
    disk: &DiskPool,
    src: Arc<dyn Source>,
    job: ReadJob,
    mut buf: PoolBuf,
    tx: mpsc::UnboundedSender<SrcIn<K>>,
) where
    K: Send + 'static,
{
    disk.spawn(move || {
        let read = match (job.again, job.part) {
            (None, None) => {
                let mut digests = Vec::new();
                src.read_chunk(job.chunk, &mut buf, &mut digests)
                    .map_err(Error::from)
                    .map(|r| {
                        (
                            buf,
                            ChunkMeta {
                                crc: r.crc,
                                digests,
                                zeros: r.zeros,
                                part: None,
                            },
                        )
                    })
            }
            (Some(meta), None) => src
                .reread_chunk(job.chunk, &mut buf, meta.crc)
                .map_err(Error::from)
                .map(|()| (buf, meta)),
            (again, Some(p)) => read_part(&*src, job.chunk, p, buf).and_then(|(buf, meta)| {
                // Sent before on a lost stream: the bytes must be the same.
                match again {
                    Some(m) if m.crc.is_some() && m.crc != meta.crc => Err(Error::refused(
                        ErrorCode::Io,
                        format!(
                            "chunk {} changed at the source while it was being sent",
                            job.chunk
                        ),
                    )),
                    _ => Ok((buf, meta)),
                }
            }),
        };
        let _ = tx.send(SrcIn::Read {
            chunk: job.chunk,
            read,
        });
    });
}

/// The runs of a chunk's buffer that make part `p` of its payload, `p.offset` being an
/// offset into the chunk's virtual range (as a buffer offset): `None` unless the part
/// lies within one of `segments` (one piece, one file).
fn part_segments(segments: &[(usize, usize)], p: PartRange) -> Option<Vec<(usize, usize)>> {
    let (from, len) = (p.offset as usize, p.len as usize);
    segments
        .iter()
        .find(|&&(o, l)| o <= from && from + len <= o + l)
        .map(|_| vec![(from, len)])
}

/// Reads chunk `k` for part `p` of it: the chunk as usual, then the part's frame fields
/// (the CRC of its bytes, and the chunk's failure markers as its digests).
fn read_part(
    src: &dyn Source,
    k: u64,
    p: PartRange,
    mut buf: PoolBuf,
) -> Result<(PoolBuf, ChunkMeta)> {
    let mut digests = Vec::new();
    let r = src.read_chunk(k, &mut buf, &mut digests)?;
    let mut segments = Vec::new();
    src.layout().segments(k, &mut segments);
    if r.zeros || part_segments(&segments, p).is_none() {
        return Err(Error::protocol(
            "the sink",
            format!(
                "asked for {} bytes at {} of chunk {k}, not within one file's piece of it",
                p.len, p.offset
            ),
        ));
    }
    let bytes = &buf[p.offset as usize..(p.offset + p.len) as usize];
    let crc = r.crc.map(|_| dmover_proto::digest::crc32c_append(0, bytes));
    digests.retain(DigestEntry::is_failure);
    Ok((
        buf,
        ChunkMeta {
            crc,
            digests,
            zeros: false,
            part: Some(p),
        },
    ))
}

/// A source's data stream: writes the chunks it is given and reads acknowledgements.
async fn source_stream<L: DataLink, K>(
    i: u16,
    s: DataStream<L>,
    mut work: mpsc::UnboundedReceiver<SrcOut>,
    tx: mpsc::UnboundedSender<SrcIn<K>>,
    progress: Arc<Progress>,
    zerocopy: Option<Arc<ZeroCopyUse>>,
    zero_frames: bool,
) {
    let peer = s.peer;
    let (mut out, mut acks) = s.io.into_source();
    if let Some(z) = &zerocopy {
        if let Err(e) = out.zerocopy() {
            *z.refused.lock() = Some(e);
        }
    }
    // A stream that sent its first chunks before its join's answer reports a failed
    // join as the join would have (see `Error::data`).
    let io_err = |what, e| Error::data(what, &peer, e);
    let writer = async {
        while let Some(item) = work.recv().await {
            match item {
                SrcOut::Chunk {
                    chunk,
                    mut buf,
                    meta,
                    segments,
                } => {
                    let zeros = meta.zeros && zero_frames;
                    let frame = ChunkFrame {
                        chunk,
                        crc: meta.crc,
                        digests: &meta.digests,
                        segments: if zeros { &[] } else { &segments },
                        zeros,
                        part: meta.part.map(|p| p.offset),
                    };
                    let payload = frame.payload_len() as u64;
                    if zeros {
                        let len: usize = segments.iter().map(|s| s.1).sum();
                        progress.holes.fetch_add(len as u64, Relaxed);
                    }
                    // The transport may seal the chunk's records in its buffer and
                    // write them from there; the buffer is not used after this.
                    out.send_chunk(frame, &mut buf)
                        .await
                        .map_err(|e| io_err("sending data to", e))?;
                    drop(buf);
                    progress.bytes.fetch_add(payload, Relaxed);
                    progress.stream_bytes.add(i, payload);
                    progress.chunks.fetch_add(1, Relaxed);
                    progress.data_flowing();
                    let _ = tx.send(SrcIn::Written { stream: i, chunk });
                }
                SrcOut::End(sent) => {
                    out.send_end(sent)
                        .await
                        .map_err(|e| io_err("sending data to", e))?;
                    if let (Some(z), Some(st)) = (&zerocopy, out.zerocopy_stats()) {
                        let mut t = z.stats.lock();
                        t.sends += st.sends;
                        t.completed += st.completed;
                        t.copied += st.copied;
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    };
    let acker = async {
        loop {
            match acks.recv_ack().await {
                Ok(frames) => {
                    let _ = tx.send(SrcIn::Acked { stream: i, frames });
                }
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Error::Net(NetError::Closed { peer: peer.clone() });
                }
                Err(e) => return io_err("reading acknowledgements from", e),
            }
        }
    };
    let r = tokio::select! {
        r = writer => r,
        e = acker => Err(e),
    };
    if let Err(error) = r {
        let _ = tx.send(SrcIn::Failed { stream: i, error });
    }
}
