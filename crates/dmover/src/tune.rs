//! `dmover tune HOST[:PORT] [PATH]`: probes a link and, with PATH, a storage path within
//! a time budget and a size cap, cleans up after itself, and prints the settings it
//! would use and what limits a transfer (docs/tuning.md, "dmover tune").
//!
//! 1. Network: a memory-to-memory session pushed to the server ([`Client::memtest`]:
//!    pattern source, discarding sink, no disk at either end) with the source's tuner
//!    on (no `-P`), for about half the budget (all of it without PATH). The tuner's
//!    decisions, the streams it kept, the rate, the smallest round trip the streams'
//!    `TCP_INFO` saw, and this process's CPU time against wall time × cores.
//! 2. Storage, a local directory: one temporary file written with direct I/O (as the
//!    copy engine writes; buffered with `fdatasync` where the file system refuses
//!    `O_DIRECT`) in chunk-size blocks by the I/O threads until the size cap or its
//!    share of the budget, then read back the same way, then removed.
//!    A directory on a server (`HOST:PATH`, `dmover://HOST/PATH`): a sparse file of
//!    at most the size cap (less when the network would not carry it within the
//!    budget) pushed into it, timed, then deleted with [`Client::remove_remote`]
//!    (`Op::Prune` limited to that one name, at most one entry), which is first tried
//!    as a dry run, so a path where this user may not delete is refused before
//!    anything is written.
//! 3. The verdict from the numbers.
//!
//! Ctrl-C (or SIGTERM) stops the test that runs and still cleans up, locally and on
//! the server; a second one exits at once.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use dmover_core::client::Client;
use dmover_core::engine::{ProgressEvent, Run};
use dmover_core::memtest::MemTestOptions;
use dmover_core::transfer::{Endpoint, with_port};
use dmover_proto::control::{ErrorCode, MemDirection};
use dmover_proto::manifest::{EntryKind, Mtime};
use dmover_proto::session::tune::rate_text;
use dmover_proto::units::parse_size;
use rustix::fs::{Mode, OFlags};
use serde_json::{Value, json};

use crate::args::{TransferArgs, usage};
use crate::interrupt::sweep as interrupt;
use crate::output;
use crate::resolve::ClientSetup;

/// Arguments of `dmover tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// The server: HOST or HOST:PORT of a `dmover serve` (port 7700 by default).
    pub host: String,
    /// Storage to probe as well: a local directory, or a directory on a server where
    /// you may write and delete (HOST:PATH or dmover://HOST[:PORT]/PATH, below an
    /// export's root). A test file is written there and removed.
    pub path: Option<OsString>,
    /// Time budget of the whole probe in seconds (2 to 600): the network test takes
    /// about half of it with PATH, all of it without.
    #[arg(long, default_value_t = 20.0, value_parser = seconds)]
    pub seconds: f64,
    /// Most bytes the storage test writes (1M or more; e.g. 256M, 4G).
    #[arg(long, default_value = "1G", value_parser = size_cap)]
    pub size: u64,
    /// Print the result as one JSON object on stdout (docs/json.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(2.0..=600.0).contains(&v) {
        return Err(format!("{s}: the budget must be between 2 and 600 seconds"));
    }
    Ok(v)
}

fn size_cap(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < 1 << 20 {
        return Err(format!("{s:?}: the size cap must be at least 1M"));
    }
    Ok(v)
}

/// Direct-I/O alignment of the storage test's offsets, lengths and buffer.
const ALIGN: u64 = 4096;
/// The test file's name prefix, locally and on a server.
const PREFIX: &str = "dmover-tune-";
/// Chunk size of the probes when the user leaves it to us (the engine's default).
const DEFAULT_CHUNK: u32 = 4 << 20;
/// CPU use (of all cores) from which the CPU counts as the limit.
const CPU_BUSY: f64 = 0.85;
/// A rate within this fraction of the network's is "as fast as the network".
const NEAR: f64 = 0.9;

/// What the network test measured.
struct Net {
    bytes: u64,
    seconds: f64,
    streams: u16,
    of: u16,
    tuned: bool,
    changes: u32,
    settled_ms: Option<u64>,
    rtt: Option<Duration>,
    chunk: u32,
    decisions: Vec<Value>,
    cpu_seconds: f64,
    wall: f64,
    cores: usize,
}

