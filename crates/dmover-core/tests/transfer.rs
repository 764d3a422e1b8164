//! The library API's example (`examples/push.rs`) run as a test: an in-process server
//! on loopback, a tree pushed through `dmover_core::transfer`, its events and report.

#[path = "../examples/push.rs"]
mod example;

use dmover_core::transfer::Event;

#[test]
fn the_example_pushes_a_tree_and_reports_it() {
    let mut lines = Vec::new();
    let seen = example::push_example(&mut |l| lines.push(l)).expect("the example runs");
    let r = &seen.finished.report;
    assert_eq!(seen.identical, 5);
    assert_eq!(r.summary.files, 5, "{r:?}");
    assert_eq!(r.totals.files, 5);
    assert_eq!(r.attempts, 1);
    assert!(seen.finished.complete());
    // Every file with data is named once, and the last counters are complete.
    let mut done: Vec<String> = seen
        .events
        .iter()
        .filter_map(|e| match e {
            Event::FilesDone { paths, .. } => Some(paths.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    done.sort();
    assert_eq!(
        done,
        [
            "run1/a.dat",
            "run1/b.dat",
            "run1/big.bin",
            "run1/logs/x.log"
        ]
    );
    let last = seen
        .events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Progress(s) => Some(*s),
            _ => None,
        })
        .expect("a last progress event");
    assert_eq!(last.total, r.totals.bytes);
    assert_eq!(last.done(), last.total);
    assert_eq!((last.files, last.total_files), (4, 4));
    assert!(lines.iter().any(|l| l.starts_with("server on 127.0.0.1:")));
}

/// A pull through the API, cancelled by its handle once data flows: it ends with the
/// reason given and leaves only staging files its journal can resume; a second
/// transfer with `resume` completes the tree.
#[test]
fn a_cancelled_pull_stops_cleanly_and_resumes() {
    use dmover_core::server::{Faults, Server, ServerConfig};
    use dmover_core::session::TransferOptions;
    use dmover_core::transfer::{Endpoint, ErrorCode, Transfer, TransferSpec, Watch};
    use std::time::Duration;

    let t = tempfile::tempdir().unwrap();
    let (root, dest) = (t.path().join("root"), t.path().join("dest"));
    let src = root.join("src");
    std::fs::create_dir_all(src.join("small")).unwrap();
    std::fs::create_dir(&dest).unwrap();
    for i in 0..100u32 {
        std::fs::write(src.join(format!("small/{i}")), i.to_le_bytes().repeat(1000)).unwrap();
    }
    for i in 0..4u8 {
        std::fs::write(src.join(format!("big{i}")), vec![i; 1 << 20]).unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Every chunk read at the server waits, so that the pull lasts.
    let faults = Faults {
        chunk_delay: Some(Duration::from_millis(30)),
        ..Faults::default()
    };
    let server = Server::with_faults(ServerConfig::new(&root), faults).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move { server.serve(l, stop).await });
        addr
    });
    let pull = |resume: bool| {
        let options = TransferOptions {
            trust: Some(dmover_net::tls::Trust::KnownHosts(t.path().join("kh"))),
            chunk_size: 64 << 10,
            streams: 2,
            resume,
            ..TransferOptions::default()
        };
        let spec = TransferSpec::copy(
            vec![Endpoint::remote(&addr, "src").unwrap()],
            Endpoint::local(&dest),
        )
        .options(options);
        Transfer::new(spec).unwrap()
    };

    let first = pull(false);
    let cancel = first.canceller();
    let err = rt
        .block_on(first.run(Watch::every(Duration::from_millis(5)), |e| {
            // Once a file is written (and journalled), so that the second transfer has
            // something to resume from whatever the machine's load.
            if matches!(e, Event::Progress(s) if s.files > 0) {
                cancel.cancel("stop");
            }
        }))
        .unwrap_err();
    assert_eq!(err.to_string(), "stop");
    assert_eq!(err.code(), ErrorCode::Aborted);
    let moved = first.snapshot();
    assert!(moved.bytes > 0 && moved.bytes < moved.total, "{moved:?}");
    drop(first);
    for f in staging(&dest) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".dmv.journal.") || name.contains("big"),
            "{name} left behind"
        );
    }

    let second = pull(true);
    let done = rt.block_on(second.run(Watch::events(), |_| {})).unwrap();
    assert!(done.complete());
    assert!(done.report.held_bytes > 0, "{:?}", done.report);
    drop(second);
    stop.cancel();
    for i in 0..4u8 {
        assert_eq!(
            std::fs::read(dest.join(format!("src/big{i}"))).unwrap(),
            vec![i; 1 << 20]
        );
    }
    assert_eq!(
        std::fs::read_dir(dest.join("src/small")).unwrap().count(),
        100
    );
    assert_eq!(staging(&dest), Vec::<std::path::PathBuf>::new());
}

/// Files whose names start `.dmv.` (staging files and journals) below `dir`.
fn staging(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().starts_with(".dmv.") {
                out.push(e.path());
            }
        }
    }
    out
}

/// Two pushes at once on one [`Engine`]'s two disk threads, into a server in this
/// process: both complete.
#[test]
fn an_engine_runs_transfers_at_once_on_shared_disk_threads() {
    use dmover_core::Engine;
    use dmover_core::server::{Server, ServerConfig};
    use dmover_core::session::TransferOptions;
    use dmover_core::transfer::{Endpoint, TransferSpec, Watch};

    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for tree in ["a", "b"] {
        let d = t.path().join(tree);
        std::fs::create_dir(&d).unwrap();
        for i in 0..20u32 {
            std::fs::write(d.join(i.to_string()), tree.repeat(3000 + i as usize)).unwrap();
        }
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = Server::new(ServerConfig::new(&root)).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move { server.serve(l, stop).await });
        addr
    });
    let engine = Engine::new(Some(2));
    let push = |tree: &str| {
        let options = TransferOptions {
            trust: Some(dmover_net::tls::Trust::KnownHosts(t.path().join("kh"))),
            ..TransferOptions::default()
        };
        let spec = TransferSpec::copy(
            vec![Endpoint::local(t.path().join(tree))],
            Endpoint::remote(&addr, "").unwrap(),
        )
        .options(options);
        engine.transfer(spec).unwrap()
    };
    // The known-hosts file pins the key on first use: one push first.
    let first = push("a");
    rt.block_on(first.run(Watch::events(), |_| {})).unwrap();
    let (a, b) = (push("a"), push("b"));
    let (ra, rb) = rt.block_on(async {
        tokio::join!(
            a.run(Watch::events(), |_| {}),
            b.run(Watch::events(), |_| {})
        )
    });
    assert_eq!(ra.unwrap().report.totals.files, 20);
    assert_eq!(rb.unwrap().report.summary.files, 20);
    stop.cancel();
    for tree in ["a", "b"] {
        for i in 0..20u32 {
            let name = format!("{tree}/{i}");
            assert_eq!(
                std::fs::read(root.join(&name)).unwrap(),
                std::fs::read(t.path().join(&name)).unwrap()
            );
        }
    }
}
