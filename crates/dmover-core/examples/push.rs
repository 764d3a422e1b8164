//! The library API end to end: starts a dmover server in this process on loopback
//! over a temporary directory, generates a small tree, pushes it through
//! [`dmover_core::transfer`] while printing the typed progress events, prints the
//! report and checks the copy byte for byte. Runs on its own:
//!
//! ```text
//! cargo run --release -p dmover-core --example push
//! ```
//!
//! `tests/transfer.rs` runs the same code, so it keeps working.

use std::error::Error as StdError;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_core::transfer::{Endpoint, Event, Finished, Transfer, TransferSpec, Watch};
use dmover_net::tls::Trust;
use tokio_util::sync::CancellationToken;

/// The generated tree: a few files across two directories, one over several chunks.
const FILES: &[(&str, usize)] = &[
    ("run1/a.dat", 300_000),
    ("run1/b.dat", 4_096),
    ("run1/logs/x.log", 12_345),
    ("run1/logs/empty", 0),
    ("run1/big.bin", 3 << 20),
];

/// What the example saw: for its test.
#[derive(Debug)]
pub struct Seen {
    /// Every event, in order.
    pub events: Vec<Event>,
    /// The transfer's end.
    pub finished: Finished,
    /// Files compared equal at the server.
    pub identical: usize,
}

#[allow(dead_code)] // the test calls `push_example` only
fn main() -> Result<(), Box<dyn StdError>> {
    let seen = push_example(&mut |line| println!("{line}"))?;
    let r = &seen.finished.report;
    println!(
        "pushed {} files ({} bytes) in {:.3} s over {} streams, {} attempt(s); {} files identical",
        r.summary.files,
        r.bytes_sent,
        seen.finished.elapsed.as_secs_f64(),
        r.streams,
        r.attempts,
        seen.identical,
    );
    Ok(())
}

/// Runs the example, telling `say` each line it prints.
pub fn push_example(say: &mut dyn FnMut(String)) -> Result<Seen, Box<dyn StdError>> {
    let tmp = tempfile::tempdir()?;
    let (src, root) = (tmp.path().join("src"), tmp.path().join("server-root"));
    make_tree(&src)?;
    std::fs::create_dir(&root)?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // A server on loopback, without authentication (loopback only), its key made now.
    let mut cfg = ServerConfig::new(&root);
    (cfg.io_threads, cfg.io_threads_max) = (2, 2);
    let server = Server::new(cfg)?;
    let stop = CancellationToken::new();
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (server, stop) = (Arc::clone(&server), stop.clone());
        tokio::spawn(async move { server.serve(listener, stop).await });
        std::io::Result::Ok(addr)
    })?;
    say(format!("server on {addr}, key {}", server.fingerprint()));

    // The transfer: the local `run1` into the server's root. The server's key is
    // pinned on first use in a known-hosts file of the example's own.
    let options = TransferOptions {
        trust: Some(Trust::KnownHosts(tmp.path().join("known_hosts"))),
        streams: 2,
        chunk_size: 1 << 20,
        ..TransferOptions::default()
    };
    let mut spec = TransferSpec::copy(
        vec![Endpoint::local(src.join("run1"))],
        Endpoint::remote(&addr.to_string(), "")?,
    )
    .options(options);
    spec.disk_threads = Some(2);
    let transfer = Transfer::new(spec)?;
    say(format!("{:?} of {}", transfer.direction(), src.display()));

    let mut events = Vec::new();
    let result = rt.block_on(transfer.run(Watch::every(Duration::from_millis(20)), |e| {
        say(describe(&e));
        events.push(e);
    }));
    stop.cancel();
    // Joins the transfer's disk threads, outside the runtime.
    drop(transfer);
    drop(rt);
    let finished = result?;

    let mut identical = 0;
    for (name, _) in FILES {
        let (a, b) = (src.join(name), root.join(name));
        if std::fs::read(&a)? != std::fs::read(&b)? {
            return Err(format!("{} differs from the source", b.display()).into());
        }
        identical += 1;
    }
    Ok(Seen {
        events,
        finished,
        identical,
    })
}

/// One line for an event.
fn describe(e: &Event) -> String {
    match e {
        Event::Progress(s) => format!(
            "progress: {} of {} bytes, {} of {} files, {:.1} MB/s",
            s.done(),
            s.total,
            s.files,
            s.total_files,
            s.rate / 1e6
        ),
        Event::FilesDone { paths, .. } => format!("done: {}", paths.join(", ")),
        Event::FileFailed(why) => format!("not copied: {why}"),
        Event::Session { attempt, event } => format!("attempt {attempt}: {event:?}"),
        other => format!("{other:?}"),
    }
}

/// Writes [`FILES`] under `dir`, each with its own pseudo-random bytes.
fn make_tree(dir: &Path) -> std::io::Result<()> {
    for (i, (name, size)) in FILES.iter().enumerate() {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().expect("a parent"))?;
        let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let bytes: Vec<u8> = (0..*size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(p, bytes)?;
    }
    Ok(())
}