impl Net {
    fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }

    /// This process's share of all cores during the test.
    fn cpu_share(&self) -> f64 {
        self.cpu_seconds / (self.wall.max(1e-9) * self.cores.max(1) as f64)
    }
}

/// What the storage test measured.
struct Storage {
    place: &'static str,
    path: String,
    direct_io: Option<bool>,
    write_bytes: u64,
    write_seconds: f64,
    read_bytes: u64,
    read_seconds: f64,
    /// A push's walk and session set-up, before its first chunk.
    setup_seconds: Option<f64>,
    removed: bool,
    note: Option<String>,
}

impl Storage {
    fn write_rate(&self) -> f64 {
        self.write_bytes as f64 / self.write_seconds.max(1e-9)
    }

    fn read_rate(&self) -> Option<f64> {
        (self.read_bytes > 0).then(|| self.read_bytes as f64 / self.read_seconds.max(1e-9))
    }
}

/// A failure with the exit code it gives (a session's error keeps its code).
enum Failed {
    Core(String, Box<dmover_core::Error>),
    Other(anyhow::Error),
}

impl Failed {
    fn core(what: String, e: dmover_core::Error) -> Self {
        Failed::Core(what, Box::new(e))
    }
}

impl From<anyhow::Error> for Failed {
    fn from(e: anyhow::Error) -> Self {
        Failed::Other(e)
    }
}

/// `dmover tune`, with its client resolved from `a.transfer`.
pub fn run(a: TuneArgs, client: ClientSetup) -> anyhow::Result<ExitCode> {
    let server = with_port(&a.host).map_err(|e| usage(format!("HOST: {e}")))?;
    let place = match &a.path {
        None => None,
        Some(p) => Some(Endpoint::parse(p.as_bytes()).map_err(|e| usage(format!("PATH: {e}")))?),
    };
    if let Some(Endpoint::Local(p)) = &place {
        let dir = Path::new(std::ffi::OsStr::from_bytes(p));
        let md = std::fs::metadata(dir).with_context(|| format!("PATH {}", dir.display()))?;
        if !md.is_dir() {
            bail!("PATH {} is not a directory", dir.display());
        }
    }
    match probe(&a, client, &server, place) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(Failed::Other(e)) => Err(e),
        Err(Failed::Core(what, e)) => {
            eprintln!("dmover: error: {what}: {e}");
            Ok(ExitCode::from(output::exit_code(&e)))
        }
    }
}

/// Cancels `run` when a stop signal arrives, until the run ends.
fn watch_interrupt(rt: &tokio::runtime::Runtime, run: &Arc<Run>) {
    let run = run.clone();
    rt.spawn(async move {
        loop {
            if interrupt::requested() {
                run.fail(dmover_core::Error::refused(
                    ErrorCode::Aborted,
                    "interrupted",
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

fn probe(
    a: &TuneArgs,
    client: ClientSetup,
    server: &str,
    place: Option<Endpoint>,
) -> Result<(), Failed> {
    let started = Instant::now();
    interrupt::install().context("watching for Ctrl-C")?;
    let budget = Duration::from_secs_f64(a.seconds);
    let mut opts = client.options.clone();
    opts.retries = 0;
    // A test push leaves nothing to resume: without a journal an interrupted one
    // leaves no staging file either.
    opts.journal = false;
    let rt = crate::resolve::runtime(opts.streams)?;
    let io_threads = dmover_core::diskpool::threads_from(client.disk_threads()).0;
    let chunk = match opts.chunk_size {
        0 => DEFAULT_CHUNK,
        c => c,
    };

    // A remote storage test where it could not clean up fails before anything runs.
    let name = format!(
        "{PREFIX}{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let mut dir_mtime = Mtime { sec: 0, nsec: 0 };
    if let Some(Endpoint::Remote { server: at, path }) = &place {
        dir_mtime = check_remote(&rt, &opts, at, path, &name)?;
    }

    // The network, memory to memory.
    let net_share = if place.is_some() { 0.5 } else { 0.9 };
    // Set-up and the end of the session come on top of the sending time.
    let send_for = (budget.mul_f64(net_share)).saturating_sub(Duration::from_millis(1500));
    let send_for = send_for.max(Duration::from_secs(1));
    if !a.json {
        eprintln!(
            "network: memory to memory to {server} for {:.1} s{}",
            send_for.as_secs_f64(),
            if opts.tune {
                ", the streams tuned while it runs"
            } else {
                ""
            }
        );
    }
    let net = network(&rt, &opts, io_threads, server, send_for)?;
    if !a.json {
        eprintln!(
            "network: {} on {} stream(s){}",
            rate_text(net.rate()),
            net.streams,
            net.rtt
                .map(|r| format!(", RTT {:.3} ms", r.as_secs_f64() * 1e3))
                .unwrap_or_default()
        );
    }

    // The storage.
    let left = budget.saturating_sub(started.elapsed());
    let storage = match &place {
        None => None,
        Some(Endpoint::Local(p)) => {
            let dir = PathBuf::from(std::ffi::OsStr::from_bytes(p));
            if !a.json {
                eprintln!(
                    "storage: writing then reading up to {} in {}",
                    dmover_bench::report::size_label(a.size),
                    dir.display()
                );
            }
            let block = u64::from(chunk);
            Some(
                local_storage(&dir, &name, a.size, block, io_threads, left)
                    .map_err(Failed::Other)?,
            )
        }
        Some(Endpoint::Remote { server: at, path }) => {
            // The network's rate tells how much it carries in the time left.
            let fits = (net.rate() * left.as_secs_f64() * 0.5) as u64;
            let size = a.size.min(fits.max(1 << 20)) / ALIGN * ALIGN;
            if !a.json {
                eprintln!(
                    "storage: pushing {} into {}:{}",
                    dmover_bench::report::size_label(size),
                    at,
                    String::from_utf8_lossy(path)
                );
            }
            let client = Client::new(opts.clone(), io_threads);
            // The push stops when the budget is spent, but for a second to clean up
            // (it has at least 2 s).
            let time = left
                .saturating_sub(Duration::from_secs(1))
                .max(Duration::from_secs(2));
            Some(remote_storage(
                &rt,
                &client,
                at,
                path,
                &name,
                dir_mtime,
                (size, time),
            )?)
        }
    };
    if interrupt::requested() {
        return Err(Failed::Other(anyhow::anyhow!("interrupted (cleaned up)")));
    }
    let total = started.elapsed().as_secs_f64();
    let verdict = verdict(&net, storage.as_ref());
    let settings = settings(&net, &opts);
    if a.json {
        let out = json!({
            "schema": 1,
            "type": "tune",
            "server": server,
            "seconds": round(total, 3),
            "budget_seconds": a.seconds,
            "size_cap": a.size,
            "network": net_json(&net),
            "storage": storage.as_ref().map(storage_json),
            "settings": settings,
            "limit": verdict.0,
            "limit_reason": verdict.1,
        });
        println!("{out}");
    } else {
        print_text(&net, storage.as_ref(), &settings, &verdict, total);
    }
    Ok(())
}

/// The memory-to-memory push of `send_for`.
fn network(
    rt: &tokio::runtime::Runtime,
    opts: &dmover_core::session::TransferOptions,
    io_threads: usize,
    server: &str,
    send_for: Duration,
) -> Result<Net, Failed> {
    let client = Client::new(opts.clone(), io_threads);
    let run = Run::new();
    watch_interrupt(rt, &run);
    let t = MemTestOptions {
        direction: MemDirection::ToServer,
        duration: send_for,
        zerocopy: false,
        congestion: opts.socket.congestion.clone(),
    };
    let c0 = dmover_bench::report::cpu_seconds();
    let w0 = Instant::now();
    let r = rt.block_on(client.memtest(server, &t, run.clone()));
    let wall = w0.elapsed().as_secs_f64();
    let cpu_seconds = dmover_bench::report::cpu_seconds() - c0;
    let r = r.map_err(|e| {
        Failed::core(
            format!("the memory-to-memory test with {server}"),
            run.take_error().unwrap_or(e),
        )
    })?;
    let p = &run.progress;
    let tuning = *p.tuning.lock();
    let decisions = p
        .take_events()
        .into_iter()
        .filter_map(|(_, e)| match e {
            ProgressEvent::Tuned {
                streams,
                rate,
                reason,
            } => Some(json!({
                "streams": streams,
                "gbit_per_s": round(rate as f64 * 8.0 / 1e9, 4),
                "reason": reason,
            })),
            _ => None,
        })
        .collect();
    Ok(Net {
        bytes: r.bytes,
        seconds: r.seconds,
        streams: tuning.map_or(r.streams, |t| t.streams),
        of: tuning.map_or(r.streams, |t| t.of),
        tuned: tuning.is_some(),
        changes: tuning.map_or(0, |t| t.changes),
        settled_ms: tuning.and_then(|t| t.settled_ms),
        rtt: p.min_rtt(),
        chunk: r.chunk_size,
        decisions,
        cpu_seconds,
        wall,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

/// A file removed when dropped (the local storage test's).
struct TestFile(PathBuf);

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A page-aligned buffer of `len` bytes of a pattern (not zeros, which some file
/// systems compress away).
struct Aligned {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize, seed: u64) -> Self {
        let mut raw = vec![0u8; len + ALIGN as usize];
        let off = raw.as_ptr().align_offset(ALIGN as usize);
        let mut x = seed | 1;
        for b in raw[off..off + len].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
        }
        Aligned { raw, off, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

/// `threads` threads moving `block`-byte blocks of `fd` at offsets they take in turn
/// from 0, up to `end` or `until` or a stop signal; returns the bytes moved.
fn blocks(
    fd: &OwnedFd,
    path: &Path,
    end: u64,
    block: u64,
    threads: usize,
    until: Instant,
    write: bool,
) -> anyhow::Result<u64> {
    let next = AtomicU64::new(0);
    let moved = AtomicU64::new(0);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let (next, moved) = (&next, &moved);
                s.spawn(move || -> anyhow::Result<()> {
                    let mut buf = Aligned::new(block as usize, 0x7e57 + t as u64);
                    loop {
                        if Instant::now() >= until || interrupt::requested() {
                            return Ok(());
                        }
                        let off = next.fetch_add(block, Ordering::Relaxed);
                        if off >= end {
                            return Ok(());
                        }
                        let n = block.min(end - off) as usize;
                        let mut done = 0;
                        while done < n {
                            let r = if write {
                                rustix::io::pwrite(
                                    fd.as_fd(),
                                    &buf.bytes()[done..n],
                                    off + done as u64,
                                )
                            } else {
                                rustix::io::pread(
                                    fd.as_fd(),
                                    &mut buf.bytes_mut()[done..n],
                                    off + done as u64,
                                )
                            };
                            let r = r.with_context(|| {
                                format!(
                                    "{} {}",
                                    if write { "writing" } else { "reading" },
                                    path.display()
                                )
                            })?;
                            if r == 0 {
                                bail!("{}: no progress at offset {off}", path.display());
                            }
                            done += r;
                        }
                        moved.fetch_add(n as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a storage test thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(moved.load(Ordering::Relaxed))
}

/// Writes then reads a temporary file in `dir` (see the module docs); `left`: the
/// budget's time left, shared by the two phases.
fn local_storage(
    dir: &Path,
    name: &str,
    cap: u64,
    block: u64,
    threads: usize,
    left: Duration,
) -> anyhow::Result<Storage> {
    let cap = (cap / ALIGN * ALIGN).max(ALIGN);
    let direct = dmover_bench::storage::direct_io_supported(dir);
    let path = dir.join(name);
    let open = |flags: OFlags| -> anyhow::Result<OwnedFd> {
        let mut flags = flags | OFlags::CLOEXEC;
        if direct {
            flags |= OFlags::DIRECT;
        }
        rustix::fs::open(&path, flags, Mode::from_raw_mode(0o600))
            .with_context(|| format!("creating {}", path.display()))
    };
    let fd = open(OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL)?;
    let file = TestFile(path.clone());
    let phase = left.div_f64(2.0).max(Duration::from_millis(500));
    let t0 = Instant::now();
    let written = blocks(&fd, &path, cap, block, threads, t0 + phase, true)?;
    rustix::fs::fdatasync(&fd).with_context(|| format!("syncing {}", path.display()))?;
    let write_seconds = t0.elapsed().as_secs_f64();
    // The read must come from the disk, not from what the write left in the page
    // cache (with direct I/O there is none; buffered, the clean pages go).
    let _ = rustix::fs::fadvise(&fd, 0, None, rustix::fs::Advice::DontNeed);
    drop(fd);
    let mut read_bytes = 0;
    let mut read_seconds = 0.0;
    if !interrupt::requested() {
        let fd = open(OFlags::RDONLY)?;
        let _ = rustix::fs::fadvise(&fd, 0, None, rustix::fs::Advice::DontNeed);
        let t1 = Instant::now();
        read_bytes = blocks(&fd, &path, written, block, threads, t1 + phase, false)?;
        read_seconds = t1.elapsed().as_secs_f64();
    }
    drop(file);
    let removed = !path.exists();
    let fs_type = rustix::fs::statfs(dir).map(|s| s.f_type).unwrap_or(0);
    // tmpfs (0x01021994) and ramfs (0x858458f6) keep files in memory.
    let in_memory = [0x0102_1994, 0x8584_58f6].contains(&(fs_type as i64));
    let note = if in_memory {
        Some(format!(
            "{} is in memory (tmpfs): its rates are not a disk's",
            dir.display()
        ))
    } else if !direct {
        Some(format!(
            "{} refuses direct I/O: buffered, with fdatasync and the pages dropped before \
             the read",
            dir.display()
        ))
    } else {
        None
    };
    Ok(Storage {
        place: "local",
        path: dir.display().to_string(),
        direct_io: Some(direct),
        write_bytes: written,
        write_seconds,
        read_bytes,
        read_seconds,
        setup_seconds: None,
        removed,
        note,
    })
}

/// Checks, changing nothing, that `dir` on `server` is a directory and that the server
/// lets this client delete `name` in it (`Op::Prune` as a dry run): where it could
/// not, the storage test writes nothing. Returns `dir`'s mtime, which it gets back
/// after the test (a one-entry walk of it: a filtered pull that excludes everything
/// below it, opened and closed, no data).
fn check_remote(
    rt: &tokio::runtime::Runtime,
    opts: &dmover_core::session::TransferOptions,
    server: &str,
    dir: &[u8],
    name: &str,
) -> Result<Mtime, Failed> {
    let shown = format!("{server}:{}", String::from_utf8_lossy(dir));
    let mut o = opts.clone();
    o.rules = vec![dmover_proto::control::FilterRule {
        include: false,
        pattern: b"*".to_vec(),
    }];
    let client = Client::new(o, 1);
    let root = rt.block_on(async {
        let r = dmover_core::remote::Remote::open(&client, server, dir).await?;
        let root = r.roots().first().and_then(|&i| r.stat(i)).cloned();
        let _ = r.close().await;
        Ok::<_, dmover_core::Error>(root)
    });
    let root = root.map_err(|e| Failed::core(format!("looking at {shown}"), e))?;
    let Some(root) = root.filter(|e| e.kind == EntryKind::Dir) else {
        return Err(Failed::Other(anyhow::anyhow!(
            "{shown} is not a directory (the storage test writes a file into one)"
        )));
    };
    let client = Client::new(opts.clone(), 1);
    rt.block_on(client.remove_remote(server, dir, name.as_bytes(), root.mtime, 1, true))
        .map_err(|e| {
            let what = match e {
                dmover_core::Error::Net(_) => format!("checking {shown}"),
                _ => format!(
                    "{shown}: the storage test needs a directory below an export's root where \
                     you may write and delete"
                ),
            };
            Failed::core(what, e)
        })?;
    Ok(root.mtime)
}

/// Pushes a sparse file of `cap.0` bytes into `dir` on `server`, timed, and deletes it
/// there again (also after a failure or an interrupt). A push still running after
/// `cap.1` is stopped and measured by the bytes it sent until then.
fn remote_storage(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    server: &str,
    dir: &[u8],
    name: &str,
    dir_mtime: Mtime,
    cap: (u64, Duration),
) -> Result<Storage, Failed> {
    let (size, time) = cap;
    let shown = format!("{server}:{}", String::from_utf8_lossy(dir));
    let tmp = tempfile::Builder::new()
        .prefix(PREFIX)
        .tempdir()
        .context("creating a temporary directory")?;
    let local = tmp.path().join(name);
    std::fs::File::create(&local)
        .and_then(|f| f.set_len(size))
        .with_context(|| format!("creating {}", local.display()))?;
    let mut dest = dir.to_vec();
    while dest.len() > 1 && dest.ends_with(b"/") {
        dest.pop();
    }
    if !dest.is_empty() && !dest.ends_with(b"/") {
        dest.push(b'/');
    }
    dest.extend_from_slice(name.as_bytes());
    let run = Run::new();
    watch_interrupt(rt, &run);
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (run, timed_out) = (run.clone(), timed_out.clone());
        rt.spawn(async move {
            tokio::time::sleep(time).await;
            timed_out.store(true, Ordering::SeqCst);
            run.fail(dmover_core::Error::refused(
                ErrorCode::Aborted,
                "the time budget is spent",
            ));
        });
    }
    let t0 = Instant::now();
    let pushed = rt.block_on(client.push(
        &[local.as_os_str().as_bytes().to_vec()],
        server,
        &dest,
        run.clone(),
    ));
    let end = Instant::now();
    // From the first chunk on: the walk and the session's set-up are not the
    // storage's (the memory-to-memory rate is timed the same way).
    let first = run.progress.first_data().unwrap_or(t0);
    let seconds = end.saturating_duration_since(first).as_secs_f64();
    let setup = first.saturating_duration_since(t0).as_secs_f64();
    drop(tmp);
    // Deleted in any case; after a failure the server may still be winding the
    // session down: once more a moment later.
    let mut removed =
        rt.block_on(client.remove_remote(server, dir, name.as_bytes(), dir_mtime, 1, false));
    if pushed.is_err() {
        std::thread::sleep(Duration::from_millis(500));
        removed =
            rt.block_on(client.remove_remote(server, dir, name.as_bytes(), dir_mtime, 1, false));
    }
    // Stopped at the budget (not by an interrupt): measured by the bytes sent.
    let stopped = pushed.is_err() && timed_out.load(Ordering::SeqCst) && !interrupt::requested();
    let written = match pushed {
        Ok(report) => report.summary.bytes,
        Err(_) if stopped && run.progress.first_data().is_none() => {
            return Err(Failed::Other(anyhow::anyhow!(
                "the test push to {shown} sent nothing within the budget (its set-up took \
                 {:.1} s): give more --seconds",
                time.as_secs_f64()
            )));
        }
        Err(_) if stopped => run.progress.bytes.load(Ordering::Relaxed),
        Err(e) => {
            return Err(Failed::core(
                format!("the test push to {shown}"),
                run.take_error().unwrap_or(e),
            ));
        }
    };
    let removed = removed.map_err(|e| {
        Failed::core(
            format!("deleting the test file {name} in {shown} (remove it by hand)"),
            e,
        )
    })?;
    // A push that was stopped never gave the file its name (the server removes its
    // staging file): nothing to delete then.
    if removed.deleted != 1 && !stopped {
        return Err(Failed::Other(anyhow::anyhow!(
            "the test file {name} was not found in {shown} to delete"
        )));
    }
    Ok(Storage {
        place: "remote",
        path: shown,
        direct_io: None,
        write_bytes: written,
        write_seconds: seconds,
        read_bytes: 0,
        read_seconds: 0.0,
        setup_seconds: Some(setup),
        removed: true,
        note: Some(if stopped {
            format!(
                "a push through the network into the server's storage, timed from its first \
                 chunk, stopped after {:.1} s (the budget): measured by the bytes sent",
                time.as_secs_f64()
            )
        } else {
            "a push through the network into the server's storage, timed from its first \
             chunk: the server's write rate when below the network's"
                .into()
        }),
    })
}

/// What limits a transfer, and the numbers that say so.
fn verdict(net: &Net, storage: Option<&Storage>) -> (&'static str, String) {
    let cpu = net.cpu_share();
    let net_rate = net.rate();
    if cpu >= CPU_BUSY {
        return (
            "cpu",
            format!(
                "this process used {:.0} % of {} cores ({:.2} s of CPU in {:.2} s) while the \
                 network test sent {}",
                cpu * 100.0,
                net.cores,
                net.cpu_seconds,
                net.wall,
                rate_text(net_rate)
            ),
        );
    }
    let mut limit = (
        "network",
        format!(
            "memory to memory the network carried {} ({} streams{}); this process used \
             {:.0} % of {} cores",
            rate_text(net_rate),
            net.streams,
            net.rtt
                .map(|r| format!(", RTT {:.3} ms", r.as_secs_f64() * 1e3))
                .unwrap_or_default(),
            cpu * 100.0,
            net.cores
        ),
    );
    let Some(s) = storage else {
        return (
            limit.0,
            format!("{} (no storage measured: give PATH)", limit.1),
        );
    };
    let mut slowest = net_rate;
    let w = s.write_rate();
    let where_ = if s.place == "remote" {
        "the server's"
    } else {
        "local"
    };
    if s.place == "remote" {
        // The push went through the network: only clearly slower is the disk.
        if w < net_rate * NEAR {
            limit = (
                "disk write",
                format!(
                    "the push into {} (the server writing to its storage) ran at {}, the \
                 network carries {}",
                    s.path,
                    rate_text(w),
                    rate_text(net_rate)
                ),
            );
        } else {
            limit.1 = format!(
                "{}; the push into {} ran at {} (as fast as the network allows)",
                limit.1,
                s.path,
                rate_text(w)
            );
        }
        return limit;
    }
    if w < slowest {
        slowest = w;
        limit = (
            "disk write",
            format!(
                "{where_} writes ran at {}, the network carries {}{}",
                rate_text(w),
                rate_text(net_rate),
                s.read_rate()
                    .map(|r| format!(", reads {}", rate_text(r)))
                    .unwrap_or_default()
            ),
        );
    }
    if let Some(r) = s.read_rate().filter(|&r| r < slowest) {
        limit = (
            "disk read",
            format!(
                "{where_} reads ran at {}, writes {}, the network carries {}",
                rate_text(r),
                rate_text(w),
                rate_text(net_rate)
            ),
        );
    }
    if limit.0 == "network" {
        limit.1 = format!(
            "{}; {where_} writes {}{}",
            limit.1,
            rate_text(w),
            s.read_rate()
                .map(|r| format!(", reads {}", rate_text(r)))
                .unwrap_or_default()
        );
    }
    limit
}

/// The settings `dmover tune` would use, and what it cannot choose yet.
fn settings(net: &Net, opts: &dmover_core::session::TransferOptions) -> Value {
    // A search that had not settled ended in a probe ("trying N") whose result is
    // unknown: the count it started from is the best one measured.
    let streams = match net.decisions.as_slice() {
        [.., before, _] if opts.tune && net.settled_ms.is_none() => {
            before["streams"].as_u64().map_or(net.streams, |n| n as u16)
        }
        _ => net.streams,
    };
    let bdp = net
        .rtt
        .map(|r| (net.rate() * r.as_secs_f64()) as u64 / u64::from(streams.max(1)));
    json!({
        "streams": streams,
        "streams_pinned": !opts.tune,
        "streams_settled": !opts.tune || net.settled_ms.is_some(),
        "chunk_size": if opts.chunk_size == 0 { Value::Null } else { json!(opts.chunk_size) },
        "chunk_size_auto": opts.chunk_size == 0,
        "window_per_stream": bdp,
        "not_tuned": [
            "chunk size by measured rates (auto: from the files' sizes, per part of a large tree, the link's round trip and a small dataset's size; docs/tuning.md)",
            "in-flight chunks per stream (what each stream's socket holds: its congestion window's data, at most 4 MiB unsent)",
            "congestion control (--congestion; a pull asks the server to send with it)",
        ],
        "socket_buffers": "autotuned; held to the session's share where the host's limit is above it, raised to it where a stream reaches a lower limit (docs/tuning.md, \"Socket buffers\"); --tcp-buffer pins them",
    })
}

fn round(x: f64, digits: i32) -> f64 {
    dmover_bench::report::round_sig(x, digits)
}

fn net_json(n: &Net) -> Value {
    json!({
        "direction": "push",
        "bytes": n.bytes,
        "seconds": round(n.seconds, 4),
        "bit_per_s": (n.rate() * 8.0).round() as u64,
        "gbit_per_s": round(n.rate() * 8.0 / 1e9, 4),
        "streams": n.streams,
        "streams_max": n.of,
        "tuned": n.tuned,
        "changes": n.changes,
        "settled_ms": n.settled_ms,
        "rtt_ms": n.rtt.map(|r| round(r.as_secs_f64() * 1e3, 4)),
        "chunk_size": n.chunk,
        "decisions": n.decisions,
        "cpu_seconds": round(n.cpu_seconds, 4),
        "wall_seconds": round(n.wall, 4),
        "cores": n.cores,
        "cpu_percent": round(n.cpu_share() * 100.0, 3),
    })
}

fn storage_json(s: &Storage) -> Value {
    json!({
        "where": s.place,
        "path": s.path,
        "direct_io": s.direct_io,
        "write_bytes": s.write_bytes,
        "write_seconds": round(s.write_seconds, 4),
        "write_bit_per_s": (s.write_rate() * 8.0).round() as u64,
        "read_bytes": (s.place == "local").then_some(s.read_bytes),
        "read_seconds": (s.place == "local").then(|| round(s.read_seconds, 4)),
        "read_bit_per_s": s.read_rate().map(|r| (r * 8.0).round() as u64),
        "setup_seconds": s.setup_seconds.map(|x| round(x, 4)),
        "removed": s.removed,
        "note": s.note,
    })
}

fn print_text(
    net: &Net,
    storage: Option<&Storage>,
    settings: &Value,
    verdict: &(&'static str, String),
    total: f64,
) {
    println!(
        "network:  {} memory to memory, {} of {} streams{}{}",
        rate_text(net.rate()),
        net.streams,
        net.of,
        if net.tuned {
            format!(
                " (tuned: {} change(s){})",
                net.changes,
                net.settled_ms
                    .map(|ms| format!(", settled after {:.1} s", ms as f64 / 1e3))
                    .unwrap_or_else(|| ", not settled yet".into())
            )
        } else {
            " (pinned with -P)".into()
        },
        net.rtt
            .map(|r| format!(", RTT {:.3} ms", r.as_secs_f64() * 1e3))
            .unwrap_or_default()
    );
    println!(
        "cpu:      {:.0} % of {} cores during the network test",
        net.cpu_share() * 100.0,
        net.cores
    );
    if let Some(s) = storage {
        let read = s
            .read_rate()
            .map(|r| format!(", read {}", rate_text(r)))
            .unwrap_or_default();
        println!(
            "storage:  {} ({}): write {}{read}{}",
            s.path,
            s.place,
            rate_text(s.write_rate()),
            if s.removed {
                ", test file removed"
            } else {
                ", TEST FILE LEFT"
            }
        );
        if let Some(n) = &s.note {
            println!("          ({n})");
        }
    }
    let chunk = settings["chunk_size"]
        .as_u64()
        .map_or("auto".to_string(), dmover_bench::report::size_label);
    println!(
        "settings: -P {} --chunk {chunk}{}{}",
        settings["streams"],
        if settings["streams_settled"] == true {
            ""
        } else {
            " (the tuner had not settled: a longer --seconds would tell more)"
        },
        settings["window_per_stream"]
            .as_u64()
            .filter(|&w| w >= 64 << 10)
            .map(|w| format!(
                "; rate x RTT is {} per stream (the socket buffers must hold it)",
                dmover_bench::report::size_label(w)
            ))
            .unwrap_or_default()
    );
    println!(
        "          not chosen yet: chunk size by measured rates, in-flight chunks per stream, congestion control (disk threads and socket buffers: a copy tunes them while it runs)"
    );
    println!("limit:    {}: {}", verdict.0, verdict.1);
    println!("({total:.1} s)");
}
